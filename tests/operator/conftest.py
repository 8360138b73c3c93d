"""An operator running against the local API server, with the CRDs and default runtimes installed.

The operator talks to the server over HTTPS as its own user (the chart's ServiceAccount), so the
audit log tells its requests from the test's and from the simulated controllers'.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_helpers import OPERATOR_USER
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.fixtures import apiserver  # noqa: F401 - a fixture used by the ones below
from trainer_sandbox.sandbox import prepare

from trainer.controller.config import Configuration
from trainer.controller.embedded import EmbeddedOperator


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
