"""kube-scheduler's own gang scheduling (docs/scheduling.md), on a control plane started with its
alpha gates on (``ControlPlane.start(gang=True)``, ``scripts/cluster up --gang``): every module
starts its own, so no other test's cluster runs with alpha gates. Outside CI a machine without Go
skips these tests with the reason; in CI that is a failure."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from trainer_sandbox.cluster import build_binaries


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    if not shutil.which("go"):
        reason = "go is not on PATH: the real control plane is built from cluster/go.mod with it"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set, so this is an error, not a skip: {reason}")
        pytest.skip(reason)
    return build_binaries()
