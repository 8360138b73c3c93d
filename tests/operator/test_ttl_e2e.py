"""TrainJobs that clean up after themselves (docs/decisions.md §ttl), on both backends: the TTL
runs out, the operator deletes the TrainJob, and the garbage collector takes its JobSet (and, on
the real control plane, its Jobs and pods) with it."""

from __future__ import annotations

import copy
import time
from pathlib import Path

from operator_helpers import TJ, conditions, get_or_none, trainjob, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.controller.config import Configuration

JS = "jobset.x-k8s.io/v1alpha2"
RUN_FAST = [{"name": "SANDBOX_RUN_SECONDS", "value": "1"}]
RUN_FOREVER = [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]
TTL = 5
SLACK = 6.0  # reconcile, the delete, and the moment the test looks


def complete_at(cluster: Cluster, name: str) -> float:
    """Wait for Complete; return the wall-clock time the condition says it became True."""
    from trainer.runtime.render import parse_time

    wait_for(
        lambda: conditions(cluster, name).get("Complete", ("",))[0] == "True",
        timeout=90,
        what=f"{name} Complete",
    )
    found = next(
        c for c in cluster.get(TJ, "TrainJob", name)["status"]["conditions"] if c["type"] == "Complete"
    )
    return parse_time(found["lastTransitionTime"]).timestamp()


def gone(cluster: Cluster, name: str) -> bool:
    return get_or_none(cluster, TJ, "TrainJob", name) is None


def pods_of(cluster: Cluster, name: str) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in cluster.list("v1", "Pod")
        if (p["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name") == name
    ]


def test_a_finished_trainjob_is_gone_when_its_ttl_runs_out_with_its_children(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    cluster.create(trainjob("short", trainer={"env": RUN_FAST}, ttlSecondsAfterFinished=TTL))
    wait_for(lambda: get_or_none(cluster, JS, "JobSet", "short"), what="the JobSet")
    finished = complete_at(cluster, "short")
    status = cluster.get(TJ, "TrainJob", "short")["status"]
    assert status.get("startTime") and status.get("completionTime"), status
    assert not gone(cluster, "short"), "still there right after it completed"
    wait_for(
        lambda: gone(cluster, "short"), timeout=TTL + SLACK + 10, interval=0.2, what="the TrainJob deleted"
    )
    deleted_after = time.time() - finished
    assert TTL - 1.0 <= deleted_after <= TTL + SLACK, (
        f"deleted {deleted_after:.1f}s after Complete (TTL {TTL}s)"
    )
    # The garbage collector's pace, not ours: kube-controller-manager's is busy on a shared machine.
    started = time.monotonic()
    wait_for(
        lambda: get_or_none(cluster, JS, "JobSet", "short") is None, timeout=120, what="the JobSet collected"
    )
    wait_for(lambda: not pods_of(cluster, "short"), timeout=120, what="the pods collected")
    print(f"children collected {time.monotonic() - started:.1f}s after the TrainJob was deleted")


def test_the_runtime_run_policy_ttl_is_inherited_and_a_running_trainjob_is_never_deleted(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    base = cluster.get(TJ, "ClusterTrainingRuntime", "torch-distributed", namespace="")
    cluster.create(
        {
            "apiVersion": TJ,
            "kind": "TrainingRuntime",
            "metadata": {"name": "short-lived"},
            "spec": {**copy.deepcopy(base["spec"]), "runPolicy": {"ttlSecondsAfterFinished": 2}},
        }
    )
    ref = {"name": "short-lived", "kind": "TrainingRuntime"}
    cluster.create(
        {
            "apiVersion": TJ,
            "kind": "TrainJob",
            "metadata": {"name": "inherits"},
            "spec": {"runtimeRef": ref, "trainer": {"env": RUN_FAST}},
        }
    )
    cluster.create(
        {
            "apiVersion": TJ,
            "kind": "TrainJob",
            "metadata": {"name": "running"},
            "spec": {"runtimeRef": ref, "trainer": {"env": RUN_FOREVER}, "ttlSecondsAfterFinished": 0},
        }
    )
    complete_at(cluster, "inherits")
    wait_for(
        lambda: gone(cluster, "inherits"),
        timeout=2 + SLACK + 10,
        interval=0.2,
        what="the inheriting TrainJob deleted",
    )
    # The running one was reconciled all along (its JobSet's status changes) and is still there.
    before = operator.reconciles()
    cluster.patch(TJ, "TrainJob", "running", {"metadata": {"labels": {"poke": "1"}}})
    wait_for(lambda: operator.reconciles() > before, what="a reconcile of the running TrainJob")
    time.sleep(2.0)
    assert not gone(cluster, "running"), "a TrainJob that has not finished is never deleted"
    assert get_or_none(cluster, JS, "JobSet", "running") is not None


def test_a_restart_in_between_does_not_lose_the_ttl(cluster: Cluster, operator_kubeconfig: Path) -> None:
    with EmbeddedOperator(operator_kubeconfig, Configuration(), namespaces=[cluster.namespace]):
        cluster.create(trainjob("survives", trainer={"env": RUN_FAST}, ttlSecondsAfterFinished=TTL))
        finished = complete_at(cluster, "survives")
    # No operator while the TTL runs out: nothing deletes it.
    time.sleep(max(0.0, finished + TTL + 1.0 - time.time()))
    assert not gone(cluster, "survives")
    with EmbeddedOperator(operator_kubeconfig, Configuration(), namespaces=[cluster.namespace]):
        wait_for(
            lambda: gone(cluster, "survives"),
            timeout=20,
            interval=0.2,
            what="deleted by the restarted operator",
        )
