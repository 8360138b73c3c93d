"""An operator running against the local API server, with the CRDs and default runtimes installed.

The operator talks to the server over HTTPS as its own user (the chart's ServiceAccount), so the
audit log tells its requests from the test's and from the simulated controllers'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainer.controller.config import Configuration
from trainer.controller.embedded import EmbeddedOperator
from trainer.testing.apiserver import LocalAPIServer
from trainer.testing.fixtures import apiserver  # noqa: F401 - a fixture used by the ones below
from trainer.testing.sandbox import prepare

OPERATOR_USER = "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"
TJ = "trainer.kubeflow.org/v1alpha1"


@pytest.fixture
def cluster(apiserver: LocalAPIServer) -> LocalAPIServer:  # noqa: F811
    prepare(apiserver)
    apiserver.add_user(OPERATOR_USER, ["system:serviceaccounts"])
    return apiserver


@pytest.fixture
def operator_kubeconfig(cluster: LocalAPIServer, tmp_path: Path) -> Path:
    return cluster.write_kubeconfig(tmp_path / "operator.kubeconfig", user=OPERATOR_USER)


@pytest.fixture
def operator(operator_kubeconfig: Path) -> Iterator[EmbeddedOperator]:
    with EmbeddedOperator(operator_kubeconfig, Configuration()) as op:
        yield op


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
    from trainer.testing.apiserver.errors import APIError

    try:
        return server.get(api_version, kind, name)
    except APIError:
        return None


def operator_writes(server: LocalAPIServer, since: int = 0, *, events: bool = False) -> list[Any]:
    records = server.audit.records[since:]
    return [
        r for r in records if r.user == OPERATOR_USER and r.mutated and (events or r.resource != "events")
    ]
