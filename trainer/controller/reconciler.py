"""Level-triggered reconciliation of TrainJobs: a work queue, workers, and one reconcile.

Watch events only say *which* TrainJob to look at; a worker then reads the TrainJob and
everything else from the cache, asks the render core what should exist, and writes the
difference. A key is never processed by two workers at once; a key added while it is being
processed is processed again afterwards. Failures retry with per-key exponential backoff.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeAlias, assert_never

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.controller import events
from trainer.controller.cache import Cache, TrainJobKey
from trainer.controller.client import ApiClient, ApiError, Throttled
from trainer.controller.metrics import CONTROLLER, Metrics, framework_of
from trainer.controller.resources import Resources
from trainer.controller.writer import StaleCache, Writer, WriteReport, status_patch
from trainer.runtime import conditions as cond
from trainer.runtime.framework import Framework
from trainer.runtime.info import controlled_by
from trainer.runtime.render import Event, Outcome, parse_time, render

logger = logging.getLogger("trainer.controller")
STATUS_RETRY_SECONDS = 0.5
# docs/decisions.md §batch: the status fields that only follow the children's progress.
PROGRESS_FIELDS = frozenset({"jobsStatus", "startTime"})


class Next(enum.Enum):
    """What a reconcile asks of the queue when it has no delay to give."""

    DONE = enum.auto()  # nothing until a watch event says something changed
    BACKOFF = enum.auto()  # a failure shown on status: look again after the key's growing backoff


@dataclass(frozen=True)
class After:
    """Look again after ``seconds`` (a deadline to check, a status write put off), failures forgotten."""

    seconds: float


Requeue: TypeAlias = Next | After


class ProgressBatch:
    """docs/decisions.md §batch: a status write that only follows the children's progress
    (``PROGRESS_FIELDS``) waits ``seconds``, as kube's Job controller batches its pods' updates:
    the first such change starts the wait, every later one folds into the one write at its end,
    and any other change (a condition) writes at once, the progress so far with it.

    Across TrainJobs, such writes go out at most ``qps`` a second (0: no limit): each wait that
    begins takes the next free slot, one ``1/qps`` after the last taken, so under a flood of
    progress the writes queue in the order their waits began and each carries all its TrainJob's
    steps since. A condition never takes a slot."""

    def __init__(
        self, seconds: float, qps: float = 0.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.seconds = seconds
        self.qps = qps
        self.clock = clock
        self._due: dict[TrainJobKey, float] = {}  # when each waiting TrainJob's write goes out
        self._began: dict[TrainJobKey, str] = {}  # when a wait for a first report began
        self._last_slot = -math.inf

    def held(self, key: TrainJobKey, patch: Obj | None, stamp: str = "") -> float | None:
        """Seconds this status patch still waits, or None to write it now. A wait that has run
        out stays run out until ``written``: a write the API server refused or the budget put
        off is retried without waiting again. ``stamp``, the reconcile's time, is kept as ``began``
        when the wait begins with the first report of the Jobs (a patch that sets startTime)."""
        if patch is None or not patch.keys() <= PROGRESS_FIELDS:
            return None
        if self.seconds <= 0 and self.qps <= 0:
            return None
        now = self.clock()
        due = self._due.get(key)
        if due is None:
            due = now + max(self.seconds, 0.0)
            if self.qps > 0:
                due = max(due, self._last_slot + 1.0 / self.qps)
                self._last_slot = due
            self._due[key] = due
            if patch.get("startTime") and stamp:
                self._began[key] = stamp
        left = due - now
        return left if left > 0 else None

    def waiting_on(self, key: TrainJobKey) -> bool:
        """Whether the TrainJob's progress write is waiting its turn (not yet due)."""
        due = self._due.get(key)
        return due is not None and due > self.clock()

    def began(self, key: TrainJobKey) -> str | None:
        """When the TrainJob's wait began (the ``now`` of the reconcile that first held it)."""
        return self._began.get(key) or None

    def written(self, key: TrainJobKey) -> None:
        """The status was written (or there was nothing to write): the next progress waits afresh.
        A slot given back before its time (a condition wrote first, the TrainJob went) that no
        one waits behind is given up: the next wait starts from the last slot still held, not
        from one nobody will use."""
        due = self._due.pop(key, None)
        self._began.pop(key, None)
        if due is not None and due >= self._last_slot and due > self.clock():
            # Given back before its time (a slot that was used stays taken: the spacing holds).
            self._last_slot = max(self._due.values(), default=-math.inf)

    def forget(self, key: TrainJobKey) -> None:
        """The TrainJob is gone: a namesake made later waits afresh."""
        self.written(key)

    @property
    def waiting(self) -> int:
        """How many TrainJobs have a status write waiting (a settled operator has none)."""
        return len(self._due)


