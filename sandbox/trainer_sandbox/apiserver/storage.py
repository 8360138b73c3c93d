"""In-memory object storage: one resourceVersion counter, indexes, and bounded watch history.

Everything here runs on the server's event loop, so there are no locks. Stored objects are never
mutated after they are stored: every write stores a new dict, and readers serialize or copy.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from trainer.api.objects import Obj

Key = tuple[str, str]  # (group, plural)


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    key: Key
    obj: Obj
    old: Obj | None


class Watcher:
    """A subscriber of the events of one resource; the HTTP watch drains ``queue``."""

    def __init__(self, key: Key) -> None:
        self.key = key
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()

    def close(self) -> None:
        self.queue.put_nowait(None)


class Store:
    def __init__(self, history_size: int = 5000) -> None:
        self.rv = 0
        self.history_size = history_size
        self._objects: dict[Key, dict[str, dict[str, Obj]]] = {}
        self._by_uid: dict[str, tuple[Key, str, str]] = {}
        self._dependents: dict[str, set[str]] = {}
        self._history: dict[Key, deque[Event]] = {}
        self._compacted: dict[Key, int] = {}
        self._watchers: dict[Key, set[Watcher]] = {}
        self.listeners: list[Callable[[Event], None]] = []

    # -- reads ---------------------------------------------------------------------------------
    def get(self, key: Key, namespace: str, name: str) -> Obj | None:
        return self._objects.get(key, {}).get(namespace, {}).get(name)

    def iter(self, key: Key, namespace: str | None = None) -> Iterator[Obj]:
        by_ns = self._objects.get(key, {})
        if namespace is not None:
            yield from by_ns.get(namespace, {}).values()
            return
        for objs in list(by_ns.values()):
            yield from list(objs.values())

    def count(self, key: Key, namespace: str | None = None) -> int:
        by_ns = self._objects.get(key, {})
        if namespace is not None:
            return len(by_ns.get(namespace, {}))
        return sum(len(v) for v in by_ns.values())

    def by_uid(self, uid: str) -> Obj | None:
        loc = self._by_uid.get(uid)
        return self.get(*loc) if loc else None

    def locate(self, uid: str) -> tuple[Key, str, str] | None:
        return self._by_uid.get(uid)

    def dependents(self, owner_uid: str) -> list[tuple[Key, Obj]]:
        out = []
        for uid in list(self._dependents.get(owner_uid, ())):
            loc = self._by_uid.get(uid)
            obj = self.get(*loc) if loc else None
            if loc and obj is not None:
                out.append((loc[0], obj))
        return out

    def namespaces_with_content(self, namespace: str) -> list[Key]:
        return [key for key, by_ns in self._objects.items() if by_ns.get(namespace)]

    # -- writes --------------------------------------------------------------------------------
    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def put(self, key: Key, obj: Obj, old: Obj | None) -> Event:
        """Store ``obj`` (its metadata.resourceVersion must already be the next rv)."""
        meta = obj["metadata"]
        ns, name, uid = meta.get("namespace", ""), meta["name"], meta["uid"]
        self._objects.setdefault(key, {}).setdefault(ns, {})[name] = obj
        self._by_uid[uid] = (key, ns, name)
        self._index_owners(uid, old, obj)
        return self._emit(Event(int(meta["resourceVersion"]), "MODIFIED" if old else "ADDED", key, obj, old))

    def remove(self, key: Key, obj: Obj, old: Obj) -> Event:
        meta = obj["metadata"]
        ns, name, uid = meta.get("namespace", ""), meta["name"], meta["uid"]
        by_ns = self._objects.get(key, {})
        objs = by_ns.get(ns, {})
        objs.pop(name, None)
        if not objs:
            by_ns.pop(ns, None)
        self._by_uid.pop(uid, None)
        self._index_owners(uid, old, None)
        return self._emit(Event(int(meta["resourceVersion"]), "DELETED", key, obj, old))

    def _index_owners(self, uid: str, old: Obj | None, new: Obj | None) -> None:
        before = {r.get("uid") for r in (old or {}).get("metadata", {}).get("ownerReferences") or []}
        after = {r.get("uid") for r in (new or {}).get("metadata", {}).get("ownerReferences") or []}
        for owner in before - after:
            deps = self._dependents.get(owner)
            if deps is not None:
                deps.discard(uid)
                if not deps:
                    del self._dependents[owner]
        for owner in after - before:
            if owner:
                self._dependents.setdefault(owner, set()).add(uid)

    def _emit(self, event: Event) -> Event:
        hist = self._history.get(event.key)
        if hist is None:
            hist = self._history[event.key] = deque()
        hist.append(event)
        if len(hist) > self.history_size:
            dropped = hist.popleft()
            self._compacted[event.key] = dropped.rv
        for w in list(self._watchers.get(event.key, ())):
            w.queue.put_nowait(event)
        for listener in list(self.listeners):
            listener(event)
        return event

    # -- watch ---------------------------------------------------------------------------------
    def subscribe(self, key: Key) -> Watcher:
        w = Watcher(key)
        self._watchers.setdefault(key, set()).add(w)
        return w

    def unsubscribe(self, w: Watcher) -> None:
        self._watchers.get(w.key, set()).discard(w)

    def close_watchers(self) -> None:
        for ws in self._watchers.values():
            for w in list(ws):
                w.close()

    def too_old(self, key: Key, rv: int) -> bool:
        """Events after ``rv`` are no longer all in the history: a real server answers 410."""
        return rv < self._compacted.get(key, 0)

    def compact(self, key: Key | None = None) -> None:
        """Forget the watch history (tests use it to provoke 410 Gone)."""
        keys = [key] if key else list(self._history)
        for k in keys:
            hist = self._history.get(k)
            if hist:
                self._compacted[k] = hist[-1].rv
                hist.clear()
            else:
                self._compacted[k] = self.rv

    def events_since(self, key: Key, rv: int) -> list[Event]:
        return [e for e in self._history.get(key, ()) if e.rv > rv]
