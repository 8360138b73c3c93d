"""A small async Kubernetes API client for the operator's writes.

kopf watches; this writes. It uses the credentials kopf resolved at login (so the operator talks
to exactly one cluster, however it was configured), keeps to a QPS and burst budget as
client-go does, and retries what a real API server asks to be retried (429 with Retry-After,
and 5xx) a bounded number of times. It never logs request bodies: a Secret's data must not reach
a log line.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"


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


class RateLimiter:
    """A token bucket: ``qps`` tokens a second, at most ``burst`` at once (client-go's default)."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self.tokens = float(self.burst)
        self.updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        if self.qps <= 0:
            return
        async with self._lock:
            while True:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.qps)
                self.updated = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                await asyncio.sleep((1 - self.tokens) / self.qps)


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
    ) -> None:
        self.server = server.rstrip("/")
        self.headers = {"User-Agent": user_agent, "Accept": "application/json", **(headers or {})}
        self.ssl = ssl_context
        self.limiter = RateLimiter(qps, burst)
        self.retries = retries
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0

    @classmethod
    def from_connection_info(cls, info: Any, **kwargs: Any) -> ApiClient:
        """Build from kopf's ConnectionInfo: the same server and credentials kopf watches with."""
        # kopf builds both exactly as its own watches do: tokens or basic auth, CA and client
        # certificates from files or inline (base64 or PEM) data, insecure-skip-tls-verify.
        headers: dict[str, str] = dict(info.as_http_headers())
        context: ssl.SSLContext | bool | None = None
        if info.server.startswith("https"):
            context = False if info.insecure else info.as_ssl_context()
        return cls(info.server, headers=headers, ssl_context=context, **kwargs)

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self.headers)
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
    ) -> Obj:
        data = json.dumps(body).encode() if body is not None else None
        session = await self.session()
        delay = 0.2
        for attempt in range(self.retries + 1):
            await self.limiter.acquire()
            self.requests += 1
            try:
                async with session.request(
                    method,
                    self.server + path,
                    data=data,
                    params=params,
                    headers={"Content-Type": content_type} if data is not None else None,
                    ssl=self.ssl if self.ssl is not None else True,
                    timeout=aiohttp.ClientTimeout(total=30),
                ) as response:
                    text = await response.text()
                    payload: Obj = json.loads(text) if text else {}
                    if response.status < 400:
                        return payload
                    retry_after = response.headers.get("Retry-After")
                    if (response.status == 429 or response.status >= 500) and attempt < self.retries:
                        wait = float(retry_after) if retry_after and retry_after.isdigit() else delay
                        await asyncio.sleep(min(wait, 10.0))
                        delay = min(delay * 2, 5.0)
                        continue
                    status = (
                        payload
                        if payload.get("kind") == "Status"
                        else {"message": text[:500], "reason": response.reason}
                    )
                    raise ApiError(response.status, status)
            except (TimeoutError, aiohttp.ClientConnectionError):
                if attempt >= self.retries:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    async def create(self, rtype: ResourceType, namespace: str | None, obj: Obj) -> Obj:
        return await self.request("POST", rtype.path(namespace), obj)

    async def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        patch: Obj,
        subresource: str | None = None,
    ) -> Obj:
        return await self.request(
            "PATCH", rtype.path(namespace, name, subresource), patch, content_type=MERGE_PATCH
        )

    async def delete(
        self, rtype: ResourceType, namespace: str | None, name: str, *, propagation: str = "Background"
    ) -> Obj:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        return await self.request("DELETE", rtype.path(namespace, name), body)

    async def list(
        self, rtype: ResourceType, namespace: str | None = None, label_selector: str | None = None
    ) -> Obj:
        params = {"labelSelector": label_selector} if label_selector else None
        return await self.request("GET", rtype.path(namespace), params=params)
