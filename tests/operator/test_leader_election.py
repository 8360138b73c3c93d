"""Two replicas of the operator, one Lease: only the holder reconciles, and a SIGKILLed holder is
replaced within the lease duration plus the retry period after its last renewal, with no TrainJob
getting a second child or losing its status (controller/leader.py).

Each replica is a ``trainer run`` process (``trainer_sandbox.operator_process``), so the kill is
a real one: nothing released, requests cut. The replicas run as two ServiceAccounts, so the audit
log tells their requests apart (in a cluster both would be the chart's one ServiceAccount). The
durations are short (lease 4 s, renew deadline 3 s, retry 2 s -> 1 s) to keep the test short.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from operator_helpers import TJ, conditions, get_or_none, trainjob, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.operator_process import OperatorProcess

pytestmark = pytest.mark.timeout(240)

JS = "jobset.x-k8s.io/v1alpha2"
LEASE_API = "coordination.k8s.io/v1"
LEASE = "trainer.kubeflow.org"
LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 4.0, 3.0, 1.0
# Request latency and the clock's granularity between a renewal's renewTime and the take-over's
# acquireTime (both written by processes on this machine, from one clock).
SLACK = 0.5


def run(seconds: int) -> list[dict[str, str]]:
    return [{"name": "SANDBOX_RUN_SECONDS", "value": str(seconds)}]


def replica(cluster: Cluster, workdir: Path, name: str, **config: Any) -> OperatorProcess:
    user = f"system:serviceaccount:{cluster.namespace}:trainer-{name}"
    election = {
        "leaderElect": True,
        "resourceName": LEASE,
        "resourceNamespace": cluster.namespace,
        "leaseDuration": f"{LEASE_SECONDS:g}s",
        "renewDeadline": f"{RENEW_SECONDS:g}s",
        "retryPeriod": f"{RETRY_SECONDS:g}s",
    }
    process = OperatorProcess(
        cluster,
        workdir / name,
        user=user,
        config={"leaderElection": election, **config},
        namespaces=[cluster.namespace],
    )
    cluster.grant(user)
    return process


def lease_spec(cluster: Cluster) -> dict[str, Any]:
    spec: dict[str, Any] = cluster.get(LEASE_API, "Lease", LEASE)["spec"]
    return spec


def micro_time(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def test_a_killed_leader_is_replaced_within_the_lease_and_nothing_is_done_twice(
    cluster: Cluster, tmp_path: Path
) -> None:
    a, b = replica(cluster, tmp_path, "a"), replica(cluster, tmp_path, "b")
    mark = cluster.audit_mark()
    try:
        a.start()
        b.start()
        leaders = wait_for(
            lambda: (
                [p for p in (a, b) if p.leads()] if a.leads() is not None and b.leads() is not None else []
            ),
            timeout=30,
            what="a leader",
        )
        assert len(leaders) == 1, "exactly one replica leads"
        leader = leaders[0]
        follower = b if leader is a else a
        assert follower.leads() is False

        # TrainJobs that complete, that keep running, and MPI ones (an SSH Secret each).
        names = {"done-1": 1, "done-2": 1, "running-1": -1, "running-2": -1}
        for name, seconds in names.items():
            cluster.create(trainjob(name, trainer={"numNodes": 2, "env": run(seconds)}))
        mpi = ("mpi-1", "mpi-2")
        for name in mpi:
            cluster.create(
                trainjob(name, runtime="deepspeed-distributed", trainer={"numNodes": 2, "env": run(-1)})
            )
        for name in [*names, *mpi]:
            wait_for(
                lambda name=name: get_or_none(cluster, JS, "JobSet", name), timeout=60, what=f"JobSet {name}"
            )
        for name in mpi:
            wait_for(
                lambda name=name: get_or_none(cluster, "v1", "Secret", f"{name}-mpi-ssh-auth"),
                what=f"the SSH Secret of {name}",
            )
        for name in ("done-1", "done-2"):
            wait_for(
                lambda name=name: conditions(cluster, name).get("Complete", ("",))[0] == "True",
                timeout=90,
                what=f"{name} Complete",
            )
        status_before = {n: conditions(cluster, n) for n in [*names, *mpi]}
        keys_before = {
            n: cluster.get("v1", "Secret", f"{n}-mpi-ssh-auth")["data"]["ssh-publickey"] for n in mpi
        }

        # Only the leader reconciled: the follower wrote nothing at all, not even an Event.
        before = cluster.audit_since(mark)
        follower_writes = [
            f"{r.verb} {r.resource}{'/' + r.subresource if r.subresource else ''} {r.name}"
            for r in before
            if r.user == follower.user and r.mutated
        ]
        assert follower_writes == [], f"the follower wrote while another replica led: {follower_writes}"
        assert any(r.user == leader.user and r.mutated and r.resource == "jobsets" for r in before)

        # SIGKILL the leader: the Lease is not released; it has to expire.
        killed_at = time.monotonic()
        leader.kill()
        last = lease_spec(cluster)
        assert last["holderIdentity"], "the killed leader's Lease is still held"
        taken = wait_for(
            lambda: (spec := lease_spec(cluster))["holderIdentity"] != last["holderIdentity"] and spec,
            timeout=LEASE_SECONDS + RETRY_SECONDS + 10,
            interval=0.05,
            what="another replica to take the Lease",
        )
        waited = time.monotonic() - killed_at
        gap = micro_time(taken["acquireTime"]) - micro_time(last["renewTime"])
        print(f"take-over {gap:.2f}s after the last renewal, {waited:.2f}s after the kill")
        assert gap <= LEASE_SECONDS + RETRY_SECONDS + SLACK, (
            f"taken over {gap:.2f}s after the last renewal (lease {LEASE_SECONDS:g}s, retry {RETRY_SECONDS:g}s)"
        )
        assert gap >= LEASE_SECONDS - SLACK, (
            f"taken over {gap:.2f}s after the last renewal: before it expired"
        )
        assert waited <= LEASE_SECONDS + RETRY_SECONDS + 2 * SLACK
        assert taken["leaseTransitions"] == int(last.get("leaseTransitions") or 0) + 1
        wait_for(lambda: follower.leads(), what="the survivor's metrics to say it leads")

        # The new leader reconciles: new TrainJobs get their children, old ones their status.
        cluster.create(trainjob("after", trainer={"numNodes": 2, "env": run(1)}))
        cluster.create(
            trainjob("mpi-after", runtime="deepspeed-distributed", trainer={"numNodes": 2, "env": run(1)})
        )
        for name in ("after", "mpi-after"):
            wait_for(
                lambda name=name: conditions(cluster, name).get("Complete", ("",))[0] == "True",
                timeout=90,
                what=f"{name} Complete under the new leader",
            )

        # No status lost: every condition a TrainJob had, it still has, as it was.
        for name, had in status_before.items():
            now = conditions(cluster, name)
            for type_, value in had.items():
                if type_ != "ReconcileFailed":
                    assert now.get(type_) == value, (name, type_, had, now)

        # No duplicate children: one JobSet per TrainJob, one SSH Secret per MPI TrainJob, made once.
        trainjobs = {tj["metadata"]["uid"]: tj["metadata"]["name"] for tj in cluster.list(TJ, "TrainJob")}
        owners = Counter(
            trainjobs.get(ref["uid"], "?")
            for js in cluster.list(JS, "JobSet")
            for ref in js["metadata"].get("ownerReferences") or []
            if ref.get("kind") == "TrainJob"
        )
        assert owners == Counter(trainjobs.values()), owners
        secrets = sorted(
            s["metadata"]["name"]
            for s in cluster.list("v1", "Secret")
            if s["metadata"]["name"].endswith("-ssh-auth")
        )
        assert secrets == sorted(f"{n}-mpi-ssh-auth" for n in (*mpi, "mpi-after"))
        for name in mpi:
            assert (
                cluster.get("v1", "Secret", f"{name}-mpi-ssh-auth")["data"]["ssh-publickey"]
                == keys_before[name]
            )
        records = cluster.audit_since(mark)
        operators = {a.user, b.user}
        secret_writes = Counter(
            (r.verb, r.name) for r in records if r.user in operators and r.resource == "secrets" and r.mutated
        )
        assert secret_writes == Counter({("create", f"{n}-mpi-ssh-auth"): 1 for n in (*mpi, "mpi-after")})
        jobset_creates = Counter(
            r.name
            for r in records
            if r.user in operators
            and r.resource == "jobsets"
            and r.mutated
            and r.verb in ("create", "patch")
            and r.status == 201
        )
        assert all(count == 1 for count in jobset_creates.values()), jobset_creates
        assert any(r.user == follower.user and r.mutated and r.resource == "jobsets" for r in records)
    finally:
        for process in (a, b):
            process.stop()
        print(f"--- replica a ---\n{a.log_tail()}\n--- replica b ---\n{b.log_tail()}")


def test_a_stopped_leader_releases_the_lease_and_hands_over_without_overlap(
    cluster: Cluster, tmp_path: Path
) -> None:
    """What a rolling upgrade does: SIGTERM the leader; it stops its workers, then releases the
    Lease, and the other replica takes over within a retry period instead of a lease duration."""
    a, b = replica(cluster, tmp_path, "a"), replica(cluster, tmp_path, "b")
    try:
        a.start()
        b.start()
        wait_for(lambda: a.leads() and b.leads() is False, timeout=30, what="replica a to lead")
        cluster.create(trainjob("before", trainer={"numNodes": 1, "env": run(-1)}))
        wait_for(lambda: get_or_none(cluster, JS, "JobSet", "before"), timeout=60, what="JobSet before")
        held = lease_spec(cluster)
        mark = cluster.audit_mark()
        a.stop()
        assert a.proc is not None and a.proc.returncode == 0, a.log_tail()
        stopped = time.monotonic()
        released_or_taken = lease_spec(cluster)
        assert released_or_taken["holderIdentity"] != held["holderIdentity"], "released before it exited"
        taken = wait_for(
            lambda: (
                (spec := lease_spec(cluster))["holderIdentity"] not in ("", held["holderIdentity"]) and spec
            ),
            timeout=LEASE_SECONDS,
            interval=0.05,
            what="replica b to take the released Lease",
        )
        assert time.monotonic() - stopped <= RETRY_SECONDS + SLACK, "taken within a retry period, not a lease"
        assert taken["leaseTransitions"] == int(held.get("leaseTransitions") or 0) + 1
        cluster.create(trainjob("after", trainer={"numNodes": 1, "env": run(1)}))
        wait_for(
            lambda: conditions(cluster, "after").get("Complete", ("",))[0] == "True",
            timeout=90,
            what="a TrainJob reconciled by the new leader",
        )
        # No overlap: every write of the old leader comes before the first of the new one.
        records = cluster.audit_since(mark)
        writes = [(i, r.user) for i, r in enumerate(records) if r.mutated and r.user in (a.user, b.user)]
        last_a = max((i for i, user in writes if user == a.user), default=-1)
        first_b = min((i for i, user in writes if user == b.user), default=len(records))
        assert last_a < first_b, [(records[i].verb, records[i].resource, user) for i, user in writes]
    finally:
        for process in (a, b):
            process.stop()


@pytest.mark.standin_only("fault injection: the leader's Lease requests fail while its other requests pass")
def test_a_leader_cut_off_from_its_lease_stops_writing_before_another_starts(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A partition between the leader and its Lease alone: it still watches and could still write
    children, so only the fence stops it. It must stop within the renew deadline of its last
    renewal, before the Lease can expire for anyone else, and then follow."""
    from trainer_sandbox.apiserver import LocalAPIServer

    assert isinstance(cluster, LocalAPIServer)
    a, b = replica(cluster, tmp_path, "a"), replica(cluster, tmp_path, "b")
    try:
        a.start()
        b.start()
        wait_for(lambda: a.leads() and b.leads() is False, timeout=30, what="replica a to lead")
        mark = cluster.audit_mark()
        cut = cluster.faults.add("500", users=[a.user], resources=["leases"])
        # TrainJobs arrive all along: each is reconciled by whoever leads at that moment.
        names = [f"tj-{i}" for i in range(14)]
        for name in names:
            cluster.create(trainjob(name, trainer={"numNodes": 1, "env": run(-1)}))
            time.sleep(0.5)
        wait_for(lambda: b.leads(), timeout=LEASE_SECONDS + RETRY_SECONDS + 5, what="replica b to lead")
        assert a.leads() is False
        for name in names:
            wait_for(
                lambda name=name: get_or_none(cluster, JS, "JobSet", name), timeout=30, what=f"JobSet {name}"
            )
        records = cluster.audit_since(mark)
        writes = [(i, r) for i, r in enumerate(records) if r.mutated and r.user in (a.user, b.user)]
        last_a = max(i for i, r in writes if r.user == a.user and r.resource != "leases")
        first_b = min(i for i, r in writes if r.user == b.user)
        assert last_a < first_b, "the cut-off leader wrote after the new one had started"
        assert any(r.user == a.user and r.resource == "jobsets" for _, r in writes), "a led at first"
        assert any(r.user == b.user and r.resource == "jobsets" for _, r in writes), "b took over"
        # Back in reach, a follows: b renews, so a never takes the Lease again.
        cluster.faults.rules.remove(cut)
        time.sleep(LEASE_SECONDS + RETRY_SECONDS)
        assert a.leads() is False and b.leads() is True
        assert not [r for r in cluster.audit_since(mark)[len(records) :] if r.user == a.user and r.mutated]
    finally:
        for process in (a, b):
            process.stop()


