"""The progress status server (feature gate ``TrainJobStatus``): training pods POST their progress.

Upstream's contract (docs/upstream-behaviour.md §trainjob-status; ours: docs/decisions.md
§status-server-auth and §status-server-rate-limit; for users: docs/user-guide.md, "Report
progress"): one route, ``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status``
with ``{"trainerStatus": {...}}``, over TLS with the operator's serving certificate, on every replica.
Each request is taken in a fixed order, every refusal a JSON ``metav1.Status``:

1. a declared body over 64 KiB: 413, whatever the path;
2. any other method or path: 404;
3. more than one client address's share of requests: 429 (ours), before any token is looked at;
4. the bearer token: 403 unless it is a service-account token for this TrainJob's audience, of
   this namespace, bound to a pod of this TrainJob (``TokenReviewAuthenticator``); a token refused
   in the last 10 s is refused again without asking; 429 when as many TokenReviews as the server
   makes at once are under way; 500 when the API server cannot tell;
5. more than this TrainJob's share of requests: 429 (ours);
6. a body that is not the request's JSON: 422;
7. no ``trainerStatus``: 200, the request echoed, nothing written;
8. a server-side apply of ``status.trainerStatus`` alone on the status subresource, field manager
   ``trainer-status``, forced: 200 with the request echoed, or the API server's refusal (422, 404).

Requests it makes, with an API client of its own (``statusServer.qps``/``burst``): ``create``
TokenReviews, ``get`` pods and their Jobs, the status writes, and a LIST by name of a JobSet or TrainJob its
replica's cache does not hold yet.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aiohttp import web

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.reviews import Busy, RateLimits, Slots, Verdicts, bearer, digest
from trainer.controller.reviews import ReviewError as AuthenticationError
from trainer.controller.serving import BodyTooLarge, GuardedServer, Limits, read_body
from trainer.runtime.info import Facts, StatusServer, controlled_by, controller_ref

logger = logging.getLogger("trainer.status-server")

ROUTE = re.compile(
    "^" + re.escape("/apis/" + c.API_VERSION + "/namespaces/") + r"([^/]+)/trainjobs/([^/]+)/status$"
)
MAX_BODY = c.STATUS_SERVER_MAX_BODY
# The port's guards (controller/serving.py): an SDK report is one small request on a fresh
# connection, from any training pod of any TrainJob.
LIMITS = Limits(
    max_connections=256,
    head_seconds=10.0,
    idle_seconds=60.0,
    handshake_seconds=10.0,
    body_seconds=10.0,
    max_body=MAX_BODY,
    max_in_flight=64,
)
# Ours (docs/decisions.md §status-server-rate-limit): each TrainJob's pods may send this many
# requests at once, and this many a second after that. The SDK sends one every 5 s at most.
PER_TRAINJOB_BURST = 10
PER_TRAINJOB_QPS = 1.0
# A token the API server accepted for a TrainJob is taken again without asking it for this long
# (and never past the token's own expiry): each update then costs one request, the write.
AUTH_CACHE_SECONDS = 60.0
# One refused is refused again without asking for this long: junk costs the API server nothing.
REJECT_CACHE_SECONDS = 10.0
# TokenReviews under way at once; a request that would be one more is answered 429 at once
# rather than queued behind the client's budget (400 junk requests once held a real report 73 s).
MAX_REVIEWS = 8
# Each client address may send this many requests at once, and this many a second after that,
# before anything about its token is asked (a pod's SDK sends one every 5 s at most).
PER_CLIENT_BURST = 20
PER_CLIENT_QPS = 2.0
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


class Authenticator(Protocol):
    async def authenticate(self, token: str, namespace: str, name: str) -> bool:
        """True when ``token`` may report the progress of TrainJob ``namespace/name``."""
        ...


Write = Callable[[str, str, Obj], Awaitable[Obj]]


def status_error(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


class InvalidRequest(ValueError):
    """The body is not an ``UpdateTrainJobStatusRequest`` as upstream's server decodes one."""


def _int32(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**31) <= value < 2**31:
        raise InvalidRequest(f"{field}: not an int32")
    return value


