"""docs/decisions.md §batch: status writes that only follow the children's progress are batched;
every other status change is written at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from trainer.api.objects import Obj
from trainer.controller import events
from trainer.controller import reconciler as reconciler_module
from trainer.controller.cache import Cache
from trainer.controller.client import Throttled
from trainer.controller.config import Configuration
from trainer.controller.metrics import Metrics
from trainer.controller.reconciler import After, Next, ProgressBatch, Reconciler, WorkQueue
from trainer.controller.resources import Resources
from trainer.runtime import framework as fw
from trainer.runtime.render import Outcome


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
    batch = ProgressBatch(1.0, clock=clock)
    assert batch.held(KEY, ZERO) == 1.0, "the first progress starts the wait"
    clock.now += 0.4
    assert batch.held(KEY, ACTIVE) == pytest.approx(0.6), (
        "later progress waits for the same end, not a new one"
    )
    clock.now += 0.6
    assert batch.held(KEY, ACTIVE) is None, "at the end: written"
    assert batch.held(KEY, ACTIVE) is None, "and until the write is done, not held again"
    batch.written(KEY)
    assert batch.held(KEY, ZERO) == 1.0, "the next progress waits afresh"


def test_a_condition_writes_at_once_and_ends_the_wait() -> None:
    clock = Clock()
    batch = ProgressBatch(1.0, clock=clock)
    assert batch.held(KEY, ZERO) == 1.0
    complete = {**ACTIVE, "conditions": [{"type": "Complete", "status": "True"}]}
    assert batch.held(KEY, complete) is None
    batch.written(KEY)
    clock.now += 0.1
    assert batch.held(KEY, ZERO) == 1.0, "the wait began again: the earlier one ended with the write"


def test_nothing_to_write_and_a_zero_period_hold_nothing() -> None:
    clock = Clock()
    assert ProgressBatch(1.0, clock=clock).held(KEY, None) is None
    assert ProgressBatch(0.0, clock=clock).held(KEY, ZERO) is None


def test_waits_are_per_trainjob_and_forgotten_with_it() -> None:
    clock = Clock()
    batch = ProgressBatch(2.0, clock=clock)
    assert batch.held(KEY, ZERO) == 2.0
    clock.now += 1.5
    assert batch.held(("ns", "other"), ZERO) == 2.0, "another TrainJob's wait is its own"
    batch.forget(KEY)
    assert batch.held(KEY, ZERO) == 2.0, "a deleted TrainJob's wait does not carry over to its namesake"


def test_across_trainjobs_progress_writes_keep_to_the_rate_in_the_order_their_waits_began() -> None:
    clock = Clock()
    batch = ProgressBatch(1.0, 10.0, clock=clock)
    keys = [("ns", f"tj-{i}") for i in range(20)]
    assert [batch.held(k, ZERO) for k in keys[:3]] == pytest.approx([1.0, 1.1, 1.2]), (
        "waits begun together go out a tenth of a second apart at 10 a second"
    )
    for k in keys[3:]:
        batch.held(k, ZERO)  # the last of the 20 goes out at 2.9 s
    clock.now += 1.05
    assert batch.held(keys[0], ACTIVE) is None, "the first slot has come"
    assert batch.held(keys[2], ACTIVE) == pytest.approx(0.15), "later progress keeps its slot"
    batch.written(keys[0])
    assert batch.held(keys[0], ZERO) == pytest.approx(1.95), (
        "a new wait queues behind those already taken (3.0 s), not at its own second (2.05 s)"
    )
    clock.now += 10
    assert batch.held(("ns", "late"), ZERO) == 1.0, "once the queue has drained, a wait is the period"


def test_a_condition_takes_no_slot_and_a_zero_period_waits_only_for_the_rate() -> None:
    clock = Clock()
    batch = ProgressBatch(0.0, 10.0, clock=clock)
    complete = {**ACTIVE, "conditions": [{"type": "Complete", "status": "True"}]}
    assert batch.held(("ns", "a"), complete) is None
    assert batch.held(("ns", "b"), ZERO) is None, "no one ahead: at once, though it took a slot"
    assert batch.held(("ns", "c"), ZERO) == pytest.approx(0.1), "one ahead in the same instant"
    assert batch.held(("ns", "d"), complete) is None, "a condition is never queued"
    assert ProgressBatch(0.0, 0.0, clock=clock).held(KEY, ZERO) is None, "both off: every step at once"


def test_the_period_is_configured_as_a_go_duration_defaulting_to_one_second() -> None:
    assert Configuration().controller.progress_batch_seconds == 1.0
    config = Configuration.model_validate({"controller": {"progressBatchPeriod": "0s"}})
    assert config.controller.progress_batch_seconds == 0.0


def test_the_rate_defaults_to_ten_a_second_and_a_negative_one_is_refused_naming_the_field() -> None:
    assert Configuration().controller.progress_qps == 10.0
    assert Configuration.model_validate({"controller": {"progressQPS": 0}}).controller.progress_qps == 0.0
    with pytest.raises(ValueError, match="progressQPS"):
        Configuration.model_validate({"controller": {"progressQPS": -1}})


# --- the reconciler's use of it: a stubbed render core, a client that records status patches ---


class StatusClient:
    """Records each status patch and answers as the API server would; ``throttle`` refuses the
    next so many for want of budget, as the client does when a write asks not to wait."""

    def __init__(self) -> None:
        self.patches: list[Obj] = []
        self.throttle = 0

    async def patch(self, rtype: Any, namespace: str | None, name: str, body: Obj, **kwargs: Any) -> Obj:
        if self.throttle:
            self.throttle -= 1
            raise Throttled()
        self.patches.append(body["status"])
        rv = str(len(self.patches) + 1)
        return {
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv},
            "status": body["status"],
        }


def _reconciler(
    monkeypatch: pytest.MonkeyPatch, seconds: float
) -> tuple[Reconciler, StatusClient, list[Obj]]:
    """A Reconciler whose render core returns the next status of ``wanted`` (a list the test
    appends to), for one TrainJob in its cache."""
    client = StatusClient()
    cache = Cache()
    cache.observe(
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "tj", "namespace": "ns", "uid": "u", "resourceVersion": "1"},
            "spec": {},
        }
    )
    wanted: list[Obj] = []
    monkeypatch.setattr(reconciler_module, "render", lambda *args: Outcome(status=wanted[-1]))
    framework = fw.load(fw.PluginConfig())
    reconciler = Reconciler(
        client,  # type: ignore[arg-type]
        cache,
        framework,
        Resources.of(framework),
        Metrics(),
        events.Recorder(client),  # type: ignore[arg-type]
        WorkQueue(),
    )
    reconciler.progress.seconds = seconds
    return reconciler, client, wanted


def _stamping_render(monkeypatch: pytest.MonkeyPatch, wanted: list[Obj], *times: str) -> None:
    """The reconciler's clock reads ``times`` in turn, and its render core stamps startTime with
    the reconcile's now, as the real one does on a first report of the Jobs."""
    clock = iter(times)
    monkeypatch.setattr(reconciler_module, "utc_now", lambda: next(clock))
    monkeypatch.setattr(
        reconciler_module,
        "render",
        lambda tj, cache, fw, now: Outcome(status={**wanted[-1], "startTime": now}),
    )


