"""kube-scheduler's own gang scheduling (docs/scheduling.md), on a control plane started with its
alpha gates on (``ControlPlane.start(gang=True)``, ``scripts/cluster up --gang``): every module
starts its own, so no other test's cluster runs with alpha gates. Outside CI a machine without Go
skips these tests with the reason; in CI that is a failure."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_helpers import require_go
from trainer_sandbox.cluster import build_binaries


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    require_go()
    return build_binaries()
