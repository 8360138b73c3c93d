"""Options shared by the whole suite."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-long",
        action="store_true",
        default=False,
        help="run the chaos test in its long form (more TrainJobs, more operator kills; minutes)",
    )
