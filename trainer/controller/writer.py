"""Write only the difference between what the render core wants and what the cluster has.

Servers and other controllers add defaults to what we write (JobSet's webhook fills in its
spec, the API server adds metadata), so "the same" means: every field we own, as we want it, is
present in what is observed. A reconcile that finds the world as it should be writes nothing.
Writes are plain creates and JSON merge patches of the fields we own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.api.objects import Obj
from trainer.controller.cache import Cache
from trainer.controller.client import STATUS, ApiClient, ApiError
from trainer.controller.resources import TRAINJOBS, resource_of

_SERVER_OWNED_TOP = ("apiVersion", "kind", "metadata", "status")


def contains(observed: object, desired: object) -> bool:
    """True when every field of ``desired`` is in ``observed`` with the same value.

    Maps may hold more keys than we set; lists must match item by item (we own the lists we
    write), each item compared the same way so defaults inside items are tolerated.
    """
    if isinstance(desired, dict):
        return isinstance(observed, dict) and all(
            k in observed and contains(observed[k], v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(observed, list)
            and len(observed) == len(desired)
            and all(contains(o, d) for o, d in zip(observed, desired, strict=True))
        )
    if isinstance(desired, bool) or isinstance(observed, bool):
        return observed is desired
    return bool(observed == desired)


def patch_for(observed: Obj, desired: Obj) -> Obj:
    """A merge patch that sets the fields we own: our metadata, and each field of ours that differs.

    A JSON merge patch replaces a list whole, and what others added inside one is then lost.
    JobSet's webhook defaults fields inside ``replicatedJobs`` on create only (``completionMode``,
    the pod ``restartPolicy``), and refuses any later change to ``replicatedJobs`` outside a few
    pod-template fields: resending the whole ``spec`` to flip ``suspend`` was refused (422), so a
    suspended TrainJob never resumed on a real cluster. So maps are patched key by key, only where
    they differ, and a list that does differ is sent with each item laid over the observed item it
    replaces.
    """
    meta = desired.get("metadata") or {}
    patch: Obj = {"metadata": {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta}}
    for key, value in desired.items():
        if key not in _SERVER_OWNED_TOP and not contains(observed.get(key), value):
            patch[key] = _difference(observed.get(key), value)
    return patch


def _difference(observed: object, desired: object) -> object:
    """The merge patch of one field whose observed value does not contain the desired one."""
    if isinstance(desired, dict) and isinstance(observed, dict):
        return {
            k: _difference(observed.get(k), v) for k, v in desired.items() if not contains(observed.get(k), v)
        }
    return _overlay(observed, desired)


def _overlay(observed: object, desired: object) -> object:
    """``desired`` laid over ``observed``: the fields others added stay, ours win."""
    if isinstance(desired, dict):
        merged = dict(observed) if isinstance(observed, dict) else {}
        merged.update({k: _overlay(merged.get(k), v) for k, v in desired.items()})
        return merged
    if isinstance(desired, list):
        items = observed if isinstance(observed, list) else []
        return [_overlay(_counterpart(items, i, item), item) for i, item in enumerate(desired)]
    return desired


def _counterpart(observed: list[object], index: int, item: object) -> object:
    """The observed item a desired one replaces: the one with its name, else the one in its place
    (a named item whose name is new has none: it must not inherit another item's fields)."""
    if isinstance(item, dict) and "name" in item:
        return next((o for o in observed if isinstance(o, dict) and o.get("name") == item["name"]), None)
    return observed[index] if index < len(observed) else None


def status_patch(current: Obj | None, desired: Obj | None) -> Obj | None:
    """The merge patch that turns one status into the other, or None when they are equal."""
    current = current or {}
    desired = desired or {}
    if current == desired:
        return None
    patch: Obj = {k: v for k, v in desired.items() if current.get(k) != v}
    patch.update({k: None for k in current if k not in desired})
    return patch


@dataclass
class WriteReport:
    created: list[Obj] = field(default_factory=list)
    patched: list[Obj] = field(default_factory=list)
    deleted: list[tuple[str, str, str]] = field(default_factory=list)
    status_written: bool = False


class Writer:
    def __init__(self, client: ApiClient, cache: Cache) -> None:
        self.client = client
        self.cache = cache

    async def apply(self, desired: list[Obj], report: WriteReport) -> None:
        for obj in desired:
            meta = obj["metadata"]
            rtype = resource_of(obj)
            observed = self.cache.get(
                obj["kind"], meta.get("namespace"), meta["name"], group=Cache.group_of(obj)
            )
            if observed is None:
                try:
                    stored = await self.client.create(rtype, meta.get("namespace"), obj)
                except ApiError as exc:
                    if exc.code != 409:
                        raise
                    # The object exists but our cache lacks it: the watch is behind, or it is one
                    # our label-selected watches never see (made by hand, or by another operator).
                    # Read it once (LIST by name: the rights we already hold), so the next
                    # reconcile judges it: ours gets our label by patch, a foreign snapshot is
                    # refused on status, an existing SSH Secret is used.
                    found = await self.client.list(
                        rtype, meta.get("namespace"), field_selector=f"metadata.name={meta['name']}"
                    )
                    for item in found.get("items") or []:
                        self.cache.observe(_with_kind(item, obj))
                    raise StaleCache(f"{obj['kind']} {meta['name']} exists but was not in the cache") from exc
                self.cache.observe(_with_kind(stored, obj))
                report.created.append(obj)
                continue
            if obj["kind"] == "Secret" or contains(observed, obj):
                continue  # Secrets we own are immutable; anything else already matches
            stored = await self.client.patch(
                rtype, meta.get("namespace"), meta["name"], patch_for(observed, obj)
            )
            self.cache.observe(_with_kind(stored, obj))
            report.patched.append(obj)

    async def delete(self, kind: str, namespace: str, name: str, report: WriteReport) -> None:
        observed = self.cache.get(kind, namespace, name)
        if observed is None:
            return
        try:
            await self.client.delete(resource_of(observed), namespace, name)
        except ApiError as exc:
            if exc.code != 404:
                raise
        self.cache.forget(kind, namespace, name)
        report.deleted.append((kind, namespace, name))

    async def write_status(
        self, trainjob: Obj, desired: Obj | None, report: WriteReport, *, wait: bool = True
    ) -> Obj | None:
        """Patch the status when it differs; ``wait=False`` raises Throttled when the budget is spent."""
        patch = status_patch(trainjob.get("status"), desired)
        if patch is None:
            return None
        meta = trainjob["metadata"]
        # The CRD's status needs at least one property: one with nothing left goes whole.
        body = {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": patch if desired else None,
        }
        stored = await self.client.patch(
            TRAINJOBS.type,
            meta.get("namespace"),
            meta["name"],
            body,
            subresource="status",
            priority=STATUS,
            wait=wait,
        )
        self.cache.observe(_with_kind(stored, trainjob))
        report.status_written = True
        return stored


class StaleCache(Exception):
    """A write found the cluster ahead of our cache; retry once the watch has caught up."""


def _with_kind(stored: Obj, sent: Obj) -> Obj:
    stored.setdefault("apiVersion", sent["apiVersion"])
    stored.setdefault("kind", sent["kind"])
    return stored
