"""List and watch, as client-go's reflector does: how the cache learns what exists.

One :class:`Reflector` per watched resource and namespace (or the whole cluster) LISTs, hands the
listing to its sink as the whole truth of that scope, and WATCHes from the listing's
resourceVersion: the start-up list and the watch agree on one resourceVersion, so no change
between the two is lost. A watch that ends (the server's timeout, a dropped connection, a link
that failed) resumes from the last resourceVersion it saw, bookmarks included, and the server
sends what happened meanwhile, deletions too. When the server no longer has those events (410
Gone: the outage outlasted its watch cache, or the server restarted), the reflector LISTs again,
and the sink drops what the new listing lacks.

kopf's own watches could not do this. After a 410 kopf lists again and replays each listed
object, but tells its handlers neither when a listing starts nor when it ends, and sends nothing
for an object that vanished meanwhile (``kopf/_cogs/clients/watching.py``, ``continuous_watch``);
and its start-up listing is its own, apart from the one the cache was filled by.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import aiohttp
import orjson

from trainer.api.objects import Obj
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.resources import Resource

logger = logging.getLogger("trainer.informer")

WATCH_SECONDS = 300  # the server ends each watch after 300-600 s (client-go's range); it resumes
LIST_PAGE = 500  # items per LIST page (client-go's default page size)
MIN_BACKOFF = 0.2
MAX_BACKOFF = 10.0  # seconds between attempts while the API server cannot be reached
ABSENT_RETRY = 60.0  # an optional API that is not installed (a gang scheduler) is looked for again
MAX_LINE = 64 * 1024 * 1024  # one watch event; the API server's own limit on an object is far lower


class Sink(Protocol):
    def listed(
        self, resource: Resource, namespace: str | None, items: list[Obj], resource_version: str
    ) -> None:
        """A LIST of the scope: the whole truth of it at ``resource_version``."""

    def changed(self, resource: Resource, type_: str, obj: Obj) -> None:
        """A watch event: ADDED, MODIFIED or DELETED."""


class Gone(Exception):
    """The server no longer has the events since our resourceVersion (410): list again."""


class Reflector:
    def __init__(
        self,
        client: ApiClient,
        resource: Resource,
        namespace: str | None,
        sink: Sink,
        session: Callable[[], aiohttp.ClientSession],
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace if resource.type.namespaced else None
        self.sink = sink
        self.session = session
        self.resource_version: str | None = None  # None: LIST before the next watch
        self.absent = False  # an optional API that is not installed
        self.lists = 0  # LISTs made, the start-up one included
        self.watches = 0  # watch requests made
        self._delay = MIN_BACKOFF

    def __repr__(self) -> str:
        where = f"in {self.namespace}" if self.namespace else "cluster-wide"
        return f"{self.resource.type.name} {where}"

    def _params(self) -> dict[str, str]:
        selector = self.resource.label
        return {"labelSelector": selector} if selector else {}

    async def list(self) -> None:
        """LIST the scope, page by page, and hand it to the sink; the watch resumes from its resourceVersion."""
        path = self.resource.type.path(self.namespace)
        params = {**self._params(), "limit": str(LIST_PAGE)}
        items: list[Obj] = []
        resource_version = ""
        while True:
            try:
                page = await self.client.request("GET", path, params=params)
            except ApiError as exc:
                if exc.code == 404 and self.resource.optional:
                    # That API is not installed: nothing of it exists (what was cached is gone).
                    self.lists += 1
                    self.absent = True
                    self.sink.listed(self.resource, self.namespace, [], "")
                    return
                if exc.code == 410 and "continue" in params:
                    # The snapshot the pages came from expired between two pages: start over.
                    del params["continue"]
                    items.clear()
                    resource_version = ""
                    continue
                raise
            meta = page.get("metadata") or {}
            # Every page comes from the first page's snapshot, and carries its resourceVersion.
            resource_version = resource_version or str(meta.get("resourceVersion") or "")
            items.extend(page.get("items") or [])
            token = meta.get("continue")
            if not token:
                break
            params["continue"] = str(token)
        self.lists += 1
        self.absent = False
        self.sink.listed(self.resource, self.namespace, items, resource_version)
        self.resource_version = resource_version

    async def run(self) -> None:
        """Watch from the last LIST's resourceVersion for ever: resume, or LIST again after a 410."""
        while True:
            listed = False
            try:
                if self.resource_version is None:
                    await self.list()
                    listed = True
                if self.absent:
                    await asyncio.sleep(ABSENT_RETRY)
                    self.resource_version = None
                    continue
                started = time.monotonic()
                if not await self.watch() and time.monotonic() - started < 1:
                    await self._back_off()  # ended at once with nothing in it: do not spin
            except (Gone, ApiError) as exc:
                if isinstance(exc, Gone) or exc.code == 410:
                    logger.info("watch of %s: %s; listing again", self, exc)
                    self.resource_version = None
                    if listed:  # even a fresh LIST's resourceVersion is too old: do not spin
                        await self._back_off()
                    continue
                if exc.code == 404 and self.resource.optional:
                    self.resource_version = None  # the API went away: the LIST will say so
                    continue
                logger.warning("watch of %s: %s; trying again in %.1f s", self, exc, self._delay)
                await self._back_off()
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                # The link failed (or the stream broke off mid-event): resume from the last
                # resourceVersion seen, which the server answers with what happened meanwhile.
                logger.info(
                    "watch of %s interrupted (%s); resuming in %.1f s", self, type(exc).__name__, self._delay
                )
                await self._back_off()
            except Exception:  # a bug must not end the watch: start over from a LIST
                logger.exception("watch of %s failed; listing again in %.1f s", self, self._delay)
                self.resource_version = None
                await self._back_off()

    async def _back_off(self) -> None:
        await asyncio.sleep(self._delay)
        self._delay = min(self._delay * 2, MAX_BACKOFF)

    async def watch(self) -> int:
        """One watch from ``resource_version`` until the server ends it (Gone on a 410).

        Returns how many events (bookmarks included) it brought.
        """
        client = self.client
        params = {
            **self._params(),
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.resource_version or "",
            "timeoutSeconds": str(int(WATCH_SECONDS * (1 + random.random()))),
        }
        await client.limiter.acquire()
        sent = await client.authenticated()  # fetched again first if they expired
        self.watches += 1
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=2 * WATCH_SECONDS + 30)
        received = 0
        async with self.session().get(
            client.server + self.resource.type.path(self.namespace),
            params=params,
            headers=client.headers,
            ssl=client.ssl if client.ssl is not None else True,
            timeout=timeout,
        ) as response:
            if response.status >= 400:
                if response.status == 401:  # revoked or expired: the next attempt has new ones
                    await client.unauthorized(sent)
                text = await response.text()
                try:
                    status: Obj = orjson.loads(text)
                except ValueError:
                    status = {"message": text[:500], "reason": response.reason}
                raise ApiError(response.status, status)
            self._delay = MIN_BACKOFF  # connected: the next failure starts the backoff afresh
            buffer = bytearray()
            async for chunk in response.content.iter_any():
                scanned = len(buffer)
                buffer.extend(chunk)
                start = 0
                while (end := buffer.find(b"\n", max(start, scanned))) >= 0:
                    line = bytes(buffer[start:end])
                    start = end + 1
                    if line.strip():
                        received += 1
                        self._event(orjson.loads(line))
                del buffer[:start]
                if len(buffer) > MAX_LINE:
                    raise ValueError(f"a watch event of {self} exceeds {MAX_LINE} bytes")
        return received

    def _event(self, event: Obj) -> None:
        type_ = event.get("type")
        obj: Obj = event.get("object") or {}
        if type_ == "ERROR":
            if obj.get("code") == 410:
                raise Gone(str(obj.get("message") or "410 Gone"))
            # client-go ends the watch and lists again after any other error the server sends.
            self.resource_version = None
            raise ApiError(int(obj.get("code") or 500), obj)
        resource_version = (obj.get("metadata") or {}).get("resourceVersion")
        if type_ in ("ADDED", "MODIFIED", "DELETED"):
            self.sink.changed(self.resource, type_, obj)
        elif type_ != "BOOKMARK":
            logger.warning("watch of %s: ignoring an event of type %r", self, type_)
            return
        if resource_version:
            self.resource_version = str(resource_version)


class Informer:
    """The reflectors of the operator's watched resources, with a connection pool of their own.

    Watches hold their connections for minutes; on a pool of their own they never take the
    connections the writes need.
    """

    def __init__(self, client: ApiClient, scopes: Iterable[tuple[Resource, str | None]], sink: Sink) -> None:
        self.client = client
        self._session: aiohttp.ClientSession | None = None
        self.reflectors = [Reflector(client, resource, ns, sink, self.session) for resource, ns in scopes]

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), proxy=self.client.proxy
            )
        return self._session

    async def list_all(self) -> None:
        """The start-up LIST of every scope, one after the other (the cache is complete after it)."""
        for reflector in self.reflectors:
            await reflector.list()

    def start(self) -> list[asyncio.Task[None]]:
        """Each reflector's watch, from its LIST's resourceVersion."""
        return [asyncio.create_task(r.run(), name=f"watch {r}") for r in self.reflectors]

    async def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
