"""A control plane with two real nodes (``scripts/cluster up --real-nodes 2``), started per module.

Real nodes need root, runc, iptables and the rest ``scripts/bootstrap`` installs from Debian.
Outside CI a machine without them skips these tests with the reason; in CI (``CI`` set) that is a
failure: the point there is to prove pods on real containers. Only one cluster with real nodes
runs on a machine at a time (they share the fabric's address), so each module starts its own and
stops it before the next module's starts.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from node_helpers import Kubectl, require_real_nodes
from trainer_sandbox.cluster import ControlPlane, build_binaries


@pytest.fixture(scope="module")
def nodes_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    require_real_nodes()
    bin_dir = build_binaries()
    plane = ControlPlane.start(tmp_path_factory.mktemp("real-nodes"), bin_dir=bin_dir, real_nodes=2)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def bare_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Two real nodes and nothing of ours: no trainer CRDs, runtimes or public ConfigMap (the
    PodGroup CRDs stay), for a chart to install."""
    require_real_nodes()
    plane = ControlPlane.start(
        tmp_path_factory.mktemp("bare-nodes"), bin_dir=build_binaries(), real_nodes=2, trainer_objects=False
    )
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def kubectl(nodes_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[Kubectl]:
    namespace = "t-" + request.node.name.replace("_", "-")[:50].strip("-").lower()
    nodes_plane.run_kubectl("create", "namespace", namespace)
    try:
        yield Kubectl(nodes_plane, namespace)
    finally:
        nodes_plane.run_kubectl("delete", "namespace", namespace, "--wait=false", check=False)
