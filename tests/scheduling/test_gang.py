"""Gang scheduling by kube-scheduler v1.36 itself: the Workload source of podGroupPolicy on the real
control plane, with kwok's four nodes (64 CPUs each) and pods of 40 CPUs, so that one node takes
one pod and one TrainJob of three nodes fits at a time.

What must hold: of two such TrainJobs, neither holds part of its nodes while the rest of its pods
wait (without the gang, the scheduler gives the second one the fourth node while the first runs,
which the control case shows); the second starts as the first ends; a gang that can never fit
fails its TrainJob after ``scheduleTimeoutSeconds``; a gang resized while suspended is made again;
the operator, holding only the chart's rights, uses each it is granted for the gang's kinds.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import real_cluster, wait_for
from render_helpers import replicated_job, runtime
from trainer_sandbox.backends import RealCluster
from trainer_sandbox.cluster import ControlPlane
from trainer_sandbox.embedded_operator import EmbeddedOperator
from trainer_sandbox.operator_process import OPERATOR_USER

from trainer.controller.config import Configuration

TJ = "trainer.kubeflow.org/v1alpha1"
V1ALPHA2 = "scheduling.k8s.io/v1alpha2"
NAMESPACE = "gangs"
NODES = 3  # of the four kwok nodes: two gangs never fit at once
CPU = "40"  # of a node's 64: one pod a node


@pytest.fixture(scope="module")
def plane(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane.start(tmp_path_factory.mktemp("gang"), bin_dir=bin_dir, gang=True)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def gangs(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """Our operator on the gang-enabled plane, and three runtimes: a gang without a schedule
    timeout, one with 10 s, and one without podGroupPolicy."""
    cluster = real_cluster(plane, NAMESPACE)
    directory = tmp_path_factory.mktemp("gang-run")
    cluster.add_user(OPERATOR_USER, ["system:serviceaccounts"])
    # Exactly the chart's rights (charts/tools/sync_chart.py writes them from the plugins' kinds):
    # the real authorizer checks each call, and test_the_operator_used_each_right_the_chart_grants
    # sees each of the gang's used.
    role = chart_manager_role()
    cluster.create({**role, "metadata": {"name": "gang-operator"}})
    cluster.grant(OPERATOR_USER, "gang-operator")
    runtimes: tuple[tuple[str, dict[str, Any] | None], ...] = (
        ("torch-gang", {"workload": {}}),  # waits as long as it takes: a queue of gangs
        ("torch-gang-10s", {"workload": {"scheduleTimeoutSeconds": 10}}),
        ("torch-loose", None),
    )
    for name, policy in runtimes:
        node = replicated_job("node", "trainer", [{"name": "node", "image": "trainer"}])
        obj = runtime(name, ml_policy={"numNodes": 1, "torch": {}}, jobs=[node])
        obj["metadata"]["labels"] = {"trainer.kubeflow.org/framework": "torch"}
        if policy is not None:
            obj["spec"]["podGroupPolicy"] = policy
        cluster.create(obj)
    with contextlib.ExitStack() as running:
        ours = EmbeddedOperator(
            cluster.write_kubeconfig(directory / "ours.kubeconfig", user=OPERATOR_USER),
            Configuration(),
            [NAMESPACE],
        )
        running.enter_context(ours)
        yield cluster


def chart_manager_role() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    for folder in (root / "tests" / "chart", root / "charts" / "tools"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    import chart_harness as h

    role: dict[str, Any] = h.one(h.render(), "ClusterRole", "kubeflow-trainer-controller-manager")
    return role


@pytest.fixture(autouse=True)
def cleanup(gangs: RealCluster) -> Iterator[None]:
    """Each test's TrainJobs and their pods gone after it: the next one needs the nodes."""
    yield
    for tj in gangs.list(TJ, "TrainJob"):
        gangs.delete(TJ, "TrainJob", tj["metadata"]["name"])
    wait_for(lambda: not gangs.list("v1", "Pod"), "every pod gone", timeout=120)


def trainjob(name: str, runtime: str, *, nodes: int = NODES, run: str = "8") -> dict[str, Any]:
    return {
        "apiVersion": TJ,
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {
                "numNodes": nodes,
                "env": [{"name": "SANDBOX_RUN_SECONDS", "value": run}],
                "resourcesPerNode": {"requests": {"cpu": CPU, "memory": "1Gi"}},
            },
        },
    }


