"""The guards every listening port has (controller/serving.py), with short limits so a slow or
greedy client shows in well under a second; and the metrics and webhook servers built on them."""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from trainer_sandbox.ports import free_port

from trainer.controller import tls_certificates
from trainer.controller.metrics import Metrics
from trainer.controller.serving import BodyTooLarge, GuardedServer, Limits, read_body
from trainer.controller.webhook_server import MAX_ADMISSION_BODY, WebhookServer


def in_loop(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Each test runs its own event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))  # type: ignore[arg-type]

    return run


pytestmark = pytest.mark.timeout(60)  # the tests are about time bounds: none may hang the suite

FAST = Limits(
    max_connections=4, head_seconds=0.3, idle_seconds=1.5, body_seconds=0.3, max_body=1024, max_in_flight=2
)


def echo_app(limits: Limits, seen: list[str] | None = None) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        try:
            body = await read_body(request, limits)
        except BodyTooLarge:
            return web.Response(status=413)
        except TimeoutError:
            return web.Response(status=408)
        if seen is not None:
            seen.append(body.decode())
        return web.Response(body=body)

    app = web.Application()
    app.router.add_post("/", echo)
    return app


async def started(app: web.Application, limits: Limits = FAST) -> GuardedServer:
    server = GuardedServer(app, "127.0.0.1", free_port(), "test server", limits)
    await server.start()
    return server


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> float:
    """How long until the server closed the connection (EOF or reset); fails past ``seconds``."""
    began = time.monotonic()
    try:
        while await asyncio.wait_for(reader.read(4096), seconds):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - began


def request(body: bytes, *, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size + body


@in_loop
async def test_a_request_head_sent_slowly_is_cut_at_the_head_deadline() -> None:
    server = await started(echo_app(FAST))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for piece in (b"POST / HTTP/1.1\r\n", b"Host: x\r\n", b"X-Slow: 1\r\n"):  # never the blank line
            writer.write(piece)
            await asyncio.sleep(0.1)
        assert await closed_within(reader, 2.0) < 1.0
        writer.close()
    finally:
        await server.stop()


@in_loop
async def test_a_connection_that_never_sends_is_cut_at_the_head_deadline() -> None:
    server = await started(echo_app(FAST))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        waited = await closed_within(reader, 2.0)
        assert 0.2 < waited < FAST.idle_seconds  # the head deadline, not the idle timeout
        writer.close()
    finally:
        await server.stop()


@in_loop
async def test_a_kept_alive_connection_serves_requests_then_closes_when_idle() -> None:
    server = await started(echo_app(FAST))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for word in (b"one", b"two"):  # two requests on one connection, each well inside the limits
            writer.write(request(word))
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(len(word)) == word
            await asyncio.sleep(0.4)  # past the head deadline, inside the idle timeout: kept
        waited = await closed_within(reader, 3.0)
        assert 0.9 < waited < 2.0  # the idle timeout (less the last sleep), not the head deadline
        writer.close()
    finally:
        await server.stop()


@in_loop
async def test_a_full_port_makes_room_by_closing_the_oldest_silent_connection() -> None:
    """Connections that hold the port sending nothing keep nobody out: a new one takes the place of
    the oldest that has not sent a request head (refusing the new one let 16 silent connections
    fail the kubelet's probe and restart the pod)."""
    server = await started(echo_app(FAST))
    try:
        held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(FAST.max_connections)]
        await asyncio.sleep(0.05)
        assert server.connections == FAST.max_connections
        url = f"http://127.0.0.1:{server.port}/"
        async with aiohttp.ClientSession() as session, session.post(url, data=b"in") as response:
            assert await response.read() == b"in", "served, though the port was full"
        assert (server.evicted, server.refused) == (1, 0)
        assert await closed_within(held[0][0], 1.0) < 0.5, "the oldest silent one made room"
        for held_reader, _ in held[1:]:  # the rest go at the head deadline
            await closed_within(held_reader, 2.0)
        assert server.connections == 0
        for _, held_writer in held:
            held_writer.close()
    finally:
        await server.stop()