def test_a_deposed_leader_sends_nothing_it_had_queued(cluster: Cluster, tmp_path: Path) -> None:
    """A leader with writes and Events queued behind a small client budget loses its Lease (here an
    administrator hands it to someone else). Once it has stopped leading, none of what it had
    queued goes out: each attempt passes the fence as it goes on the wire, and the Event recorder
    stops, dropping its queue. Before, a request that had passed the fence and then waited for the
    budget (or a retry) went out after leadership ended, and queued Events kept being posted."""
    a = replica(cluster, tmp_path, "a", clientConnection={"qps": 1, "burst": 1})
    try:
        a.start()
        wait_for(lambda: a.leads(), timeout=30, what="replica a to lead")
        for i in range(10):
            cluster.create(trainjob(f"queued-{i}", trainer={"numNodes": 1, "env": run(-1)}))
        wait_for(lambda: get_or_none(cluster, JS, "JobSet", "queued-0"), timeout=30, what="the first JobSet")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        usurped = {
            "holderIdentity": "usurper",
            "renewTime": now,
            "acquireTime": now,
            "leaseDurationSeconds": 3600,
        }
        cluster.patch(LEASE_API, "Lease", LEASE, {"spec": usurped})
        wait_for(
            lambda: a.leads() is False, timeout=RETRY_SECONDS + 5, interval=0.05, what="a to stop leading"
        )
        mark = cluster.audit_mark()
        time.sleep(3 * RETRY_SECONDS + 1)  # a budget of 1 request a second: queued writes would show
        late = [
            (r.verb, r.resource)
            for r in cluster.audit_since(mark)
            if r.user == a.user and r.mutated and r.resource != "leases"
        ]
        assert late == [], f"writes after leadership ended: {late}"
        assert a.leads() is False
    finally:
        a.stop()
