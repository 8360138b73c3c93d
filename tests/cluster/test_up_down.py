"""``scripts/cluster up`` and ``down`` as a user runs them: processes that outlive ``up``, a ``down``
that leaves nothing behind (twice), and an ``up`` that names the component that failed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from trainer_sandbox.cluster.processes import Record, is_ours, load_records

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster"
COMPONENTS = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kwok-logs",
    "jobset",
]


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


def processes_under(directory: Path) -> list[str]:
    """Command lines of every process whose arguments mention ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if str(directory) in cmdline and state != "Z":
            found.append(cmdline)
    return found


def test_up_then_down_leaves_nothing_running(bin_dir: Path, tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    up = run("up", "--dir", str(directory))
    assert up.returncode == 0, up.stderr
    for name in [*COMPONENTS, "CRDs and runtimes installed"]:
        assert name in up.stdout
    records, _ = load_records(directory / "cluster.json")
    assert [r.name for r in records] == COMPONENTS
    assert all(is_ours(r) for r in records)  # still running after `up` returned

    down = run("down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    assert "stopped" in down.stdout
    assert not any(is_ours(r) for r in records)
    assert processes_under(directory) == []

    again = run("down", "--dir", str(directory))
    assert again.returncode == 0 and "nothing running" in again.stdout


def test_up_names_the_component_that_fails_and_stops_the_rest(bin_dir: Path, tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    for binary in bin_dir.iterdir():
        (fake / binary.name).symlink_to(binary)
    (fake / "kube-apiserver").unlink()
    (fake / "kube-apiserver").write_text("#!/bin/sh\necho 'no API server here' >&2\nexit 3\n")
    (fake / "kube-apiserver").chmod(0o755)
    directory = tmp_path / "cluster"

    up = run("up", "--dir", str(directory), "--bin-dir", str(fake))

    assert up.returncode != 0
    assert "kube-apiserver: exited with code 3" in up.stderr
    assert "no API server here" in up.stderr  # the end of its log
    assert "etcd" in up.stdout  # etcd came up first...
    assert processes_under(directory) == []  # ...and was stopped
    assert not (directory / "cluster.json").exists()


def test_a_reused_pid_is_not_ours() -> None:
    me = Record(name="etcd", pid=os.getpid(), binary="/no/such/etcd")
    assert not is_ours(me)
