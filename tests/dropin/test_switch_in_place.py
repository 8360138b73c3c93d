"""Switching a live cluster from upstream's controller to ours, and back (docs/drop-in.md).

Upstream's trainer-controller-manager v2.3.0, built from its module by ``cluster/build``, runs on
the real control plane with its own CRDs and runtimes and TrainJobs in every state: suspended,
running (torch, and MPI with its SSH Secret and hostfile), finished, failed. It is stopped, our
CRDs replace its, and ours starts. The audit log shows that no JobSet is created or deleted, no pod
deleted, that ours writes nothing to the JobSets it finds right, and the TrainJobs' status is what
upstream left and then moves on under ours. Then the same the other way round.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import finished, real_cluster, recreated, running_pods, wait_for, world
from trainer_sandbox.backends import RealCluster
from trainer_sandbox.cluster import ControlPlane, addons, install
from trainer_sandbox.cluster.kube import KubeError
from trainer_sandbox.embedded_operator import EmbeddedOperator
from trainer_sandbox.operator_process import OPERATOR_USER

from trainer.controller.config import Configuration

TJ = "trainer.kubeflow.org/v1alpha1"
NAMESPACE = "switch"
UPSTREAM_USER = "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"
LEGACY_FINALIZER = "trainer.kubeflow.org/resource-in-use"
# Long enough to switch while the pods run; the jobs then finish under the other controller.
RUN_SECONDS = "45"


def trainjob(
    name: str, runtime: str, *, run: str = RUN_SECONDS, exit_code: str = "0", **spec: Any
) -> dict[str, Any]:
    env = [{"name": "SANDBOX_RUN_SECONDS", "value": run}, {"name": "SANDBOX_EXIT_CODE", "value": exit_code}]
    return {
        "apiVersion": TJ,
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": 2, "env": env}, **spec},
    }


@pytest.fixture(scope="module")
def plane(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane with upstream's CRDs and runtimes, as upstream's install leaves a cluster."""
    plane = ControlPlane.start(tmp_path_factory.mktemp("switch"), bin_dir=bin_dir, trainer_objects=False)
    try:
        module = addons.module_dir(addons.UPSTREAM_MODULE)
        admin = plane.client()
        addons.install_crds(admin, addons.upstream_crds(module))
        for runtime in addons.upstream_runtimes(module):
            admin.create(runtime)
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def cluster(plane: ControlPlane) -> RealCluster:
    cluster = real_cluster(plane, NAMESPACE)
    for user in (UPSTREAM_USER, OPERATOR_USER):
        cluster.add_user(user, ["system:serviceaccounts"])
        cluster.grant(user)
    return cluster


def start_upstream(plane: ControlPlane, cluster: RealCluster, directory: Path) -> addons.GoController:
    addons.install_crds(plane.client(), addons.upstream_crds(addons.module_dir(addons.UPSTREAM_MODULE)))
    kubeconfig = cluster.write_kubeconfig(directory / "upstream.kubeconfig", user=UPSTREAM_USER)
    return addons.start_upstream_trainer(plane, kubeconfig, directory / "upstream")


def start_ours(plane: ControlPlane, cluster: RealCluster, directory: Path) -> EmbeddedOperator:
    ours = [c for c in install.trainer_and_podgroup_crds() if c["spec"]["group"] == "trainer.kubeflow.org"]
    addons.install_crds(plane.client(), ours)
    kubeconfig = cluster.write_kubeconfig(directory / "ours.kubeconfig", user=OPERATOR_USER)
    return EmbeddedOperator(kubeconfig, Configuration(), [NAMESPACE], webhooks=True).start()


def stop_ours(operator: EmbeddedOperator, plane: ControlPlane) -> None:
    """Stop ours as an uninstall does: the process, and its webhook configurations."""
    operator.stop()
    admin = plane.client()
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        with contextlib.suppress(KubeError):
            admin.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/trainer.kubeflow.org")


def quiet(cluster: RealCluster, user: str, seconds: float = 3.0, timeout: float = 60) -> None:
    """Until ``user`` has written nothing in the namespace for ``seconds``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mark = cluster.audit_mark()
        time.sleep(seconds)
        if not [
            r for r in cluster.audit_since(mark) if r.user == user and r.mutated and r.namespace == NAMESPACE
        ]:
            return
    raise AssertionError(f"{user} kept writing for {timeout} s")


def writes(records: list[Any], user: str, resource: str) -> list[str]:
    return [
        f"{r.verb} {r.resource}/{r.name}{'/' + r.subresource if r.subresource else ''}"
        for r in records
        if r.user == user and r.mutated and r.resource == resource
    ]


@pytest.fixture(scope="module")
def under_upstream(
    plane: ControlPlane, cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """TrainJobs in every state under upstream's controller, then the switch to ours."""
    directory = tmp_path_factory.mktemp("switch-to-ours")
    upstream = start_upstream(plane, cluster, directory)
    try:
        cluster.create(trainjob("suspended", "torch-distributed", suspend=True))
        cluster.create(trainjob("torch", "torch-distributed"))
        cluster.create(trainjob("mpi", "deepspeed-distributed"))
        cluster.create(trainjob("finished", "torch-distributed", run="1"))
        cluster.create(trainjob("failed", "torch-distributed", run="1", exit_code="1"))
        wait_for(lambda: finished(cluster, "finished") == "Complete", "finished to complete")
        wait_for(lambda: finished(cluster, "failed") == "Failed", "failed to fail")
        wait_for(lambda: running_pods(cluster, "torch") == 2, "torch's two pods to run")
        wait_for(lambda: running_pods(cluster, "mpi") == 2, "mpi's launcher and node to run")
        quiet(cluster, UPSTREAM_USER)
    finally:
        upstream.stop()
    # A runtime with the finalizer upstream v2.0-v2.2 left on runtimes, made while no controller
    # runs (v2.3 removes it itself, so it must not be running to leave this for ours).
    legacy = {
        "apiVersion": TJ,
        "kind": "TrainingRuntime",
        "metadata": {"name": "legacy", "finalizers": [LEGACY_FINALIZER]},
        "spec": cluster.get(TJ, "ClusterTrainingRuntime", "torch-distributed", namespace="")["spec"],
    }
    assert cluster.create(legacy)["metadata"]["finalizers"] == [LEGACY_FINALIZER]
    before = world(cluster)
    mark = cluster.audit_mark()
    ours = start_ours(plane, cluster, directory)
    try:
        # Its first list queues every TrainJob: five reconciles and an empty queue is each one seen.
        wait_for(lambda: ours.reconciles() >= 5 and ours.idle(), "ours to reconcile every TrainJob")
        quiet(cluster, OPERATOR_USER)
        after = world(cluster)
        records = cluster.audit_since(mark)
        yield {"before": before, "after": after, "records": records, "operator": ours}
    finally:
        stop_ours(ours, plane)


