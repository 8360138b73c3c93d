"""Kinds the plugins declare, through a running operator on both backends: what a plugin reads is
watched and reaches admission and the render core; what it builds is written and watched.

- Volcano reads PriorityClasses (``Reads``): through the validating webhook, a runtime whose pods
  name an existing PriorityClass is accepted and one naming a missing class refused, including a
  class created after the operator started (the watch brings it).
- A plugin from another package, allow-listed, reads a kind of its own CRD and builds another: the
  operator, which has never heard of either, watches the one, writes the other owned by the
  TrainJob, and writes it again when it is deleted.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_helpers import TJ, get_or_none, trainjob, wait_for
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.api.objects import Obj
from trainer.controller.config import Configuration
from trainer.plugin import Builds, Info, Kind, PluginError, Reads, hookimpl
from trainer.runtime import framework as fw

RUN_FAST = [{"name": "SANDBOX_RUN_SECONDS", "value": "1"}]


def _volcano_runtime(cluster: Cluster, name: str, priority_class: str) -> Obj:
    base = cluster.get(TJ, "ClusterTrainingRuntime", "torch-distributed", namespace="")
    spec = copy.deepcopy(base["spec"])
    spec["podGroupPolicy"] = {"volcano": {}}
    pod = spec["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["priorityClassName"] = priority_class
    return {"apiVersion": TJ, "kind": "TrainingRuntime", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def webhook_operator(operator_kubeconfig: Path, cluster: Cluster) -> Iterator[EmbeddedOperator]:
    with EmbeddedOperator(operator_kubeconfig, Configuration(), [cluster.namespace], webhooks=True) as op:
        yield op


def test_volcano_reads_priority_classes_through_the_webhook(
    cluster: Cluster, webhook_operator: EmbeddedOperator
) -> None:
    # Cluster-scoped, on a control plane other tests share: named after this test's namespace.
    existing, later = f"{cluster.namespace}-high", f"{cluster.namespace}-later"
    cluster.create(_priority_class(existing))
    cluster.create(_volcano_runtime(cluster, "gang-high", existing))
    cluster.create(_volcano_runtime(cluster, "gang-later", later))

    # The class exists: admitted (the operator's cache has PriorityClasses, as Volcano declares).
    wait_for(
        lambda: _admitted(cluster, _namespaced("high", "gang-high")),
        what="the TrainJob admitted once the operator's watch has the PriorityClass",
    )
    group = wait_for(
        lambda: get_or_none(cluster, "scheduling.volcano.sh/v1beta1", "PodGroup", "high"), what="the PodGroup"
    )
    assert group["spec"]["priorityClassName"] == existing

    # A missing class is refused by the webhook, naming it.
    with pytest.raises(APIError) as refused:
        cluster.create(_namespaced("late", "gang-later"))
    assert f'PriorityClass "{later}" doesn\'t exist' in str(refused.value)
    assert f'priorityclasses.scheduling.k8s.io "{later}" not found' in str(refused.value)

    # Made now, it reaches the operator by its watch, and the same TrainJob is admitted.
    cluster.create(_priority_class(later))
    wait_for(
        lambda: _admitted(cluster, _namespaced("late", "gang-later")),
        what="the TrainJob admitted once the new PriorityClass was watched",
    )


def _namespaced(name: str, runtime: str) -> Obj:
    job = trainjob(name, runtime=runtime, trainer={"env": RUN_FAST})
    job["spec"]["runtimeRef"]["kind"] = "TrainingRuntime"
    return job


def _priority_class(name: str) -> Obj:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": 1000,
    }


def _admitted(cluster: Cluster, obj: Obj) -> bool:
    try:
        cluster.create(obj)
    except APIError as exc:
        if "doesn't exist" in str(exc):
            return False
        raise
    return True


# --- a plugin from another package, with kinds of its own --------------------------------------

GROUP = "reservations.e2e.trainer.example"
BUDGET = Kind(f"{GROUP}/v1", "TeamBudget", "teambudgets")
RESERVATION = Kind(f"{GROUP}/v1", "Reservation", "reservations")


class Reservations:
    """Reserves a team's share for each TrainJob, from the TeamBudget of its namespace."""

    name = "Reservations"
    kinds = (Reads(BUDGET), Builds(RESERVATION))

    def needed_by(self, spec: Any) -> bool:
        return False

    @hookimpl
    def trainer_build(self, info: Info) -> list[Obj]:
        budget = info.facts.get(BUDGET.kind, info.namespace, "budget", group=BUDGET.group)
        if budget is None:
            raise PluginError("no TeamBudget named budget in the namespace")
        trainer = info.trainer_pod_set()
        return [
            {
                "apiVersion": RESERVATION.api_version,
                "kind": RESERVATION.kind,
                "metadata": info.child_metadata(info.name),
                "spec": {"team": budget["spec"]["team"], "nodes": trainer.count if trainer else 0},
            }
        ]


