"""Write only the difference between what the render core wants and what the cluster has.

Servers and other controllers add defaults to what we write (JobSet's webhook fills in its
spec, the API server adds metadata), so "the same" means: every field we own, as we want it, is
present in what is observed. A reconcile that finds the world as it should be writes nothing.

What differs is written with server-side apply under one field manager, ``trainer`` (upstream's
name too), forced as controllers do: we send the whole object we want, the API server merges it
with the object as it is, and the fields others set that we do not (a node selector or toleration
Kueue puts on a suspended JobSet's pod template, what a webhook defaulted) stay; a field we set
once and want no longer goes. ConfigMaps and Secrets are created with a plain create instead (see
``Writer.create``). Secrets (create-only key material) are never listed or watched: what is
cached of one is its metadata, from our create or, when a create finds the name taken, from a
read of that one object by name. The TrainJob status is a merge patch with the TrainJob's
resourceVersion.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.api.objects import Obj, contains
from trainer.controller.cache import Cache, slim
from trainer.controller.client import STATUS, ApiClient, ApiError, ResourceType
from trainer.controller.resources import TRAINJOBS, Resources

FIELD_MANAGER = "trainer"


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
    def __init__(self, client: ApiClient, cache: Cache, resources: Resources) -> None:
        self.client = client
        self.cache = cache
        self.resources = resources

    async def apply(self, desired: list[Obj], report: WriteReport) -> None:
        for obj in desired:
            meta = obj["metadata"]
            resource = self.resources.writable_resource(obj)
            rtype = resource.type
            observed = self.cache.get(
                obj["kind"], meta.get("namespace"), meta["name"], group=Cache.group_of(obj)
            )
            if observed is None:
                try:
                    # Create-only kinds (never watched) by a plain create too: its 409 is how an
                    # object already in the name's way shows.
                    stored = await self.create(rtype, obj, plain=resource.labelled or not resource.watched)
                except ApiError as exc:
                    if exc.code == 404 and resource.optional:
                        raise not_served(exc, obj) from exc
                    if exc.code != 409:
                        raise
                    # The object exists but our cache lacks it: the watch is behind, or it is one
                    # our label-selected watches never see (made by hand, or by another operator).
                    # Read it once (LIST by name: the rights we already hold), so the next
                    # reconcile judges it: ours gets our label by apply, a foreign snapshot is
                    # refused on status, an existing SSH Secret is used.
                    if resource.watched:
                        found = await self.client.list(
                            rtype, meta.get("namespace"), field_selector=f"metadata.name={meta['name']}"
                        )
                        for item in found.get("items") or []:
                            item = _with_kind(item, obj)
                            # Whole if ours (a watch running behind); another's costs its name only.
                            self.cache.observe(item if self.cache.controlled(item) else slim(item))
                    else:  # never listed: its metadata, by name (who controls it is all we need)
                        try:
                            item = await self.client.get_metadata(rtype, meta.get("namespace"), meta["name"])
                        except ApiError as gone:
                            if gone.code != 404:
                                raise
                        else:
                            self.cache.observe(_metadata_of(item, obj))
                    raise StaleCache(f"{obj['kind']} {meta['name']} exists but was not in the cache") from exc
                self.cache.observe(_with_kind(stored, obj) if resource.watched else _metadata_of(stored, obj))
                report.created.append(obj)
                continue
            if not resource.patch or contains(observed, obj):
                continue  # written once and never changed (key material), or already as built
            # Forced: a field another manager took (Kueue resuming a JobSet itself) is ours again.
            stored = await self.client.apply(
                rtype, meta.get("namespace"), obj, field_manager=FIELD_MANAGER, force=True
            )
            self.cache.observe(_with_kind(stored, obj))
            report.patched.append(obj)

    async def create(self, rtype: ResourceType, obj: Obj, *, plain: bool) -> Obj:
        """Create ``obj``; 409 when an object of its name exists that this must not overwrite.

        JobSets and PodGroups are created by an unforced apply, so that the fields we set are ours
        to change and remove later (a plain create would leave them owned by an ``Update`` entry,
        and a node selector we stop wanting would stay). Their watches see every object, so one
        missing from the cache is only a watch running behind, and applying what we want over it
        is harmless; one another manager wrote with other values is a conflict (409), which the
        caller treats as a create's AlreadyExists. The API server asks ``create`` as well as
        ``patch`` of an apply that creates. Kinds we watch through a label (``plain``: ConfigMaps
        and Secrets) are created by a plain create under the same manager name: one that exists
        without our label (made by hand, or by upstream's operator) never reaches the cache, and
        what it holds was fixed when it was made, so a create must fail on it rather than apply
        over it: an SSH Secret is never re-keyed, a snapshot never rewritten.
        """
        namespace = obj["metadata"].get("namespace")
        if plain:
            return await self.client.create(rtype, namespace, obj, field_manager=FIELD_MANAGER)
        return await self.client.apply(rtype, namespace, obj, field_manager=FIELD_MANAGER, force=False)

    async def delete(self, observed: Obj, report: WriteReport, *, propagation: str = "Background") -> None:
        """Delete that object, that incarnation of it only: its uid is the precondition."""
        meta = observed["metadata"]
        kind, namespace, name = observed["kind"], meta.get("namespace") or "default", meta["name"]
        stored: Obj | None = None
        try:
            stored = await self.client.delete(
                self.resources.resource_of(observed),
                namespace,
                name,
                uid=meta.get("uid"),
                propagation=propagation,
            )
        except ApiError as exc:
            if exc.code not in (404, 409):  # gone, or another object has the name now
                raise
        if stored and stored.get("kind") == kind and (stored.get("metadata") or {}).get("deletionTimestamp"):
            # Still there, going (its dependents first, in the foreground): the next reconcile
            # must see it so, not build a new one onto it (docs/decisions.md §resize).
            self.cache.observe(_with_kind(stored, observed))
        else:
            self.cache.forget(kind, namespace, name)
        report.deleted.append((kind, namespace, name))

    async def delete_trainjob(self, trainjob: Obj, report: WriteReport) -> None:
        """Delete a TrainJob whose TTL ran out (its children go by garbage collection); the uid
        precondition spares a new TrainJob that took the name meanwhile."""
        meta = trainjob["metadata"]
        namespace = meta.get("namespace") or "default"
        try:
            await self.client.delete(TRAINJOBS.type, namespace, meta["name"], uid=meta.get("uid"))
        except ApiError as exc:
            if exc.code not in (404, 409):
                raise
            return
        report.deleted.append(("TrainJob", namespace, meta["name"]))

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


def _metadata_of(stored: Obj, sent: Obj) -> Obj:
    """What is cached of a create-only child: its identity and ownership (cache.slim), never its
    data (key material has no business in the operator's memory once written). ``stored`` may be
    a PartialObjectMetadata: the kind is the one sent."""
    return slim({**stored, "apiVersion": sent["apiVersion"], "kind": sent["kind"]})


def _with_kind(stored: Obj, sent: Obj) -> Obj:
    stored.setdefault("apiVersion", sent["apiVersion"])
    stored.setdefault("kind", sent["kind"])
    return stored


def not_served(exc: ApiError, obj: Obj) -> ApiError:
    """A create's 404 for a kind whose API may be absent says so: the status shows why, not "the
    server could not find the requested resource" (a gang scheduler's CRD, or kube-scheduler's
    alpha API behind its feature gates: docs/scheduling.md)."""
    message = (
        f"the API server does not serve {obj.get('kind')} ({obj.get('apiVersion')}): its API is not "
        "installed or not enabled in this cluster"
    )
    return ApiError(exc.code, {**exc.status, "message": message})