Held = dict[str, tuple[int, int]]  # TrainJob -> (pods holding a node, pods waiting for one)


def held(cluster: RealCluster) -> Held:
    """Per TrainJob, its unfinished pods that hold a node and those still waiting for one (one
    consistent LIST)."""
    found: Held = {}
    for pod in cluster.list("v1", "Pod"):
        owner = pod["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/jobset-name")
        if not owner or pod["status"].get("phase") not in ("Pending", "Running"):
            continue
        bound, waiting = found.get(owner, (0, 0))
        found[owner] = (bound + 1, waiting) if pod["spec"].get("nodeName") else (bound, waiting + 1)
    return found


def finished(cluster: RealCluster, name: str, kind: str = "Complete") -> dict[str, Any] | None:
    conditions = (cluster.get(TJ, "TrainJob", name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind and c["status"] == "True"), None)


def watch_two(cluster: RealCluster, names: tuple[str, str], timeout: float = 150) -> list[tuple[float, Held]]:
    """What the two TrainJobs hold, looked at every 0.2 s until both complete."""
    seen: list[tuple[float, Held]] = []
    deadline = time.monotonic() + timeout
    while not all(finished(cluster, n) for n in names):
        assert time.monotonic() < deadline, f"timed out waiting for both to complete; last: {seen[-1:]}"
        seen.append((time.monotonic(), held(cluster)))
        time.sleep(0.2)
    return seen


def longest_partial(seen: list[tuple[float, Held]], name: str) -> float:
    """The longest time ``name`` held some nodes while others of its pods waited for one."""
    longest, since = 0.0, None
    for at, found in seen:
        bound, waiting = found.get(name, (0, 0))
        if bound and waiting:
            since = at if since is None else since
            longest = max(longest, at - since)
        else:
            since = None
    return longest


def test_two_gangs_that_cannot_fit_together_run_one_after_the_other_never_in_part(gangs: RealCluster) -> None:
    gangs.create(trainjob("first", "torch-gang"))
    gangs.create(trainjob("second", "torch-gang"))
    group = wait_for(
        lambda: next((g for g in gangs.list(V1ALPHA2, "PodGroup") if g["metadata"]["name"] == "first"), None),
        "the first TrainJob's PodGroup",
    )
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": NODES}}
    seen = watch_two(gangs, ("first", "second"))
    for name in ("first", "second"):
        # Binding a placed gang is one request per pod: a listing may fall between two of them.
        assert longest_partial(seen, name) < 2.0, f"{name} held part of its nodes while the rest waited"
    order = [name for _, found in seen for name, (bound, _) in found.items() if bound]
    runs_first = order[0]
    runs_second = "second" if runs_first == "first" else "first"
    _, at_start = next((at, found) for at, found in seen if found.get(runs_second, (0, 0))[0])
    # Two of four nodes freed by the first's finished pods, and the one it never had, fit the
    # second: it may start while the first's last pod runs, never beside all of it.
    assert at_start.get(runs_first, (0, 0))[0] < NODES, (
        f"the second started beside the whole first: {at_start}"
    )
    scheduled = next(
        c
        for c in gangs.get(V1ALPHA2, "PodGroup", runs_second)["status"]["conditions"]
        if c["type"] == "PodGroupScheduled"
    )
    assert scheduled["status"] == "True"


def test_without_the_gang_the_second_holds_the_node_left_over_while_its_others_wait(
    gangs: RealCluster,
) -> None:
    """The control case: the same two TrainJobs on the runtime without podGroupPolicy."""
    gangs.create(trainjob("first", "torch-loose"))
    gangs.create(trainjob("second", "torch-loose"))
    seen = watch_two(gangs, ("first", "second"), timeout=240)
    partial = max(longest_partial(seen, name) for name in ("first", "second"))
    assert partial > 4.0, (
        f"the default scheduler places pods one by one; longest partial hold {partial:.1f} s"
    )


