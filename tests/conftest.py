"""Options shared by the whole suite."""

from __future__ import annotations

import pytest
import reference_data
from hypothesis import HealthCheck, settings

# `pytest --backend=standin|real|both`: which control plane the backend-neutral tests run on.
pytest_plugins = ["backend_plugin"]

# The fuzz tests explore at random on every run (that is how they keep finding new inputs); CI runs
# the default profile. `pytest tests/test_fuzz.py --hypothesis-profile=fuzz-long` explores longer.
# A failure prints the input that caused it; hypothesis replays it first on the next local run.
FUZZ_BASE = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("default", max_examples=300, **FUZZ_BASE)  # type: ignore[arg-type]
settings.register_profile("fuzz-long", max_examples=5000, **FUZZ_BASE)  # type: ignore[arg-type]
settings.load_profile("default")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-long",
        action="store_true",
        default=False,
        help="run the chaos test in its long form (more TrainJobs, more operator kills; minutes)",
    )


# --- upstream reference data (tests/reference_data.py) -------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{reference_data.MARKER}(*paths): reads upstream's CRDs and runtimes from the reference "
        "directory (tests/reference_data.py); skipped without it, failed in CI",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    marks = list(item.iter_markers(reference_data.MARKER))
    if marks:
        reference_data.require(*[path for mark in marks for path in mark.args])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line saying how many tests did not run for lack of the reference data."""
    stats = terminalreporter.stats
    skipped = sum(reference_data.MISSING in str(r.longrepr) for r in stats.get("skipped", []))
    failed = sum(
        reference_data.MISSING in str(getattr(r, "longrepr", ""))
        for key in ("failed", "error")
        for r in stats.get(key, [])
    )
    if skipped or failed:
        counts = ", ".join(f"{n} {what}" for n, what in ((skipped, "skipped"), (failed, "failed")) if n)
        terminalreporter.write_line(
            f"upstream reference data: {counts} because files under "
            f"{reference_data.reference_dir()} are missing; set {reference_data.ENV_VAR} "
            "(see docs/reference-data.md)",
            yellow=not failed,
            red=bool(failed),
            bold=True,
        )
