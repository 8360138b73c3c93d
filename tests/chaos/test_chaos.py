"""Chaos: TrainJob lifecycles while the operator is SIGKILLed at random and the API server injects faults.

The operator runs as its own process (``trainer run``) so a kill is a real one: requests cut
mid-flight, nothing flushed. The local API server fails about one request in ten of the
operator's (latency, 429, 500 before and after the write, 409 on stale writes, dropped and
expired watches). Everything is seeded: the faults, the kill instants, which TrainJobs fail or
are deleted; thread timing is not, so a failure prints its seed and the operator's log.

What must hold (chaos_checks.py; read from the server's own event stream, ordered by resourceVersion, so no
timing can hide a violation):

- every TrainJob converges to the state its inputs call for (Complete, Failed, Suspended, gone);
- no child is created after its TrainJob finished (docs/decisions.md §4);
- no MPI SSH Secret is created twice or changed (a re-key would break a running job);
- every child is owned by its TrainJob when created, and nothing is left once TrainJobs are
  deleted (no orphans);
- no status is lost: a TrainJob's conditions never lose a type (ReconcileFailed excepted: it is
  removed by design), and a terminal condition, once True, stays True.

The CI form runs 200 lifecycles with a handful of kills; ``pytest --chaos-long`` runs 600 with
many more kills and a longer run per TrainJob.
"""

from __future__ import annotations

import copy
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chaos_checks import (
    CHILD_KEYS,
    JOBSETS,
    TRAINJOBS,
    History,
    check_history,
    in_expected_state,
    looks_like_child,
    owner_uid,
)
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.operator_process import OPERATOR_USER, OperatorProcess
from trainer_sandbox.sandbox import local_apiserver, prepare

Obj = dict[str, Any]
TJ = "trainer.kubeflow.org/v1alpha1"
SUBMITTER = "chaos-user"
FAULT_KINDS = ("latency", "429", "500", "500-after", "409", "drop-watch", "expire-watch")


@dataclass(frozen=True)
class Form:
    trainjobs: int
    kills: int
    run_seconds: int
    converge_timeout: float


SHORT = Form(trainjobs=200, kills=5, run_seconds=1, converge_timeout=240)
LONG = Form(trainjobs=600, kills=30, run_seconds=3, converge_timeout=900)

# What each TrainJob is asked to do, and the state it must end in.
SCENARIOS = ("complete", "complete", "fail", "mpi", "gang", "suspended", "deleted")


def plan(form: Form, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(f"chaos-{i:04d}", rng.choice(SCENARIOS)) for i in range(form.trainjobs)]


def trainjob(name: str, scenario: str, run_seconds: int) -> Obj:
    env = [{"name": "SANDBOX_RUN_SECONDS", "value": str(run_seconds)}]
    runtime, spec = "torch-distributed", {}
    if scenario == "fail":
        env.append({"name": "SANDBOX_EXIT_CODE", "value": "3"})
    elif scenario == "mpi":
        runtime = "deepspeed-distributed"
    elif scenario == "gang":
        runtime = "chaos-gang"
    elif scenario == "suspended":
        spec["suspend"] = True
    elif scenario == "deleted":
        env = [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]
    return {
        "apiVersion": TJ,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {"numNodes": 2 if scenario in ("mpi", "gang") else 1, "env": env},
            **spec,
        },
    }


def gang_runtime(server: LocalAPIServer) -> Obj:
    base = server.get(TJ, "ClusterTrainingRuntime", "torch-distributed", namespace="")
    spec = copy.deepcopy(base["spec"])
    spec["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 60}}
    return {
        "apiVersion": TJ,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "chaos-gang"},
        "spec": spec,
    }


@pytest.fixture
def chaos_form(request: pytest.FixtureRequest) -> Form:
    return LONG if request.config.getoption("--chaos-long") else SHORT


@pytest.fixture
def chaos_server() -> Iterator[LocalAPIServer]:
    server = local_apiserver(seed=7, bookmark_interval=0.5).start()
    try:
        prepare(server)
        server.add_user(SUBMITTER)
        server.create(gang_runtime(server))
        yield server
    finally:
        server.stop()


