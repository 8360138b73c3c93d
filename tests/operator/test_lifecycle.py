"""The operator on the local API server: a TrainJob's whole life, and the writes it costs."""

from __future__ import annotations

import time
from typing import Any

from operator_helpers import (
    TJ,
    conditions,
    get_or_none,
    operator_requests,
    operator_writes,
    trainjob,
    wait_for,
    wait_settled,
)
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.controller.resources import Resources
from trainer.runtime import framework

JS = "jobset.x-k8s.io/v1alpha2"
RUN_FAST = [{"name": "SANDBOX_RUN_SECONDS", "value": "1"}]


def test_trainjob_runs_to_complete_with_minimal_writes(cluster: Cluster, operator: EmbeddedOperator) -> None:
    mark = cluster.audit_mark()
    cluster.create(trainjob("mnist", trainer={"numNodes": 2, "env": RUN_FAST}))
    jobset = wait_for(lambda: get_or_none(cluster, JS, "JobSet", "mnist"), what="the JobSet")
    writes = operator_writes(cluster, mark)
    # Created by server-side apply: a patch that answers 201 Created.
    jobset_created = next(i for i, r in enumerate(writes) if r.resource == "jobsets" and r.status == 201)
    until_jobset = writes[: jobset_created + 1]
    # The snapshot ConfigMap and the JobSet, and at most one status write: no bookkeeping writes.
    kinds = sorted((r.verb, r.resource, r.subresource) for r in until_jobset)
    assert ("create", "configmaps", "") in kinds
    assert len(until_jobset) <= 2 + 1, kinds
    assert jobset["metadata"]["ownerReferences"][0]["name"] == "mnist"
    wait_for(
        lambda: conditions(cluster, "mnist").get("Complete") == ("True", "AllJobsCompleted"), what="Complete"
    )
    status = cluster.get(TJ, "TrainJob", "mnist")["status"]
    assert status["jobsStatus"] == [
        {"name": "node", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
    ]


def test_steady_state_and_noop_reconcile_write_nothing(cluster: Cluster, operator: EmbeddedOperator) -> None:
    cluster.create(trainjob("idle", suspend=True))
    wait_for(lambda: conditions(cluster, "idle").get("Suspended") == ("True", "Suspended"), what="Suspended")
    wait_settled(cluster, operator.idle)
    mark = cluster.audit_mark()
    before = operator.reconciles()
    # Force reconciles of a TrainJob whose world is as it should be.
    _requeue(operator, (cluster.namespace, "idle"))
    time.sleep(1.0)
    assert operator.idle()
    assert operator.reconciles() > before, "the forced reconciles ran"
    assert operator_writes(cluster, mark, events=True) == []


def _requeue(operator: EmbeddedOperator, key: tuple[str, str]) -> None:
    loop = operator._loop
    assert loop is not None
    for _ in range(3):
        loop.call_soon_threadsafe(operator.operator.queue.add, key)
        time.sleep(0.2)


def test_suspend_and_resume(cluster: Cluster, operator: EmbeddedOperator) -> None:
    cluster.create(trainjob("pausable", suspend=True, trainer={"env": RUN_FAST}))
    wait_for(
        lambda: (get_or_none(cluster, JS, "JobSet", "pausable") or {}).get("spec", {}).get("suspend") is True
    )
    assert conditions(cluster, "pausable") == {"Suspended": ("True", "Suspended")}
    cluster.patch(TJ, "TrainJob", "pausable", {"spec": {"suspend": False}})
    wait_for(
        lambda: cluster.get(JS, "JobSet", "pausable")["spec"]["suspend"] is False, what="the JobSet resumed"
    )
    wait_for(lambda: conditions(cluster, "pausable").get("Suspended") == ("False", "Resumed"), what="Resumed")
    wait_for(lambda: conditions(cluster, "pausable").get("Complete", ("",))[0] == "True", what="Complete")


def test_deleted_jobset_recreated_while_running_not_after_finish(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    cluster.create(trainjob("long", trainer={"env": [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]}))
    first = wait_for(lambda: get_or_none(cluster, JS, "JobSet", "long"), what="the JobSet")
    cluster.delete(JS, "JobSet", "long")
    second = wait_for(
        lambda: (
            (js := get_or_none(cluster, JS, "JobSet", "long"))
            and js["metadata"]["uid"] != first["metadata"]["uid"]
            and js
        ),
        what="a new JobSet",
    )
    assert second["spec"]["replicatedJobs"][0]["name"] == "node"
    registry = operator.operator.metrics.registry
    created = registry.get_sample_value("trainer_trainjobs_created_total", {"framework": "torch"})
    assert created == 1, "a re-created JobSet is not another TrainJob created"

    cluster.create(trainjob("short", trainer={"env": RUN_FAST}))
    wait_for(lambda: conditions(cluster, "short").get("Complete", ("",))[0] == "True", what="Complete")
    cluster.delete(JS, "JobSet", "short")
    wait_for(lambda: get_or_none(cluster, JS, "JobSet", "short") is None, what="the JobSet gone")
    time.sleep(1.5)
    assert get_or_none(cluster, JS, "JobSet", "short") is None, (
        "a finished TrainJob never re-creates children"
    )
    assert conditions(cluster, "short")["Complete"][0] == "True"


def test_missing_runtime_shows_on_status_and_recovers(cluster: Cluster, operator: EmbeddedOperator) -> None:
    cluster.create(trainjob("waiting", runtime="not-yet"))
    wait_for(lambda: "ReconcileFailed" in conditions(cluster, "waiting"), what="ReconcileFailed")
    assert conditions(cluster, "waiting")["ReconcileFailed"] == ("True", "TrainingRuntimeNotFound")
    runtime = cluster.get(TJ, "ClusterTrainingRuntime", "torch-distributed", namespace="")
    clone = {
        "apiVersion": TJ,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "not-yet"},
        "spec": runtime["spec"],
    }
    cluster.create(clone)
    wait_for(
        lambda: get_or_none(cluster, JS, "JobSet", "waiting"), what="the JobSet after the runtime appeared"
    )
    wait_for(lambda: "ReconcileFailed" not in conditions(cluster, "waiting"), what="the condition removed")
    # A LIST of an optional API the cluster does not serve (kube-scheduler's gang kinds, behind
    # gates this cluster leaves off) is answered 404: "none of those", not a refusal.
    optional = [r.type for r in Resources.of(framework.default()).watched if r.optional]

    def absent(record: Any) -> bool:
        path = record.path.partition("?")[0]
        return record.status == 404 and any(
            path.startswith(f"/apis/{t.group}/{t.version}/") and path.endswith(f"/{t.plural}")
            for t in optional
        )

    refused = [r for r in operator_requests(cluster, cluster.start_mark) if r.status >= 400 and not absent(r)]
    assert refused == [], "removing the only condition removes the status whole (it needs a property)"


def test_restart_mid_lifecycle_converges_without_duplicate_writes(
    cluster: Cluster, operator_kubeconfig: str
) -> None:
    with EmbeddedOperator(operator_kubeconfig, namespaces=[cluster.namespace]) as first:
        cluster.create(trainjob("survivor", suspend=True))
        wait_for(lambda: conditions(cluster, "survivor").get("Suspended", ("",))[0] == "True")
        wait_settled(cluster, first.idle)
    mark = cluster.audit_mark()
    with EmbeddedOperator(operator_kubeconfig, namespaces=[cluster.namespace]) as second:
        time.sleep(1.0)
        assert second.idle()
        assert second.reconciles() >= 1, "the restarted operator reconciled the TrainJob"
        assert operator_writes(cluster, mark, events=True) == [], "a restart re-creates or rewrites nothing"
        cluster.patch(TJ, "TrainJob", "survivor", {"spec": {"suspend": False}})
        wait_for(
            lambda: cluster.get(JS, "JobSet", "survivor")["spec"]["suspend"] is False,
            what="resumed after restart",
        )


def test_children_the_watches_do_not_see_are_read_once_not_retried_forever(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    """Objects without our label (made by hand, by upstream's operator) exist but never reach our
    label-selected watches: a create that meets one reads it instead of retrying in a loop."""
    foreign = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "taken-runtime-snapshot"}}
    cluster.create({**foreign, "data": {"runtime": "kind: ClusterTrainingRuntime"}})
    cluster.create(trainjob("taken"))
    wait_for(lambda: "ReconcileFailed" in conditions(cluster, "taken"), what="ReconcileFailed")
    tj = cluster.get(TJ, "TrainJob", "taken")
    failed = next(c for c in tj["status"]["conditions"] if c["type"] == "ReconcileFailed")
    assert "owned by another object" in failed["message"]
    # Gone, the name is free: the TrainJob goes on (it was looked at again by name, not forever
    # judged by the copy read once).
    cluster.delete("v1", "ConfigMap", "taken-runtime-snapshot")
    wait_for(
        lambda: get_or_none(cluster, JS, "JobSet", "taken"),
        timeout=60,
        what="the JobSet once the name is free",
    )

    # A Secret in an SSH key's way is read by name, its metadata only (Secrets are never listed),
    # and refused: it is not the TrainJob's (docs/decisions.md §11). Retries back off.
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "ds-mpi-ssh-auth"},
        "type": "kubernetes.io/ssh-auth",
        "data": {"ssh-privatekey": "a2V5", "ssh-publickey": "cHVi"},
    }
    cluster.create(secret)
    cluster.create(trainjob("ds", runtime="deepspeed-distributed", trainer={"numNodes": 2}))
    wait_for(lambda: "ReconcileFailed" in conditions(cluster, "ds"), what="ReconcileFailed")
    time.sleep(3.0)
    secret_calls = [r for r in operator_requests(cluster, cluster.start_mark) if r.resource == "secrets"]
    assert {r.verb for r in secret_calls} == {"create", "get"}, [(r.verb, r.path) for r in secret_calls]
    # 3 s of retries with a backoff doubling from half a second: a handful, not a loop.
    assert len([r for r in secret_calls if r.status == 409]) <= 5, len(secret_calls)
    assert get_or_none(cluster, JS, "JobSet", "ds") is None
    assert cluster.get("v1", "Secret", "ds-mpi-ssh-auth")["data"] == secret["data"]


def test_configmaps_are_watched_through_a_label_selector_and_secrets_not_at_all(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    cluster.create(trainjob("watched", suspend=True))
    wait_for(lambda: "Suspended" in conditions(cluster, "watched"), what="Suspended")
    reads = [
        r
        for r in operator_requests(cluster, cluster.start_mark)
        if r.resource in ("configmaps", "secrets") and r.verb in ("list", "watch")
    ]
    # Secrets are never listed or watched (docs/security.md, finding 1): only ConfigMaps, filtered
    # by the API server through our label.
    assert {r.resource for r in reads} == {"configmaps"}
    unfiltered = [
        r.path for r in reads if "labelSelector=trainer.kubeflow.org" not in r.path.replace("%2F", "/")
    ]
    assert unfiltered == [], "the API server, not the operator, filters the ConfigMaps it sends"