class WorkQueue:
    """Deduplicating queue with delayed adds and per-key backoff (client-go's workqueue, small)."""

    def __init__(self, base_delay: float = 0.5, max_delay: float = 60.0) -> None:
        # client-go's workqueue metrics, when the operator gives its Metrics.
        self.metrics: Metrics | None = None
        self._queued_at: dict[TrainJobKey, float] = {}
        self._started_at: dict[TrainJobKey, float] = {}
        self._queue: asyncio.Queue[TrainJobKey] = asyncio.Queue()
        self._dirty: set[TrainJobKey] = set()
        self._processing: set[TrainJobKey] = set()
        self._failures: dict[TrainJobKey, int] = {}
        self._timers: dict[TrainJobKey, asyncio.TimerHandle] = {}
        self.base_delay = base_delay
        self.max_delay = max_delay

    def add(self, key: TrainJobKey) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if self.metrics is not None:
            self.metrics.wq_adds.labels(controller=CONTROLLER, name=CONTROLLER).inc()
        if key not in self._processing:
            self._put(key)

    def _put(self, key: TrainJobKey) -> None:
        self._queue.put_nowait(key)
        if self.metrics is not None:
            self._queued_at.setdefault(key, time.monotonic())
            self.metrics.wq_depth.labels(controller=CONTROLLER, name=CONTROLLER).set(self._queue.qsize())

    def add_after(self, key: TrainJobKey, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        timer = self._timers.get(key)
        when = asyncio.get_running_loop().time() + delay
        if timer is not None and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = asyncio.get_running_loop().call_at(when, self._fire, key)

    def _fire(self, key: TrainJobKey) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def scheduled(self, key: TrainJobKey) -> bool:
        """Whether a delayed add of the key is pending: it will be reconciled when that fires."""
        return key in self._timers

    def add_rate_limited(self, key: TrainJobKey) -> None:
        if self.metrics is not None:
            self.metrics.wq_retries.labels(controller=CONTROLLER, name=CONTROLLER).inc()
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        self.add_after(key, min(self.max_delay, self.base_delay * (2**failures)))

    def forget(self, key: TrainJobKey) -> None:
        self._failures.pop(key, None)

    async def get(self) -> TrainJobKey:
        key = await self._queue.get()
        self._dirty.discard(key)
        self._processing.add(key)
        if self.metrics is not None:
            now = time.monotonic()
            labels = {"controller": CONTROLLER, "name": CONTROLLER}
            self.metrics.wq_queue_seconds.labels(**labels).observe(now - self._queued_at.pop(key, now))
            self.metrics.wq_depth.labels(**labels).set(self._queue.qsize())
            self._started_at[key] = now
        return key

    def done(self, key: TrainJobKey) -> None:
        self._processing.discard(key)
        started = self._started_at.pop(key, None)
        if self.metrics is not None and started is not None:
            self.metrics.wq_work_seconds.labels(controller=CONTROLLER, name=CONTROLLER).observe(
                time.monotonic() - started
            )
        if key in self._dirty:
            self._put(key)

    def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    @property
    def idle(self) -> bool:
        return not self._dirty and not self._processing and self._queue.empty()


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    def __init__(
        self,
        client: ApiClient,
        cache: Cache,
        framework: Framework,
        resources: Resources,
        metrics: Metrics,
        recorder: events.Recorder,
        queue: WorkQueue,
    ) -> None:
        self.client = client
        self.recorder = recorder
        self.cache = cache
        self.framework = framework
        self.metrics = metrics
        self.resources = resources
        self.writer = Writer(client, cache, resources)
        self.queue = queue
        self.progress = ProgressBatch(0.0)  # docs/decisions.md §batch
        # TrainJob key -> uid of the TrainJob whose JobSet creation was counted: a JobSet
        # re-created for a running TrainJob is not another TrainJob created (nor a sample of the
        # creation-to-JobSet latency).
        self._counted: dict[TrainJobKey, str] = {}

    def deferring(self, key: TrainJobKey) -> bool:
        """docs/decisions.md §batch: whether a change that only moves the TrainJob's progress can
        wait for the reconcile already set for when its status write's turn comes (a timer is
        pending, and that reconcile reads the cache as it is then). Held, such a change would be
        a whole reconcile that ends by holding the write again."""
        return self.progress.waiting_on(key) and self.queue.scheduled(key)

    async def worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self.process(key)
            finally:
                self.queue.done(key)

    async def process(self, key: TrainJobKey) -> None:
        started = time.monotonic()
        active = self.metrics.cr_active.labels(controller=CONTROLLER)
        active.inc()
        try:
            requeue: Requeue = await self.reconcile(key)
        except StaleCache as exc:
            logger.debug("TrainJob %s/%s: %s", *key, exc)
            self.metrics.reconciles.labels(result="requeue").inc()
            self.metrics.cr_reconciles.labels(controller=CONTROLLER, result="requeue").inc()
            self.queue.add_after(key, 0.5)
        except ApiError as exc:
            self._failed(key, f"the API server refused a write: {exc}")
        except Exception as exc:  # a bug must not stop the other TrainJobs; it is retried and logged
            logger.exception("TrainJob %s/%s: reconcile failed", *key)
            self._failed(key, f"{type(exc).__name__}: {exc}")
        else:
            self.metrics.reconciles.labels(result="success").inc()
            if (
                requeue is Next.BACKOFF
            ):  # a failure shown on status: an error, as controller-runtime counts one
                self.metrics.cr_reconciles.labels(controller=CONTROLLER, result="error").inc()
                self.metrics.cr_errors.labels(controller=CONTROLLER).inc()
            else:
                result = "requeue_after" if isinstance(requeue, After) else "success"
                self.metrics.cr_reconciles.labels(controller=CONTROLLER, result=result).inc()
            match requeue:
                case Next.DONE:
                    self.queue.forget(key)
                case Next.BACKOFF:
                    self.queue.add_rate_limited(key)
                case After(seconds):
                    self.queue.forget(key)
                    self.queue.add_after(key, seconds)
                case _:
                    assert_never(requeue)
        finally:
            active.dec()
            elapsed = time.monotonic() - started
            self.metrics.reconcile_seconds.observe(elapsed)
            self.metrics.cr_time.labels(controller=CONTROLLER).observe(elapsed)

    def _failed(self, key: TrainJobKey, message: str) -> None:
        logger.warning("TrainJob %s/%s: %s", key[0], key[1], events.scrub(message))
        self.metrics.reconciles.labels(result="error").inc()
        self.metrics.reconcile_errors.inc()
        self.metrics.cr_reconciles.labels(controller=CONTROLLER, result="error").inc()
        self.metrics.cr_errors.labels(controller=CONTROLLER).inc()
        self.queue.add_rate_limited(key)

    async def reconcile(self, key: TrainJobKey) -> Requeue:
        """One reconcile of one TrainJob; what it returns says when to look at the TrainJob again."""
        trainjob = self.cache.trainjob(key)
        if trainjob is None or trainjob["metadata"].get("deletionTimestamp"):
            self._counted.pop(key, None)
            self.progress.forget(key)
            return Next.DONE
        now = utc_now()
        outcome = render(trainjob, self.cache, self.framework, now)
        if outcome.skipped:
            return Next.DONE
        if outcome.conflict is not None:
            self._forget_unwatched(outcome.conflict)
        report = WriteReport()
        write_error: ApiError | None = None
        try:
            await self.writer.apply(outcome.objects, report)
            for kind, namespace, name in outcome.delete:
                # Only a child this TrainJob controls (docs/decisions.md §11), and only that
                # incarnation of it: the uid is the delete's precondition.
                observed = self.cache.get(kind, namespace, name)
                if observed is not None and controlled_by(observed, trainjob):
                    await self.writer.delete(observed, report)
            for child in outcome.rebuild:
                # docs/decisions.md §resize: its dependents (the Jobs) go first, so the one built
                # in its place never finds Jobs of the old one under their names.
                await self.writer.delete(child, report, propagation="Foreground")
        except ApiError as exc:
            # docs/decisions.md §3: objects refused by the API server show on status too.
            write_error = exc
            outcome = _with_write_error(outcome, trainjob, str(exc))
        patch = status_patch(trainjob.get("status"), outcome.status)
        held = None if outcome.expired else self.progress.held(key, patch, now)
        if held is not None:
            self._tell(trainjob, outcome, report, status_written=False)
            if write_error is not None or outcome.error is not None:
                # The error is already on status; a child that could not be written is tried
                # again on the failure's backoff, not when this progress write's turn comes.
                return Next.BACKOFF
            return After(min(held, outcome.requeue_after if outcome.requeue_after is not None else held))
        began = self.progress.began(key)
        if began and patch and patch.get("startTime") and outcome.status:
            # The first report of the Jobs waited its turn to be written (a condition may have come
            # meanwhile): the Jobs started when the reconcile that began the wait saw them.
            outcome.status["startTime"] = min(began, str(patch["startTime"]))
        try:
            await self.writer.write_status(trainjob, outcome.status, report, wait=False)
            self.progress.written(key)
        except Throttled:
            # The budget goes to children first (they unblock jobs); the status is computed
            # again, from then-current facts, when the key comes back.
            self._tell(trainjob, outcome, report, status_written=False)
            return After(STATUS_RETRY_SECONDS)
        except ApiError:
            self._tell(trainjob, outcome, report, status_written=False)  # the children were written
            raise
        if outcome.expired:
            # docs/decisions.md §ttl: finished, and its TTL ran out.
            await self.writer.delete_trainjob(trainjob, report)
        self._tell(trainjob, outcome, report)
        if outcome.expired:
            return Next.DONE
        if write_error is not None or outcome.error is not None:
            return Next.BACKOFF
        return After(outcome.requeue_after) if outcome.requeue_after is not None else Next.DONE

    def _forget_unwatched(self, obj: Obj) -> None:
        """An object in the way of a child that no watch follows (it lacks the label ours are
        selected by: it was read by name after a create met it) is dropped from the cache, so
        the retry looks again by name and goes on once it is gone (docs/decisions.md §11)."""
        meta = obj.get("metadata") or {}
        resource = self.resources.writable.get((obj.get("apiVersion", ""), obj.get("kind", "")))
        watched = resource is not None and resource.watched
        if resource is None or (
            watched and (resource.label is None or resource.label in (meta.get("labels") or {}))
        ):
            return  # watched: its deletion is an event of its own
        self.cache.forget(obj["kind"], meta.get("namespace"), meta["name"], Cache.group_of(obj))

    def _tell(
        self, trainjob: Obj, outcome: Outcome, report: WriteReport, *, status_written: bool = True
    ) -> None:
        """Events and metrics for what changed; nothing for a reconcile that changed nothing.

        Condition changes are told once their status is written (a put-off status write tells
        them on the reconcile that writes it).
        """
        framework = framework_of(outcome.framework_label)
        before = (trainjob.get("status") or {}).get("conditions") or []
        after = (outcome.status or {}).get("conditions") or [] if status_written else before
        notes: list[tuple[str, str, str]] = []
        for obj in report.created:
            if obj["kind"] == c.JOBSET_KIND:
                # Logged, not posted: an Event for every TrainJob's start would be a request
                # upstream does not make (docs/decisions.md §events).
                self.recorder.record(
                    trainjob,
                    "Normal",
                    "JobSetCreated",
                    f"Created JobSet {obj['metadata']['name']}",
                    post=False,
                )
                meta = trainjob["metadata"]
                key = (meta.get("namespace") or "default", meta["name"])
                if self._counted.get(key) == meta.get("uid"):
                    continue
                self._counted[key] = meta.get("uid", "")
                self.metrics.created.labels(framework=framework).inc()
                created = meta.get("creationTimestamp")
                if created:
                    self.metrics.creation_to_jobset.observe(
                        max(0.0, (datetime.now(UTC) - parse_time(created)).total_seconds())
                    )
        for kind, _, name in report.deleted:
            notes.append(("Normal", f"{kind}Deleted", f"Deleted {kind} {name}"))
        transitions = {
            (c.COND_SUSPENDED, "True"): ("Normal", "TrainJobSuspended"),
            (c.COND_SUSPENDED, "False"): ("Normal", "TrainJobResumed"),
            (c.COND_COMPLETE, "True"): ("Normal", "TrainJobCompleted"),
            (c.COND_FAILED, "True"): ("Warning", "TrainJobFailed"),
        }
        for new in after:
            old = cond.find(before, new["type"])
            if (
                old is not None
                and old.get("status") == new.get("status")
                and old.get("message") == new.get("message")
            ):
                continue
            if (new["type"], new["status"]) in transitions:
                type_, reason = transitions[(new["type"], new["status"])]
                notes.append((type_, reason, new.get("message", "")))
                if new["type"] == c.COND_COMPLETE:
                    self.metrics.completed.labels(framework=framework).inc()
                elif new["type"] == c.COND_FAILED:
                    self.metrics.failed.labels(framework=framework).inc()
            elif new["type"] == c.COND_RECONCILE_FAILED:
                for event in outcome.events:
                    notes.append((event.type, event.reason, event.message))
        for type_, reason, message in notes:
            self.recorder.record(trainjob, type_, reason, message)


def _with_write_error(outcome: Outcome, trainjob: Obj, message: str) -> Outcome:
    """docs/decisions.md §3: objects the API server refused show on status, with their Event's message."""
    status = dict(outcome.status or {})
    conditions = [dict(x) for x in status.get("conditions") or []]
    short = message if len(message) <= 950 else message[:950] + " ..."
    event_message = events.scrub(f"TrainJob resources reconciliation failed: {short}")
    cond.set_condition(
        conditions,
        {
            "type": c.COND_RECONCILE_FAILED,
            "status": "True",
            "reason": "ResourcesRefused",
            "message": event_message,
        },
        utc_now(),
    )
    status["conditions"] = conditions
    outcome.status = status
    outcome.events.append(Event("Warning", "TrainJobResourcesCreationFailed", event_message))
    return outcome