def _crd(kind: Kind) -> Obj:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{kind.plural}.{kind.group}"},
        "spec": {
            "group": kind.group,
            "names": {
                "kind": kind.kind,
                "plural": kind.plural,
                "singular": kind.kind.lower(),
                "listKind": f"{kind.kind}List",
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        }
                    },
                }
            ],
        },
    }


class _EntryPoint:
    def load(self) -> Reservations:
        return Reservations()


@pytest.fixture
def reservations_operator(
    operator_kubeconfig: Path, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EmbeddedOperator]:
    # Installed as another package's plugin is: found by its entry point, loaded when allow-listed.
    monkeypatch.setattr(fw, "_external_entry_points", lambda: {Reservations.name: _EntryPoint()})
    config = Configuration.model_validate({"plugins": {"allowed": [Reservations.name]}})
    with EmbeddedOperator(operator_kubeconfig, config, [cluster.namespace]) as op:
        yield op


@pytest.fixture
def reservation_crds(cluster: Cluster) -> None:
    for kind in (BUDGET, RESERVATION):
        cluster.create(_crd(kind))  # cluster-scoped: removed after the test
    probe = {
        "apiVersion": BUDGET.api_version,
        "kind": BUDGET.kind,
        "metadata": {"name": "budget"},
        "spec": {"team": "vision"},
    }
    wait_for(lambda: _served(cluster, probe), what="the TeamBudget CRD served")


def _served(cluster: Cluster, obj: Obj) -> bool:
    try:
        cluster.create(obj)
    except APIError as exc:
        if exc.code == 404:
            return False
        raise
    return True


def test_a_plugin_from_another_package_reads_and_builds_kinds_the_core_does_not_know(
    cluster: Cluster, reservation_crds: None, reservations_operator: EmbeddedOperator
) -> None:
    assert reservations_operator.operator.framework.enabled[-1] == "Reservations"
    watched = {(r.api_version, r.kind) for r in reservations_operator.operator.resources.watched}
    assert {(BUDGET.api_version, "TeamBudget"), (RESERVATION.api_version, "Reservation")} <= watched

    cluster.create(trainjob("resnet", trainer={"numNodes": 2, "env": RUN_FAST}))
    reservation = wait_for(
        lambda: get_or_none(cluster, RESERVATION.api_version, "Reservation", "resnet"), what="the Reservation"
    )
    assert reservation["spec"] == {"team": "vision", "nodes": 2}, (
        "built from the TeamBudget the operator watched"
    )
    tj = cluster.get(TJ, "TrainJob", "resnet")
    (owner,) = reservation["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TrainJob", tj["metadata"]["uid"], True)

    # The operator watches what it builds: deleted, the Reservation is written again.
    cluster.delete(RESERVATION.api_version, "Reservation", "resnet")
    again = wait_for(
        lambda: get_or_none(cluster, RESERVATION.api_version, "Reservation", "resnet"),
        what="the Reservation again",
    )
    assert again["metadata"]["uid"] != reservation["metadata"]["uid"]