def test_progress_seen_within_the_period_is_one_write_and_a_condition_is_written_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        reconciler, client, wanted = _reconciler(monkeypatch, 0.3)
        wanted.append(ZERO)
        first = await reconciler.reconcile(KEY)
        assert client.patches == [] and isinstance(first, After) and 0 < first.seconds <= 0.3 + 1e-6
        wanted.append(ACTIVE)
        assert isinstance(await reconciler.reconcile(KEY), After), "still within the wait"
        await asyncio.sleep(0.31)
        assert await reconciler.reconcile(KEY) is Next.DONE
        assert client.patches == [ACTIVE], "one write, with the latest progress"
        done = {**ACTIVE, "conditions": [{"type": "Complete", "status": "True"}]}
        wanted.append(done)
        assert await reconciler.reconcile(KEY) is Next.DONE
        assert client.patches[-1] == {"conditions": done["conditions"]}, "a condition does not wait"

    asyncio.run(scenario())


def test_a_write_put_off_by_the_budget_is_retried_without_waiting_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        reconciler, client, wanted = _reconciler(monkeypatch, 0.2)
        wanted.append(ZERO)
        await reconciler.reconcile(KEY)
        await asyncio.sleep(0.21)
        client.throttle = 1
        retry = await reconciler.reconcile(KEY)
        assert isinstance(retry, After) and client.patches == []
        assert reconciler.progress.waiting == 1
        assert await reconciler.reconcile(KEY) is Next.DONE, "written at once: its wait had run out"
        assert client.patches == [ZERO] and reconciler.progress.waiting == 0

    asyncio.run(scenario())