@in_loop
async def test_a_port_whose_every_connection_is_mid_request_refuses_one_more() -> None:
    release = asyncio.Event()

    async def slow(_: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="done")

    app = web.Application()
    app.router.add_get("/", slow)
    limits = Limits(max_connections=2, head_seconds=5, idle_seconds=5, max_in_flight=2)
    server = await started(app, limits)
    try:
        busy = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            busy.append((reader, writer))
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await closed_within(reader, 1.0) < 0.2, "refused at once: no one to make room"
        assert (server.refused, server.evicted) == (1, 0)
        writer.close()
        release.set()
        for busy_reader, busy_writer in busy:
            assert (await asyncio.wait_for(busy_reader.readuntil(b"\r\n\r\n"), 2.0)).startswith(
                b"HTTP/1.1 200"
            )
            busy_writer.close()
    finally:
        await server.stop()


@in_loop
async def test_tls_handshakes_under_way_count_against_the_cap_and_make_room(tmp_path: Path) -> None:
    """aiohttp lists a TLS connection only once its handshake is done: counted from there, 400
    clients that were slow to shake hands all got in past a cap of 128. Counted from the accept,
    a handshake that does not come is among the first to make room."""
    tls_certificates.write_self_signed(tmp_path, ["127.0.0.1"])
    reloader = tls_certificates.CertificateReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    reloader.context.load_cert_chain(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    limits = Limits(max_connections=3, head_seconds=5, idle_seconds=5, handshake_seconds=0.3)

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    server = GuardedServer(app, "127.0.0.1", free_port(), "tls server", limits, reloader.context)
    await server.start()
    try:
        silent = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]  # no TLS hello
        await asyncio.sleep(0.05)
        assert server.connections == 3
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"https://127.0.0.1:{server.port}/", ssl=False) as response,
        ):
            assert await response.text() == "ok"
        assert server.evicted == 1 and server.refused == 0
        for reader, _ in silent:  # evicted, or closed at the handshake deadline: counted out
            await closed_within(reader, 2.0)
        await asyncio.sleep(0.2)
        assert server.connections == 0
        for _, writer in silent:
            writer.close()
    finally:
        await server.stop()


@in_loop
async def test_bodies_are_bounded_in_size_and_in_time() -> None:
    seen: list[str] = []
    server = await started(echo_app(FAST, seen))
    url = f"http://127.0.0.1:{server.port}/"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=b"x" * (FAST.max_body + 1)) as response:
                assert response.status == 413

            async def chunked() -> AsyncIterator[bytes]:  # no declared length: counted as it comes
                for _ in range(4):
                    yield b"y" * 400

            async with session.post(url, data=chunked()) as response:
                assert response.status == 413
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request(b"part", length=100))  # promises 100 bytes, sends 4
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0)
        assert head.startswith(b"HTTP/1.1 408")
        writer.close()
        assert seen == []
    finally:
        await server.stop()


@in_loop
async def test_requests_in_flight_are_bounded_and_a_handler_whose_client_left_is_cancelled() -> None:
    running, cancelled = [], []
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        running.append(request.query["n"])
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(request.query["n"])
            raise
        return web.Response(text="done")

    app = web.Application()
    app.router.add_get("/", slow)
    server = await started(app, Limits(max_connections=8, head_seconds=5, idle_seconds=5, max_in_flight=2))
    try:
        clients = []
        for n in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(f"GET /?n={n} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            clients.append((reader, writer))
            await asyncio.sleep(0.1)
        assert running == ["0", "1"]  # the third waits for a slot
        clients[0][1].close()  # the first client leaves: its handler is cancelled, the third runs
        await asyncio.sleep(0.2)
        assert cancelled == ["0"]
        assert running == ["0", "1", "2"]
        release.set()
        for reader, writer in clients[1:]:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0)
            assert head.startswith(b"HTTP/1.1 200")
            writer.close()
    finally:
        await server.stop()


