"""The admission webhooks' HTTPS server: kopf's webhook-server contract, on a guarded port.

kopf lets an operator bring its own server (``kopf.WebhookServerProtocol``: called with kopf's
admission function, it yields the client configuration the API server is to use). Ours exists
for what kopf's own cannot be told: it refused admission requests over 1 MiB (aiohttp's
default body limit), while the API server sends objects up to ~3 MiB and an UPDATE carries two
of them; and it had no head deadline, idle timeout or connection cap (controller/serving.py).
The body limit is controller-runtime's (7 MiB), so whatever upstream's webhooks take, ours do.

The TLS context is the operator's (controller/tls_certificates.py reloads renewed files into it
in place), so a renewal never closes the port.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import kopf
from aiohttp import web

from trainer.controller.serving import BODY, GuardedServer, Limits

logger = logging.getLogger("trainer.webhooks")

# controller-runtime's webhook server reads up to 7 MiB: two objects at the API server's 3 MiB
# request limit, and the AdmissionReview around them.
MAX_ADMISSION_BODY = 7 << 20
LIMITS = Limits(
    max_connections=128,
    head_seconds=10.0,
    # Longer than the API server's idle timeout for webhook connections (90 s): it closes first.
    idle_seconds=120.0,
    handshake_seconds=10.0,
    # The API server gives a webhook 10 s by default for the whole call: a body slower than that
    # is no API server's.
    body_seconds=10.0,
    max_body=MAX_ADMISSION_BODY,
    max_in_flight=16,
)


class WebhookServer:
    """Serve kopf's admission function at ``https://<host>:<port>/<webhook id>``."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        context: ssl.SSLContext,
        certfile: str,
        keyfile: str,
        advertise_host: str | None = None,
        limits: Limits = LIMITS,
    ) -> None:
        self.host = host
        self.port = port
        self.context = context
        self.certfile = certfile
        self.keyfile = keyfile
        self.advertise_host = advertise_host
        self.limits = limits
        self.server: GuardedServer | None = None

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        limits = self.limits

        async def handle(request: web.Request) -> web.Response:
            try:
                review = json.loads(request[BODY])
            except ValueError as exc:
                return web.json_response({"message": f"not JSON: {exc}"}, status=400)
            peer = request.transport.get_extra_info("peercert") if request.transport else None
            try:
                response = await fn(
                    review, webhook=request.match_info.get("id"), headers=dict(request.headers), sslpeer=peer
                )
            except Exception as exc:  # kopf's WebhookError family: a request it cannot route or read
                logger.warning("webhooks: an admission request could not be served: %s", exc)
                return web.json_response({"message": str(exc)}, status=400)
            return web.json_response(response)

        # The files exist by now (written at start-up when the operator manages its certificate);
        # renewals are loaded into the same context in place, with no restart of the port.
        self.context.load_cert_chain(self.certfile, self.keyfile)
        app = web.Application(client_max_size=limits.max_body)
        app.router.add_post("/{id:.*}", handle)
        self.server = GuardedServer(
            app, self.host, self.port, "webhook server", limits, self.context, read_body_first=True
        )
        await self.server.start()
        try:
            config = kopf.WebhookClientConfig(
                url=_url(self.advertise_host or _reachable(self.host), self.server.port)
            )
            # The certificate is its own CA when self-signed (webhook.manageConfiguration); with a
            # mounted certificate the configurations are the chart's, and this goes unused.
            with contextlib.suppress(FileNotFoundError):
                config["caBundle"] = base64.b64encode(Path(self.certfile).read_bytes()).decode("ascii")
            logger.debug("webhooks: serving at %s", config["url"])
            yield config
            await asyncio.Event().wait()
        finally:
            await self.server.stop()


def _reachable(host: str) -> str:
    """The address a local client reaches a listening address at (any-address: loopback)."""
    if not host:
        return "localhost"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.is_unspecified:
        return "127.0.0.1" if address.version == 4 else "::1"
    return host


def _url(host: str, port: int) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass
    return f"https://{host}:{port}"