def test_with_a_zero_period_every_step_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        reconciler, client, wanted = _reconciler(monkeypatch, 0.0)
        for status in (ZERO, ACTIVE):
            wanted.append(status)
            await reconciler.reconcile(KEY)
        assert len(client.patches) == 2

    asyncio.run(scenario())


def test_a_first_report_that_waited_gives_the_start_time_it_was_seen_at_not_the_write_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        reconciler, client, wanted = _reconciler(monkeypatch, 0.2)
        _stamping_render(
            monkeypatch, wanted, "2026-11-27T10:00:00Z", "2026-11-27T10:00:30Z", "2026-11-27T10:01:00Z"
        )
        wanted.append(ZERO)
        assert isinstance(await reconciler.reconcile(KEY), After)
        wanted.append({"jobsStatus": ACTIVE["jobsStatus"]})
        assert isinstance(await reconciler.reconcile(KEY), After)
        await asyncio.sleep(0.21)
        assert await reconciler.reconcile(KEY) is Next.DONE
        assert client.patches == [
            {"jobsStatus": ACTIVE["jobsStatus"], "startTime": "2026-11-27T10:00:00Z"}
        ], "the latest progress, started when the first report was seen (not 10:01, when it went out)"

    asyncio.run(scenario())


def test_slots_given_back_early_do_not_hold_later_waits() -> None:
    clock = Clock()
    batch = ProgressBatch(1.0, 10.0, clock=clock)
    keys = [("ns", f"gone-{i}") for i in range(100)]
    for key in keys:
        batch.held(key, ZERO)  # the last slot is 10.9 s away
    for key in keys:
        batch.forget(key)  # the TrainJobs went (or a condition wrote their status first)
    clock.now += 5
    assert batch.held(KEY, ZERO) == 1.0, "no one waits: the period alone, not the slot after 100 gone"
    assert batch.held(("ns", "next"), ZERO) == pytest.approx(1.1), "and the next queues behind it"
    batch.written(("ns", "next"))
    assert batch.held(("ns", "after"), ZERO) == pytest.approx(1.1), "a slot given back from the end is reused"


def test_only_a_wait_for_the_first_report_keeps_when_it_began() -> None:
    batch = ProgressBatch(1.0, clock=Clock())
    batch.held(KEY, ZERO, "2026-11-27T10:00:00Z")  # progress of a suspended TrainJob: no startTime
    assert batch.began(KEY) is None
    batch.written(KEY)
    batch.held(KEY, ACTIVE, "2026-11-27T10:00:05Z")
    assert batch.began(KEY) == "2026-11-27T10:00:05Z"


def test_a_first_report_still_waiting_when_the_trainjob_finishes_keeps_its_start_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        reconciler, client, wanted = _reconciler(monkeypatch, 5.0)
        _stamping_render(monkeypatch, wanted, "2026-11-27T10:00:00Z", "2026-11-27T10:01:00Z")
        wanted.append(ZERO)
        assert isinstance(await reconciler.reconcile(KEY), After), "the first report waits its turn"
        wanted.append({**ZERO, "conditions": [{"type": "Complete", "status": "True"}]})
        assert await reconciler.reconcile(KEY) is Next.DONE, "a condition is written at once"
        assert client.patches[-1]["startTime"] == "2026-11-27T10:00:00Z", (
            "started when first seen, not at the end"
        )

    asyncio.run(scenario())


def test_a_failed_child_write_is_retried_on_its_backoff_not_at_the_progress_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario() -> None:
        reconciler, client, wanted = _reconciler(monkeypatch, 60.0)
        monkeypatch.setattr(
            reconciler_module,
            "render",
            lambda *args: Outcome(status=wanted[-1], error="the ConfigMap was refused"),
        )
        wanted.append(ZERO)
        assert await reconciler.reconcile(KEY) is Next.BACKOFF
        assert client.patches == [], "the progress still waits its turn"

    asyncio.run(scenario())


def test_a_slot_that_was_used_stays_taken() -> None:
    clock = Clock()
    batch = ProgressBatch(0.0, 2.0, clock=clock)
    assert batch.held(("ns", "a"), ZERO) is None, "no one ahead: at once"
    batch.written(("ns", "a"))
    assert batch.held(("ns", "b"), ZERO) == pytest.approx(0.5), "the next is spaced from the write that went"
