"""Helpers of the drop-in tests (imported by module name: ``conftest`` is ambiguous across folders)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from trainer_sandbox.backends import RealCluster
from trainer_sandbox.cluster import ControlPlane


def real_cluster(plane: ControlPlane, namespace: str) -> RealCluster:
    """A client of ``plane`` whose namespaced objects go to ``namespace`` (created now)."""
    cluster = RealCluster(plane.kubeconfig, plane.audit_log, ca_dir=plane.pki_dir, kubectl=str(plane.kubectl))
    return cluster.for_test(namespace)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    """Until ``check`` returns something true, which is returned; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {found!r}")
        time.sleep(0.3)
