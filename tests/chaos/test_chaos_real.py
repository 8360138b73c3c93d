"""Chaos on the real control plane: two replicas, the leader SIGKILLed, links cut and paused.

Two ``trainer run`` processes elect a leader on a Lease (short durations, so a take-over costs
seconds). Each talks to kube-apiserver through a TCP proxy of its own (``trainer_sandbox.tcp_proxy``),
so the test can cut a replica's connections (its watches end mid-stream, its requests fail) or
hold them silent long enough that the leader's renewals stop and its fence closes. Meanwhile
TrainJobs of every kind arrive and run their course on kwok's pods: complete, fail, MPI (an SSH
Secret and a hostfile each), coscheduled (a PodGroup), suspended, deleted while running.

The actions are seeded (which, when, how long); thread timing is not, so a failure prints the
seed and both replicas' logs. What must hold is read from the server's own change stream (the test
watches every resource from one list's resourceVersion on; see chaos_checks.py), plus:

- every TrainJob converges to the state its inputs call for: none lost;
- one JobSet, ever, per TrainJob: no duplicate children;
- leadership moved at least once (the Lease's transitions, and JobSets created by both replicas);
- once the TrainJobs are deleted, the garbage collector leaves nothing of theirs.

The CI form runs 60 TrainJobs through 9 actions; ``pytest --chaos-long`` 240 through 30.
"""

from __future__ import annotations

import copy
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from chaos_checks import (
    CHILD_KEYS,
    JOBSETS,
    TRAINJOBS,
    History,
    Key,
    check_history,
    in_expected_state,
    looks_like_child,
    owner_uid,
)
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.backends import RealCluster
from trainer_sandbox.operator_process import OperatorProcess
from trainer_sandbox.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(1200)

Obj = dict[str, Any]
TJ = "trainer.kubeflow.org/v1alpha1"
JS = "jobset.x-k8s.io/v1alpha2"
LEASE_API = "coordination.k8s.io/v1"
LEASE = "trainer.kubeflow.org"
LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS = 4, 3, 1
PATHS: dict[Key, str] = {
    TRAINJOBS: "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs",
    JOBSETS: "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets",
    ("", "configmaps"): "/api/v1/namespaces/{ns}/configmaps",
    ("", "secrets"): "/api/v1/namespaces/{ns}/secrets",
    ("scheduling.x-k8s.io", "podgroups"): "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups",
}
SCENARIOS = ("complete", "complete", "fail", "mpi", "gang", "suspended", "deleted")


@dataclass(frozen=True)
class Form:
    trainjobs: int
    actions: int
    leader_kills: int
    run_seconds: int
    converge_timeout: float


SHORT = Form(trainjobs=60, actions=9, leader_kills=3, run_seconds=2, converge_timeout=300)
LONG = Form(trainjobs=240, actions=30, leader_kills=8, run_seconds=3, converge_timeout=900)


@pytest.fixture
def chaos_form(request: pytest.FixtureRequest) -> Form:
    return LONG if request.config.getoption("--chaos-long") else SHORT


# --- the server's change stream ------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """A watch event, in the shape chaos_checks reads (``old``: the object before, as we saw it)."""

    rv: int
    type: str
    key: Key
    obj: Obj
    old: Obj | None


