"""The pure core: one TrainJob, the runtime it names and what is known of the cluster -> the
objects that should exist for it and the status it should have.

No I/O happens here. The operator calls :func:`render` with facts from its watch caches and
writes the difference; ``trainer render`` calls it with facts read from manifests.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.api.views import TrainingRuntime, TrainJob
from trainer.runtime import conditions as cond
from trainer.runtime.build import build_info
from trainer.runtime.framework import Framework
from trainer.runtime.info import ChildConflict, Facts, Failure, PluginError, controlled_by, controller_ref
from trainer.runtime.snapshot import read_snapshot, snapshot_configmap, snapshot_name

EVENT_RESOURCES_FAILED = "TrainJobResourcesCreationFailed"
SUPPORTED_RUNTIMES = (f"{c.TRAINING_RUNTIME_KIND}.{c.GROUP}", f"{c.CLUSTER_TRAINING_RUNTIME_KIND}.{c.GROUP}")


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass
class Outcome:
    """What one reconcile wants: children to write, one to delete, the status, what to tell."""

    objects: list[Obj] = field(default_factory=list)
    status: Obj | None = None
    delete: list[tuple[str, str, str]] = field(default_factory=list)
    # Children to delete in the foreground (their own dependents go first) and build again once
    # gone: an update could not make them what they must now be (docs/decisions.md §resize).
    rebuild: list[Obj] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    error: str | None = None
    requeue_after: float | None = None
    framework_label: str | None = None
    skipped: bool = False
    # The TrainJob finished and its TTL has run out: it is to be deleted (its children go by
    # garbage collection). Never set for an unfinished one.
    expired: bool = False
    # The object (as the facts hold it) whose name a child needs, which this TrainJob does not
    # control: the operator looks again, by name, when it retries (docs/decisions.md §11).
    conflict: Obj | None = None
    # A plugin found that the TrainJob cannot succeed (Info.fail): it fails, its JobSet goes.
    failure: Failure | None = None

    def requeue_within(self, seconds: float) -> None:
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


class RuntimeNotFound(Exception):
    """The runtime a TrainJob names does not exist: upstream's words, then ours on what does.

    ``reason`` is upstream's message (users search for it). What exists is looked up only when a
    message is made (``str()``, ``suggestion()``), never for a lookup whose failure is dropped,
    as the run policy's is: it scans the facts. The status and its Event carry the closest name
    alone (``did you mean``), which changes only with a closer runtime, not with every runtime
    added; the admission refusal lists the runtimes that exist as well.
    """

    def __init__(
        self,
        reason: str,
        name: str,
        kind: str,
        existing: Callable[[], list[str]],
        namespace: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.name = name
        self.kind = kind
        self.namespace = namespace
        self._existing = existing

    def __str__(self) -> str:
        closest = closest_runtime(self.name, self._existing())
        return f'{self.reason}; did you mean "{closest}"?' if closest else self.reason

    def suggestion(self) -> str:
        return runtime_suggestion(self.name, self.kind, self._existing(), self.namespace)


# How many runtime names a not-found message lists: enough for a cluster's usual runtimes, short
# enough for a one-line refusal and a condition message.
MAX_LISTED_RUNTIMES = 10


def closest_runtime(name: str, existing: list[str]) -> str | None:
    """The existing runtime ``name`` most likely misspells (difflib), if one is close enough."""
    import difflib

    found = difflib.get_close_matches(name, sorted(set(existing)), n=1)
    return found[0] if found else None


def runtime_suggestion(name: str, kind: str, existing: list[str], namespace: str | None = None) -> str:
    """``did you mean "<closest>"?`` (difflib's closest name, if any is close) and the runtimes of
    ``kind`` that exist: all when at most ``MAX_LISTED_RUNTIMES``, else the closest that many."""
    import difflib

    where = f' in namespace "{namespace}"' if namespace is not None else ""
    names = sorted(set(existing))
    if not names:
        return f"no {kind}s exist{where}"
    closest = closest_runtime(name, names)
    listed = names
    if len(names) > MAX_LISTED_RUNTIMES:
        ratio = {n: difflib.SequenceMatcher(None, name, n).ratio() for n in names}
        listed = sorted(sorted(names, key=lambda n: -ratio[n])[:MAX_LISTED_RUNTIMES])
        which = f"the {len(listed)} closest of the {len(names)} {kind}s that exist{where}"
    else:
        which = f"{kind}s that exist{where}"
    said = f'did you mean "{closest}"? ' if closest else ""
    return f"{said}{which}: {', '.join(listed)}"


def runtime_key(ref: Obj) -> str:
    kind = ref.get("kind") or c.CLUSTER_TRAINING_RUNTIME_KIND
    group = ref.get("apiGroup")
    group = c.GROUP if group is None else group
    return f"{kind}.{group}" if group else kind


def lookup_runtime(facts: Facts, ref: Obj, namespace: str) -> Obj:
    """The live runtime a TrainJob names, or RuntimeNotFound with upstream's wording."""
    kind = ref.get("kind") or c.CLUSTER_TRAINING_RUNTIME_KIND
    name = ref.get("name", "")
    if kind == c.TRAINING_RUNTIME_KIND:
        found = facts.get(kind, namespace, name)
        if found is None:
            raise RuntimeNotFound(
                f"TrainingRuntime specified in TrainJob is not found: "
                f'trainingruntimes.{c.GROUP} "{name}" not found in namespace "{namespace}"',
                str(name),
                kind,
                lambda: [_name_of(o) for o in facts.of_kind(kind) if _namespace_of(o) == namespace],
                namespace,
            )
        return found
    found = facts.get(kind, None, name)
    if found is None:
        raise RuntimeNotFound(
            f"ClusterTrainingRuntime specified in TrainJob is not found: "
            f'clustertrainingruntimes.{c.GROUP} "{name}" not found',
            str(name),
            kind,
            lambda: [_name_of(o) for o in facts.of_kind(kind)],
        )
    return found


def _name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _namespace_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def render(
    trainjob_obj: Obj, facts: Facts, framework: Framework, now: str, *, seed: bytes | None = None
) -> Outcome:
    """Decide everything about one TrainJob as it stands now.

    ``seed`` makes generated key material reproducible (``Info.seed``): ``trainer render`` passes
    one derived from the TrainJob so its output is byte-for-byte stable; the operator passes None,
    so keys come from the operating system's randomness.
    """
    spec = trainjob_obj.get("spec") or {}
    managed_by = spec.get("managedBy") or c.MANAGED_BY_TRAINER
    if managed_by != c.MANAGED_BY_TRAINER:
        return Outcome(skipped=True)

    status: Obj = copy.deepcopy(trainjob_obj.get("status") or {})
    conditions: list[Obj] = status.setdefault("conditions", [])
    outcome = Outcome()
    key = runtime_key(spec.get("runtimeRef") or {})
    if key not in SUPPORTED_RUNTIMES:
        cond.set_condition(
            conditions,
            {
                "type": c.COND_FAILED,
                "status": "True",
                "reason": c.REASON_RUNTIME_NOT_SUPPORTED,
                "message": f"unsupported runtime: {key}",
            },
            now,
        )
        outcome.status = _tidy(status)
        return outcome

    finished = cond.is_finished(status)
    runtime_obj: Obj | None = None
    if finished:
        # Nothing is reconciled any more, so nothing can fail to be (docs/decisions.md §4).
        cond.remove(conditions, c.COND_RECONCILE_FAILED)
    else:
        try:
            runtime_obj = _build(trainjob_obj, facts, framework, now, outcome, seed)
        except (PluginError, RuntimeNotFound) as exc:
            _record_failure(outcome, conditions, exc, now)
            if isinstance(exc, ChildConflict):
                outcome.conflict = exc.observed
        else:
            cond.remove(conditions, c.COND_RECONCILE_FAILED)

    suspended = bool(spec.get("suspend"))
    was_suspended = cond.is_true(conditions, c.COND_SUSPENDED)
    if suspended:
        cond.set_condition(
            conditions,
            {
                "type": c.COND_SUSPENDED,
                "status": "True",
                "reason": c.REASON_SUSPENDED,
                "message": c.MSG_SUSPENDED,
            },
            now,
        )
    elif cond.is_true(conditions, c.COND_SUSPENDED):
        cond.set_condition(
            conditions,
            {
                "type": c.COND_SUSPENDED,
                "status": "False",
                "reason": c.REASON_RESUMED,
                "message": c.MSG_RESUMED,
            },
            now,
        )

    _sync_jobset_status(trainjob_obj, status, facts, framework)
    if outcome.failure is not None and not suspended and not cond.is_finished(status):
        _fail(trainjob_obj, conditions, outcome, outcome.failure.reason, outcome.failure.message, now)
    policy = _Policy(trainjob_obj, facts, runtime_obj)
    _check_deadline(trainjob_obj, status, outcome, now, policy)
    _set_times(
        status, runs=not suspended and outcome.error is None, resumed=was_suspended and not suspended, now=now
    )
    _check_ttl(trainjob_obj, status, outcome, now, policy)
    outcome.status = _tidy(status)
    return outcome


class _Policy:
    """The runtime's ``runPolicy``, found only when a field the TrainJob leaves unset asks for it."""

    def __init__(self, trainjob_obj: Obj, facts: Facts, runtime_obj: Obj | None) -> None:
        self.trainjob_obj = trainjob_obj
        self.facts = facts
        self.runtime_obj = runtime_obj
        self._policy: Obj | None = None

    def get(self, field_name: str) -> Any:
        if self._policy is None:
            if self.runtime_obj is not None:
                found = (self.runtime_obj.get("spec") or {}).get("runPolicy")
                self._policy = found if isinstance(found, dict) else {}
            else:
                self._policy = run_policy(self.trainjob_obj, self.facts)
        return self._policy.get(field_name)


def run_policy(trainjob_obj: Obj, facts: Facts) -> Obj:
    """The runtime's ``runPolicy``: from the snapshot the TrainJob was pinned to, else the live
    runtime (before the first build), else none (docs/decisions.md §ttl)."""
    meta = trainjob_obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    snapshot = facts.get("ConfigMap", namespace, snapshot_name(meta.get("name", "")))
    runtime_obj: Obj | None = None
    if snapshot is not None:
        try:
            runtime_obj = _pinned(snapshot, trainjob_obj)  # only read: no copy
        except PluginError:
            runtime_obj = None
    if runtime_obj is None:
        try:
            runtime_obj = lookup_runtime(
                facts, (trainjob_obj.get("spec") or {}).get("runtimeRef") or {}, namespace
            )
        except RuntimeNotFound:
            return {}
    policy = (runtime_obj.get("spec") or {}).get("runPolicy")
    return policy if isinstance(policy, dict) else {}


def effective(trainjob_obj: Obj, policy: _Policy | Obj, field_name: str) -> int | None:
    """A TrainJob's own ``field_name`` if set, else its runtime's ``runPolicy`` default."""
    value = (trainjob_obj.get("spec") or {}).get(field_name)
    if value is None:
        value = policy.get(field_name)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _set_times(status: Obj, *, runs: bool, resumed: bool, now: str) -> None:
    """startTime when what runs the TrainJob first reports its Jobs while it is not suspended
    (as a pod's startTime is when its kubelet first acknowledges it), and again on resume;
    completionTime when it completes, not when it fails (docs/decisions.md §ttl).

    Set with the first report of the Jobs, startTime goes out in the status write that report
    makes anyway, never in a write of its own."""
    conditions: list[Obj] = status["conditions"]
    finished = cond.is_finished(status)
    reported = bool(status.get("jobsStatus"))
    if runs and not finished and (resumed or (reported and not status.get("startTime"))):
        status["startTime"] = now
    elif finished and reported and not status.get("startTime"):
        # Its first report came finished (it ran while the operator was busy, restarting or
        # failing over): it started no later than it finished, so completionTime is never earlier.
        ended = finished_at(status)
        status["startTime"] = ended if ended is not None and parse_time(ended) < parse_time(now) else now
    complete = cond.find(conditions, c.COND_COMPLETE)
    if complete is not None and complete.get("status") == "True" and not status.get("completionTime"):
        status["completionTime"] = complete.get("lastTransitionTime") or now


def finished_at(status: Obj) -> str | None:
    """When the TrainJob finished: its first True terminal condition's transition time."""
    times = [
        str(found["lastTransitionTime"])
        for type_ in (c.COND_COMPLETE, c.COND_FAILED)
        if (found := cond.find(status.get("conditions") or [], type_)) is not None
        and found.get("status") == "True"
        and found.get("lastTransitionTime")
    ]
    return min(times, key=parse_time) if times else None


def _check_ttl(trainjob_obj: Obj, status: Obj, outcome: Outcome, now: str, policy: _Policy) -> None:
    """A finished TrainJob whose TTL ran out is deleted; until then, looked at again when it does.

    Computed from the terminal condition's time each reconcile, so an operator restart loses
    nothing; an unfinished TrainJob is never deleted, whatever its TTL.
    """
    finished = finished_at(status)
    if finished is None:
        return
    ttl = effective(trainjob_obj, policy, "ttlSecondsAfterFinished")
    if ttl is None:
        return
    expires = parse_time(finished) + timedelta(seconds=ttl)
    remaining = (expires - parse_time(now)).total_seconds()
    if remaining <= 0:
        outcome.expired = True
    else:
        outcome.requeue_within(remaining)


def _build(
    trainjob_obj: Obj, facts: Facts, framework: Framework, now: str, outcome: Outcome, seed: bytes | None
) -> Obj:
    """Build the children into ``outcome``; return the runtime they were built from."""
    meta = trainjob_obj.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    spec = trainjob_obj["spec"]
    trainjob = TrainJob(trainjob_obj)
    snapshot = facts.get("ConfigMap", namespace, snapshot_name(meta.get("name", "")))
    if snapshot is not None:
        runtime_obj = pinned_runtime(snapshot, trainjob_obj)
    else:
        runtime_obj = lookup_runtime(facts, spec.get("runtimeRef") or {}, namespace)
        # Pinned before anything else runs, as upstream does: a TrainJob whose first build fails
        # keeps the runtime it was admitted with, and later edits of the runtime do not reach it.
        outcome.objects.append(snapshot_configmap(trainjob, runtime_obj))
    runtime = TrainingRuntime(runtime_obj)
    outcome.framework_label = ((runtime_obj.get("metadata") or {}).get("labels") or {}).get(c.FRAMEWORK_LABEL)
    missing = framework.missing_for(runtime.spec)
    if missing:
        raise PluginError(f"the runtime needs plugins that are disabled: {', '.join(missing)}")
    info = build_info(trainjob, trainjob_obj, runtime, runtime_obj, facts, now=now)
    info.seed = seed
    hook = framework.hook
    hook.trainer_enforce_ml_policy(info=info)
    hook.trainer_enforce_pod_group_policy(info=info)
    hook.trainer_enforce_pod_spec(info=info)
    hook.trainer_pre_build_sync(info=info)
    # Every object is built before any is written: a builder's error writes none of them.
    built_objects = [obj for built in hook.trainer_build(info=info) for obj in built or []]
    declared = framework.built_kinds
    for obj in built_objects:
        if (obj.get("apiVersion"), obj.get("kind")) not in declared:
            # The operator could neither write nor watch it (nor the chart grant it): say so
            # on status here, offline and on a cluster alike, before anything is written.
            raise PluginError(
                f"a plugin built a {obj.get('kind')} ({obj.get('apiVersion')}), which no enabled plugin "
                "declares in its kinds (Builds)"
            )
    check_control(trainjob_obj, facts, built_objects, info.kept)
    for obj in info.rebuilt:
        if (obj.get("apiVersion"), obj.get("kind")) not in framework.deletable_kinds:
            raise PluginError(
                f"a plugin asked for the {obj.get('kind')} {obj['metadata'].get('name')} to be rebuilt, "
                "a kind no enabled plugin declares it deletes (Builds(..., delete=True))"
            )
        if not controlled_by(obj, trainjob_obj):
            raise PluginError(
                f"{obj.get('kind')} {obj['metadata'].get('name')} is not this TrainJob's to rebuild"
            )
    outcome.objects.extend(built_objects)
    outcome.rebuild.extend(info.rebuilt)
    outcome.failure = info.failure
    if info.requeue_after is not None:
        outcome.requeue_within(info.requeue_after)
    return runtime_obj


def check_control(trainjob_obj: Obj, facts: Facts, built: list[Obj], kept: list[Obj]) -> None:
    """Refuse to go on when a child's name is taken by an object this TrainJob does not control
    (docs/decisions.md §11).

    Applying over it would adopt it (a user's ConfigMap would get our ownerReference and go
    with the TrainJob), and keeping it would mount it (a Secret a namespace peer planted under
    the SSH key's name would be the job's key). Either way the TrainJob says why, on its status
    and in an Event, and nothing is written until the name is free.
    """
    for obj in [*built, *kept]:
        meta = obj.get("metadata") or {}
        observed = obj if any(obj is k for k in kept) else None
        if observed is None:
            observed = facts.get(obj["kind"], meta.get("namespace"), meta["name"], group=Facts.group_of(obj))
        if observed is None or controlled_by(observed, trainjob_obj):
            continue
        raise ChildConflict(
            f"{obj['kind']} {meta.get('namespace')}/{meta['name']} exists and is not this TrainJob's "
            f"({_controller_of(observed)}): the operator neither writes nor uses an object it does "
            f"not control; delete or rename that {obj['kind']}",
            observed,
        )


def _controller_of(obj: Obj) -> str:
    ref = controller_ref(obj)
    if ref is None:
        return "it has no controller"
    return f"controlled by {ref.get('kind')} {ref.get('name')} uid {ref.get('uid')}"


_PINNED: dict[tuple[str, str, str], Obj] = {}
_PINNED_MAX = 4096


def pinned_runtime(snapshot: Obj, trainjob_obj: Obj) -> Obj:
    """The runtime in a TrainJob's snapshot, read and checked (PluginError when it is not fit).

    Remembered by the snapshot's uid and resourceVersion and the TrainJob's uid, as the same
    snapshot is read on every reconcile: parsing its YAML and checking it against the schema each
    time was a tenth of the operator's CPU under load. Callers get a copy of their own.
    """
    return copy.deepcopy(_pinned(snapshot, trainjob_obj))


def _pinned(snapshot: Obj, trainjob_obj: Obj) -> Obj:
    """:func:`pinned_runtime`'s remembered object itself, for readers that change nothing."""
    meta = snapshot.get("metadata") or {}
    key = (
        str(meta.get("uid") or ""),
        str(meta.get("resourceVersion") or ""),
        str((trainjob_obj.get("metadata") or {}).get("uid") or ""),
    )
    found = _PINNED.get(key) if all(key) else None
    if found is None:
        found = read_snapshot(snapshot, trainjob_obj)
        _check_snapshot_runtime(found)
        if all(key):
            if len(_PINNED) >= _PINNED_MAX:
                del _PINNED[next(iter(_PINNED))]
            _PINNED[key] = found
    return found


def _check_snapshot_runtime(runtime_obj: Obj) -> None:
    """A snapshot is a ConfigMap anyone with rights may edit: check it as the API server checked
    the runtime it copies, before plugins read it as typed data."""
    from trainer.apimachinery import schema_validation
    from trainer.apimachinery.openapi import schemas

    kind = runtime_obj.get("kind")
    schema = schemas().get(kind) if kind in c.RUNTIME_KINDS else None
    errors = schema_validation.validate(schema, runtime_obj) if schema is not None else []
    if schema is None or errors:
        reason = str(errors[0]) if errors else f"it holds a {kind}, not a runtime"
        raise PluginError(f"invalid runtime snapshot: {reason}")


def _record_failure(outcome: Outcome, conditions: list[Obj], exc: Exception, now: str) -> None:
    """docs/decisions.md §3: a retryable failure shows on status, with the message of its Event."""
    message = str(exc)
    outcome.error = message
    short = message if len(message) <= 950 else message[:950] + " ..."
    event_message = f"TrainJob resources reconciliation failed: {short}"
    outcome.events.append(Event("Warning", EVENT_RESOURCES_FAILED, event_message))
    reason = c.REASON_RUNTIME_NOT_FOUND if isinstance(exc, RuntimeNotFound) else EVENT_RESOURCES_FAILED
    cond.set_condition(
        conditions,
        {"type": c.COND_RECONCILE_FAILED, "status": "True", "reason": reason, "message": event_message},
        now,
    )


def _sync_jobset_status(trainjob_obj: Obj, status: Obj, facts: Facts, framework: Framework) -> None:
    from_jobset: Obj | None = framework.hook.trainer_compute_status(trainjob=trainjob_obj, facts=facts)
    if from_jobset is None:
        return  # nothing runs it yet, or it is gone after the TrainJob finished
    conditions: list[Obj] = status["conditions"]
    for new in from_jobset.get("conditions") or []:
        # A True condition stays as it is: a Failed of ours (a deadline, a plugin's) keeps its
        # reason when the JobSet, deleted for it, reports failing too.
        current = cond.find(conditions, new["type"])
        if current is None:
            conditions.append(dict(new))
        elif current.get("status") != "True":
            current.update(new)
    if from_jobset.get("jobsStatus"):
        status["jobsStatus"] = from_jobset["jobsStatus"]
    else:
        status.pop("jobsStatus", None)


def _check_deadline(trainjob_obj: Obj, status: Obj, outcome: Outcome, now: str, policy: _Policy) -> None:
    spec = trainjob_obj.get("spec") or {}
    conditions: list[Obj] = status["conditions"]
    if spec.get("suspend") or cond.is_finished(status):
        return
    seconds = effective(trainjob_obj, policy, "activeDeadlineSeconds")
    if not seconds:
        return
    resumed = cond.find(conditions, c.COND_SUSPENDED)
    start_text = (
        resumed["lastTransitionTime"]
        if resumed is not None and resumed.get("status") == "False"
        else (trainjob_obj.get("metadata") or {}).get("creationTimestamp") or now
    )
    deadline = parse_time(start_text) + timedelta(seconds=int(seconds))
    current = parse_time(now)
    if current > deadline:
        _fail(trainjob_obj, conditions, outcome, c.REASON_DEADLINE_EXCEEDED, c.MSG_DEADLINE_EXCEEDED, now)
    else:
        outcome.requeue_within(max(1.0, (deadline - current).total_seconds()))


def _fail(
    trainjob_obj: Obj, conditions: list[Obj], outcome: Outcome, reason: str, message: str, now: str
) -> None:
    """The TrainJob fails for good and what runs it goes: its deadline passed, or a plugin found
    it cannot succeed. Its JobSet's Failed condition no longer reaches it."""
    cond.set_condition(
        conditions, {"type": c.COND_FAILED, "status": "True", "reason": reason, "message": message}, now
    )
    meta = trainjob_obj.get("metadata") or {}
    outcome.delete.append((c.JOBSET_KIND, meta.get("namespace") or "default", meta.get("name", "")))
    # Upstream applies the children, then deletes the JobSet; not creating it comes to the same.
    outcome.objects = [obj for obj in outcome.objects if obj.get("kind") != c.JOBSET_KIND]


def _tidy(status: Obj) -> Obj:
    return {k: v for k, v in status.items() if v not in (None, [], {})}
