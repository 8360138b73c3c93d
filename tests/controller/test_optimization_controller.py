"""The OptimizationJob controller's I/O around ``plan`` (trainer/controller/optimization.py), with a
client that records what it is asked and answers as the API server would: what one step creates
and writes, and what it does when a create is refused or the cache is behind."""

from __future__ import annotations

import asyncio
import copy
import itertools
from typing import Any

from optimization_helpers import finish, optimizationjob

from trainer.api import constants as c
from trainer.controller.cache import Cache
from trainer.controller.client import ApiError, ResourceType
from trainer.controller.optimization import REASON_CREATE_REFUSED, OptimizationReconciler
from trainer.controller.reconciler import WorkQueue
from trainer.runtime import conditions as cond

Obj = dict[str, Any]
KEY = ("default", "tune")


class Client:
    """Creates and status patches, as the API server answers them; ``refuse`` maps a trial's name
    to the error its create meets."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache  # where the stored OptimizationJob is, for a patch's answer
        self.creates: list[Obj] = []
        self.patches: list[Obj] = []
        self.refuse: dict[str, ApiError] = {}
        self._versions = itertools.count(100)

    async def create(self, rtype: ResourceType, namespace: str | None, obj: Obj, **_: Any) -> Obj:
        name = obj["metadata"]["name"]
        if name in self.refuse:
            raise self.refuse[name]
        self.creates.append(obj)
        stored = copy.deepcopy(obj)
        stored["metadata"].update(uid=f"uid-{name}", resourceVersion=str(next(self._versions)))
        return stored

    async def patch(self, rtype: ResourceType, namespace: str | None, name: str, body: Obj, **_: Any) -> Obj:
        """A merge patch of the status subresource, answered with the whole object."""
        self.patches.append(body)
        stored = copy.deepcopy(self.cache.get(c.OPTIMIZATIONJOB_KIND, namespace, name, c.GROUP))
        assert stored is not None
        status = stored.setdefault("status", {})
        for field, value in body["status"].items():
            if value is None:
                status.pop(field, None)
            else:
                status[field] = value
        stored["metadata"]["resourceVersion"] = str(next(self._versions))
        return stored


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, obj: Obj, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


def controller(search: Obj, *trials: Obj) -> tuple[OptimizationReconciler, Client, Recorder, Cache]:
    cache = Cache()
    cache.observe(copy.deepcopy(search))
    for trial in trials:
        cache.observe(copy.deepcopy(trial))
    client, recorder = Client(cache), Recorder()
    reconciler = OptimizationReconciler(client, cache, recorder, WorkQueue())  # type: ignore[arg-type]
    return reconciler, client, recorder, cache


def stored_search(**spec: Any) -> Obj:
    search = optimizationjob(**spec)
    search["metadata"]["resourceVersion"] = "1"
    return search


def step(reconciler: OptimizationReconciler) -> bool:
    return asyncio.run(reconciler.reconcile(KEY))


def test_a_step_creates_the_first_wave_queues_it_and_counts_it_in_one_status_write() -> None:
    reconciler, client, _, cache = controller(stored_search(numTrials=5, parallelTrials=2))
    assert step(reconciler) is False
    assert [t["metadata"]["name"] for t in client.creates] == ["tune-trial-0", "tune-trial-1"]
    assert reconciler.trainjobs._dirty == {("default", "tune-trial-0"), ("default", "tune-trial-1")}, (
        "the TrainJob reconciler runs them: their watch echo queues nothing"
    )
    assert len(client.patches) == 1
    assert client.patches[0]["status"]["trials"] == {"created": 2, "running": 2, "succeeded": 0, "failed": 0}
    assert client.patches[0]["metadata"] == {"resourceVersion": "1"}, "the precondition"
    assert cache.trainjob(("default", "tune-trial-0")) is not None


def test_a_trial_name_met_taken_is_looked_at_again_with_backoff() -> None:
    reconciler, client, _, _ = controller(stored_search(numTrials=2, parallelTrials=2))
    client.refuse["tune-trial-1"] = ApiError(409, {"reason": "AlreadyExists", "message": "exists"})
    assert step(reconciler) is True
    assert [t["metadata"]["name"] for t in client.creates] == ["tune-trial-0"]
    assert client.patches[0]["status"]["trials"]["created"] == 1, "only what exists is counted"


def test_a_refused_create_shows_on_the_running_condition_and_is_told_once() -> None:
    reconciler, client, recorder, _ = controller(stored_search(numTrials=2))
    client.refuse["tune-trial-0"] = ApiError(
        400,
        {"reason": "BadRequest", "message": 'admission webhook denied the request: runtime "gone" not found'},
    )
    assert step(reconciler) is True
    running = cond.find(client.patches[0]["status"]["conditions"], "Running")
    assert running is not None and running["reason"] == REASON_CREATE_REFUSED
    assert 'runtime "gone" not found' in running["message"]
    assert [e[:2] for e in recorder.events] == [("Warning", REASON_CREATE_REFUSED)]
    # The next step meets the same refusal: the status (stored now) is as it was, and not told again.
    assert step(reconciler) is True
    assert len(client.patches) == 1 and len(recorder.events) == 1


def test_a_search_is_not_ended_on_a_cache_behind_its_stored_status() -> None:
    """A new leader whose TrainJob watch is behind sees none of the two trials the stored status
    counted: ended there, the search would fail for good with trials still to report."""
    search = stored_search(numTrials=2, parallelTrials=2)
    search["status"] = {"trials": {"created": 2, "running": 2, "succeeded": 0, "failed": 0}}
    reconciler, client, recorder, _ = controller(search)
    assert step(reconciler) is True
    assert client.patches == [] and client.creates == [] and recorder.events == []


def test_each_failure_is_told_once_and_not_again_by_a_replica_that_starts_leading() -> None:
    search = stored_search(numTrials=3, parallelTrials=3)
    reconciler, client, recorder, cache = controller(search)
    step(reconciler)
    trial = copy.deepcopy(cache.trainjob(("default", "tune-trial-0")))
    assert trial is not None
    finish(trial, None)  # completes without its metric
    trial["metadata"]["resourceVersion"] = "300"
    cache.observe(trial)
    step(reconciler)
    step(reconciler)
    told = [e for e in recorder.events if e[1] == "TrialFailed"]
    assert len(told) == 1 and "tune-trial-0: MetricMissing" in told[0][2]
    # Leadership moves away and back: the stored status counts the one failure, so it is not retold.
    assert client.patches[-1]["status"]["trials"]["failed"] == 1
    reconciler.started()
    step(reconciler)
    assert len([e for e in recorder.events if e[1] == "TrialFailed"]) == 1
