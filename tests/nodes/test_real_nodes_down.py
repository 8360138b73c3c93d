"""``scripts/cluster down`` leaves nothing of a cluster with real nodes on the machine: no
process, mount, network namespace, link, route or cgroup, and no file outside its directory;
also after the cluster's processes died without a chance to clean up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from node_helpers import HOST_PATHS, leftovers, require_real_nodes
from trainer_sandbox.cluster import ControlPlane, build_binaries
from trainer_sandbox.cluster.nodepool import BUSYBOX_IMAGE, cluster_id
from trainer_sandbox.cluster.realnode import read_sysctls

pytestmark = pytest.mark.real_nodes
ROOT = Path(__file__).resolve().parents[2]


def _busy_cluster(directory: Path) -> ControlPlane:
    """One real node running a pod that keeps a volume mounted."""
    plane = ControlPlane.start(directory, bin_dir=build_binaries(), real_nodes=1)
    spec = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sleeper", "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                }
            ]
        },
    }
    plane.run_kubectl("apply", "-f", "-", input=json.dumps(spec))
    deadline = time.monotonic() + 120
    while plane.run_kubectl("get", "pod", "sleeper", "-o", "jsonpath={.status.phase}").stdout != "Running":
        assert time.monotonic() < deadline, plane.run_kubectl("describe", "pod", "sleeper").stdout
        time.sleep(0.5)
    return plane


@pytest.mark.parametrize("how", ["down", "crash-then-down"])
def test_down_leaves_nothing_behind(how: str, tmp_path: Path) -> None:
    require_real_nodes()
    absent = [p for p in HOST_PATHS if not p.exists()]
    settings = read_sysctls()
    directory = tmp_path / "cluster"
    ident = cluster_id(directory)
    try:
        plane = _busy_cluster(directory)
        assert leftovers(directory, ident), "the check sees a running cluster"
        if how == "crash-then-down":
            # Every process of the cluster dies at once, as on a crash of the machine's session:
            # nothing got to unmount or delete anything.
            for record in plane.records:
                os.kill(record.pid, signal.SIGKILL)
    finally:  # whatever happened, `down` is what is tested, and it must run
        out = subprocess.run(
            [str(ROOT / "scripts" / "cluster"), "down", "--dir", str(directory)],
            capture_output=True,
            text=True,
        )
    assert out.returncode == 0, out.stderr
    assert leftovers(directory, ident) == []
    assert read_sysctls() == settings  # what kubelet changed host-wide is put back
    assert [p for p in absent if p.exists()] == []
