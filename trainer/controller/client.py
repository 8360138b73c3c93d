"""A small async Kubernetes API client for the operator's writes.

kopf watches; this writes. It uses the operator's credentials, the ones kopf is given at login (so
the operator talks to exactly one cluster, however it was configured), fetched again when they
expire and on a 401, after which the request is made once more (``controller/credentials.py``);
it keeps to a QPS and burst budget as client-go does, and retries what a real API server asks to
be retried (429 with Retry-After, and 5xx, whatever the body: a proxy's 502, 503 or 504 is an HTML
page) a bounded number of times; an answer that is not JSON is an ApiError. It never logs request
bodies: a Secret's data must not reach a log line.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import orjson

from trainer.api.objects import Obj

if TYPE_CHECKING:
    import kopf

    from trainer.controller.credentials import Credentials

MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply (JSON is YAML)
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class ApiError(Exception):
    """The API server refused a request; ``status`` is its Status object (never a request body)."""

    def __init__(self, code: int, status: Obj) -> None:
        self.code = code
        self.status = status
        self.reason = str(status.get("reason", ""))
        super().__init__(f"{code} {self.reason}: {status.get('message', '')}")


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """``plural.group``, as a CRD and RBAC name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if subresource:
            base += f"/{subresource}"
        return base


# Priorities of the client budget: what unblocks a user's job goes first.
CHILDREN = 0  # reads, and writes of a TrainJob's children (JobSet, ConfigMaps, Secrets, PodGroups)
STATUS = 1  # TrainJob status: level-triggered, so a write put off is recomputed, never lost


class Throttled(Exception):
    """The budget has no token for a request that asked not to wait (see ``ApiClient.request``)."""


class RateLimiter:
    """A token bucket (``qps`` a second, at most ``burst`` at once: client-go's default) with priorities.

    Waiters are served lowest priority number first, then in arrival order; one timer wakes the
    next waiter when a token is due, so a thousand waiters cost no polling.

    A request that does not wait and is less urgent than children's (a status write) takes a
    token only while a fifth of the burst stays in reserve: under a sustained load above the QPS,
    status writes would otherwise drain the bucket between children's creates and make the next
    JobSet wait. Put off, a status write is recomputed later, several changes in one write.
    """

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self.reserve = self.burst // 5
        # The default event loop's clock, which times the wake-ups; a test passes its virtual loop's.
        self.clock = clock
        self.tokens = float(self.burst)
        self.updated = clock()
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.updated) * self.qps)
        self.updated = now

    def try_acquire(self, priority: int = CHILDREN) -> bool:
        """Take a token if one is free and nobody more urgent (or as urgent and earlier) waits."""
        if self.qps <= 0:
            return True
        self._refill()
        self._drop_cancelled()
        needed = 1 + (self.reserve if priority > CHILDREN else 0)
        if self.tokens >= needed and (not self._waiters or self._waiters[0][0] > priority):
            self.tokens -= 1
            return True
        return False

    async def acquire(self, priority: int = CHILDREN) -> None:
        if self.try_acquire(priority):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), future))
        self._schedule()
        await future

    def _drop_cancelled(self) -> None:
        while self._waiters and self._waiters[0][2].done():
            heapq.heappop(self._waiters)

    def _schedule(self) -> None:
        if self._timer is None and self._waiters:
            delay = max(0.0, (1 - self.tokens) / self.qps)
            self._timer = asyncio.get_running_loop().call_later(delay, self._release)

    def _release(self) -> None:
        self._timer = None
        self._refill()
        # The timer was set for when a token is due; it may fire up to the loop's clock resolution
        # early, and rounding may leave the token a hair short: then it is due, not re-timed.
        while self._waiters and self.tokens >= 1 - 1e-6:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():  # a cancelled waiter takes no token
                self.tokens -= 1
                future.set_result(None)
        self._drop_cancelled()
        self._schedule()


