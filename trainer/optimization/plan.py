"""An OptimizationJob's next step, as one pure function: from the OptimizationJob and the trial
TrainJobs that exist, the TrainJobs to create now and the whole status to write.

The controller's part is I/O only: list the trials, call :func:`plan`, create what it says, write
the status it gives when it differs from the stored one, and emit Events for new failures. Nothing
is remembered between calls but what is in the cluster, so a controller that restarts, or runs
twice on one state, neither loses nor duplicates a trial:

- Trial i's TrainJob is ``search.trial_name(<name>, i)``; its values are read back from its
  ``trainer.kubeflow.org/trial-parameters`` annotation, never computed again.
- The next index is one past the highest that was ever created: the highest existing one, or
  ``status.trials.created`` when that is more (a trial deleted by hand, or by a TTL, after a
  written status counted it is not made again, and numTrials counts it).
- A TrainJob is this OptimizationJob's trial only if its controller ownerReference has this
  OptimizationJob's uid. Any other is never adopted, even with our label and a trial's name; if it
  holds the name of the next trial, no trial is created past it (indexes stay in order): the
  Running condition says which TrainJob is in the way, as a TrainJob's ReconcileFailed does for
  a child it does not control (docs/decisions.md §11), and the search goes on once it is gone.

The status describes the trials as they are (what ``create`` will add is not counted yet: the next
call sees them), so a write that follows a failed create never claims a trial that does not exist.
docs/optimization.md is the user's account of all this.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.optimization import search
from trainer.runtime import conditions as cond

if TYPE_CHECKING:
    from trainer.api.objects import NewCondition

# Condition types.
CREATED = "Created"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"

# Reasons.
REASON_CREATED = "Created"
REASON_TRIALS_RUNNING = "TrialsRunning"
REASON_TRIAL_NAME_TAKEN = "TrialNameTaken"
REASON_TRIALS_FINISHED = "TrialsFinished"  # Succeeded: every trial finished, the best is known
REASON_NO_TRIAL_SUCCEEDED = "NoTrialSucceeded"  # Failed: every trial finished, none with the metric
REASON_TOO_MANY_FAILED = "TooManyFailedTrials"  # Failed: more than maxFailedTrials failed
REASON_METRIC_MISSING = "MetricMissing"  # a trial completed without a finite value for the metric
REASON_TRIAL_FAILED = "TrialFailed"  # a trial failed, its TrainJob giving no reason

# Bounds on what a failure adds to a message, so a search with many failures keeps a small status.
MAX_LISTED_FAILURES = 3
MAX_REASON_LENGTH = 64
MAX_FAILURE_MESSAGE = 256

_TRIAL_INDEX = re.compile(r"-trial-([0-9]+)$")


@dataclass(frozen=True)
class Failure:
    """A failed trial, for an Event and for the condition messages that name it."""

    trial: str  # its TrainJob's name
    reason: str  # MetricMissing, or its TrainJob's Failed reason (TrialFailed if it gave none)
    message: str  # at most MAX_FAILURE_MESSAGE characters


@dataclass(frozen=True)
class Plan:
    """What :func:`plan` decided.

    ``create``: the trial TrainJobs to create now, in index order (``search.trial_trainjob``).
    Creating one that exists already (a cache that has not seen it yet) is harmless: its name is
    its index, and AlreadyExists from one of ours means it is there; one that is not ours waits.

    ``status``: the OptimizationJob's whole status: ``conditions``, ``trials`` and, once a trial
    has a value, ``result``. The same input gives the same status, byte for byte, so the
    controller can write it only when it differs from the stored one.

    ``failures``: every failed trial, in index order, each time (not only new ones): the
    controller emits an Event for the ones it has not told of yet.
    """

    create: list[Obj]
    status: Obj
    failures: list[Failure]

    @property
    def finished(self) -> bool:
        """The search is over (Succeeded or Failed): nothing will be created again."""
        conditions = self.status.get("conditions")
        return cond.is_true(conditions, SUCCEEDED) or cond.is_true(conditions, FAILED)


@dataclass(frozen=True)
class _Trial:
    index: int
    name: str
    assignment: search.Assignment | None  # None: its annotation is missing or unreadable
    state: str  # RUNNING, SUCCEEDED or FAILED
    value: float | None = None
    value_text: str = ""
    failure: Failure | None = None


def plan(optimizationjob: Mapping[str, Any], trials: Sequence[Mapping[str, Any]], now: str) -> Plan:
    """The next step of ``optimizationjob`` (as stored: CRD defaults applied, uid set, its status
    as last written), given ``trials``, the TrainJobs labelled with its name, and ``now`` (RFC
    3339), the time a condition that changes status gets.

    Rules (docs/optimization.md, "How a search runs"):

    - At most ``parallelTrials`` trials unfinished at once, ``numTrials`` in all (a grid's size,
      if it has fewer combinations).
    - A trial has finished when its TrainJob has ``Complete`` or ``Failed`` True. A Complete
      trial without a finite value for the objective's metric in
      ``status.trainerStatus.metrics`` has failed (``MetricMissing``); a failed trial is never
      run again.
    - More failed trials than ``maxFailedTrials`` (when set): Failed, ``TooManyFailedTrials``;
      nothing more is created and the trials running are left to finish (they still count, and
      may still give the result). Every trial finished: Succeeded, naming the best trial, or
      Failed (``NoTrialSucceeded``) if none has a value.
    - Once Succeeded or Failed and no trial runs, the status is final: returned as it is stored,
      whatever happens to the trials afterwards (a TTL deleting them takes nothing away).

    Raises ValueError only for an OptimizationJob admission refuses.
    """
    spec = optimizationjob["spec"]
    meta = optimizationjob.get("metadata") or {}
    name = str(meta.get("name") or "")
    previous: Mapping[str, Any] = optimizationjob.get("status") or {}
    objective = spec["objectives"][0]
    metric = str(objective["metric"])
    direction = str(objective.get("direction") or "Minimize")

    ours, foreign = _read_trials(name, str(meta.get("uid") or ""), trials, metric)
    failures = [t.failure for t in ours if t.failure is not None]
    previous_conditions = previous.get("conditions")
    ended = _ended(previous_conditions)
    if ended is not None and not (previous.get("trials") or {}).get("running"):
        return Plan([], copy.deepcopy(dict(previous)), failures)

    limit = _limit(spec)
    created = max([t.index + 1 for t in ours] + [_count(previous, "created")])
    running = [t for t in ours if t.state == RUNNING]
    succeeded = [t for t in ours if t.state == SUCCEEDED]
    failed = [t for t in ours if t.state == FAILED]
    progress = _progress(limit, created, running, succeeded, failed)

    conditions: list[Obj] = copy.deepcopy(list(previous_conditions or []))
    cond.set_condition(conditions, _new(CREATED, "True", REASON_CREATED, "OptimizationJob is created"), now)
    best = search.best(direction, [(t.name, t.assignment or {}, t.value) for t in succeeded])
    create: list[Obj] = []
    ending: NewCondition | None = None  # the condition that ends the search in this step
    if ended is None:
        max_failed = spec.get("maxFailedTrials")
        best_trial = next((t for t in succeeded if best is not None and t.name == best[0]), None)
        ended = _ending(
            metric,
            None if max_failed is None else int(max_failed),
            created >= limit and not running,
            progress,
            best_trial,
            failures,
        )
        ending = ended
    if ended is None:
        count = min(int(spec.get("parallelTrials") or 1) - len(running), limit - created)
        indexes = list(range(created, created + max(count, 0)))
        taken = next((i for i in indexes if search.trial_name(name, i) in foreign), None)
        create = _trial_trainjobs(
            optimizationjob,
            indexes[: indexes.index(taken)] if taken is not None else indexes,
            ours,
            direction,
        )
        running_condition = _running(progress, None if taken is None else search.trial_name(name, taken))
    else:
        running_condition = _stopped(ended, len(running))
    cond.set_condition(conditions, running_condition, now)
    if ending is not None:
        # After Running, even when the first status written ends the search: the last condition
        # is the state `kubectl get` shows (trainer/api/crdgen.py).
        cond.set_condition(conditions, ending, now)

    status: Obj = {
        "conditions": conditions,
        "trials": {
            "created": created,
            "running": len(running),
            "succeeded": len(succeeded),
            "failed": len(failed),
        },
    }
    if best is not None:
        status["result"] = _result(spec, *best)
    return Plan(create, status, failures)


# --- reading the trials ---


def _read_trials(
    name: str, uid: str, trials: Sequence[Mapping[str, Any]], metric: str
) -> tuple[list[_Trial], set[str]]:
    """This OptimizationJob's trials, in index order, and the names of the other TrainJobs."""
    ours: dict[int, _Trial] = {}
    foreign: set[str] = set()
    for trainjob in trials:
        meta = trainjob.get("metadata") or {}
        trainjob_name = str(meta.get("name") or "")
        if not uid or not _controlled_by(meta, uid):
            foreign.add(trainjob_name)
            continue
        index = _index(name, meta)
        if index is not None:
            ours[index] = _trial(index, trainjob_name, trainjob, metric)
    return [ours[i] for i in sorted(ours)], foreign


