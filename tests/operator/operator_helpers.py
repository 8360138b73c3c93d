"""Helpers of the operator tests (imported by module name: ``conftest`` is ambiguous across folders)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trainer_sandbox.backends import Cluster
from trainer_sandbox.operator_process import OPERATOR_USER

TJ = "trainer.kubeflow.org/v1alpha1"
__all__ = [
    "OPERATOR_USER",
    "TJ",
    "conditions",
    "get_or_none",
    "operator_requests",
    "operator_writes",
    "trainjob",
    "wait_for",
]


def wait_for(
    check: Callable[[], Any], timeout: float = 20, interval: float = 0.1, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last value: {last!r}")


def trainjob(name: str, runtime: str = "torch-distributed", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": TJ,
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime}, **spec},
    }


def conditions(server: Cluster, name: str) -> dict[str, tuple[str, str]]:
    tj = server.get(TJ, "TrainJob", name)
    return {
        c["type"]: (c["status"], c.get("reason", ""))
        for c in (tj.get("status") or {}).get("conditions") or []
    }


def get_or_none(server: Cluster, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
    from trainer_sandbox.apiserver.errors import APIError

    try:
        return server.get(api_version, kind, name)
    except APIError:
        return None


def operator_requests(server: Cluster, since: int = 0) -> list[Any]:
    """The operator's requests after ``since``, in the test's namespace or outside any.

    On the real control plane every test's operator is the same user: the namespace keeps another
    test's (a watch closing late, say) out of this one's.
    """
    return [
        r
        for r in server.audit_since(since)
        if r.user == OPERATOR_USER and r.namespace in (server.namespace, "")
    ]


def operator_writes(server: Cluster, since: int = 0, *, events: bool = False) -> list[Any]:
    return [r for r in operator_requests(server, since) if r.mutated and (events or r.resource != "events")]


def wait_settled(server: Cluster, idle: Callable[[], bool], quiet: float = 1.0, timeout: float = 20) -> None:
    """Wait until the operator (``idle``: its queue is empty) has written nothing for ``quiet`` s.

    A TrainJob's own condition can be right before the world has settled: the JobSet controller
    writes the JobSet's status a moment later (on a real cluster, visibly later), which the
    operator copies to the TrainJob, and Events are posted by a task of their own. A test about
    what a settled world costs must start from one.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mark = server.audit_mark()
        time.sleep(quiet)
        if idle() and not operator_writes(server, mark, events=True):
            return
    raise AssertionError(f"the operator kept writing for {timeout} s")