def test_ours_takes_over_without_recreating_or_rewriting_anything(
    under_upstream: dict[str, Any], cluster: RealCluster
) -> None:
    before, after, records = under_upstream["before"], under_upstream["after"], under_upstream["records"]
    assert {"JobSet/torch", "JobSet/mpi", "Secret/mpi-mpi-ssh-auth", "ConfigMap/mpi-mpi-hostfile"} <= set(
        before
    )
    assert sum(k.startswith("Pod/") for k in before) >= 4, before
    assert recreated(records, NAMESPACE) == []
    assert after == before, "the same objects, the same status"
    assert writes(records, OPERATOR_USER, "jobsets") == []
    assert writes(records, OPERATOR_USER, "secrets") == []
    # One write: the hostfile gets our trainjob-name label, by which our watch of ConfigMaps
    # sees it from then on (its data, above, unchanged). The snapshots are read as they are.
    assert writes(records, OPERATOR_USER, "configmaps") == ["patch configmaps/mpi-mpi-hostfile"]
    hostfile = cluster.get("v1", "ConfigMap", "mpi-mpi-hostfile")
    assert hostfile["metadata"]["labels"]["trainer.kubeflow.org/trainjob-name"] == "mpi"
    # The legacy runtime's finalizer is gone, by one patch of ours; nothing else was written to a runtime.
    assert cluster.get(TJ, "TrainingRuntime", "legacy")["metadata"].get("finalizers") in (None, [])
    assert writes(records, OPERATOR_USER, "trainingruntimes") == ["patch trainingruntimes/legacy"]
    assert writes(records, OPERATOR_USER, "clustertrainingruntimes") == []


def test_status_moves_on_under_ours(under_upstream: dict[str, Any], cluster: RealCluster) -> None:
    mark = cluster.audit_mark()
    wait_for(lambda: finished(cluster, "torch") == "Complete", "torch to complete", timeout=120)
    wait_for(lambda: finished(cluster, "mpi") == "Complete", "mpi to complete", timeout=120)
    status_writes = writes(cluster.audit_since(mark), OPERATOR_USER, "trainjobs")
    assert "patch trainjobs/torch/status" in status_writes and "patch trainjobs/mpi/status" in status_writes
    assert finished(cluster, "finished") == "Complete" and finished(cluster, "failed") == "Failed"


def test_back_to_upstream_without_recreating_anything(
    under_upstream: dict[str, Any], plane: ControlPlane, cluster: RealCluster, tmp_path: Path
) -> None:
    """A rollback: TrainJobs started under ours carry on under upstream's controller."""
    ours: EmbeddedOperator = under_upstream["operator"]
    cluster.create(trainjob("ours-suspended", "torch-distributed", suspend=True))
    cluster.create(trainjob("ours-torch", "torch-distributed", run="20"))
    cluster.create(trainjob("ours-mpi", "deepspeed-distributed", run="20"))
    wait_for(lambda: running_pods(cluster, "ours-torch") == 2, "ours-torch's two pods to run")
    wait_for(lambda: running_pods(cluster, "ours-mpi") == 2, "ours-mpi's launcher and node to run")
    quiet(cluster, OPERATOR_USER)
    stop_ours(ours, plane)
    before = world(cluster)
    mark = cluster.audit_mark()
    upstream = start_upstream(plane, cluster, tmp_path)
    try:
        quiet(cluster, UPSTREAM_USER)
        assert recreated(cluster.audit_since(mark), NAMESPACE) == []
        after = world(cluster)
        assert {k: v for k, v in after.items() if k.startswith(("JobSet/", "Secret/", "ConfigMap/"))} == {
            k: v for k, v in before.items() if k.startswith(("JobSet/", "Secret/", "ConfigMap/"))
        }
        assert after["TrainJob/ours-torch"] == before["TrainJob/ours-torch"]
        assert cluster.get(TJ, "TrainJob", "ours-suspended")["spec"]["suspend"] is True
        assert cluster.get("jobset.x-k8s.io/v1alpha2", "JobSet", "ours-suspended")["spec"]["suspend"] is True
        wait_for(lambda: finished(cluster, "ours-torch") == "Complete", "ours-torch to complete", timeout=120)
        wait_for(lambda: finished(cluster, "ours-mpi") == "Complete", "ours-mpi to complete", timeout=120)
        assert recreated(cluster.audit_since(mark), NAMESPACE) == []
    finally:
        upstream.stop()
