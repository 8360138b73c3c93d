"""docs/decisions.md §batch: status writes that only follow the children's progress are batched;
every other status change is written at once."""

from __future__ import annotations

import pytest

from trainer.controller.config import Configuration
from trainer.controller.reconciler import ProgressBatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


KEY = ("ns", "tj")
ZERO = {"jobsStatus": [{"name": "node", "active": 0, "ready": 0}]}
ACTIVE = {"jobsStatus": [{"name": "node", "active": 1, "ready": 0}], "startTime": "2026-11-27T00:00:00Z"}


def test_progress_waits_from_its_first_change_and_later_progress_folds_into_one_write() -> None:
    clock = Clock()
    batch = ProgressBatch(1.0, clock)
    assert batch.held(KEY, ZERO) == 1.0, "the first progress starts the wait"
    clock.now += 0.4
    assert batch.held(KEY, ACTIVE) == pytest.approx(0.6), (
        "later progress waits for the same end, not a new one"
    )
    clock.now += 0.6
    assert batch.held(KEY, ACTIVE) is None, "at the end: written"
    assert batch.held(KEY, ZERO) == 1.0, "the next progress waits afresh"


def test_a_condition_writes_at_once_and_ends_the_wait() -> None:
    clock = Clock()
    batch = ProgressBatch(1.0, clock)
    assert batch.held(KEY, ZERO) == 1.0
    complete = {**ACTIVE, "conditions": [{"type": "Complete", "status": "True"}]}
    assert batch.held(KEY, complete) is None
    clock.now += 0.1
    assert batch.held(KEY, ZERO) == 1.0, "the wait began again: the earlier one ended with the write"


def test_nothing_to_write_and_a_zero_period_hold_nothing() -> None:
    clock = Clock()
    assert ProgressBatch(1.0, clock).held(KEY, None) is None
    assert ProgressBatch(0.0, clock).held(KEY, ZERO) is None


def test_waits_are_per_trainjob_and_forgotten_with_it() -> None:
    clock = Clock()
    batch = ProgressBatch(2.0, clock)
    assert batch.held(KEY, ZERO) == 2.0
    clock.now += 1.5
    assert batch.held(("ns", "other"), ZERO) == 2.0, "another TrainJob's wait is its own"
    batch.forget(KEY)
    assert batch.held(KEY, ZERO) == 2.0, "a deleted TrainJob's wait does not carry over to its namesake"


def test_the_period_is_configured_as_a_go_duration_defaulting_to_one_second() -> None:
    assert Configuration().controller.progress_batch_seconds == 1.0
    config = Configuration.model_validate({"controller": {"progressBatchPeriod": "0s"}})
    assert config.controller.progress_batch_seconds == 0.0
