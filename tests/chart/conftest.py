"""The chart tests import the chart's tools (charts/tools) and their own harness (chart_harness).

``chart_cluster`` is the control plane a module's release is installed into, once per backend that
``--backend`` selects (tests/backend_plugin.py): a fresh stand-in, or the session's real control
plane, in whose namespace ``team-a`` the workload runs.
"""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
for _path in (_ROOT / "charts" / "tools", Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from backend_plugin import selected_backends  # noqa: E402
from trainer_sandbox.backends import Cluster  # noqa: E402


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "chart_backend" in metafunc.fixturenames:
        metafunc.parametrize(
            "chart_backend", selected_backends(metafunc.config), indirect=True, scope="module"
        )


@pytest.fixture(scope="module")
def chart_backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def chart_cluster(chart_backend: str, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    if chart_backend == "standin":
        from trainer_sandbox.sandbox import local_apiserver

        server = local_apiserver().start()
        try:
            yield server
        finally:
            server.stop()
        return
    import chart_harness as h

    plane = request.getfixturevalue("control_plane")
    view = plane.for_test(h.SCENARIO_NAMESPACE)
    try:
        yield view
    finally:
        view.cleanup()
