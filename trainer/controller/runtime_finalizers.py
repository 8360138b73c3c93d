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
# After a failure (anything but a conflict or a runtime gone): this long, doubled for each failure
# of the same runtime in a row, up to the last; other runtimes go first meanwhile.
RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 300.0


def carries_it(obj: Obj) -> bool:
    return RESOURCE_IN_USE in ((obj.get("metadata") or {}).get("finalizers") or [])


class RuntimeFinalizers:
    """Runtimes seen with the finalizer, and the workers that remove it while this replica leads."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.pending: dict[RuntimeKey, None] = {}  # ordered, without duplicates
        self.wake = asyncio.Event()
        self.removed = 0
        self.failures: dict[RuntimeKey, int] = {}  # failed in a row

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
        """Runs while this replica leads; no failure ends it (as a reconcile worker's does not)."""
        while True:
            if not self.pending:
                self.wake.clear()
                await self.wake.wait()
                continue
            key = next(iter(self.pending))
            del self.pending[key]
            try:
                await self.remove(client, key)
            except Exception as exc:  # the API server's refusal, a connection given up, a bug
                failures = self.failures[key] = self.failures.get(key, 0) + 1
                delay = min(MAX_RETRY_SECONDS, RETRY_SECONDS * 2 ** (failures - 1))
                logger.warning(
                    "%s %s: removing the finalizer %s failed (%s); again in %.0f s",
                    key[0],
                    key[2],
                    RESOURCE_IN_USE,
                    exc if isinstance(exc, ApiError) else type(exc).__name__,
                    delay,
                )
                asyncio.get_running_loop().call_later(delay, self._again, key)
            else:
                self.failures.pop(key, None)

    def _again(self, key: RuntimeKey) -> None:
        self.pending.setdefault(key, None)
        self.wake.set()

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