def test_a_gang_that_can_never_fit_fails_after_its_schedule_timeout(gangs: RealCluster) -> None:
    started = time.monotonic()
    gangs.create(trainjob("too-big", "torch-gang-10s", nodes=5))
    seen: list[Held] = []

    def failed() -> dict[str, Any] | None:
        seen.append(held(gangs))
        return finished(gangs, "too-big", "Failed")

    condition = wait_for(failed, "the TrainJob Failed", timeout=90)
    # The clock starts when the scheduler first finds the gang unplaceable (whole seconds).
    assert time.monotonic() - started >= 9
    assert condition["reason"] == "GangScheduleTimeout"
    assert condition["message"].startswith(
        "the gang of 5 pods (PodGroup too-big) was not scheduled within scheduleTimeoutSeconds (10s)"
    ), condition["message"]
    assert not any(h.get("too-big", (0, 0))[0] for h in seen), "no pod of it ever held a node"
    wait_for(
        lambda: (
            not [
                j
                for j in gangs.list("jobset.x-k8s.io/v1alpha2", "JobSet")
                if j["metadata"]["name"] == "too-big"
            ]
        ),
        "its JobSet deleted",
    )


def pod_group(cluster: RealCluster, name: str) -> dict[str, Any] | None:
    return next((g for g in cluster.list(V1ALPHA2, "PodGroup") if g["metadata"]["name"] == name), None)


def placed_verdict(group: dict[str, Any] | None) -> bool:
    conditions = ((group or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "PodGroupScheduled" and c["status"] == "True" for c in conditions)


def test_a_gang_resized_while_suspended_is_made_again_and_placed_afresh_on_resume(gangs: RealCluster) -> None:
    """kube-scheduler never takes back a PodGroup's PodGroupScheduled, and neither a PodGroup's
    nor a Workload's spec can change: the operator makes both again while no pods run, so the
    resumed gang has its new size and is judged, and timed, afresh."""
    gangs.create(trainjob("paused", "torch-gang", run="-1"))

    def placed_group() -> dict[str, Any] | None:
        group = pod_group(gangs, "paused")
        return group if placed_verdict(group) else None

    first = wait_for(placed_group, "the gang placed")
    workload = gangs.get(V1ALPHA2, "Workload", "paused")
    gangs.patch(TJ, "TrainJob", "paused", {"spec": {"suspend": True}})
    wait_for(lambda: not held(gangs).get("paused"), "its pods gone", timeout=120)
    gangs.patch(TJ, "TrainJob", "paused", {"spec": {"trainer": {"numNodes": 2}}})

    def made_again() -> dict[str, Any] | None:
        group = pod_group(gangs, "paused")
        fresh = group is not None and group["metadata"]["uid"] != first["metadata"]["uid"]
        return group if fresh and group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}} else None

    again = wait_for(made_again, "the PodGroup made again, of the new size", timeout=120)
    assert not (again.get("status") or {}).get("conditions"), "no verdict carried over"
    assert gangs.get(V1ALPHA2, "Workload", "paused")["metadata"]["uid"] != workload["metadata"]["uid"]
    gangs.patch(TJ, "TrainJob", "paused", {"spec": {"suspend": False}})
    wait_for(placed_group, "the resumed gang placed", timeout=120)
    wait_for(lambda: held(gangs).get("paused") == (2, 0), "both nodes held", timeout=60)


def test_the_operator_used_each_right_the_chart_grants_for_the_gang(
    plane: ControlPlane, gangs: RealCluster
) -> None:
    """Runs after the others in this module: they made, watched and made again the gang's objects,
    as the operator's own user, with the chart's ClusterRole alone."""
    calls = [r for r in gangs.audit_since(0) if r.user == OPERATOR_USER]
    # kopf, given namespaces to serve, looks for them by listing namespaces, which the chart does
    # not grant (its operator serves the cluster); refused, kopf goes on with the names it was given.
    refused = [f"{r.verb} {r.resource}" for r in calls if r.status == 403 and r.resource != "namespaces"]
    assert not refused, f"the API server refused the operator: {refused}"
    used = {(r.resource, r.verb) for r in calls if r.group == "scheduling.k8s.io" and r.status < 400}
    for plural in ("workloads", "podgroups"):
        for verb in ("create", "delete", "list", "watch"):
            assert (plural, verb) in used, f"{verb} {plural} granted but never used"
