"""Software nobody here wrote, run beside ours on the real control plane: upstream's own
trainer-controller-manager and Kueue, built by ``cluster/build`` (trainer_sandbox.cluster.addons).

Each module starts a control plane of its own: what these controllers register (CRDs, webhooks)
must not reach other tests' clusters. Outside CI a machine without Go skips them with the reason;
in CI that is a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_helpers import require_go
from trainer_sandbox.cluster import build_binaries


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    require_go("upstream's controller and Kueue are")
    return build_binaries()
