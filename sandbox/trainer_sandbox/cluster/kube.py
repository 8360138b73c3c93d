"""Plain HTTPS to the API server and the components' health endpoints.

``up`` makes a few dozen requests (health probes, CRDs, nodes, webhook configurations); a process
per request (kubectl) would cost more than the requests themselves, and the official client is not
a dependency. Only what ``up`` needs is here: JSON in, JSON out, no retries of its own.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trainer.api.objects import Obj


class KubeError(Exception):
    """A response other than 2xx, with the API's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def tls_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def _opener(ctx: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    """Everything is on loopback: an HTTP(S)_PROXY in the environment must not see these requests."""
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )


def probe(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> tuple[int, str] | None:
    """GET ``url``; ``None`` when nothing answers yet (refused, reset, timed out)."""
    try:
        with _opener(ctx).open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return None


def resource_path(obj: Obj) -> str:
    """The collection URL of ``obj``: the plural is the lower-cased kind plus ``s``, which holds for
    every kind ``up`` writes (CRDs, Nodes, Namespaces, ConfigMaps, bindings, webhook
    configurations, runtimes, JobSets)."""
    api_version = obj["apiVersion"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    namespace = (obj.get("metadata") or {}).get("namespace")
    plural = obj["kind"].lower() + "s"
    return f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"


@dataclass
class Kube:
    """One identity talking to one API server."""

    server: str
    ctx: ssl.SSLContext

    def request(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        timeout: float = 30.0,
        content_type: str = "application/json",
    ) -> Obj:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with _opener(self.ctx).open(req, timeout=timeout) as resp:
                out = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read().decode(errors="replace")
            try:
                message = str(json.loads(raw).get("message") or raw)
            except ValueError:
                message = raw
            raise KubeError(int(e.code), message) from None
        return json.loads(out) if out else {}

    def get(self, path: str) -> Obj:
        return self.request("GET", path)

    def merge_patch(self, path: str, patch: Obj) -> Obj:
        return self.request("PATCH", path, patch, content_type="application/merge-patch+json")

    def create(self, obj: Obj, *, exist_ok: bool = False, dry_run: bool = False) -> Obj:
        path = resource_path(obj) + ("?dryRun=All" if dry_run else "")
        try:
            return self.request("POST", path, obj)
        except KubeError as e:
            if exist_ok and e.status == 409:
                return obj
            raise
