"""Options shared by the whole suite."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

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
