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
from status_helpers import ROLES, chart_cluster_roles
from trainer_sandbox.backends import Cluster, RealCluster
from trainer_sandbox.embedded_operator import EmbeddedOperator
from trainer_sandbox.ports import free_port

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


@pytest.fixture
def status_operator(real: RealCluster, tmp_path: Path) -> Iterator[tuple[EmbeddedOperator, int]]:
    """The operator with the gate on, holding exactly the chart's ClusterRoles for it (the real RBAC
    authorizer checks every call, the status server's TokenReviews and pod reads among them)."""
    real.add_user(OPERATOR_USER, ["system:serviceaccounts"])
    roles = chart_cluster_roles()
    assert sorted(r["metadata"]["name"] for r in roles) == sorted(ROLES)
    for role in roles:
        name = f"{role['metadata']['name']}-{real.namespace}"[:63]
        real.create({**role, "metadata": {"name": name}})
        real.grant(OPERATOR_USER, name)
    kubeconfig = real.write_kubeconfig(tmp_path / "operator.kubeconfig", user=OPERATOR_USER)
    port = free_port()
    config = Configuration.model_validate(
        {
            "featureGates": {"TrainJobStatus": True},
            "statusServer": {"host": "127.0.0.1", "port": port, "advertisedURL": f"https://127.0.0.1:{port}"},
        }
    )
    with EmbeddedOperator(kubeconfig, config, namespaces=[real.namespace]) as op:
        yield op, port
