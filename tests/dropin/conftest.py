"""Software nobody here wrote, run beside ours on the real control plane: upstream's own
trainer-controller-manager and Kueue, built by ``cluster/build`` (trainer_sandbox.cluster.addons).

Each module starts a control plane of its own: what these controllers register (CRDs, webhooks)
must not reach other tests' clusters. Outside CI a machine without Go skips them with the reason;
in CI that is a failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from trainer_sandbox.cluster import build_binaries


def require_go() -> None:
    if shutil.which("go"):
        return
    reason = "go is not on PATH: upstream's controller and Kueue are built from cluster/go.mod with it"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set, so this is an error, not a skip: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    require_go()
    return build_binaries()
