"""Helpers of the drop-in tests (imported by module name: ``conftest`` is ambiguous across folders)."""

from __future__ import annotations

from trainer_sandbox.backends import RealCluster
from trainer_sandbox.cluster import ControlPlane


def real_cluster(plane: ControlPlane, namespace: str) -> RealCluster:
    """A client of ``plane`` whose namespaced objects go to ``namespace`` (created now)."""
    cluster = RealCluster(plane.kubeconfig, plane.audit_log, ca_dir=plane.pki_dir, kubectl=str(plane.kubectl))
    return cluster.for_test(namespace)