def _json_object(text: str) -> Obj | None:
    """The body as a JSON object, ``{}`` if empty; None if it is not one (an HTML page, a list)."""
    if not text:
        return {}
    try:
        value = orjson.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class ApiClient:
    def __init__(
        self,
        server: str,
        *,
        headers: dict[str, str] | None = None,
        ssl_context: ssl.SSLContext | bool | None = None,
        qps: float = 50.0,
        burst: int = 100,
        retries: int = 5,
        user_agent: str = "trainer-operator",
        credentials: Credentials | None = None,
        proxy: str | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self._headers = {"User-Agent": user_agent, "Accept": "application/json", **(headers or {})}
        self._ssl = ssl_context
        self._tls_of: tuple[object, ...] | None = None  # what ``_ssl`` was made from
        self.credentials = credentials  # None: the headers and TLS context given are used as they are
        self.proxy = proxy  # an http:// proxy (a kubeconfig's proxy-url)
        self.limiter = RateLimiter(qps, burst)
        self.retries = retries
        self.timeout = 30.0  # seconds each attempt may take, the answer read
        # Told of every attempt: (method, host, status code or None, seconds); the operator's
        # metrics (rest_client_requests_total, rest_client_request_duration_seconds).
        self.observer: Callable[[str, str, int | None, float], None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0

    @classmethod
    def from_credentials(cls, credentials: Credentials, *, qps: float, burst: int) -> ApiClient:
        """A client whose every request goes with the credentials held now (fetched already)."""
        info = credentials.info
        return cls(info.server, qps=qps, burst=burst, credentials=credentials, proxy=info.proxy_url)

    @property
    def headers(self) -> dict[str, str]:
        """The headers of the next request, the credentials held now included."""
        if self.credentials is None:
            return self._headers
        return {**self._headers, **self.credentials.info.as_http_headers()}

    @property
    def ssl(self) -> ssl.SSLContext | bool | None:
        """The TLS context of the next request: made again when the client certificate changes."""
        if self.credentials is None:
            return self._ssl
        info = self.credentials.info
        tls = (
            info.server,
            info.insecure,
            info.ca_path,
            info.ca_data,
            info.certificate_path,
            info.certificate_data,
            info.private_key_path,
            info.private_key_data,
        )
        if tls != self._tls_of:
            self._tls_of = tls
            self._ssl = None
            if info.server.startswith("https"):
                self._ssl = False if info.insecure else info.as_ssl_context()
        return self._ssl

    async def authenticated(self) -> kopf.ConnectionInfo | None:
        """The credentials the next request goes with (in ``headers`` and ``ssl``), fetched again
        first when they are due; hand them to :meth:`unauthorized` if the server answers 401."""
        return await self.credentials.current() if self.credentials is not None else None

    async def unauthorized(self, sent: kopf.ConnectionInfo | None) -> bool:
        """The server answered 401 to a request made with ``sent``: fetch new credentials (unless
        that was done meanwhile). True if there are other credentials to try."""
        if self.credentials is None or sent is None:
            return False
        return await self.credentials.refresh(sent)

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers, proxy=self.proxy)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        priority: int = CHILDREN,
        wait: bool = True,
        reauthenticate: bool = True,
        accept: str | None = None,
    ) -> Obj:
        """One request within the budget; ``wait=False`` raises Throttled rather than queue for it.

        A 401 fetches new credentials, and the request is made once more with them (through this
        method again, ``reauthenticate=False``: a subclass's checks apply to it too): a token
        expires, or is revoked, while the operator runs.
        """
        sent = await self.authenticated()
        try:
            return await self._request(method, path, body, content_type, params, priority, wait, accept)
        except ApiError as exc:
            if exc.code != 401 or not reauthenticate or not await self.unauthorized(sent):
                raise
        return await self.request(
            method,
            path,
            body,
            content_type=content_type,
            params=params,
            priority=priority,
            wait=wait,
            reauthenticate=False,
            accept=accept,
        )

    async def _request(
        self,
        method: str,
        path: str,
        body: Obj | None,
        content_type: str,
        params: dict[str, str] | None,
        priority: int,
        wait: bool,
        accept: str | None = None,
    ) -> Obj:
        data = json.dumps(body).encode() if body is not None else None
        session = await self.session()
        delay = 0.2
        if not wait and not self.limiter.try_acquire(priority):
            raise Throttled(f"{method} {path}: the client budget is spent")
        for attempt in range(self.retries + 1):
            if attempt or wait:
                await self.limiter.acquire(priority)
            self.before_sending(method, path)
            self.requests += 1
            sent_at = time.monotonic()
            try:
                async with session.request(
                    method,
                    self.server + path,
                    data=data,
                    params=params,
                    headers=self._request_headers(content_type if data is not None else None, accept),
                    ssl=self.ssl if self.ssl is not None else True,
                    timeout=aiohttp.ClientTimeout(total=self.timeout),
                ) as response:
                    # The status first: a proxy in front of the API server (a load balancer, an
                    # ingress) answers 502, 503 and 504 with an HTML page of its own.
                    self._observe(method, response.status, sent_at)
                    retry_after = response.headers.get("Retry-After")
                    if (response.status == 429 or response.status >= 500) and attempt < self.retries:
                        pause = float(retry_after) if retry_after and retry_after.isdigit() else delay
                        await asyncio.sleep(min(pause, 10.0))
                        delay = min(delay * 2, 5.0)
                        continue
                    # Bytes, decoded here: a page in an odd charset must not raise either.
                    text = (await response.read()).decode("utf-8", errors="replace")
                    payload = _json_object(text)
                    if response.status < 400:
                        if payload is None:
                            raise ApiError(
                                response.status,
                                {
                                    "reason": "InvalidResponse",
                                    "message": f"the answer is not JSON: {text[:200]}",
                                },
                            )
                        return payload
                    status = (
                        payload
                        if payload is not None and payload.get("kind") == "Status"
                        else {"message": text[:500], "reason": response.reason}
                    )
                    raise ApiError(response.status, status)
            except (TimeoutError, aiohttp.ClientConnectionError):
                self._observe(method, None, sent_at)
                if attempt >= self.retries:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def _observe(self, method: str, code: int | None, sent_at: float) -> None:
        if self.observer is not None:
            self.observer(method, urllib.parse.urlsplit(self.server).netloc, code, time.monotonic() - sent_at)

    def before_sending(self, method: str, path: str) -> None:
        """Called as each attempt goes on the wire, after any wait for the budget or a retry's
        pause: the last moment a subclass can stop it (controller/leader.py's fence)."""

    def _request_headers(self, content_type: str | None, accept: str | None = None) -> dict[str, str] | None:
        """What a request adds to the session's headers: the credentials held now, a body's type,
        the representation asked for."""
        headers = self.credentials.info.as_http_headers() if self.credentials is not None else {}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if accept is not None:
            headers["Accept"] = accept
        return headers or None

    async def create(
        self, rtype: ResourceType, namespace: str | None, obj: Obj, *, field_manager: str | None = None
    ) -> Obj:
        params = {"fieldManager": field_manager} if field_manager else None
        return await self.request("POST", rtype.path(namespace), obj, params=params)

    async def apply(
        self, rtype: ResourceType, namespace: str | None, obj: Obj, *, field_manager: str, force: bool
    ) -> Obj:
        """Server-side apply of ``obj`` (the fields ``field_manager`` owns); creates it when absent."""
        return await self.request(
            "PATCH",
            rtype.path(namespace, obj["metadata"]["name"]),
            obj,
            content_type=APPLY_PATCH,
            params={"fieldManager": field_manager, "force": "true" if force else "false"},
        )

    async def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        patch: Obj,
        subresource: str | None = None,
        *,
        priority: int = CHILDREN,
        wait: bool = True,
    ) -> Obj:
        return await self.request(
            "PATCH",
            rtype.path(namespace, name, subresource),
            patch,
            content_type=MERGE_PATCH,
            priority=priority,
            wait=wait,
        )

    async def delete(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        uid: str | None = None,
    ) -> Obj:
        """Delete; with ``uid``, only that incarnation (a 409 if the name now holds another)."""
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        return await self.request("DELETE", rtype.path(namespace, name), body)

    async def get_metadata(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        """One object's metadata only (``PartialObjectMetadata``): what the operator needs of a
        Secret in a child's way (whether it exists, who controls it), never its data."""
        return await self.request("GET", rtype.path(namespace, name), accept=PARTIAL_METADATA)

    async def list(
        self,
        rtype: ResourceType,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Obj:
        params = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        return await self.request("GET", rtype.path(namespace), params=params or None)