def _controlled_by(meta: Mapping[str, Any], uid: str) -> bool:
    refs = meta.get("ownerReferences")
    return any(
        isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid") == uid
        for ref in (refs if isinstance(refs, list) else [])
    )


def _index(name: str, meta: Mapping[str, Any]) -> int | None:
    """A trial's index: its label's, or its name's; None unless its name is that trial's name."""
    trainjob_name = str(meta.get("name") or "")
    guesses = [str((meta.get("labels") or {}).get(c.TRIAL_INDEX_LABEL) or "")]
    found = _TRIAL_INDEX.search(trainjob_name)
    if found:
        guesses.append(found[1])
    for guess in guesses:
        if guess.isascii() and guess.isdigit() and search.trial_name(name, int(guess)) == trainjob_name:
            return int(guess)
    return None


def _trial(index: int, name: str, trainjob: Mapping[str, Any], metric: str) -> _Trial:
    assignment = _assignment(trainjob)
    status = trainjob.get("status") or {}
    conditions = status.get("conditions")
    if cond.is_true(conditions, c.COND_FAILED):
        found = cond.find(conditions, c.COND_FAILED) or {}
        reason = str(found.get("reason") or REASON_TRIAL_FAILED)
        message = _cut(str(found.get("message") or ""), MAX_FAILURE_MESSAGE)
        return _Trial(index, name, assignment, FAILED, failure=Failure(name, reason, message))
    if not cond.is_true(conditions, c.COND_COMPLETE):
        return _Trial(index, name, assignment, RUNNING)
    reported = [m for m in (status.get("trainerStatus") or {}).get("metrics") or [] if isinstance(m, Mapping)]
    text = next((str(m.get("value")) for m in reported if m.get("name") == metric), None)
    value = _number(text)
    if value is None:
        said = "no value" if text is None else f"{_cut(text, 64)!r}, not a finite number,"
        message = f"completed, but reported {said} for metric {metric!r}"
        return _Trial(index, name, assignment, FAILED, failure=Failure(name, REASON_METRIC_MISSING, message))
    return _Trial(index, name, assignment, SUCCEEDED, value=value, value_text=str(text))


