"""An operator running against a control plane with the CRDs and default runtimes installed: the
stand-in, the real one built from cluster/, or both (``pytest --backend``; tests/backend_plugin.py).

The operator talks to the server over HTTPS as its own user (the chart's ServiceAccount), so the
audit log tells its requests from the test's and from the controllers'. It watches the test's
namespace only: on the real control plane other tests' namespaces share the server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_helpers import OPERATOR_USER
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.controller.config import Configuration


@pytest.fixture
def cluster(cluster: Cluster) -> Cluster:
    cluster.add_user(OPERATOR_USER, ["system:serviceaccounts"])
    # The chart's own ClusterRole is proven against the real authorizer by the install tests;
    # here the operator's behaviour is under test, not its rights.
    cluster.grant(OPERATOR_USER)
    return cluster


@pytest.fixture
def operator_kubeconfig(cluster: Cluster, tmp_path: Path) -> Path:
    return cluster.write_kubeconfig(tmp_path / "operator.kubeconfig", user=OPERATOR_USER)


@pytest.fixture
def operator(operator_kubeconfig: Path, cluster: Cluster) -> Iterator[EmbeddedOperator]:
    with EmbeddedOperator(operator_kubeconfig, Configuration(), namespaces=[cluster.namespace]) as op:
        yield op
