"""From what the watches report to which TrainJobs to reconcile.

The reflectors (``controller/informer.py``) hand their listings and watch events to a
:class:`Router`: it keeps the cache current and queues the TrainJob each change concerns (the
TrainJob itself, the owner of a child, the TrainJobs waiting for a runtime that arrived). This is
kept apart from the process that runs it (``controller/operator.py``): routing needs only the
cache and the work queue, and is tested with nothing running.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.controller.cache import Cache, TrainJobKey, owner_trainjob, slim
from trainer.controller.optimization import OptimizationReconciler, optimizationjob_of
from trainer.controller.reconciler import WorkQueue
from trainer.controller.resources import Resource, Resources, Role
from trainer.controller.runtime_finalizers import RuntimeFinalizers
from trainer.runtime.info import trainjob_controller

logger = logging.getLogger("trainer.operator")


@dataclass
class Router:
    """The reflectors' sink (``informer.Sink``): the cache fed, the concerned TrainJobs queued."""

    cache: Cache
    queue: WorkQueue
    resources: Resources
    namespaces: Collection[str] = ()  # the namespaces served; none: the whole cluster
    # Told of every runtime seen (controller/runtime_finalizers.py), when the operator has one.
    runtime_finalizers: RuntimeFinalizers | None = None
    # Whether a TrainJob's reconcile is already set for when its progress write goes out
    # (``Reconciler.deferring``): a child's change that only moves progress waits for it.
    deferring: Callable[[TrainJobKey], bool] | None = None
    # The OptimizationJob controller, once the operator runs one: its searches and their trials
    # are queued there.
    optimizer: OptimizationReconciler | None = None
    # Objects kept slim that name a TrainJob controller the cache did not hold then, by that uid:
    # when the TrainJob arrives they are read again, whole (its children, seen first by a watch).
    _slim_for: dict[str, list[tuple[str, str | None, str, str]]] = field(default_factory=dict, repr=False)

    def scopes(self) -> list[tuple[Resource, str | None]]:
        """What is listed and watched: each resource in each namespace served, or cluster-wide."""
        namespaces: list[str | None] = list(self.namespaces) or [None]
        return [
            (resource, ns)
            for resource in self.resources.watched
            for ns in (namespaces if resource.type.namespaced else [None])
        ]

    def queue_all(self) -> None:
        """Queue every TrainJob the cache holds, and every OptimizationJob."""
        for key in list(self.cache.trainjobs):
            self.queue.add(key)
        if self.optimizer is not None:
            self.optimizer.queue_all()

    async def resync(self, period: float) -> None:
        """Reconcile every TrainJob now and then, as controller-runtime's SyncPeriod does: what no
        watch event told (a change the operator missed, a bug's leftover) is corrected. A TrainJob
        whose world is as it should be costs no write."""
        while True:
            await asyncio.sleep(period * random.uniform(0.9, 1.1))  # its jitter, too
            logger.debug("resync: reconciling %d TrainJobs", len(self.cache.trainjobs))
            self.queue_all()

    def listed(
        self, resource: Resource, namespace: str | None, items: list[Obj], resource_version: str
    ) -> None:
        """A LIST (at start-up, or after a watch the server could not resume): the cache takes it
        as the whole truth of its scope, and the TrainJobs of what changed or vanished are queued."""
        typed = [self._kept(resource, _typed(item, resource)) for item in items]
        if resource.role is Role.TRAINJOB:
            for item in typed:
                self._arrived(item)
        changed, gone = self.cache.replace(
            resource.kind, resource.type.group, namespace, typed, resource_version, label=resource.label
        )
        for obj in gone:
            self._concerns(resource, obj, deleted=True)
            self._trial(resource, obj)
        for obj in changed:
            self._concerns(resource, obj, deleted=False)
            self._trial(resource, obj)

    def changed(self, resource: Resource, type_: str, obj: Obj) -> None:
        """A watch event: keep the cache current and queue the TrainJobs the change concerns."""
        obj = _typed(obj, resource)
        meta = obj["metadata"]
        deleted = type_ == "DELETED"
        # A trial's every change, the echo of its status write too: its search reads it next.
        self._trial(resource, obj)
        if deleted:
            self.cache.forget(resource.kind, meta.get("namespace"), meta["name"], Cache.group_of(obj))
            if resource.role is Role.TRAINJOB:
                self._forget_unwatched_children(obj)
        else:
            before = self._cached(resource, obj)
            self.cache.observe(kept := self._kept(resource, obj))
            if resource.role is Role.TRAINJOB:
                self._arrived(obj)
            if before is not None:
                version = meta.get("resourceVersion")
                if version and (before.get("metadata") or {}).get("resourceVersion") == version:
                    # The cache held this very version: a write of ours returned it (this is the
                    # write's echo) or a read found it, and the reconcile that wrote or read it
                    # had it. A LIST treats it so too (Cache.replace): no change, no reconcile.
                    return
                if (
                    resource.kind == c.JOBSET_KIND
                    and self.deferring is not None
                    and progress_only(before, kept)
                ):
                    owner = owner_trainjob(kept)
                    if owner is not None and self.deferring(owner):
                        return
        self._concerns(resource, obj, deleted=deleted)

    def _cached(self, resource: Resource, obj: Obj) -> Obj | None:
        """What the cache holds of a TrainJob's or a child's name, before this event."""
        meta = obj["metadata"]
        if resource.role is Role.TRAINJOB:
            return self.cache.trainjob((meta.get("namespace") or "default", meta["name"]))
        if resource.role in (Role.CHILD, Role.OPTIMIZATIONJOB):
            return self.cache.get(resource.kind, meta.get("namespace"), meta["name"], Cache.group_of(obj))
        return None

    def _trial(self, resource: Resource, trainjob: Obj) -> None:
        """A TrainJob that is a search's trial: its OptimizationJob is queued."""
        if resource.role is Role.TRAINJOB and self.optimizer is not None:
            key = optimizationjob_of(trainjob)
            if key is not None:
                self.optimizer.queue.add(key)

    def _arrived(self, trainjob: Obj) -> None:
        """Its children the cache keeps slim (seen before it) are forgotten: the next reconcile
        reads them again by name (its create meets them), whole now that their controller is
        known, instead of judging a snapshot without its runtime."""
        uid = str((trainjob.get("metadata") or {}).get("uid") or "")
        for kind, namespace, name, group in self._slim_for.pop(uid, []):
            self.cache.forget(kind, namespace, name, group)

    def _forget_unwatched_children(self, trainjob: Obj) -> None:
        """What the cache holds of a deleted TrainJob's create-only children (its Secrets, which
        no watch follows) goes with it: the cache does not grow with every TrainJob ever run."""
        uid = (trainjob.get("metadata") or {}).get("uid")
        for resource in self.resources.writable.values():
            if resource.watched:
                continue
            for child in list(self.cache.of_kind(resource.kind)):
                meta = child.get("metadata") or {}
                if any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or []):
                    self.cache.forget(resource.kind, meta.get("namespace"), meta["name"], resource.type.group)

    def _kept(self, resource: Resource, obj: Obj) -> Obj:
        """What the cache keeps of a watched object: the whole of a child one of our TrainJobs
        controls (the render core compares it with what it builds), only the identity and
        ownership of any other object of a child kind (docs/security.md, finding 4)."""
        if resource.role is Role.CHILD and not self.cache.controlled(obj):
            owner = owner_trainjob_uid(obj)
            if owner is not None:  # perhaps ours, its TrainJob not seen yet: remembered for then
                meta = obj["metadata"]
                key = (resource.kind, meta.get("namespace"), meta["name"], resource.type.group)
                if owner not in self._slim_for and len(self._slim_for) >= 10_000:
                    del self._slim_for[next(iter(self._slim_for))]  # bounded: forged references
                waiting = self._slim_for.setdefault(owner, [])
                if key not in waiting:
                    waiting.append(key)
            return slim(obj)
        return obj

    def _concerns(self, resource: Resource, obj: Obj, *, deleted: bool) -> None:
        meta = obj["metadata"]
        match resource.role:
            case Role.TRAINJOB:
                if not deleted:
                    self.queue.add((meta.get("namespace") or "default", meta["name"]))
            case Role.RUNTIME:
                if not deleted:
                    self._runtime_arrived(obj)
                    if self.runtime_finalizers is not None:
                        self.runtime_finalizers.saw(obj)
            case Role.CHILD:
                owner = owner_trainjob(obj)
                if owner is not None:
                    self.queue.add(owner)
            case Role.OPTIMIZATIONJOB:
                if self.optimizer is not None:
                    if deleted:
                        self.optimizer.forget(str(meta.get("uid") or ""))
                    else:
                        self.optimizer.queue.add((meta.get("namespace") or "default", meta["name"]))
            case Role.FACT:
                pass  # read when a TrainJob is reconciled or admitted; a change reconciles nothing

    def _runtime_arrived(self, runtime: Obj) -> None:
        """A TrainJob waiting for this runtime (no snapshot yet) can go on now."""
        meta = runtime["metadata"]
        for key, trainjob in list(self.cache.trainjobs.items()):
            ref = trainjob.get("spec", {}).get("runtimeRef") or {}
            if (
                ref.get("name") != meta["name"]
                or (ref.get("kind") or c.CLUSTER_TRAINING_RUNTIME_KIND) != runtime["kind"]
            ):
                continue
            if runtime["kind"] == c.TRAINING_RUNTIME_KIND and key[0] != meta.get("namespace"):
                continue
            if self.cache.get("ConfigMap", key[0], key[1] + c.RUNTIME_SNAPSHOT_SUFFIX) is None:
                self.queue.add(key)