class Recorder:
    """Watches each resource of a namespace from a list's resourceVersion on, resuming a closed
    stream where it ended, and hands every change to ``history``. A 410 (the server no longer has
    the events) would leave a hole: it is recorded and fails the test."""

    def __init__(self, cluster: RealCluster, history: History) -> None:
        self.cluster = cluster
        self.history = history
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.holes: list[str] = []
        self.threads: list[threading.Thread] = []
        self.latest: dict[tuple[Key, str], int] = {}  # the newest rv delivered, by object

    def start(self) -> None:
        for key, template in PATHS.items():
            path = template.format(ns=self.cluster.namespace)
            listing = self._list(path)
            rv = str(listing["metadata"]["resourceVersion"])
            for item in listing.get("items") or []:  # there before the test: no history of ours
                self.latest[(key, item["metadata"]["name"])] = int(item["metadata"]["resourceVersion"])
            thread = threading.Thread(target=self._watch, args=(key, path, rv), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _list(self, path: str) -> Obj:
        """A list; a resource whose watch cache is still filling (a fresh server) is asked again."""
        deadline = time.monotonic() + 30
        while True:
            try:
                listing: Obj = self.cluster.http.request("GET", path)
                return listing
            except APIError as exc:
                if exc.code not in (429, 503) or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(10)

    def caught_up(self) -> list[str]:
        """What a fresh list has that the streams have not delivered yet (each object at its
        current resourceVersion); empty once they are up to date."""
        behind = []
        for key, template in PATHS.items():
            for item in self._list(template.format(ns=self.cluster.namespace)).get("items") or []:
                meta = item["metadata"]
                with self.lock:
                    seen = self.latest.get((key, meta["name"]), 0)
                if seen < int(meta["resourceVersion"]):
                    behind.append(f"{key[1]} {meta['name']}")
        return behind

    def _watch(self, key: Key, path: str, rv: str) -> None:
        last: dict[str, Obj] = {}
        while not self.stopping.is_set():
            url = f"{self.cluster.server}{path}?watch=1&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=30"
            try:
                with urllib.request.urlopen(url, timeout=5, context=self.cluster._tls) as stream:
                    for line in stream:
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            self.holes.append(f"{key[1]}: {obj.get('code')} {obj.get('message')}")
                            return
                        rv = str(obj["metadata"]["resourceVersion"])
                        if event["type"] == "BOOKMARK":
                            continue
                        name = obj["metadata"]["name"]
                        seen = Seen(int(rv), event["type"], key, obj, last.get(name))
                        last[name] = obj
                        with self.lock:
                            self.history.listen(seen)
                            self.latest[(key, name)] = int(rv)
                        if self.stopping.is_set():
                            return
            except (TimeoutError, OSError, urllib.error.URLError):
                continue  # a quiet stream's read timed out, or it closed: resume from rv


# --- the replicas --------------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    process: OperatorProcess
    proxy: TcpProxy

    def leads(self) -> bool | None:
        return self.process.leads()


def replica(cluster: RealCluster, workdir: Path, name: str) -> Replica:
    user = f"system:serviceaccount:{cluster.namespace}:trainer-{name}"
    election = {
        "leaderElect": True,
        "resourceName": LEASE,
        "resourceNamespace": cluster.namespace,
        "leaseDuration": f"{LEASE_SECONDS}s",
        "renewDeadline": f"{RENEW_SECONDS}s",
        "retryPeriod": f"{RETRY_SECONDS}s",
    }
    process = OperatorProcess(
        cluster,
        workdir / name,
        user=user,
        qps=100,
        burst=200,
        config={"leaderElection": election},
        namespaces=[cluster.namespace],
    )
    cluster.grant(user)
    config = yaml.safe_load(process.kubeconfig.read_text())
    entry = config["clusters"][0]["cluster"]
    proxy = TcpProxy.to_url(entry["server"]).start()
    entry["server"] = proxy.url  # TLS passes through: the certificate is for 127.0.0.1
    process.kubeconfig.write_text(yaml.safe_dump(config))
    return Replica(name, process, proxy)


# --- the workload --------------------------------------------------------------------------------


def plan(form: Form, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(f"chaos-{i:04d}", rng.choice(SCENARIOS)) for i in range(form.trainjobs)]


def trainjob(name: str, scenario: str, run_seconds: int) -> Obj:
    env = [{"name": "SANDBOX_RUN_SECONDS", "value": str(run_seconds)}]
    runtime: Obj = {"name": "torch-distributed"}
    spec: Obj = {}
    if scenario == "fail":
        env.append({"name": "SANDBOX_EXIT_CODE", "value": "3"})
    elif scenario == "mpi":
        runtime = {"name": "deepspeed-distributed"}
    elif scenario == "gang":
        runtime = {"name": "chaos-gang", "kind": "TrainingRuntime"}
    elif scenario == "suspended":
        spec["suspend"] = True
    elif scenario == "deleted":
        env = [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]
    return {
        "apiVersion": TJ,
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": runtime,
            "trainer": {"numNodes": 2 if scenario in ("mpi", "gang") else 1, "env": env},
            **spec,
        },
    }