def _assignment(trainjob: Mapping[str, Any]) -> search.Assignment | None:
    """The values the trial was given, as its annotation says (None if it says nothing usable)."""
    text = ((trainjob.get("metadata") or {}).get("annotations") or {}).get(c.TRIAL_PARAMETERS_ANNOTATION)
    try:
        values = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        return None
    return {str(k): v for k, v in values.items()}


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# --- the next trials ---


def _limit(spec: Mapping[str, Any]) -> int:
    """How many trials the search runs: numTrials, or a smaller grid's size."""
    num_trials = int(spec.get("numTrials") or 1)
    if (spec.get("searchAlgorithm") or {}).get("grid") is not None:
        return len(search.grid(spec["parameters"], limit=num_trials))
    return num_trials


def _trial_trainjobs(
    optimizationjob: Mapping[str, Any], indexes: list[int], ours: list[_Trial], direction: str
) -> list[Obj]:
    """The TrainJobs of trials ``indexes``, each with the values its algorithm gives it."""
    if not indexes:
        return []
    spec = optimizationjob["spec"]
    parameters = spec["parameters"]
    algorithm = spec.get("searchAlgorithm") or {}
    seed = search.seed_of(optimizationjob)
    assignments: list[search.Assignment]
    if algorithm.get("grid") is not None:
        assignments = search.grid(parameters, limit=indexes[-1] + 1)[indexes[0] :]
    elif algorithm.get("tpe") is not None:
        from trainer.optimization.tpe import tpe_assignment

        history = [(t.assignment, t.value) for t in ours if t.state != RUNNING and t.assignment is not None]
        pending = [t.assignment for t in ours if t.state == RUNNING and t.assignment is not None]
        assignments = []
        for index in indexes:
            assignment = tpe_assignment(
                parameters, seed, index, history, direction=direction, pending=pending + assignments
            )
            assignments.append(assignment)
    else:
        assignments = [search.random_assignment(parameters, seed, index) for index in indexes]
    return [
        search.trial_trainjob(optimizationjob, index, assignment)
        for index, assignment in zip(indexes, assignments, strict=True)
    ]


