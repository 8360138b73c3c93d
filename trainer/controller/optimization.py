"""The OptimizationJob controller: the I/O around :func:`trainer.optimization.plan.plan`.

A reconcile reads the OptimizationJob and its trials from the cache (the trials are TrainJobs, which
the operator watches anyway), asks ``plan`` what to do, creates the trials it names, and writes the
status it gives when that differs from the stored one. Nothing is remembered between reconciles but
which failed trials were told of in an Event, so a restart neither loses nor duplicates a trial
(docs/optimization.md, "The controller").

The trials it creates go into the cache and onto the TrainJob work queue at once: the watch's echo
of a create is not queued again (controller/routing.py), and the TrainJob reconciler is the one
that runs them. A trial's own changes (its status, its deletion) queue its OptimizationJob, by its
controller reference.

What goes wrong waits with a growing delay, and says so: a create the API server refuses (a
runtime deleted since admission, a quota) is on the Running condition and in a Warning Event; a
trial's name taken by a TrainJob the cache has not seen yet is looked at again; and a search is
never ended on a cache that holds fewer trials than its stored status counted (a new leader whose
TrainJob watch runs behind its OptimizationJob watch).
"""

from __future__ import annotations

import asyncio
import copy
import logging

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.controller import events
from trainer.controller.cache import Cache, TrainJobKey
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.reconciler import WorkQueue, utc_now
from trainer.controller.resources import OPTIMIZATIONJOBS, TRAINJOBS
from trainer.controller.writer import FIELD_MANAGER, status_patch
from trainer.optimization import plan as planning
from trainer.optimization.search import trial_name
from trainer.runtime import conditions as cond

logger = logging.getLogger("trainer.operator")

# The reason on the Running condition while the API server refuses to create a trial.
REASON_CREATE_REFUSED = "TrialCreateRefused"
MAX_MESSAGE = 1000


