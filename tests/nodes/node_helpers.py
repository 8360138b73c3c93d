"""Helpers of the real-node tests: whether real nodes can run here, kubectl in a namespace, and
what of a cluster with real nodes is left on the machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainer_sandbox.cluster import ControlPlane
from trainer_sandbox.cluster.realnode import NodeError, preflight


def require_real_nodes() -> None:
    reason = ""
    if not shutil.which("go"):
        reason = "go is not on PATH: the nodes' binaries are built from cluster/go.mod with it"
    else:
        try:
            preflight()
        except NodeError as e:
            reason = str(e)
    if not reason:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so this is an error, not a skip: {reason}")
    pytest.skip(reason)


class Kubectl:
    """kubectl as the admin of a cluster with real nodes, in one namespace of the test's."""

    def __init__(self, plane: ControlPlane, namespace: str) -> None:
        self.plane = plane
        self.namespace = namespace

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> str:
        out = self.plane.run_kubectl("-n", self.namespace, *args, input=input, check=False)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {out.stderr}")
        return out.stdout

    def apply(self, *objects: dict[str, Any]) -> None:
        self("apply", "-f", "-", input=yaml.safe_dump_all(objects))

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return yaml.safe_load(self("get", kind, name, "-o", "yaml"))  # type: ignore[no-any-return]

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                pods = self("get", "pods", "-o", "wide", check=False)
                events = self("get", "events", "--sort-by=.lastTimestamp", check=False)
                # What the training printed, the last run of a restarted container's too.
                logs = "".join(
                    self(
                        "logs", "--prefix", "--tail=20", "--all-containers", "--max-log-requests=20",
                        "-l", "jobset.sigs.k8s.io/jobset-name", *previous, check=False,
                    )
                    for previous in ((), ("--previous",))
                )  # fmt: skip
                raise AssertionError(
                    f"timed out waiting for {what}\n{pods}\n{events[-3000:]}\n{logs[-4000:]}"
                )
            time.sleep(0.5)

    def pod_phase(self, name: str) -> str:
        out = self("get", "pod", name, "-o", "jsonpath={.status.phase}", check=False)
        return out.strip()


def helm(plane: ControlPlane, *args: str, timeout: float = 600) -> str:
    """``helm ARGS`` as the cluster's admin, with helm's caches in the cluster's directory."""
    out = subprocess.run(
        [str(plane.bin_dir / "helm"), "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"HOME": str(plane.dir), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, f"helm {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def leftovers(directory: Path, cluster_id: str) -> list[str]:
    """Whatever of a cluster with real nodes is still on the machine after ``down``."""
    found: list[str] = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if f"trn{cluster_id}" in line]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {line.split()[1]}" for line in links.splitlines() if f"trn{cluster_id}" in line]
    routes = subprocess.run(["ip", "route", "show"], capture_output=True, text=True).stdout
    found += [f"route {line}" for line in routes.splitlines() if line.startswith("10.245.")]
    with open("/proc/self/mountinfo") as f:
        found += [f"mount {line.split()[4]}" for line in f if str(directory) in line.split()[4]]
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        found += [f"cgroup {p}" for p in hierarchy.glob(f"trn{cluster_id}-*")]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        try:
            cgroups = (proc / "cgroup").read_text()
        except OSError:
            cgroups = ""
        if state != "Z" and (str(directory) in cmdline or f"/trn{cluster_id}-" in cgroups):
            found.append(f"process {proc.name}: {cmdline[:120]}")
    if (directory / "nodes").exists():
        found.append(f"path {directory / 'nodes'}")
    return found


# Where containerd and kubelet write by default, outside any directory of ours; the nodes keep them
# in tmpfs mounts of their own mount namespaces, so none may appear on the host.
HOST_PATHS = (
    Path("/run/containerd"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/var/lib/cni"),
)
