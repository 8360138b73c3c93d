"""Helpers of the tests that hand a live cluster from one controller to another (tests/dropin,
tests/nodes): what a switch must leave alone, read from the cluster and its audit log. Imported by
module name, as the tests' other top-level helpers."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from trainer_sandbox.backends import RealCluster
from trainer_sandbox.cluster import ControlPlane

TJ = "trainer.kubeflow.org/v1alpha1"


def require_go(what: str = "the real control plane is") -> None:
    """Skip without Go, naming why; in CI (``CI`` set) fail instead: there the point is to know
    that what is built from cluster/go.mod works."""
    if shutil.which("go"):
        return
    reason = f"go is not on PATH: {what} built from cluster/go.mod with it"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so this is an error, not a skip: {reason}")
    pytest.skip(reason)


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


def world(cluster: RealCluster) -> dict[str, Any]:
    """What a switch must leave alone in the cluster's namespace: each JobSet's, pod's, Secret's
    and ConfigMap's uid (not recreated), a ConfigMap's data (a hostfile, a snapshot), and each
    TrainJob's conditions."""
    out: dict[str, Any] = {}
    for api_version, kind in (
        ("jobset.x-k8s.io/v1alpha2", "JobSet"),
        ("v1", "Pod"),
        ("v1", "Secret"),
        ("v1", "ConfigMap"),
    ):
        for obj in cluster.list(api_version, kind):
            out[f"{kind}/{obj['metadata']['name']}"] = (
                obj["metadata"]["uid"],
                obj.get("data") if kind == "ConfigMap" else None,
            )
    for tj in cluster.list(TJ, "TrainJob"):
        conditions = (tj.get("status") or {}).get("conditions") or []
        out[f"TrainJob/{tj['metadata']['name']}"] = sorted(
            (c["type"], c["status"], c.get("reason", "")) for c in conditions
        )
    return out


def recreated(records: Iterable[Any], namespace: str) -> list[str]:
    """JobSets created or deleted, and pods deleted, by anyone, in ``namespace``."""
    return [
        f"{r.user} {r.verb} {r.resource}/{r.name}"
        for r in records
        if r.mutated
        and r.namespace == namespace
        and (
            (r.resource == "jobsets" and r.verb in ("create", "delete"))
            or (r.resource == "pods" and r.verb == "delete")
        )
    ]


def finished(cluster: RealCluster, name: str) -> str:
    """The TrainJob's finished condition (Complete or Failed), or "" while it runs."""
    conditions = (cluster.get(TJ, "TrainJob", name).get("status") or {}).get("conditions") or []
    return next(
        (c["type"] for c in conditions if c["type"] in ("Complete", "Failed") and c["status"] == "True"), ""
    )


def running_pods(cluster: RealCluster, jobset: str) -> int:
    """The JobSet's pods in phase Running."""
    return sum(
        1
        for p in cluster.list("v1", "Pod")
        if p["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/jobset-name") == jobset
        and (p.get("status") or {}).get("phase") == "Running"
    )


def kubectl(real: RealCluster, *args: str) -> str:
    """kubectl of the server's version, in the test's namespace; fails with its stderr."""
    done = subprocess.run(
        [real.kubectl, "--kubeconfig", str(real.kubeconfig), "-n", real.namespace, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
