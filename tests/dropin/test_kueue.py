"""Kueue v0.19.2, built from its module by ``cluster/build``, queueing our TrainJobs on the real
control plane (docs/kueue.md).

Kueue reads a TrainJob into upstream's Go types, works out its pods with upstream's runtime code,
counts them against a ClusterQueue's quota, and admits it by writing the whole TrainJob back:
unsuspended, with a runtime patch that carries the ResourceFlavor's node labels. Our operator
must turn that into the same pods Kueue counted, hold a TrainJob Kueue keeps suspended, and
suspend and resume the same JobSet when Kueue preempts. Kueue's update drops our own field
``spec.ttlSecondsAfterFinished`` (not in upstream's types); the defaulting webhook keeps it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import real_cluster, wait_for
from trainer_sandbox.backends import RealCluster
from trainer_sandbox.cluster import ControlPlane, addons
from trainer_sandbox.embedded_operator import EmbeddedOperator
from trainer_sandbox.operator_process import OPERATOR_USER

from trainer.controller.config import Configuration

TJ = "trainer.kubeflow.org/v1alpha1"
KUEUE = "kueue.x-k8s.io/v1beta2"
NAMESPACE = "queued"
KUEUE_USER = "system:serviceaccount:kueue-system:kueue-controller-manager"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The flavor's node label: every admitted pod must land on this one of the four kwok nodes.
FLAVOR_NODE = "kwok-node-2"
# The flavor's toleration, which Kueue puts on every admitted pod (no node is tainted with it).
TOLERATION = {"key": "example.com/queue", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def plane(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if os.geteuid() != 0:  # Kueue gets its metrics certificate in a mount namespace (addons.py)
        if os.environ.get("CI"):
            pytest.fail("CI is set, so this is an error, not a skip: Kueue's tests need root")
        pytest.skip("Kueue is run in a mount namespace of its own: that needs root")
    plane = ControlPlane.start(tmp_path_factory.mktemp("kueue"), bin_dir=bin_dir)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def cluster(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """Kueue and our operator running, with a flavor, a ClusterQueue of 4 CPUs and a LocalQueue."""
    cluster = real_cluster(plane, NAMESPACE)
    directory = tmp_path_factory.mktemp("kueue-run")
    for user in (KUEUE_USER, OPERATOR_USER):
        cluster.add_user(user, ["system:serviceaccounts"])
        cluster.grant(user)
    with contextlib.ExitStack() as running:
        kueue = addons.start_kueue(
            plane, cluster.write_kubeconfig(directory / "kueue.kubeconfig", user=KUEUE_USER), directory
        )
        running.callback(kueue.stop)
        ours = EmbeddedOperator(
            cluster.write_kubeconfig(directory / "ours.kubeconfig", user=OPERATOR_USER),
            Configuration(),
            [NAMESPACE],
            webhooks=True,
        )
        running.enter_context(ours)
        for obj in (
            {
                "apiVersion": KUEUE,
                "kind": "ResourceFlavor",
                "metadata": {"name": "one-node"},
                "spec": {"nodeLabels": {"kubernetes.io/hostname": FLAVOR_NODE}, "tolerations": [TOLERATION]},
            },
            {
                "apiVersion": KUEUE,
                "kind": "ClusterQueue",
                "metadata": {"name": "cq"},
                "spec": {
                    "namespaceSelector": {},
                    "preemption": {"withinClusterQueue": "LowerPriority"},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory"],
                            "flavors": [
                                {
                                    "name": "one-node",
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "4"},
                                        {"name": "memory", "nominalQuota": "16Gi"},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
            {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": "low"}, "value": 10},
            {
                "apiVersion": KUEUE,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": "high"},
                "value": 1000,
            },
        ):
            cluster.create(obj)
        cluster.create(
            {
                "apiVersion": KUEUE,
                "kind": "LocalQueue",
                "metadata": {"name": "lq"},
                "spec": {"clusterQueue": "cq"},
            }
        )
        yield cluster


@pytest.fixture(autouse=True)
def cleanup(cluster: RealCluster) -> Iterator[None]:
    """Each test's TrainJobs deleted after it, and their Workloads gone, whatever the outcome:
    the next test needs the queue's quota."""
    yield
    for tj in cluster.list(TJ, "TrainJob"):
        cluster.delete(TJ, "TrainJob", tj["metadata"]["name"])
    wait_for(lambda: not cluster.list(KUEUE, "Workload"), "every Workload gone", timeout=60)


