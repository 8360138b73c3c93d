"""What the simulated controllers share: their view of the API server, one work queue, and the
condition, ownership and deletion helpers every Kubernetes controller has.

One queue and one worker serve all of them, so a JobSet and its Jobs are reconciled one at a time,
in the order their events arrived. The Job controller's user and tracking finalizer are here
because the kubelet, which ends the pods, lets the Job controller count them at once
(``release_pod``) rather than on a later event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from trainer.api.objects import Obj
from trainer_sandbox.apiserver.core import Core, now
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.apiserver.storage import Key

log = logging.getLogger(__name__)

JOBSETS: Key = ("jobset.x-k8s.io", "jobsets")
JOBS: Key = ("batch", "jobs")
PODS: Key = ("", "pods")

JOB_USER = "system:serviceaccount:kube-system:job-controller"
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"


class APIServer(Protocol):
    """What the controllers use of the server: its core (the store, and writes under a user's name)
    and the container logs it serves, which the kubelet writes."""

    @property
    def core(self) -> Core: ...

    @property
    def pod_logs(self) -> dict[tuple[str, str], list[str]]: ...


class WorkQueue:
    """Items ``(kind, namespace, name)``, each reconciled by the function registered for its kind;
    an item already waiting is not queued twice. An item that fails on a conflict, throttling or a
    server error is queued again 0.2 s later. The tasks spawned here end with the queue."""

    def __init__(self) -> None:
        self._reconcilers: dict[str, Callable[[str, str], Awaitable[None]]] = {}
        self._pending: set[tuple[str, str, str]] = set()
        self._queue: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._worker: asyncio.Task[None] | None = None

    def register(self, kind: str, reconcile: Callable[[str, str], Awaitable[None]]) -> None:
        self._reconcilers[kind] = reconcile

    def add(self, kind: str, namespace: str, name: str) -> None:
        item = (kind, namespace, name)
        if item not in self._pending:
            self._pending.add(item)
            self._queue.put_nowait(item)

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        tasks = [t for t in (self._worker, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def idle(self) -> None:
        await self._queue.join()

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            self._pending.discard(item)
            try:
                await self._reconcilers[item[0]](item[1], item[2])
            except APIError as err:
                log.debug("jobset controller: %s: %s", item, err.message)
                if err.code in (409, 429, 500):
                    self.later(0.2, lambda i=item: self.add(*i))  # type: ignore[misc]
            except Exception:
                log.exception("jobset controller: %s failed", item)
            finally:
                self._queue.task_done()

    def later(self, delay: float, fn: Callable[[], None]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay, fn)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


# -- conditions --------------------------------------------------------------------------------
def condition(ctype: str, status: str, reason: str, message: str, old: list[Obj]) -> Obj:
    for c in old:
        if c.get("type") == ctype and c.get("status") == status:
            return {**c, "reason": reason, "message": message}
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now(),
    }


def set_condition(conditions: list[Obj], cond: Obj) -> list[Obj]:
    out = [c for c in conditions if c.get("type") != cond["type"]]
    for i, c in enumerate(conditions):
        if c.get("type") == cond["type"]:
            out.insert(i, cond)
            return out
    out.append(cond)
    return out


def is_true(obj: Obj, ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


# -- owners and deletion ---------------------------------------------------------------------------
def owner_ref(owner: Obj, api_version: str, kind: str) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned(core: Core, owner: Obj, key: Key) -> list[Obj]:
    return [o for k, o in core.store.dependents(owner["metadata"]["uid"]) if k == key]


async def delete(core: Core, user: str, key: Key, obj: Obj, policy: str = "Background") -> None:
    meta = obj["metadata"]
    if key == PODS and meta.get("finalizers"):
        await core.internal_patch(
            user, PODS, meta["namespace"], meta["name"], {"metadata": {"finalizers": None}}
        )
    await core.internal_delete(user, key, meta.get("namespace", ""), meta["name"], policy, meta["uid"])


async def release_pod(core: Core, namespace: str, name: str) -> None:
    """The Job controller drops its tracking finalizer: it has counted the pod, or lets it go."""
    await core.internal_patch(JOB_USER, PODS, namespace, name, {"metadata": {"finalizers": None}})