@in_loop
async def test_metrics_are_served_in_either_format_on_a_guarded_port() -> None:
    metrics = Metrics()
    metrics.created.labels(framework="torch").inc()
    server = metrics.server("127.0.0.1", free_port())
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as response:
                assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                assert 'trainer_trainjobs_created_total{framework="torch"} 1.0' in await response.text()
            headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
            async with session.get(url, headers=headers) as response:
                assert response.headers["Content-Type"].startswith("application/openmetrics-text")
                assert (await response.text()).endswith("# EOF\n")
            async with session.get(url.replace("/metrics", "/other")) as response:
                assert response.status == 404
        assert server.limits.max_connections == 16
    finally:
        await server.stop()


@in_loop
async def test_the_webhook_server_takes_admission_requests_up_to_controller_runtimes_limit(
    tmp_path: Path,
) -> None:
    """kopf's own server refused anything over 1 MiB (413); the API server sends objects of up to
    ~3 MiB, and an UPDATE two of them."""
    tls_certificates.write_self_signed(tmp_path, ["127.0.0.1"])
    reloader = tls_certificates.CertificateReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    received: list[tuple[str | None, int]] = []

    async def admission(review: Any, *, webhook: str | None = None, **_: Any) -> Any:
        received.append((webhook, len(json.dumps(review))))
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"allowed": True}}

    server = WebhookServer(
        host="127.0.0.1",
        port=free_port(),
        context=reloader.context,
        certfile=str(tmp_path / "tls.crt"),
        keyfile=str(tmp_path / "tls.key"),
    )
    configs = server(admission)
    config = await configs.__anext__()
    try:
        assert config["url"] == f"https://127.0.0.1:{server.port}"
        assert config.get("caBundle")
        big = {"request": {"object": {"data": "x" * (6 << 20)}}}  # 6 MiB: two 3 MiB objects
        async with aiohttp.ClientSession() as session:
            url = f"{config['url']}/validator.trainjob"
            async with session.post(url, data=json.dumps(big), ssl=False) as response:
                assert response.status == 200, await response.text()
                assert (await response.json())["response"]["allowed"] is True
            too_big = b"x" * (MAX_ADMISSION_BODY + 1)
            async with session.post(url, data=too_big, ssl=False) as response:
                assert response.status == 413
            async with session.post(url, data=b"not json", ssl=False) as response:
                assert response.status == 400
        assert received == [("validator.trainjob", len(json.dumps(big)))]
    finally:
        await configs.aclose()
    assert server.server is not None and not server.server.serving


@in_loop
async def test_a_kept_alive_tls_connection_outlives_the_head_deadline_while_idle(tmp_path: Path) -> None:
    """Over TLS a client's first request often arrives with the end of the handshake, before the
    connection is handed to its handler: the head deadline armed then must be the only one. A
    second one, left behind, cut the connection when it fired while idle, and the API server (whose
    POSTs Go does not retry) saw "failed calling webhook: EOF"."""
    tls_certificates.write_self_signed(tmp_path, ["127.0.0.1"])
    reloader = tls_certificates.CertificateReloader(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    reloader.context.load_cert_chain(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    limits = Limits(max_connections=8, head_seconds=0.3, idle_seconds=5, max_body=1024)
    server = GuardedServer(echo_app(limits), "127.0.0.1", free_port(), "tls echo", limits, reloader.context)
    await server.start()
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        for _ in range(5):  # the first request's bytes come with the handshake's end more often than not
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=context)
            for word in (b"first", b"second"):
                writer.write(request(word))
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0)
                assert head.startswith(b"HTTP/1.1 200"), head
                assert await reader.readexactly(len(word)) == word
                await asyncio.sleep(3 * limits.head_seconds)  # idle, well inside the idle timeout
            writer.close()
    finally:
        await server.stop()