def progress_only(before: Obj, after: Obj) -> bool:
    """Whether a child's change is confined to its status, its conditions as they were: what a
    TrainJob's status takes from it then is progress (``jobsStatus``, ``startTime``), never a
    condition (plugins/jobset.py ``jobset_status``), so it can wait its turn (docs/decisions.md
    §batch). A child kept slim has no status to judge by, and is never taken to be one."""
    old_status, new_status = before.get("status"), after.get("status")
    if not isinstance(old_status, dict) or not isinstance(new_status, dict):
        return False
    if old_status.get("conditions") != new_status.get("conditions"):
        return False
    if before.get("spec") != after.get("spec"):
        return False
    old_meta = {k: v for k, v in (before.get("metadata") or {}).items() if k not in _VERSION_FIELDS}
    new_meta = {k: v for k, v in (after.get("metadata") or {}).items() if k not in _VERSION_FIELDS}
    return old_meta == new_meta


_VERSION_FIELDS = frozenset({"resourceVersion", "managedFields"})


def owner_trainjob_uid(obj: Obj) -> str | None:
    """The uid of the TrainJob an object's controller reference names, if one does."""
    ref = trainjob_controller(obj)
    return str(ref["uid"]) if ref is not None and ref.get("uid") else None


def _typed(obj: Obj, resource: Resource) -> Obj:
    """Lists and watch events may leave out each item's apiVersion and kind; the cache needs them."""
    obj.setdefault("apiVersion", resource.api_version)
    obj.setdefault("kind", resource.kind)
    return obj
