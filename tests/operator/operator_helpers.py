"""Helpers of the operator tests (imported by module name: ``conftest`` is ambiguous across folders)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.operator_process import OPERATOR_USER

TJ = "trainer.kubeflow.org/v1alpha1"
__all__ = ["OPERATOR_USER", "TJ", "conditions", "get_or_none", "operator_writes", "trainjob", "wait_for"]


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
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runtimeRef": {"name": runtime}, **spec},
    }


def conditions(server: LocalAPIServer, name: str) -> dict[str, tuple[str, str]]:
    tj = server.get(TJ, "TrainJob", name)
    return {
        c["type"]: (c["status"], c.get("reason", ""))
        for c in (tj.get("status") or {}).get("conditions") or []
    }


def get_or_none(server: LocalAPIServer, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
    from trainer_sandbox.apiserver.errors import APIError

    try:
        return server.get(api_version, kind, name)
    except APIError:
        return None


def operator_writes(server: LocalAPIServer, since: int = 0, *, events: bool = False) -> list[Any]:
    records = server.audit.records[since:]
    return [
        r for r in records if r.user == OPERATOR_USER and r.mutated and (events or r.resource != "events")
    ]
