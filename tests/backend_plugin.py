"""Which control plane a backend-neutral test runs on: ``pytest --backend=standin|real|both``.

A test that takes the ``cluster`` fixture runs once per selected backend: on the stand-in
(``trainer_sandbox.apiserver``, a fresh server per test) and on the real control plane built from
``cluster/`` (one per session, a namespace per test). The default is both where Go is available
to build the real one. Outside CI a missing Go skips the real backend with one plain line in the
report header; in CI it is an error, never a skip.

``@pytest.mark.standin_only(reason)`` marks what only the stand-in can do (fault injection, its
own helpers and tables) in a module whose tests otherwise run on each backend: a test with the
``cluster`` fixture then runs on the stand-in alone, skipped with its reason when the stand-in is
not selected. On a test that reaches the stand-in directly (its own fixtures, ``apiserver`` and
the like, as the stand-in's unit tests do) the marker only says why; such tests run whatever
``--backend`` says, since there is no other backend for them to run on.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainer_sandbox.backends import Cluster, RealCluster

BACKENDS = ("standin", "real")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        choices=("standin", "real", "both"),
        default=None,
        help="control plane(s) for backend-neutral tests (default: both where Go is available)",
    )


def _go_missing() -> str | None:
    return None if shutil.which("go") else "go is not on PATH, so the real control plane cannot be built"


def selected_backends(config: pytest.Config) -> tuple[str, ...]:
    choice = config.getoption("--backend")
    if choice == "both" or choice is None:
        if choice is None and _go_missing() and not os.environ.get("CI"):
            return ("standin",)
        return BACKENDS
    return (str(choice),)


def pytest_report_header(config: pytest.Config) -> str:
    backends = selected_backends(config)
    if "real" in backends:
        return f"backends: {', '.join(backends)} (the real control plane is built from cluster/ and started once)"
    why = _go_missing() if config.getoption("--backend") is None else "--backend=standin was given"
    return f"backends: standin only; the real control plane is skipped: {why}"


STANDIN_ONLY = "standin_only"  # registered in pyproject.toml's pytest markers


def _standin_only_reason(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker(STANDIN_ONLY)
    if marker is None:
        return None
    reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
    if not reason:
        raise pytest.UsageError(f"@pytest.mark.{STANDIN_ONLY} needs a reason ({item.nodeid})")
    return str(reason)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        backends = selected_backends(metafunc.config)
        if _standin_only_reason(metafunc.definition) is not None:
            backends = ("standin",)  # skipped at setup when the stand-in was not selected
        metafunc.parametrize("backend", backends, indirect=True, scope="function")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not isinstance(item, pytest.Function):
        return
    reason = _standin_only_reason(item)
    if (
        reason is not None
        and "backend" in item.fixturenames
        and "standin" not in selected_backends(item.config)
    ):
        pytest.skip(f"stand-in only: {reason}")


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """The real control plane, started once per session (built first when not cached)."""
    missing = _go_missing()
    if missing:
        raise RuntimeError(f"the real backend was selected but {missing}")
    from trainer_sandbox.cluster import ControlPlane

    plane = ControlPlane.start(tmp_path_factory.mktemp("control-plane"))
    try:
        yield RealCluster(plane.kubeconfig, plane.audit_log, ca_dir=plane.pki_dir, kubectl=str(plane.kubectl))
    finally:
        plane.stop()


@pytest.fixture
def cluster(backend: str, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A control plane with the CRDs, the default runtimes and the public ConfigMap installed."""
    if backend == "standin":
        from trainer_sandbox.sandbox import local_apiserver, prepare

        server = local_apiserver().start()
        try:
            prepare(server)
            yield server
        finally:
            server.stop()
        return
    plane: RealCluster = request.getfixturevalue("control_plane")
    view = plane.for_test(_namespace_for(request.node.name))
    try:
        yield view
    finally:
        view.cleanup()


@pytest.fixture
def real(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    """A namespace of the real control plane alone, for what only it can show (tokens bound to
    objects, processes killed for real); skipped when --backend leaves it out."""
    if "real" not in selected_backends(request.config):
        why = _go_missing() if request.config.getoption("--backend") is None else "--backend=standin"
        pytest.skip(f"needs the real control plane ({why})")
    plane: RealCluster = request.getfixturevalue("control_plane")
    view = plane.for_test(_namespace_for(request.node.name))
    try:
        yield view
    finally:
        view.cleanup()


def _namespace_for(test_name: str) -> str:
    """A namespace name of the test's own: readable, unique across a session, a valid DNS label."""
    import uuid

    stem = re.sub(r"[^a-z0-9-]+", "-", test_name.lower().removeprefix("test_"))[:40].strip("-")
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def kubectl_program(cluster: Cluster) -> str | None:
    """The kubectl matching the server: the one built with the real control plane, else PATH's
    (None when there is none: the stand-in's tests then skip)."""
    program = getattr(cluster, "kubectl", None)
    return str(program) if program else shutil.which("kubectl")


def kubeconfig_for(cluster: Cluster, directory: Path, user: str = "admin") -> Path:
    return cluster.write_kubeconfig(directory / f"{re.sub(r'[^a-z0-9]+', '-', user)}.kubeconfig", user=user)