def trainjob(
    name: str,
    runtime: str = "torch-distributed",
    *,
    cpu: str = "1",
    run: str = "2",
    priority: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    labels = {QUEUE_LABEL: "lq"}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
    return {
        "apiVersion": TJ,
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {
                "numNodes": 2,
                "env": [{"name": "SANDBOX_RUN_SECONDS", "value": run}],
                "resourcesPerNode": {"requests": {"cpu": cpu, "memory": "1Gi"}},
            },
            **spec,
        },
    }


def jobset_or_none(cluster: RealCluster, name: str) -> dict[str, Any] | None:
    """The JobSet, or None while ours has not made it (Kueue may admit before our first reconcile)."""
    return next(
        (js for js in cluster.list("jobset.x-k8s.io/v1alpha2", "JobSet") if js["metadata"]["name"] == name),
        None,
    )


def kueue_patch(trainjob: dict[str, Any]) -> list[Any]:
    """The replicated jobs of the runtime patch Kueue writes on a TrainJob it admits."""
    for patch in trainjob["spec"].get("runtimePatches") or []:
        if patch.get("manager") == "kueue.x-k8s.io/manager":
            spec = (patch.get("trainingRuntimeSpec") or {}).get("template", {}).get("spec") or {}
            return list(spec.get("replicatedJobs") or [])
    return []


