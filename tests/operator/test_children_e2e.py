"""MPI and gang-scheduled TrainJobs end to end; Events and metrics the operator reports."""

from __future__ import annotations

import copy
import time

from operator_helpers import TJ, conditions, get_or_none, operator_writes, trainjob, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.api.objects import Obj

RUN_FAST = [{"name": "SANDBOX_RUN_SECONDS", "value": "1"}]


def test_mpi_trainjob_end_to_end(cluster: Cluster, operator: EmbeddedOperator) -> None:
    cluster.create(trainjob("ds", runtime="deepspeed-distributed", trainer={"numNodes": 3, "env": RUN_FAST}))
    secret = wait_for(lambda: get_or_none(cluster, "v1", "Secret", "ds-mpi-ssh-auth"), what="the SSH Secret")
    assert secret["type"] == "kubernetes.io/ssh-auth" and secret["immutable"] is True
    assert sorted(secret["data"]) == ["ssh-privatekey", "ssh-publickey"]
    hostfile = wait_for(
        lambda: get_or_none(cluster, "v1", "ConfigMap", "ds-mpi-hostfile"), what="the hostfile"
    )
    assert (
        hostfile["data"]["hostfile"]
        == "ds-node-0-0.ds slots=1\nds-node-0-1.ds slots=1\nds-launcher-0-0.ds slots=1\n"
    )
    wait_for(lambda: conditions(cluster, "ds").get("Complete", ("",))[0] == "True", what="Complete")
    again = cluster.get("v1", "Secret", "ds-mpi-ssh-auth")
    assert (again["metadata"]["uid"], again["data"]) == (secret["metadata"]["uid"], secret["data"]), (
        "never re-keyed"
    )