_RFC3339 = re.compile(r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def _time(value: object) -> str | None:
    """``metav1.Time`` as Go decodes and writes it: RFC 3339 in, UTC to the second out."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest("lastUpdatedTime: not a string")
    found = _RFC3339.fullmatch(value)
    if found is None:
        raise InvalidRequest("lastUpdatedTime: not an RFC 3339 time")
    date, clock, zone = found.group(1), found.group(2), found.group(4)
    offset = "+00:00" if zone in ("Z", "z") else zone
    try:
        parsed = datetime.datetime.fromisoformat(f"{date}T{clock}{offset}")
    except ValueError as exc:
        raise InvalidRequest(f"lastUpdatedTime: {exc}") from None
    return parsed.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decode_request(raw: bytes) -> Obj:
    """The request as upstream's server decodes it (unknown fields dropped), or InvalidRequest."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidRequest("the request is not a JSON object")
    status = data.get("trainerStatus")
    if status is None:
        return {}
    if not isinstance(status, dict):
        raise InvalidRequest("trainerStatus: not an object")
    out: Obj = {}
    for key in ("progressPercentage", "estimatedRemainingSeconds"):
        if status.get(key) is not None:
            out[key] = _int32(status[key], key)
    metrics = status.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, list):
            raise InvalidRequest("metrics: not a list")
        out["metrics"] = []
        for metric in metrics:
            if not isinstance(metric, dict):
                raise InvalidRequest("metrics: an item is not an object")
            item = {}
            for key in ("name", "value"):
                value = metric.get(key)
                if value is not None and not isinstance(value, str):
                    raise InvalidRequest(f"metrics[].{key}: not a string")
                item[key] = value or ""
            out["metrics"].append(item)
    # Always sent, as upstream sends it: missing, it is null and the CRD's rule refuses the write.
    out["lastUpdatedTime"] = _time(status.get("lastUpdatedTime"))
    return {"trainerStatus": out}


class NotServing(Exception):
    """The status server takes no TLS connection: its health check fails."""