def gang_runtime(cluster: RealCluster) -> Obj:
    base = cluster.get(TJ, "ClusterTrainingRuntime", "torch-distributed", namespace="")
    spec = copy.deepcopy(base["spec"])
    spec["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 60}}
    return {"apiVersion": TJ, "kind": "TrainingRuntime", "metadata": {"name": "chaos-gang"}, "spec": spec}


def get_or_none(cluster: RealCluster, api_version: str, kind: str, name: str) -> Obj | None:
    try:
        return cluster.get(api_version, kind, name)
    except APIError as exc:
        if exc.code == 404:
            return None
        raise


# --- the test --------------------------------------------------------------------------------------


def test_two_replicas_converge_through_leader_kills_and_cut_links(
    real: RealCluster, chaos_form: Form, tmp_path: Path
) -> None:
    seed = 20261125
    cluster, form = real, chaos_form
    rng = random.Random(seed)
    history = History()
    recorder = Recorder(cluster, history)
    cluster.create(gang_runtime(cluster))
    replicas = [replica(cluster, tmp_path, "a"), replica(cluster, tmp_path, "b")]
    jobs = plan(form, seed)
    done: list[str] = []
    mark = cluster.audit_mark()

    def logs() -> str:
        return "".join(f"\n--- replica {r.name} ---\n{r.process.log_tail(6000)}" for r in replicas)

    def wait(
        check: Callable[[], Any], timeout: float, what: str, pending: Callable[[], Any] | None = None
    ) -> Any:
        deadline = time.monotonic() + timeout
        while not (found := check()):
            if time.monotonic() > deadline:
                detail = f"; still pending: {pending()[:20]}" if pending else ""
                raise AssertionError(f"seed {seed}: timed out waiting for {what}{detail}{logs()}")
            time.sleep(0.25)
        return found

    def leader() -> Replica | None:
        leading = [r for r in replicas if r.leads()]
        return leading[0] if len(leading) == 1 else None

    def act(kind: str) -> None:
        now_leading = leader()
        target = now_leading or rng.choice(replicas)
        if kind == "kill-follower":
            target = next(r for r in replicas if r is not target)
        if kind in ("kill-leader", "kill-follower"):
            target.process.kill()
            time.sleep(rng.uniform(0.0, 1.5))
            target.process.start()
        elif kind == "cut":
            target = rng.choice(replicas)
            target.proxy.cut()
            time.sleep(rng.uniform(0.0, 1.0))
            target.proxy.resume()
        elif kind == "pause":  # silent past the renew deadline: a leader's fence closes
            target.proxy.pause()
            time.sleep(rng.uniform(1.0, LEASE_SECONDS + 2.0))
            target.proxy.resume()
        done.append(f"{kind} {target.name}{' (leader)' if target is now_leading else ''}")

    kinds = ["kill-leader"] * form.leader_kills + [
        rng.choice(("kill-follower", "cut", "cut", "pause")) for _ in range(form.actions - form.leader_kills)
    ]
    rng.shuffle(kinds)

    def chaos() -> None:
        span = form.trainjobs / 8 + form.run_seconds * 4 + 20
        start = time.monotonic()
        for i, kind in enumerate(kinds):
            time.sleep(max(0.0, start + span * (i + rng.uniform(0.2, 0.8)) / len(kinds) - time.monotonic()))
            # A take-over in progress is left to finish: the next kill then finds a leader.
            wait(lambda: leader() is not None, LEASE_SECONDS + RETRY_SECONDS + 30, "a leader")
            act(kind)

    recorder.start()
    try:
        for r in replicas:
            r.process.start()
        wait(leader, 30, "a leader")
        first_lease = cluster.get(LEASE_API, "Lease", LEASE)["spec"]
        failure: list[BaseException] = []

        def run_chaos() -> None:
            try:
                chaos()
            except BaseException as exc:  # reported by the test's thread
                failure.append(exc)

        thread = threading.Thread(target=run_chaos, name="chaos")
        thread.start()

        def transitions() -> int:
            return int(cluster.get(LEASE_API, "Lease", LEASE)["spec"].get("leaseTransitions") or 0)

        # The last fifth arrive once leadership has moved, so that the replica that took over
        # creates JobSets too (the first leader may have created all the others before a kill).
        held_back = max(1, len(jobs) // 5)
        first_transitions = int(first_lease.get("leaseTransitions") or 0)
        try:
            for i, (name, scenario) in enumerate(jobs):
                if i == len(jobs) - held_back:
                    wait(
                        lambda: transitions() > first_transitions, form.converge_timeout, "leadership to move"
                    )
                cluster.create(trainjob(name, scenario, form.run_seconds))
                if i % 8 == 7:
                    time.sleep(1.0)  # arrivals at about 8 per second
            deleted = [name for name, scenario in jobs if scenario == "deleted"]
            wait(
                lambda: all(get_or_none(cluster, JS, "JobSet", n) for n in deleted),
                form.converge_timeout,
                "every to-be-deleted TrainJob's JobSet",
            )
            for name in deleted:
                cluster.delete(TJ, "TrainJob", name)
        finally:
            thread.join()
        if failure:
            raise failure[0]
        assert len(done) == form.actions

        expected = dict(jobs)

        def pending() -> list[str]:
            trainjobs = {o["metadata"]["name"]: o for o in cluster.list(TJ, "TrainJob")}
            jobsets = {o["metadata"]["name"]: o for o in cluster.list(JS, "JobSet")}
            return [
                name
                for name, scenario in jobs
                if not in_expected_state(trainjobs.get(name), jobsets.get(name), scenario)
            ]

        wait(lambda: not pending(), form.converge_timeout, "convergence", pending)

        # Leadership moved: the Lease changed hands, and both replicas created JobSets.
        last_lease = cluster.get(LEASE_API, "Lease", LEASE)["spec"]
        moves = int(last_lease.get("leaseTransitions") or 0) - int(first_lease.get("leaseTransitions") or 0)
        assert moves >= 1, f"leadership never moved: {done}"
        creators = Counter(
            r.user
            for r in cluster.audit_since(mark)
            if r.resource == "jobsets" and r.mutated and r.status == 201
        )
        assert {r.process.user for r in replicas} <= set(creators), f"JobSets created by {dict(creators)}"

        # The change stream is complete up to now, then checked.
        wait(
            lambda: not recorder.caught_up() or recorder.holes,
            60,
            "the watches to catch up",
            recorder.caught_up,
        )
        assert not recorder.holes, recorder.holes
        check_history(history, [n for n, s in expected.items() if s == "mpi"])
        jobsets_made = Counter(
            owner_uid(e.obj) for e in history.children if e.key == JOBSETS and e.type == "ADDED"
        )
        duplicated = {uid: n for uid, n in jobsets_made.items() if n > 1}
        assert not duplicated, f"TrainJobs given more than one JobSet: {duplicated}"
        assert len(jobsets_made) == len(jobs), "every TrainJob got its JobSet, once"

        # Deleting every TrainJob leaves nothing behind: the children were all owned.
        for name, scenario in jobs:
            if scenario != "deleted":
                cluster.delete(TJ, "TrainJob", name)

        def leftovers() -> list[str]:
            left = [f"trainjobs {o['metadata']['name']}" for o in cluster.list(TJ, "TrainJob")]
            for key, template in PATHS.items():
                if key not in CHILD_KEYS:
                    continue
                listing = cluster.http.request("GET", template.format(ns=cluster.namespace))
                left += [
                    f"{key[1]} {o['metadata']['name']}"
                    for o in listing.get("items") or []
                    if owner_uid(o) is not None or looks_like_child(o)
                ]
            return left

        wait(lambda: not leftovers(), 120, "garbage collection", leftovers)
        print(
            f"chaos (real, seed {seed}): {form.trainjobs} TrainJobs, {moves} leadership moves, "
            f"actions {done}, JobSets created by {dict(creators)}"
        )
    finally:
        recorder.stop()
        for r in replicas:
            r.process.stop()
            r.proxy.stop()
