"""The real control plane for the launcher's own tests: built from ``cluster/`` and started once.

Outside CI a machine without Go skips these tests with that reason; in CI (``CI`` set) a missing Go
or a failed build fails them: the point there is to know the real cluster works.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import require_go
from trainer_sandbox.cluster import ControlPlane, build_binaries


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    """The built binaries (``cluster/build``: seconds when cached, a cold build prints progress)."""
    require_go()
    return build_binaries()


@pytest.fixture(scope="module")
def started(
    bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ControlPlane, list[str]]]:
    """A cluster of the module's own, and the lines ``start`` reported while it came up."""
    lines: list[str] = []
    cp = ControlPlane.start(tmp_path_factory.mktemp("cluster"), bin_dir=bin_dir, echo=lines.append)
    try:
        yield cp, lines
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def plane(started: tuple[ControlPlane, list[str]]) -> ControlPlane:
    return started[0]