def test_coscheduled_trainjob_end_to_end(cluster: Cluster, operator: EmbeddedOperator) -> None:
    base = cluster.get(TJ, "ClusterTrainingRuntime", "torch-distributed", namespace="")
    spec = copy.deepcopy(base["spec"])
    spec["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 120}}
    node = spec["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    node["resources"] = {"requests": {"cpu": "2", "memory": "4Gi"}}
    cluster.create(
        {"apiVersion": TJ, "kind": "ClusterTrainingRuntime", "metadata": {"name": "gang"}, "spec": spec}
    )
    cluster.create(trainjob("ganged", runtime="gang", trainer={"numNodes": 3, "env": RUN_FAST}))
    group = wait_for(
        lambda: get_or_none(cluster, "scheduling.x-k8s.io/v1alpha1", "PodGroup", "ganged"),
        what="the PodGroup",
    )
    assert group["spec"] == {
        "minMember": 3,
        "minResources": {"cpu": "6", "memory": "12Gi"},
        "scheduleTimeoutSeconds": 120,
    }
    # The PodGroup is written before the JobSet: seeing one does not mean the other exists yet.
    jobset = wait_for(
        lambda: get_or_none(cluster, "jobset.x-k8s.io/v1alpha2", "JobSet", "ganged"), what="the JobSet"
    )
    pod_labels = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["scheduling.x-k8s.io/pod-group"] == "ganged"
    wait_for(lambda: conditions(cluster, "ganged").get("Complete", ("",))[0] == "True", what="Complete")


def test_managed_by_multikueue_is_not_touched(cluster: Cluster, operator: EmbeddedOperator) -> None:
    mark = cluster.audit_mark()
    before = operator.reconciles()
    cluster.create(trainjob("elsewhere", managedBy="kueue.x-k8s.io/multikueue"))
    wait_for(lambda: operator.reconciles() > before, what="a reconcile of the TrainJob")
    time.sleep(1.0)
    assert operator.idle()
    touched = operator_writes(cluster, mark, events=True)
    assert touched == []
    assert get_or_none(cluster, "jobset.x-k8s.io/v1alpha2", "JobSet", "elsewhere") is None


def test_active_deadline_fails_the_trainjob_and_deletes_the_jobset(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    cluster.create(
        trainjob(
            "slow", activeDeadlineSeconds=2, trainer={"env": [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]}
        )
    )
    wait_for(lambda: get_or_none(cluster, "jobset.x-k8s.io/v1alpha2", "JobSet", "slow"), what="the JobSet")
    wait_for(
        lambda: conditions(cluster, "slow").get("Failed") == ("True", "DeadlineExceeded"),
        timeout=15,
        what="deadline",
    )
    wait_for(
        lambda: get_or_none(cluster, "jobset.x-k8s.io/v1alpha2", "JobSet", "slow") is None,
        what="JobSet deleted",
    )


def test_events_are_distinct_short_and_keyless(cluster: Cluster, operator: EmbeddedOperator) -> None:
    cluster.create(
        trainjob("evented", runtime="deepspeed-distributed", trainer={"numNodes": 2, "env": RUN_FAST})
    )
    cluster.create(trainjob("lost", runtime="gone"))
    wait_for(lambda: conditions(cluster, "evented").get("Complete", ("",))[0] == "True", what="Complete")
    wait_for(lambda: "ReconcileFailed" in conditions(cluster, "lost"), what="ReconcileFailed")
    expected = {"TrainJobCompleted", "TrainJobResourcesCreationFailed"}

    def trainjob_events() -> list[Obj]:
        return [e for e in cluster.list("v1", "Event") if e["involvedObject"]["kind"] == "TrainJob"]

    # Events are posted by a task of their own, after the status that announces them.
    wait_for(lambda: expected <= {e["reason"] for e in trainjob_events()}, what=f"events {expected}")
    events = trainjob_events()
    reasons = {e["reason"] for e in events}
    assert all(r[0].isupper() and " " not in r for r in reasons)
    assert "JobSetCreated" not in reasons, "logged, not posted (docs/decisions.md §events)"
    secret = cluster.get("v1", "Secret", "evented-mpi-ssh-auth")
    for event in events:
        assert len(event["message"]) <= 1024
        assert "PRIVATE KEY" not in event["message"]
        assert all(value not in event["message"] for value in secret["data"].values())


def test_metrics_count_by_framework(cluster: Cluster, operator: EmbeddedOperator) -> None:
    cluster.create(trainjob("counted", trainer={"env": RUN_FAST}))
    wait_for(lambda: conditions(cluster, "counted").get("Complete", ("",))[0] == "True", what="Complete")
    registry = operator.operator.metrics.registry

    def value(metric: str, **labels: str) -> float:
        return registry.get_sample_value(metric, labels) or 0.0

    wait_for(
        lambda: value("trainer_trainjobs_completed_total", framework="torch") == 1,
        what="the completed counter",
    )
    assert value("trainer_trainjobs_created_total", framework="torch") == 1
    assert value("trainer_trainjobs_failed_total", framework="mlx") == 0, (
        "every framework is exported from the start"
    )
    assert value("trainer_trainjob_creation_to_jobset_seconds_count") == 1
    assert value("trainer_reconcile_total", result="success") >= 2
    # What any controller-runtime operator exports, under the same names (docs/configuration.md,
    # "Metrics"): the process, the work queue, the reconciles, and the API client by code.
    trainjob_controller = {"controller": "trainjob"}
    queue = {"controller": "trainjob", "name": "trainjob"}
    assert (value("process_resident_memory_bytes") or 0) > 10 * 2**20
    assert value("process_open_fds") > 0 and value("process_cpu_seconds_total") > 0
    assert value("workqueue_adds_total", **queue) >= 2
    assert value("workqueue_queue_duration_seconds_count", **queue) >= 2
    assert value("workqueue_work_duration_seconds_count", **queue) >= 2
    assert value("workqueue_depth", **queue) == 0
    assert value("controller_runtime_reconcile_total", result="success", **trainjob_controller) >= 2
    assert value("controller_runtime_reconcile_time_seconds_count", **trainjob_controller) >= 2
    assert value("controller_runtime_max_concurrent_reconciles", **trainjob_controller) == 4
    assert value("controller_runtime_active_workers", **trainjob_controller) == 0
    codes = {
        (s.labels["method"], s.labels["code"])
        for m in registry.collect()
        if m.name == "rest_client_requests"
        for s in m.samples
        if s.name == "rest_client_requests_total" and s.value > 0
    }
    assert {("POST", "201"), ("PATCH", "200")} <= codes, codes