class Server:
    """The HTTP side: ordering, limits, decoding and errors. Authentication and the write are given."""

    def __init__(
        self,
        authenticator: Authenticator,
        write: Write,
        *,
        ssl_context: ssl.SSLContext | None,
        host: str = "0.0.0.0",
        port: int = c.STATUS_SERVER_PORT,
        limits: RateLimits | None = None,
        client_limits: RateLimits | None = None,
    ) -> None:
        self.authenticator = authenticator
        self.write = write
        self.ssl_context = ssl_context
        self.host = host
        self.port = port
        self.limits = limits or RateLimits(qps=PER_TRAINJOB_QPS, burst=PER_TRAINJOB_BURST)
        self.client_limits = client_limits or RateLimits(qps=PER_CLIENT_QPS, burst=PER_CLIENT_BURST)
        self._server: GuardedServer | None = None

    def app(self) -> web.Application:
        # aiohttp refuses a larger body itself (with its own 413) only on read(); ours reads in
        # chunks and answers as upstream does.
        app = web.Application(client_max_size=MAX_BODY + 1)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def start(self) -> None:
        server = GuardedServer(self.app(), self.host, self.port, "status server", LIMITS, self.ssl_context)
        await server.start()
        self._server, self.port = server, server.port
        logger.info("status server listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop()

    async def check(self, timeout: float = 2.0) -> None:
        """Upstream's status-server health check: a TLS connection to the port opens. Raises
        :class:`NotServing` when it does not (the server stopped, its port or certificate broke)."""
        if self._server is None:
            raise NotServing(f"the status server on port {self.port} is stopped")
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        context = None
        if self.ssl_context is not None:
            # Any certificate will do: the check is that the handshake completes, not whom it names.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, self.port, ssl=context), timeout)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise NotServing(
                f"the status server on port {self.port} takes no TLS connection: {exc}"
            ) from None
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()

    async def handle(self, request: web.Request) -> web.Response:
        try:
            return await self._handle(request)
        except Exception:
            logger.exception("status server: request failed")
            return status_error(500, "InternalError", "Internal Server Error")

    async def _handle(self, request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > MAX_BODY:
            return status_error(413, "RequestEntityTooLarge", "Payload too large")
        route = ROUTE.match(request.path)
        if request.method != "POST" or route is None:
            return status_error(404, "NotFound", "Not found")
        namespace, name = route.group(1), route.group(2)
        client = request.remote or ""
        if not self.client_limits.allow(client):
            return _too_many(self.client_limits.retry_after(client))
        token = bearer(request.headers.get("Authorization", ""))
        try:
            allowed = token is not None and await self.authenticator.authenticate(token, namespace, name)
        except Busy:
            return _too_many(1)
        except AuthenticationError as exc:
            logger.warning("status server: cannot authenticate a request for %s/%s: %s", namespace, name, exc)
            return status_error(500, "InternalError", "Internal error")
        if not allowed:
            return status_error(403, "Forbidden", "Forbidden")
        if not self.limits.allow((namespace, name)):
            return _too_many(self.limits.retry_after((namespace, name)))
        try:
            decoded = decode_request(await read_body(request, LIMITS))
        except (InvalidRequest, BodyTooLarge, TimeoutError):
            return status_error(422, "Invalid", "Invalid payload")
        if not decoded:
            return web.json_response(decoded)
        try:
            await self.write(namespace, name, decoded["trainerStatus"])
        except ApiError as exc:
            if exc.code == 404:
                return status_error(404, "NotFound", "Train job not found")
            if exc.code in (400, 422) or exc.reason in ("Invalid", "BadRequest"):
                message = str(exc.status.get("message") or "") or f"Validation failed: {exc}"
                return status_error(422, "Invalid", message)
            logger.warning("status server: writing %s/%s: %s", namespace, name, exc)
            return status_error(500, "InternalError", "Internal error")
        return web.json_response(decoded)


def _too_many(retry_after: int) -> web.Response:
    response = status_error(429, "TooManyRequests", "Too many requests")
    response.headers["Retry-After"] = str(retry_after)
    return response


# --- the cluster side -----------------------------------------------------------------------------


def status_writer(client: ApiClient) -> Write:
    """Server-side apply of ``status.trainerStatus`` alone, forced, as ``trainer-status``."""

    async def write(namespace: str, name: str, trainer_status: Obj) -> Obj:
        body = {
            "apiVersion": c.API_VERSION,
            "kind": c.TRAINJOB_KIND,
            "metadata": {"name": name, "namespace": namespace},
            "status": {"trainerStatus": trainer_status},
        }
        return await client.request(
            "PATCH",
            f"/apis/{c.API_VERSION}/namespaces/{namespace}/trainjobs/{name}/status",
            body,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": c.STATUS_SERVER_FIELD_MANAGER, "force": "true"},
        )

    return write


class TokenReviewAuthenticator:
    """Who may report a TrainJob's progress (docs/decisions.md §status-server-auth).

    The API server reviews the token for the TrainJob's own audience (signature, expiry, audience,
    and that the pod it is bound to still exists); the token's service account must be of the
    TrainJob's namespace, as upstream requires; and, ours, the pod it is bound to must be one of
    this TrainJob's, by its owner chain, not its labels (which whoever creates a pod sets): the
    pod's controller is a Job (the pod's uid the token's), whose controller is a JobSet, with that
    uid, controlled by the TrainJob with the uid the TrainJob has now.
    """

    def __init__(
        self,
        client: ApiClient,
        facts: Facts,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.facts = facts
        self.verdicts: Verdicts[bool] = Verdicts(clock, wall)
        self.slots = Slots(MAX_REVIEWS)

    async def authenticate(self, token: str, namespace: str, name: str) -> bool:
        key = (digest(token), namespace, name)
        kept = self.verdicts.get(key)
        if kept is not None:
            return kept[0]
        with self.slots.take():
            good = await self._review(token, namespace, name)
        if good:
            self.verdicts.keep(key, True, AUTH_CACHE_SECONDS, token)
        else:
            self.verdicts.keep(key, False, REJECT_CACHE_SECONDS)
        return good

    async def _review(self, token: str, namespace: str, name: str) -> bool:
        audience = c.status_server_audience(namespace, name)
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        }
        try:
            result = await self.client.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", review)
        except ApiError as exc:
            raise AuthenticationError(f"{exc.code} {exc.reason}".strip()) from None
        status = result.get("status") or {}
        if status.get("authenticated") is not True or audience not in (status.get("audiences") or []):
            return False
        user = status.get("user") or {}
        account = str(user.get("username") or "")
        if not account.startswith(SERVICE_ACCOUNT_PREFIX):
            return False
        if account.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")[0] != namespace:
            return False
        extra = user.get("extra") or {}
        pod_names, pod_uids = extra.get(POD_NAME_EXTRA) or [], extra.get(POD_UID_EXTRA) or []
        if len(pod_names) != 1 or len(pod_uids) != 1:
            return False  # not bound to a pod
        return await self._pod_of_trainjob(namespace, name, pod_names[0], pod_uids[0])

    async def _pod_of_trainjob(self, namespace: str, name: str, pod_name: str, pod_uid: str) -> bool:
        pod = await self._get(f"/api/v1/namespaces/{namespace}/pods/{pod_name}")
        if pod is None or pod["metadata"].get("uid") != pod_uid:
            return False
        job_ref = controller_ref(pod, "Job", "batch")
        if job_ref is None or not job_ref.get("name"):
            return False
        job = await self._get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{job_ref['name']}")
        if job is None or job["metadata"].get("uid") != job_ref.get("uid"):
            return False
        jobset_ref = controller_ref(job, c.JOBSET_KIND, c.JOBSET_GROUP)
        if jobset_ref is None or not jobset_ref.get("name"):
            return False
        jobset_name = str(jobset_ref["name"])
        # From this replica's cache; one it does not hold yet (a watch running behind) is read by
        # name with a LIST, the rights the operator already holds.
        trainjob = self.facts.get(c.TRAINJOB_KIND, namespace, name, group=c.GROUP)
        if trainjob is None:
            trainjob = await self._named(f"/apis/{c.API_VERSION}/namespaces/{namespace}/trainjobs", name)
        jobset = self.facts.get(c.JOBSET_KIND, namespace, jobset_name, group=c.JOBSET_GROUP)
        if jobset is None or trainjob is None or not controlled_by(jobset, trainjob):
            jobset = await self._named(
                f"/apis/{c.JOBSET_API_VERSION}/namespaces/{namespace}/jobsets", jobset_name
            )
        if trainjob is None or jobset is None or not controlled_by(jobset, trainjob):
            return False
        return bool(jobset["metadata"].get("uid") == jobset_ref.get("uid"))

    async def _named(self, collection: str, name: str) -> Obj | None:
        try:
            found = await self.client.request(
                "GET", collection, params={"fieldSelector": f"metadata.name={name}"}
            )
        except ApiError as exc:
            raise AuthenticationError(f"{exc.code} {exc.reason}".strip()) from None
        items: list[Obj] = found.get("items") or []
        return items[0] if items else None

    async def _get(self, path: str) -> Obj | None:
        try:
            return await self.client.request("GET", path)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise AuthenticationError(f"{exc.code} {exc.reason}".strip()) from None


# --- the CA the pods are given --------------------------------------------------------------------


@dataclass
class CertificateAuthority:
    """Where the CA of the serving certificate is read from, for the ``<name>-tls-config`` ConfigMaps.

    With ``certManagement``, the ``ca.crt`` of its Secret (as upstream reads it); with a
    ``certDir``, its ``ca.crt``, or its ``tls.crt`` when there is none (a self-signed certificate
    is its own CA).
    """

    client: ApiClient | None = None
    secret_path: str | None = None
    cert_dir: Path | None = None

    async def read(self) -> tuple[str, str | None]:
        """(the CA's PEM, or ""; why the certificate could not be looked up, or None)."""
        if self.secret_path is not None and self.client is not None:
            try:
                secret = await self.client.request("GET", self.secret_path)
            except ApiError as exc:
                return "", str(exc)
            encoded = (secret.get("data") or {}).get(c.STATUS_SERVER_CA_KEY) or ""
            try:
                return base64.b64decode(encoded).decode(), None
            except ValueError:
                return "", None
        if self.cert_dir is None:
            return "", "no serving certificate"
        for name in (c.STATUS_SERVER_CA_KEY, "tls.crt"):
            path = self.cert_dir / name
            try:
                return path.read_text(), None
            except FileNotFoundError:
                continue
            except OSError as exc:
                return "", str(exc)
        return "", f"no {c.STATUS_SERVER_CA_KEY} or tls.crt in {self.cert_dir}"


async def keep_facts(
    facts: Facts, url: str, authority: CertificateAuthority, interval: float, changed: Callable[[], None]
) -> None:
    """Keep ``facts.status_server`` on the CA as it is now; ``changed`` when it differs."""
    while True:
        if await refresh_facts(facts, url, authority):
            changed()
        await asyncio.sleep(interval)


async def refresh_facts(facts: Facts, url: str, authority: CertificateAuthority) -> bool:
    ca, error = await authority.read()
    known = facts.status_server
    fresh = StatusServer(url=url, ca_cert=ca, ca_error=error)
    if known == fresh:
        return False
    if known is not None and error is not None and known.ca_cert:
        return False  # a failed read keeps the CA last read; the ConfigMaps need not change
    facts.status_server = fresh
    return True