def optimizationjob_of(obj: Obj) -> TrainJobKey | None:
    """The OptimizationJob a TrainJob is a trial of: its controller reference's, in its namespace."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if (
            isinstance(ref, dict)
            and ref.get("controller") is True
            and ref.get("kind") == c.OPTIMIZATIONJOB_KIND
            and str(ref.get("apiVersion", "")).split("/")[0] == c.GROUP
            and ref.get("name")
        ):
            return (meta.get("namespace") or "default", str(ref["name"]))
    return None


def trials_in(cache: Cache, optimizationjob: Obj) -> list[Obj]:
    """The TrainJobs that hold this OptimizationJob's trial names, whoever made them: ``plan`` takes
    as trials those its uid controls, and waits for a name another holds (labelled or not). A
    lookup per name: at most numTrials (100), whatever the number of TrainJobs cached."""
    meta = optimizationjob["metadata"]
    namespace = meta.get("namespace") or "default"
    name = str(meta["name"])
    count = int((optimizationjob.get("spec") or {}).get("numTrials") or 1)
    found = (cache.trainjobs.get((namespace, trial_name(name, i))) for i in range(count))
    return [trainjob for trainjob in found if trainjob is not None]


class OptimizationReconciler:
    """Runs the searches: one work queue of OptimizationJob keys, its worker started and stopped
    with the TrainJob workers (while this replica leads), writing through the same fenced client."""

    def __init__(
        self, client: ApiClient, cache: Cache, recorder: events.Recorder, trainjobs: WorkQueue
    ) -> None:
        self.client = client
        self.cache = cache
        self.recorder = recorder
        self.trainjobs = trainjobs  # the TrainJob reconciler's queue: a trial created runs there
        self.queue = WorkQueue(base_delay=1.0)
        # OptimizationJob uid -> the failed trials an Event has told of, while this replica leads.
        self._told: dict[str, set[str]] = {}

    def started(self) -> None:
        """This replica leads (again): another may have told of failures meanwhile (``_tell``)."""
        self._told.clear()

    def queue_all(self) -> None:
        """Every OptimizationJob cached: a replica that starts leading looks at each search."""
        for obj in list(self.cache.of_kind(c.OPTIMIZATIONJOB_KIND)):
            meta = obj.get("metadata") or {}
            self.queue.add((meta.get("namespace") or "default", meta["name"]))

    async def worker(self) -> None:
        """Steps the searches one at a time: they are few, and a step is a handful of writes."""
        while True:
            key = await self.queue.get()
            try:
                retry = await self.reconcile(key)
            except ApiError as exc:
                logger.warning("OptimizationJob %s/%s: %s", *key, events.scrub(str(exc)))
                self.queue.add_rate_limited(key)
            except Exception:  # a bug must not stop the other searches; retried with backoff
                logger.exception("OptimizationJob %s/%s: reconcile failed", *key)
                self.queue.add_rate_limited(key)
            else:
                if retry:
                    self.queue.add_rate_limited(key)
                else:
                    self.queue.forget(key)
            finally:
                self.queue.done(key)

    async def reconcile(self, key: TrainJobKey) -> bool:
        """One step of one search; True to look again after a growing delay (a create met its
        name taken or was refused, or the cache is behind the stored status)."""
        namespace, name = key
        optimizationjob = self.cache.get(c.OPTIMIZATIONJOB_KIND, namespace, name, c.GROUP)
        if optimizationjob is None or optimizationjob["metadata"].get("deletionTimestamp"):
            return False  # its trials go by garbage collection
        now = utc_now()
        try:
            step = await self._plan(optimizationjob, now)
        except ValueError as exc:  # admission refuses such an object: only one stored before it
            logger.warning("OptimizationJob %s/%s: cannot plan: %s", namespace, name, events.scrub(str(exc)))
            return False
        retry = False
        refused: ApiError | None = None
        for trial in step.create:
            try:
                stored = await self.client.create(
                    TRAINJOBS.type, namespace, trial, field_manager=FIELD_MANAGER
                )
            except ApiError as exc:
                # 409: ours with the watch behind, or another's, which the next plan waits for.
                retry = True
                refused = exc if exc.code != 409 else None
                break
            stored.setdefault("apiVersion", c.API_VERSION)
            stored.setdefault("kind", c.TRAINJOB_KIND)
            self.cache.observe(stored)
            self.trainjobs.add((namespace, stored["metadata"]["name"]))
        if step.create:
            # The status counts the trials that exist: those just created, as the next plan sees them.
            step = await self._plan(optimizationjob, now)
        counted = ((optimizationjob.get("status") or {}).get("trials") or {}).get("created") or 0
        if step.finished and len(trials_in(self.cache, optimizationjob)) < counted:
            # An end seen on a cache without trials the stored status counted: the TrainJob watch
            # is behind (a new leader's). An end is final, so it waits for them.
            return True
        status = step.status if refused is None else _with_refusal(step.status, refused, now)
        await self._write_status(optimizationjob, status)
        self._tell(optimizationjob, step)
        return retry

    async def _plan(self, optimizationjob: Obj, now: str) -> planning.Plan:
        """``plan`` on the cache's objects; a TPE search's off the event loop, on copies: optuna's
        model of up to 100 trials takes a while, and the loop renews the Lease."""
        trials = trials_in(self.cache, optimizationjob)
        algorithm = (optimizationjob.get("spec") or {}).get("searchAlgorithm") or {}
        if algorithm.get("tpe") is None:
            return planning.plan(optimizationjob, trials, now)
        return await asyncio.to_thread(
            planning.plan, copy.deepcopy(optimizationjob), copy.deepcopy(trials), now
        )

    async def _write_status(self, optimizationjob: Obj, desired: Obj) -> None:
        """Patch the status when it differs (the resourceVersion a precondition), and tell of what
        it changed: a refused create, the search's end."""
        patch = status_patch(optimizationjob.get("status"), desired)
        if patch is None:
            return
        meta = optimizationjob["metadata"]
        before = optimizationjob.get("status") or {}
        stored = await self.client.patch(
            OPTIMIZATIONJOBS.type,
            meta.get("namespace"),
            meta["name"],
            {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": patch},
            subresource="status",
        )
        stored.setdefault("apiVersion", c.API_VERSION)
        stored.setdefault("kind", c.OPTIMIZATIONJOB_KIND)
        self.cache.observe(stored)
        running = cond.find(desired.get("conditions"), planning.RUNNING) or {}
        if running.get("reason") == REASON_CREATE_REFUSED and running.get("message") != (
            cond.find(before.get("conditions"), planning.RUNNING) or {}
        ).get("message"):
            self.recorder.record(stored, "Warning", REASON_CREATE_REFUSED, str(running.get("message") or ""))
        for type_, event_type, reason in (
            (planning.SUCCEEDED, "Normal", "OptimizationJobSucceeded"),
            (planning.FAILED, "Warning", "OptimizationJobFailed"),
        ):
            if cond.is_true(desired.get("conditions"), type_) and not cond.is_true(
                before.get("conditions"), type_
            ):
                found = cond.find(desired.get("conditions"), type_) or {}
                self.recorder.record(stored, event_type, reason, str(found.get("message") or ""))

    def _tell(self, optimizationjob: Obj, step: planning.Plan) -> None:
        """An Event for each failed trial not told of yet. A replica that starts leading takes the
        failures as told when the stored status counts them all (a restart does not repeat them);
        when it counts fewer, it cannot know which were told, and tells them all."""
        uid = str(optimizationjob["metadata"].get("uid") or "")
        told = self._told.get(uid)
        if told is None:
            counted = ((optimizationjob.get("status") or {}).get("trials") or {}).get("failed") or 0
            everything = counted == len(step.failures)
            told = self._told[uid] = {f.trial for f in step.failures} if everything else set()
        for failure in step.failures:
            if failure.trial in told:
                continue
            told.add(failure.trial)
            self.recorder.record(
                optimizationjob,
                "Warning",
                "TrialFailed",
                f"trial {failure.trial}: {failure.reason}: {failure.message}",
            )

    def forget(self, uid: str) -> None:
        """The OptimizationJob is gone: what was told of it goes too."""
        self._told.pop(uid, None)


def _with_refusal(status: Obj, refused: ApiError, now: str) -> Obj:
    """The status with the API server's refusal of a trial on its Running condition, as a
    TrainJob shows a child the server refused (docs/decisions.md §3)."""
    status = copy.deepcopy(status)
    message = events.scrub(f"the API server refused to create a trial: {refused}")
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 4] + " ..."
    cond.set_condition(
        status["conditions"],
        {
            "type": planning.RUNNING,
            "status": "True",
            "reason": REASON_CREATE_REFUSED,
            "message": message,
        },
        now,
    )
    return status
