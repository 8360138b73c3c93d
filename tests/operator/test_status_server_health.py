"""The status server's health check in the operator's liveness endpoint (upstream's
status-server-healthz/-readyz, docs/upstream-behaviour.md §trainjob-status): it passes while the
port takes a TLS connection and fails, turning the endpoint to 500, once it does not."""

from __future__ import annotations

import asyncio
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

# kopf answers a probe from results it keeps for 10 s.
PROBE_CACHE_SECONDS = 10


def health(url: str) -> tuple[int, Any]:
    """The endpoint's answer, once it listens (kopf starts it beside the operator's start-up)."""
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
        time.sleep(PROBE_CACHE_SECONDS + 0.5)
        code, _ = health(url)
        assert code == 500


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
