"""Garbage collection by ownerReferences and namespace deletion, as kube-controller-manager does it.

Both run as one worker on the server's loop, driven by storage events, and write through the normal
request path under their own users, so their deletes show in the audit log and in watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from trainer.api.objects import Obj
from trainer_sandbox.apiserver.core import GC_USER, NAMESPACE_CONTROLLER_USER, Core
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.apiserver.storage import Event, Key

log = logging.getLogger(__name__)
NAMESPACES: Key = ("", "namespaces")


class GarbageCollector:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        core.store.listeners.append(self._on_event)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    def _on_event(self, ev: Event) -> None:
        meta = ev.obj["metadata"]
        if ev.type == "DELETED":
            self.queue.put_nowait(("owner-gone", meta["uid"]))
            for ref in meta.get("ownerReferences") or []:
                self.queue.put_nowait(("recheck", ref.get("uid")))
            ns = meta.get("namespace")
            if ns:
                ns_obj = self.core.store.get(NAMESPACES, "", ns)
                if ns_obj is not None and ns_obj["metadata"].get("deletionTimestamp"):
                    self.queue.put_nowait(("namespace", ns))
            return
        if meta.get("deletionTimestamp"):
            if ev.key == NAMESPACES:
                self.queue.put_nowait(("namespace", meta["name"]))
            fins = meta.get("finalizers") or []
            if "orphan" in fins or "foregroundDeletion" in fins:
                self.queue.put_nowait(("recheck", meta["uid"]))
        if ev.type == "ADDED" and meta.get("ownerReferences"):
            self.queue.put_nowait(("check-owners", meta["uid"]))

    async def idle(self) -> None:
        """Wait until queued work is done (tests use it to avoid sleeping)."""
        await self.queue.join()

    async def _run(self) -> None:
        while True:
            item = await self.queue.get()
            try:
                await self._handle(item)
            except APIError as err:
                log.debug("gc: %s failed: %s", item, err.message)
                if err.code in (409, 429, 500):  # a stale read or an injected fault: try again
                    asyncio.get_running_loop().call_later(0.1, self.queue.put_nowait, item)
            except Exception:
                log.exception("gc: %s failed", item)
            finally:
                self.queue.task_done()

    async def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "owner-gone":
            for key, dep in self.core.store.dependents(item[1]):
                await self._orphaned(key, dep, gone_uid=item[1])
        elif kind == "check-owners":
            loc = self.core.store.locate(item[1])
            added = self.core.store.by_uid(item[1])
            if loc is not None and added is not None:
                await self._orphaned(loc[0], added, gone_uid=None)
        elif kind == "recheck":
            await self._finalize(item[1])
        elif kind == "namespace":
            await self._namespace(item[1])

    def _owner_alive(self, ref: dict[str, Any], dep: Obj) -> bool:
        owner = self.core.store.by_uid(ref.get("uid", ""))
        if owner is None:
            return False
        owner_ns = owner["metadata"].get("namespace")
        return not owner_ns or owner_ns == dep["metadata"].get("namespace")

    async def _orphaned(self, key: Key, dep: Obj, gone_uid: str | None) -> None:
        meta = dep["metadata"]
        refs = meta.get("ownerReferences") or []
        alive = [r for r in refs if r.get("uid") != gone_uid and self._owner_alive(r, dep)]
        if len(alive) == len(refs):
            return
        if alive:
            await self.core.internal_patch(
                GC_USER,
                key,
                meta.get("namespace", ""),
                meta["name"],
                {"metadata": {"ownerReferences": alive, "resourceVersion": meta["resourceVersion"]}},
            )
            return
        if meta.get("deletionTimestamp"):
            return
        policy = "Background"
        if gone_uid is None or any(self._foreground(r) for r in refs):
            policy = "Background"
        await self.core.internal_delete(
            GC_USER, key, meta.get("namespace", ""), meta["name"], policy, meta["uid"]
        )

    def _foreground(self, ref: dict[str, Any]) -> bool:
        owner = self.core.store.by_uid(ref.get("uid", ""))
        return owner is not None and "foregroundDeletion" in (owner["metadata"].get("finalizers") or [])

    async def _finalize(self, uid: str | None) -> None:
        if not uid:
            return
        obj = self.core.store.by_uid(uid)
        loc = self.core.store.locate(uid)
        if obj is None or loc is None or not obj["metadata"].get("deletionTimestamp"):
            return
        key = loc[0]
        meta = obj["metadata"]
        fins = list(meta.get("finalizers") or [])
        deps = self.core.store.dependents(uid)
        if "orphan" in fins:
            for dkey, dep in deps:
                dmeta = dep["metadata"]
                refs = [r for r in dmeta.get("ownerReferences") or [] if r.get("uid") != uid]
                await self.core.internal_patch(
                    GC_USER,
                    dkey,
                    dmeta.get("namespace", ""),
                    dmeta["name"],
                    {"metadata": {"ownerReferences": refs or None}},
                )
            fins.remove("orphan")
        elif "foregroundDeletion" in fins:
            blocking = []
            for dkey, dep in deps:
                dmeta = dep["metadata"]
                if not dmeta.get("deletionTimestamp"):
                    await self.core.internal_delete(
                        GC_USER, dkey, dmeta.get("namespace", ""), dmeta["name"], "Foreground", dmeta["uid"]
                    )
                if self.core.store.by_uid(dmeta["uid"]) is not None and any(
                    r.get("uid") == uid and r.get("blockOwnerDeletion")
                    for r in dmeta.get("ownerReferences") or []
                ):
                    blocking.append(dmeta["uid"])
            if blocking:
                return
            fins.remove("foregroundDeletion")
        else:
            return
        await self.core.internal_patch(
            GC_USER,
            key,
            meta.get("namespace", ""),
            meta["name"],
            {"metadata": {"finalizers": fins or None, "resourceVersion": meta["resourceVersion"]}},
        )

    async def _namespace(self, name: str) -> None:
        ns = self.core.store.get(NAMESPACES, "", name)
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            return
        remaining = False
        for key in self.core.store.namespaces_with_content(name):
            for obj in list(self.core.store.iter(key, name)):
                remaining = True
                meta = obj["metadata"]
                if not meta.get("deletionTimestamp"):
                    await self.core.internal_delete(
                        NAMESPACE_CONTROLLER_USER, key, name, meta["name"], "Background", meta["uid"]
                    )
        if remaining and self.core.store.namespaces_with_content(name):
            return
        if (ns.get("spec") or {}).get("finalizers"):
            await self.core.internal_patch(
                NAMESPACE_CONTROLLER_USER, NAMESPACES, "", name, {"spec": {"finalizers": None}}
            )
