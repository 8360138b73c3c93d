"""The status server's health check in the operator's liveness endpoint (upstream's
status-server-healthz/-readyz, docs/upstream-behaviour.md §trainjob-status): it passes while the
port takes a TLS connection and fails, turning the endpoint to 500, once it does not."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator
from trainer_sandbox.ports import free_port

from trainer.controller import tls_certificates
from trainer.controller.config import Configuration
from trainer.controller.status_server import NotServing, Server


def health(url: str) -> tuple[int, Any]:
    """The endpoint's answer, once it listens (it is up from before the operator's start-up)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_the_liveness_endpoint_follows_the_status_server(cluster: Cluster, operator_kubeconfig: Path) -> None:
    port, live = free_port(), free_port()
    config = Configuration.model_validate(
        {
            "featureGates": {"TrainJobStatus": True},
            "statusServer": {"host": "127.0.0.1", "port": port, "advertisedURL": f"https://127.0.0.1:{port}"},
        }
    )
    url = f"http://127.0.0.1:{live}/healthz"
    with EmbeddedOperator(
        operator_kubeconfig, config, namespaces=[cluster.namespace], liveness_endpoint=url
    ) as op:
        code, body = health(url)
        assert (code, body) == (200, {"status-server": "ok"})
        running, loop = op.operator.running, op._loop
        assert running is not None and running.status_server is not None and loop is not None
        asyncio.run_coroutine_threadsafe(running.status_server.stop(), loop).result(10)
        code, _ = health(url)
        assert code == 500


def test_the_health_port_is_guarded_like_every_other(cluster: Cluster, operator_kubeconfig: Path) -> None:
    """The health port was kopf's own aiohttp server: no head deadline, no connection cap. It is
    ours now (controller/serving.py): connections that hold it sending nothing are capped, cut at
    the head deadline, and make room for the kubelet's probe, which always gets its answer (a
    refused probe would have the pod restarted)."""
    import socket

    from trainer.controller.operator import HEALTH_LIMITS

    live = free_port()
    url = f"http://127.0.0.1:{live}/healthz"
    with EmbeddedOperator(
        operator_kubeconfig, Configuration(), namespaces=[cluster.namespace], liveness_endpoint=url
    ):
        assert health(url) == (200, {})
        held = [
            socket.create_connection(("127.0.0.1", live)) for _ in range(3 * HEALTH_LIMITS.max_connections)
        ]
        time.sleep(0.2)
        for _ in range(3):
            assert health(url) == (200, {}), "the probe is answered while others hold the port"
        closed = 0
        for sock in held:
            sock.settimeout(0.5)
            with contextlib.suppress(ConnectionResetError, TimeoutError, OSError):
                closed += sock.recv(1) == b""
            sock.close()
        assert closed >= 2 * HEALTH_LIMITS.max_connections, "no more than the cap were held"


def test_the_readiness_endpoint_waits_for_the_webhooks_under_its_configured_names(
    cluster: Cluster, operator_kubeconfig: Path
) -> None:
    """Upstream's readyz: ready once the webhook server listens. Both endpoints take the names
    health.readinessEndpointName and health.livenessEndpointName give them (upstream reads the
    names but serves /readyz and /healthz whatever they say)."""
    live = free_port()
    config = Configuration.model_validate(
        {"health": {"readinessEndpointName": "ready-now", "livenessEndpointName": "alive"}}
    )
    with EmbeddedOperator(
        operator_kubeconfig,
        config,
        namespaces=[cluster.namespace],
        liveness_endpoint=f"http://127.0.0.1:{live}/alive",
        webhooks=True,
    ) as op:
        assert health(f"http://127.0.0.1:{live}/ready-now") == (
            200,
            {"operator": "ok", "webhook-server": "ok"},
        )
        assert health(f"http://127.0.0.1:{live}/alive") == (200, {})
        assert health(f"http://127.0.0.1:{live}/readyz")[0] == 404, "the configured names, not the defaults"
        assert health(f"http://127.0.0.1:{live}/healthz")[0] == 404
        webhooks, loop = op.operator.webhook_server, op._loop
        assert webhooks is not None and webhooks.server is not None and loop is not None
        asyncio.run_coroutine_threadsafe(webhooks.server.stop(), loop).result(10)
        assert health(f"http://127.0.0.1:{live}/ready-now") == (500, None), "the webhook port closed"
        assert health(f"http://127.0.0.1:{live}/alive") == (200, {}), "alive all the same"
        op.operator.ready.clear()  # as before start-up has passed
        assert health(f"http://127.0.0.1:{live}/ready-now") == (500, None)


def test_check_needs_a_tls_handshake(tmp_path: Path) -> None:
    """A port that accepts TCP but not TLS fails the check; a stopped server fails it too."""

    async def scenario() -> None:
        certfile, keyfile = tls_certificates.write_self_signed(tmp_path, ["127.0.0.1"])
        import ssl

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certfile, keyfile)
        server = Server(None, None, ssl_context=context, host="127.0.0.1", port=0)  # type: ignore[arg-type]
        await server.start()
        await server.check()  # the handshake completes
        plain = Server(None, None, ssl_context=None, host="127.0.0.1", port=0)  # type: ignore[arg-type]
        await plain.start()
        plain.ssl_context = context  # the check now expects TLS where the port speaks plain HTTP
        with pytest.raises(NotServing, match="takes no TLS connection"):
            await plain.check(timeout=2)
        await plain.stop()
        await server.stop()
        with pytest.raises(NotServing, match="stopped"):
            await server.check()

    asyncio.run(scenario())