# --- the status ---


def _ended(conditions: Any) -> NewCondition | None:
    """The condition that ended the search (Succeeded or Failed True), if one has."""
    for type_ in (SUCCEEDED, FAILED):
        found = cond.find(conditions if isinstance(conditions, list) else None, type_)
        if found is not None and found.get("status") == "True":
            return _new(type_, "True", str(found.get("reason") or ""), str(found.get("message") or ""))
    return None


def _ending(
    metric: str,
    max_failed: int | None,
    all_finished: bool,
    progress: str,
    best: _Trial | None,
    failures: list[Failure],
) -> NewCondition | None:
    """The condition that ends the search now, if one does: too many failures, or every trial
    finished (Succeeded with a best trial, else Failed)."""
    if max_failed is not None and len(failures) > max_failed:
        message = f"{_trials(len(failures))} failed, more than maxFailedTrials ({max_failed})"
        return _new(FAILED, "True", REASON_TOO_MANY_FAILED, message + _listed(failures))
    if not all_finished:
        return None
    if best is not None:
        message = f"{progress}; best: {best.name} ({metric}={best.value_text})"
        return _new(SUCCEEDED, "True", REASON_TRIALS_FINISHED, message)
    message = f"no trial reported a finite value for {metric}: {progress}" + _listed(failures)
    return _new(FAILED, "True", REASON_NO_TRIAL_SUCCEEDED, message)


def _running(progress: str, taken: str | None) -> NewCondition:
    """Running while the search goes on; ``taken``: the name of the next trial, held by a
    TrainJob that is not this OptimizationJob's trial."""
    if taken is None:
        return _new(RUNNING, "True", REASON_TRIALS_RUNNING, progress)
    message = (
        f"TrainJob {taken} exists and is not this OptimizationJob's trial: "
        f"the trial waits for its name; {progress}"
    )
    return _new(RUNNING, "True", REASON_TRIAL_NAME_TAKEN, message)


def _stopped(ended: NewCondition, running: int) -> NewCondition:
    """Running once the search has ended: False, for the reason it ended."""
    message = "the search has ended"
    if running:
        message += f"; {_trials(running)} still running {'are' if running > 1 else 'is'} left to finish"
    return _new(RUNNING, "False", ended["reason"], message)


def _count(status: Mapping[str, Any], key: str) -> int:
    value = (status.get("trials") or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _progress(
    limit: int, created: int, running: list[_Trial], succeeded: list[_Trial], failed: list[_Trial]
) -> str:
    """``4 of 10 trials finished, 1 failed, 2 running``: the trials deleted are said too."""
    text = f"{len(succeeded) + len(failed)} of {limit} trials finished"
    if failed:
        text += f", {len(failed)} failed"
    if running:
        text += f", {len(running)} running"
    deleted = created - len(running) - len(succeeded) - len(failed)
    if deleted > 0:
        text += f", {deleted} deleted"
    return text


def _trials(count: int) -> str:
    return f"{count} trial" if count == 1 else f"{count} trials"


def _listed(failures: list[Failure]) -> str:
    """``: a-trial-1 (MetricMissing), ... and 4 more``: the first few, each reason cut short."""
    if not failures:
        return ""
    named = ", ".join(
        f"{f.trial} ({_cut(f.reason, MAX_REASON_LENGTH)})" for f in failures[:MAX_LISTED_FAILURES]
    )
    more = len(failures) - MAX_LISTED_FAILURES
    return f": {named}" + (f" and {more} more" if more > 0 else "")


def _cut(text: str, length: int) -> str:
    return text if len(text) <= length else text[: length - 3] + "..."


def _new(type_: str, status: str, reason: str, message: str) -> NewCondition:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def _result(spec: Mapping[str, Any], trainjob_name: str, assignment: search.Assignment) -> Obj:
    """``status.result``: the best trial, and its values as [{name, value}] in spec order."""
    result: Obj = {"trainJobName": trainjob_name}
    parameters = [
        {"name": str(p["name"]), "value": assignment[str(p["name"])]}
        for p in spec["parameters"]
        if str(p["name"]) in assignment
    ]
    if parameters:
        result["parameters"] = parameters
    return result