def inject_faults(server: LocalAPIServer) -> None:
    """About one request in ten of the operator's fails; watches are dropped and expired too."""
    users = [OPERATOR_USER]
    server.faults.add("latency", rate=0.03, users=users, latency=0.15)
    server.faults.add("429", rate=0.025, users=users, retry_after=1)
    server.faults.add("500", rate=0.025, users=users)
    server.faults.add("500-after", rate=0.03, users=users)
    server.faults.add("409", rate=0.05, users=users)
    server.faults.add("drop-watch", rate=0.3, users=users, after=2.0)
    server.faults.add("expire-watch", rate=0.1, users=users)


def test_lifecycles_converge_through_kills_and_faults(
    chaos_server: LocalAPIServer, chaos_form: Form, tmp_path: Path
) -> None:
    seed = 20261123
    server, form = chaos_server, chaos_form
    rng = random.Random(seed)
    history = History()
    server.core.store.listeners.append(history.listen)
    operator = OperatorProcess(server, tmp_path / "operator", qps=200, burst=400, workers=8)
    inject_faults(server)
    jobs = plan(form, seed)
    expected = dict(jobs)

    operator.start()
    kills: list[float] = []

    def killer() -> None:
        # Kills spread over the busy part of the run: while TrainJobs arrive and run.
        span = form.trainjobs / 40 + form.run_seconds * 4 + 5
        instants = sorted(rng.uniform(0.5, span) for _ in range(form.kills))
        start = time.monotonic()
        for instant in instants:
            time.sleep(max(0.0, start + instant - time.monotonic()))
            operator.kill()
            kills.append(time.monotonic() - start)
            time.sleep(rng.uniform(0.0, 0.5))
            operator.start()

    chaos = threading.Thread(target=killer, name="chaos-killer")
    chaos.start()
    try:
        for i, (name, scenario) in enumerate(jobs):
            server.create(trainjob(name, scenario, form.run_seconds), user=SUBMITTER)
            if i % 40 == 39:
                time.sleep(1.0)  # arrivals at about 40 per second
        deleted = [name for name, scenario in jobs if scenario == "deleted"]
        _wait(
            lambda: all(server.core.store.get(("jobset.x-k8s.io", "jobsets"), "default", n) for n in deleted),
            form.converge_timeout,
            "every to-be-deleted TrainJob's JobSet",
            operator,
        )
        for name in deleted:
            server.delete(TJ, "TrainJob", name, user=SUBMITTER)
    finally:
        chaos.join()
    assert len(kills) == form.kills and operator.starts == form.kills + 1

    def converged() -> list[str]:
        store = server.core.store
        return [
            name
            for name, scenario in jobs
            if not in_expected_state(
                store.get(TRAINJOBS, "default", name), store.get(JOBSETS, "default", name), scenario
            )
        ]

    _wait(lambda: not converged(), form.converge_timeout, "convergence", operator, pending=converged)

    fired = Counter(
        kind
        for r in server.audit.records
        if r.user == OPERATOR_USER and r.fault
        for kind in r.fault.split(",")
    )
    operator_requests = sum(1 for r in server.audit.records if r.user == OPERATOR_USER)
    assert set(fired) == set(FAULT_KINDS), f"faults that never fired: {set(FAULT_KINDS) - set(fired)}"

    check_history(history, [n for n, s in expected.items() if s == "mpi"])

    # Deleting every TrainJob leaves nothing behind: the children were all owned.
    for name, scenario in jobs:
        if scenario != "deleted":
            server.delete(TJ, "TrainJob", name, user=SUBMITTER)
    _wait(
        lambda: not _leftovers(server), 60, "garbage collection", operator, pending=lambda: _leftovers(server)
    )
    operator.stop()
    print(
        f"chaos: {form.trainjobs} TrainJobs, {len(kills)} kills at {[round(k, 1) for k in kills]} s, "
        f"{operator_requests} operator requests, faults {dict(fired)}"
    )


def _leftovers(server: LocalAPIServer) -> list[str]:
    left = [f"trainjobs {o['metadata']['name']}" for o in server.core.store.iter(TRAINJOBS)]
    for key in CHILD_KEYS:
        for obj in server.core.store.iter(key):
            if owner_uid(obj) is not None or looks_like_child(obj):
                left.append(f"{key[1]} {obj['metadata']['name']}")
    return left


def _wait(check: Any, timeout: float, what: str, operator: OperatorProcess, pending: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            detail = f"; still pending: {pending()[:20]}" if pending else ""
            raise AssertionError(
                f"timed out waiting for {what}{detail}\noperator log:\n{operator.log_tail()}"
            )
        time.sleep(0.2)
