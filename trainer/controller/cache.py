"""What the operator knows of the cluster, fed by LIST and watch.

The render core reads :class:`Facts`; the cache *is* a Facts, kept current by the reflectors'
listings and watch events (``controller/informer.py``) and by the operator's own writes (a
write's response goes in at once, so the next reconcile does not write the same thing again
before the watch catches up). A LIST replaces what the cache holds of its scope, so an object
deleted while no watch was there to tell leaves the cache at the next LIST.
"""

from __future__ import annotations

from collections.abc import Iterator

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.runtime.info import Facts, controlled_by, trainjob_controller

TrainJobKey = tuple[str, str]


def _rv(obj: Obj | None) -> int:
    return _int((obj or {}).get("metadata", {}).get("resourceVersion")) or 0


def _int(resource_version: object) -> int | None:
    try:
        return int(str(resource_version))
    except ValueError:
        return None


class Cache(Facts):
    """Facts plus the TrainJobs themselves, and the index from children to their TrainJob."""

    def __init__(self) -> None:
        super().__init__()
        self.trainjobs: dict[TrainJobKey, Obj] = {}

    def observe(self, obj: Obj) -> None:
        """Store what a watch or a write returned, never going back to an older version.

        ``managedFields`` are dropped (as controller-runtime's cache transform does): the
        operator never reads them, and on a cluster they are often the larger part of an object.
        """
        meta = obj.get("metadata") or {}
        if "managedFields" in meta:
            meta = {k: v for k, v in meta.items() if k != "managedFields"}
            obj = {**obj, "metadata": meta}
        current = self.get(obj["kind"], meta.get("namespace"), meta["name"], group=self.group_of(obj))
        if current is not None and _rv(current) > _rv(obj) > 0:
            return
        if obj["kind"] == c.TRAINJOB_KIND:
            key = (meta.get("namespace") or "default", meta["name"])
            old = self.trainjobs.get(key)
            if old is not None and _rv(old) > _rv(obj) > 0:
                return
            self.trainjobs[key] = obj
            return
        self.put(obj)

    def forget(self, kind: str, namespace: str | None, name: str, group: str | None = None) -> None:
        if kind == c.TRAINJOB_KIND:
            self.trainjobs.pop((namespace or "default", name), None)
        else:
            self.remove(kind, namespace, name, group)

    def trainjob(self, key: TrainJobKey) -> Obj | None:
        return self.trainjobs.get(key)

    def controlled(self, obj: Obj) -> bool:
        """Whether a TrainJob this cache holds is ``obj``'s controller (by name and uid)."""
        ref = trainjob_controller(obj)
        if ref is None:
            return False
        owner = self.trainjobs.get(
            ((obj.get("metadata") or {}).get("namespace") or "default", str(ref.get("name")))
        )
        return owner is not None and controlled_by(obj, owner)

    def replace(
        self,
        kind: str,
        group: str,
        namespace: str | None,
        items: list[Obj],
        resource_version: str,
        *,
        label: str | None = None,
    ) -> tuple[list[Obj], list[Obj]]:
        """Make a fresh LIST the truth of its scope, as an informer's relist does.

        The scope is what such a LIST shows: objects of ``kind`` in API ``group``, in
        ``namespace`` (every one when None), carrying ``label`` when the LIST selected by it.
        Returns ``(changed, gone)``: the listed objects that are new or newer than the cached
        ones, and the cached objects the LIST lacks, now dropped. One the LIST lacks but that is
        newer than it (a write's response that came after the LIST was served) stays.
        """
        listed_at = _int(resource_version)
        listed = {((o.get("metadata") or {}).get("namespace") or "", o["metadata"]["name"]) for o in items}
        gone: list[Obj] = []
        for cached in list(self._scope(kind, group, namespace)):
            meta = cached.get("metadata") or {}
            if label is not None and label not in (meta.get("labels") or {}):
                continue  # read by name, outside what the LIST selects (see Writer.apply)
            if (meta.get("namespace") or "", meta["name"]) in listed:
                continue
            if listed_at is not None and _rv(cached) > listed_at:
                continue
            self.forget(kind, meta.get("namespace"), meta["name"], group)
            gone.append(cached)
        changed: list[Obj] = []
        for obj in items:
            meta = obj["metadata"]
            if kind == c.TRAINJOB_KIND:
                current = self.trainjobs.get((meta.get("namespace") or "default", meta["name"]))
            else:
                current = self.get(kind, meta.get("namespace"), meta["name"], group=group)
            if current is None or _rv(obj) > _rv(current):
                changed.append(obj)
            self.observe(obj)
        return changed, gone

    def _scope(self, kind: str, group: str, namespace: str | None) -> Iterator[Obj]:
        found = self.trainjobs.values() if kind == c.TRAINJOB_KIND else self.of_kind(kind)
        for obj in found:
            if Cache.group_of(obj) != group:
                continue
            if namespace is not None and (obj.get("metadata") or {}).get("namespace") != namespace:
                continue
            yield obj


# What is kept of an object's metadata when only its identity and ownership matter.
_SLIM_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "labels",
    "ownerReferences",
    "deletionTimestamp",
)


def slim(obj: Obj) -> Obj:
    """``obj`` without its content: what the render core needs of an object that is not one of our
    TrainJobs' children (that it exists, who controls it), and no more. A tenant's ConfigMap with
    our label, a JobSet another controller made, cost the operator their names, not their bytes."""
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {k: meta[k] for k in _SLIM_METADATA if k in meta},
    }


def owner_trainjob(obj: Obj) -> TrainJobKey | None:
    """The TrainJob that controls a child, by owner reference (or our label, for safety)."""
    meta = obj.get("metadata") or {}
    ref = trainjob_controller(obj)
    if ref is not None and ref.get("name"):
        return (meta.get("namespace") or "default", str(ref["name"]))
    label = (meta.get("labels") or {}).get(c.TRAINJOB_NAME_LABEL)
    if label:
        return (meta.get("namespace") or "default", label)
    return None
