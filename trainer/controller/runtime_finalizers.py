"""The finalizer upstream's v2.0 to v2.2 left on runtimes, removed (docs/upstream-behaviour.md
§runtime-finalizer).

Those releases put ``trainer.kubeflow.org/resource-in-use`` on every TrainingRuntime and
ClusterTrainingRuntime a TrainJob used, and took it off when none did; v2.3 stopped using it, and
its two runtime controllers only remove it. We have no runtime controller, but we watch the
runtimes already (a TrainJob waits for its runtime): the leader removes the finalizer from each
runtime that still carries it, once, when it sees one. Without this a runtime carried over from
those releases could never be deleted: its deletion would wait for a controller that no longer
exists.

The write is a merge patch of ``metadata.finalizers`` without that entry, with the
``resourceVersion`` it was read at: a runtime changed meanwhile is a 409, and its next watch event
brings it back here. It goes through the reconciler's client, so the leader-election fence and the
client budget apply as to every other write.
"""

from __future__ import annotations

import asyncio
import logging

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.controller.cache import Cache
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.resources import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES

logger = logging.getLogger("trainer.operator")

RESOURCE_IN_USE = f"{c.GROUP}/resource-in-use"
RuntimeKey = tuple[str, str | None, str]  # (kind, namespace, name)
RETRY_SECONDS = 5.0  # after an error other than a conflict or a runtime gone


def carries_it(obj: Obj) -> bool:
    return RESOURCE_IN_USE in ((obj.get("metadata") or {}).get("finalizers") or [])


class RuntimeFinalizers:
    """Runtimes seen with the finalizer, and the workers that remove it while this replica leads."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.pending: dict[RuntimeKey, None] = {}  # ordered, without duplicates
        self.wake = asyncio.Event()
        self.removed = 0

    def saw(self, obj: Obj) -> None:
        """A runtime the watches brought: queued when it carries the finalizer."""
        if carries_it(obj):
            meta = obj["metadata"]
            self.pending[(str(obj["kind"]), meta.get("namespace"), meta["name"])] = None
            self.wake.set()

    def saw_all(self) -> None:
        """Every runtime the cache holds (a replica that starts leading looks at all of them)."""
        for kind in c.RUNTIME_KINDS:
            for obj in list(self.cache.of_kind(kind)):
                self.saw(obj)

    async def worker(self, client: ApiClient) -> None:
        while True:
            if not self.pending:
                self.wake.clear()
                await self.wake.wait()
                continue
            key = next(iter(self.pending))
            del self.pending[key]
            try:
                await self.remove(client, key)
            except ApiError as exc:
                logger.warning(
                    "%s %s: removing the finalizer %s failed: %s", key[0], key[2], RESOURCE_IN_USE, exc
                )
                await asyncio.sleep(RETRY_SECONDS)
                self.pending.setdefault(key, None)

    async def remove(self, client: ApiClient, key: RuntimeKey) -> None:
        kind, namespace, name = key
        obj = self.cache.get(kind, namespace, name, group=c.GROUP)
        if obj is None or not carries_it(obj):
            return  # gone, or removed meanwhile (by us before, or by anyone)
        meta = obj["metadata"]
        resource = TRAINING_RUNTIMES if kind == c.TRAINING_RUNTIME_KIND else CLUSTER_TRAINING_RUNTIMES
        patch = {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "finalizers": [f for f in meta.get("finalizers") or [] if f != RESOURCE_IN_USE],
            }
        }
        try:
            await client.request(
                "PATCH",
                resource.type.path(namespace, name),
                patch,
                content_type="application/merge-patch+json",
            )
        except ApiError as exc:
            if exc.code in (404, 409):  # gone, or changed: its next watch event brings it back
                return
            raise
        self.removed += 1
        logger.info(
            "%s %s: removed the finalizer %s (upstream's v2.0 to v2.2 left it)",
            kind,
            f"{namespace}/{name}" if namespace else name,
            RESOURCE_IN_USE,
        )
