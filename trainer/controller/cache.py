"""What the operator knows of the cluster, fed by watches.

The render core reads :class:`Facts`; the cache *is* a Facts, kept current by kopf's watch
events and by the operator's own writes (a write's response goes in at once, so the next
reconcile does not write the same thing again before the watch catches up).
"""

from __future__ import annotations

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.runtime.info import Facts

TrainJobKey = tuple[str, str]


def _rv(obj: Obj | None) -> int:
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


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


def owner_trainjob(obj: Obj) -> TrainJobKey | None:
    """The TrainJob that controls a child, by owner reference (or our label, for safety)."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if (
            ref.get("kind") == c.TRAINJOB_KIND
            and ref.get("controller")
            and str(ref.get("apiVersion", "")).startswith(c.GROUP)
        ):
            return (meta.get("namespace") or "default", ref["name"])
    label = (meta.get("labels") or {}).get(c.TRAINJOB_NAME_LABEL)
    if label:
        return (meta.get("namespace") or "default", label)
    return None