def condition(cluster: RealCluster, name: str, kind: str) -> bool:
    conditions = (cluster.get(TJ, "TrainJob", name).get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def workload(cluster: RealCluster, trainjob: str) -> dict[str, Any] | None:
    for wl in cluster.list(KUEUE, "Workload"):
        if any(ref["name"] == trainjob for ref in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def workload_condition(wl: dict[str, Any] | None, kind: str) -> bool:
    conditions = ((wl or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def pods_of(cluster: RealCluster, jobset: str) -> list[dict[str, Any]]:
    return [
        p
        for p in cluster.list("v1", "Pod")
        if p["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/jobset-name") == jobset
        and not p["metadata"].get("deletionTimestamp")
    ]


def pod_sets(wl: dict[str, Any]) -> dict[str, tuple[int, list[Any]]]:
    """A Workload's PodSets: each one's count and its containers' requests."""
    return {
        ps["name"]: (
            ps["count"],
            [c.get("resources", {}).get("requests") for c in ps["template"]["spec"]["containers"]],
        )
        for ps in wl["spec"]["podSets"]
    }


def jobset_pod_sets(jobset: dict[str, Any]) -> dict[str, tuple[int, list[Any]]]:
    """The same, of the JobSet our operator made: replicas times parallelism, and the requests."""
    out = {}
    for rjob in jobset["spec"]["replicatedJobs"]:
        spec = rjob["template"]["spec"]
        count = rjob.get("replicas", 1) * spec.get("parallelism", 1)
        requests = [c.get("resources", {}).get("requests") for c in spec["template"]["spec"]["containers"]]
        out[rjob["name"]] = (count, requests)
    return out


def admitted_and_completed(cluster: RealCluster, name: str) -> dict[str, Any]:
    """Wait for Kueue to admit ``name`` and for it to complete; its Workload then."""
    wait_for(lambda: workload_condition(workload(cluster, name), "Admitted"), f"{name} admitted")
    wait_for(lambda: condition(cluster, name, "Complete"), f"{name} complete", timeout=120)
    return wait_for(
        lambda: (wl := workload(cluster, name)) and workload_condition(wl, "Finished") and wl,
        f"{name}'s Workload finished",
    )


@pytest.mark.parametrize(
    "runtime, expected",
    [("torch-distributed", {"node": 2}), ("deepspeed-distributed", {"node": 1, "launcher": 1})],
)
def test_a_queued_trainjob_waits_suspended_then_runs_the_pods_kueue_counted(
    cluster: RealCluster, runtime: str, expected: dict[str, int]
) -> None:
    name = f"counted-{runtime.split('-')[0]}"
    made = cluster.create(trainjob(name, runtime))
    assert made["spec"]["suspend"] is True, "Kueue's webhook suspends a queued TrainJob at creation"
    wl = wait_for(lambda: workload(cluster, name), "its Workload")
    assert {k: v[0] for k, v in pod_sets(wl).items()} == expected
    wait_for(lambda: workload_condition(workload(cluster, name), "Admitted"), f"{name} admitted")
    jobset = wait_for(
        lambda: (js := jobset_or_none(cluster, name)) and not js["spec"].get("suspend") and js,
        "the JobSet unsuspended",
    )
    # What Kueue counted is what our JobSet runs: pods per replicated job, and their requests.
    assert jobset_pod_sets(jobset) == pod_sets(wl)
    pods = wait_for(
        lambda: (ps := pods_of(cluster, name)) and len(ps) == sum(expected.values()) and ps, "the pods"
    )
    # The flavor's node labels reached every pod, through Kueue's runtime patch.
    for pod in pods:
        assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == FLAVOR_NODE
        assert TOLERATION in pod["spec"]["tolerations"]
    # ... which it wrote on the TrainJob, one replicated job each, under its own manager's name.
    patch = kueue_patch(cluster.get(TJ, "TrainJob", name))
    assert {r["name"] for r in patch} == set(expected)
    assert all(
        r["template"]["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": FLAVOR_NODE}
        for r in patch
    )
    wait_for(
        lambda: all(p["spec"].get("nodeName") == FLAVOR_NODE for p in pods_of(cluster, name)),
        "pods on the flavor's node",
    )
    admitted_and_completed(cluster, name)


def test_a_second_trainjob_waits_for_quota_then_runs(cluster: RealCluster) -> None:
    cluster.create(trainjob("first", cpu="2", run="6"))  # 2 nodes x 2 CPUs: the whole queue
    wait_for(lambda: workload_condition(workload(cluster, "first"), "Admitted"), "first admitted")
    cluster.create(trainjob("second", cpu="2"))
    wait_for(lambda: workload(cluster, "second"), "second's Workload")
    time.sleep(2)
    assert not workload_condition(workload(cluster, "second"), "QuotaReserved")
    assert cluster.get(TJ, "TrainJob", "second")["spec"]["suspend"] is True
    assert pods_of(cluster, "second") == []
    # Ours holds it: its JobSet made suspended, and the TrainJob says it is.
    assert cluster.get("jobset.x-k8s.io/v1alpha2", "JobSet", "second")["spec"]["suspend"] is True
    assert condition(cluster, "second", "Suspended")
    admitted_and_completed(cluster, "first")
    admitted_and_completed(cluster, "second")


def test_a_trainjob_queued_with_a_ttl_is_deleted_after_it_finishes(cluster: RealCluster) -> None:
    """Kueue admits it by an update built from upstream's types, which have no TTL field."""
    cluster.create(trainjob("ttl", ttlSecondsAfterFinished=3))
    wait_for(lambda: workload_condition(workload(cluster, "ttl"), "Admitted"), "ttl admitted")
    # Kueue marks its Workload admitted, then unsuspends the TrainJob in an update of its own.
    kept = wait_for(
        lambda: (found := cluster.get(TJ, "TrainJob", "ttl"))["spec"]["suspend"] is False and found,
        "ttl unsuspended by Kueue",
    )
    assert kept["spec"]["ttlSecondsAfterFinished"] == 3
    updates = [
        r
        for r in cluster.audit_since(cluster.start_mark)
        if r.user == KUEUE_USER and r.verb == "update" and r.name == "ttl" and not r.subresource
    ]
    assert updates, "Kueue admitted it with a full update"

    def gone() -> bool:
        return not any(t["metadata"]["name"] == "ttl" for t in cluster.list(TJ, "TrainJob"))

    wait_for(gone, "the TrainJob deleted once its TTL ran out", timeout=120)


def test_a_preempted_trainjob_suspends_and_resumes_on_the_same_jobset(cluster: RealCluster) -> None:
    cluster.create(trainjob("low", cpu="2", run="-1", priority="low"))  # runs until preempted
    wait_for(
        lambda: (
            len([p for p in pods_of(cluster, "low") if p.get("status", {}).get("phase") == "Running"]) == 2
        ),
        "low's pods running",
    )
    jobset_uid = cluster.get("jobset.x-k8s.io/v1alpha2", "JobSet", "low")["metadata"]["uid"]
    cluster.create(trainjob("high", cpu="2", run="3", priority="high"))
    wait_for(lambda: cluster.get(TJ, "TrainJob", "low")["spec"]["suspend"] is True, "low suspended by Kueue")
    wait_for(lambda: not kueue_patch(cluster.get(TJ, "TrainJob", "low")), "Kueue's runtime patch emptied")
    wait_for(
        lambda: cluster.get("jobset.x-k8s.io/v1alpha2", "JobSet", "low")["spec"].get("suspend") is True,
        "low's JobSet suspended",
    )
    wait_for(lambda: pods_of(cluster, "low") == [], "low's pods gone")
    admitted_and_completed(cluster, "high")
    # Quota is free again: Kueue admits low once more, and it runs on the JobSet it had.
    wait_for(
        lambda: cluster.get(TJ, "TrainJob", "low")["spec"]["suspend"] is False, "low resumed", timeout=120
    )
    wait_for(
        lambda: (
            len([p for p in pods_of(cluster, "low") if p.get("status", {}).get("phase") == "Running"]) == 2
        ),
        "low's pods running again",
    )
    assert cluster.get("jobset.x-k8s.io/v1alpha2", "JobSet", "low")["metadata"]["uid"] == jobset_uid


@pytest.mark.parametrize(
    "runtime_resources, per_node",
    [
        ({"requests": {"memory": "2Gi"}}, {"requests": {"cpu": "1"}}),
        ({"limits": {"memory": "2Gi"}}, {"requests": {"cpu": "1"}}),
        ({"requests": {"memory": "2Gi"}}, {"limits": {"cpu": "1"}}),
    ],
    ids=["requests-and-requests", "limits-and-requests", "requests-and-limits"],
)
def test_kueue_counts_a_runtimes_own_resources_as_our_pods_request_them(
    cluster: RealCluster,
    runtime_resources: dict[str, Any],
    per_node: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    """Resources the runtime's container sets, merged with the TrainJob's resourcesPerNode: what
    Kueue counts against the quota is what our pods request (docs/kueue.md, "Resources")."""
    name = "merged-" + str(request.node.callspec.id)
    spec = cluster.get(TJ, "ClusterTrainingRuntime", "torch-distributed", namespace="")["spec"]
    pod = spec["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["resources"] = runtime_resources
    cluster.create({"apiVersion": TJ, "kind": "TrainingRuntime", "metadata": {"name": name}, "spec": spec})
    job = trainjob(name, run="1", runtimeRef={"name": name, "kind": "TrainingRuntime"})
    job["spec"]["trainer"]["resourcesPerNode"] = per_node
    cluster.create(job)
    wait_for(lambda: workload_condition(workload(cluster, name), "Admitted"), f"{name} admitted")
    counted = workload(cluster, name) or {}
    ours = cluster.get("jobset.x-k8s.io/v1alpha2", "JobSet", name)
    assert jobset_pod_sets(ours) == pod_sets(counted)
    limits = [
        c.get("resources", {}).get("limits")
        for c in ours["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    ]
    assert limits == [
        c.get("resources", {}).get("limits")
        for c in counted["spec"]["podSets"][0]["template"]["spec"]["containers"]
    ]
    admitted_and_completed(cluster, name)
