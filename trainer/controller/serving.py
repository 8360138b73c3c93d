"""Every port the operator listens on is served the same guarded way.

aiohttp, left to its defaults, lets a client take as long as it likes to send a request's head,
accepts connections without bound and lets a handler run on after its client has gone: 400
connections trickling headers held the webhook port's memory (+100 MB) for as long as they
liked. Here each port gets, as Go's ``http.Server`` gives controller-runtime's ports:

- a **head deadline** (Go's ``ReadHeaderTimeout``): a connection must deliver a whole request head
  within ``head_seconds`` of opening, or of starting the next request after a response;
- an **idle timeout** (``IdleTimeout``): a kept-alive connection with no request in flight is
  closed after ``idle_seconds``. For the webhook port it outlives the API server's own idle
  timeout (90 s), so the API server is the side that closes and never sends on a closing socket;
- a **TLS handshake deadline** of ``handshake_seconds``;
- a **connection cap**: past ``max_connections`` open connections, a new one takes the place of
  the oldest that has not sent a whole request head (``evicted``), else it is closed at once
  (``refused``): what a flood can hold is bounded, and holding it keeps nobody out;
- a **body limit** and a **body deadline**, which the application reads with :func:`read_body`,
  and a bound on requests handled at once (so on the bodies held in memory);
- handlers **cancelled** when their client goes away.

docs/security.md lists the figures each port uses.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

logger = logging.getLogger("trainer.serving")


@dataclass(frozen=True)
class Limits:
    max_connections: int = 128
    head_seconds: float = 10.0
    idle_seconds: float = 120.0
    handshake_seconds: float = 10.0
    body_seconds: float = 30.0
    max_body: int = 1 << 20
    # Requests handled at once; the rest wait their turn (their bodies still unread), so what
    # bodies in memory can take is bounded by max_in_flight * max_body.
    max_in_flight: int = 16
    # aiohttp's per-line and per-header bounds; with max_headers they bound a request head.
    max_headers: int = 64
    max_field_size: int = 8190


class BodyTooLarge(Exception):
    pass


async def read_body(request: web.Request, limits: Limits) -> bytes:
    """The whole body, within the port's size and time bounds.

    Raises :class:`BodyTooLarge`, or :class:`TimeoutError` when the client sends it too slowly.
    """
    declared = request.content_length
    if declared is not None and declared > limits.max_body:
        raise BodyTooLarge(f"the body ({declared} bytes) is over {limits.max_body} bytes")

    async def chunks() -> bytes:
        parts: list[bytes] = []
        size = 0
        async for chunk in request.content.iter_chunked(65536):
            size += len(chunk)
            if size > limits.max_body:
                raise BodyTooLarge(f"the body is over {limits.max_body} bytes")
            parts.append(chunk)
        return b"".join(parts)

    return await asyncio.wait_for(chunks(), limits.body_seconds)


class _GuardedHandler(web.RequestHandler):
    """aiohttp's connection handler with a head deadline.

    aiohttp's keep-alive timer closes a connection that has no request in flight after
    ``keepalive_timeout`` (our idle timeout). The head deadline is one more timer: armed when a
    connection opens and when the first bytes of a next request arrive, cancelled when the head
    is parsed (the application's middleware marks the request begun), firing ``force_close``.
    """

    def __init__(
        self, manager: web.Server, *, guard: GuardedServer, head_seconds: float, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self.guard = guard
        self.head_seconds = head_seconds
        self.head_timer: asyncio.TimerHandle | None = None
        self.in_request = False
        self.counted = True  # in the guard's open connections until closed() or evicted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.head_timer is None and not self.in_request:
            # Over TLS the first request's bytes can come with the end of the handshake, before
            # this: then the deadline was armed when they arrived, and is not armed twice.
            self._arm()

    def closed(self) -> None:
        """Counted out of the server's open connections, once."""
        self.guard.unwatch(self)
        if self.counted:
            self.counted = False
            self.guard.open -= 1

    def data_received(self, data: bytes) -> None:
        self.guard.idle.pop(self, None)
        if self.head_timer is None and not self.in_request:
            self._arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.disarm()
        self.closed()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self.disarm()  # one deadline at a time: one left behind would cut a kept-alive connection
        self.head_timer = asyncio.get_running_loop().call_later(self.head_seconds, self._head_late)
        self.guard.waiting[self] = None  # sending a request head: the first to go when full

    def disarm(self) -> None:
        self.guard.waiting.pop(self, None)
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def evict(self) -> None:
        """Make room for a new connection: this one is counted out now, and closed."""
        self.closed()
        self.disarm()
        self.force_close()

    def _head_late(self) -> None:
        self.head_timer = None
        if not self.in_request:
            self.force_close()


BODY = web.RequestKey("trainer.serving.body", bytes)  # request[BODY]: the body, with read_body_first


def _request_begun(in_flight: asyncio.Semaphore, limits: Limits, read_first: bool) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        protocol = request.protocol
        guarded = protocol if isinstance(protocol, _GuardedHandler) else None
        if guarded is not None:
            guarded.disarm()
            guarded.in_request = True
        try:
            if read_first:
                # The body before a slot: a client sending one slowly holds its own connection,
                # not one of the slots every other request needs (handlers take request[BODY]);
                # and while it does, its connection is among the first to go when the port is full.
                if guarded is not None:
                    guarded.guard.waiting[guarded] = None
                try:
                    request[BODY] = await read_body(request, limits)
                except BodyTooLarge as exc:
                    return web.json_response({"message": str(exc)}, status=413)
                except TimeoutError:
                    return web.json_response({"message": "the request body came too slowly"}, status=408)
                finally:
                    if guarded is not None:
                        guarded.guard.waiting.pop(guarded, None)
            async with in_flight:
                response: web.StreamResponse = await handler(request)
                return response
        finally:
            if guarded is not None:
                guarded.in_request = False
                if guarded.counted:
                    guarded.guard.idle[guarded] = None  # kept alive, nothing asked: second to go

    return middleware


class _Accepted(asyncio.Protocol):
    """A TCP connection as accepted: counted, or refused, before any TLS work is done on it.

    With the TLS context given to ``create_server``, asyncio shakes hands on every connection it
    accepts, refused ones too: each costs a TLS handshake's CPU and a 256 KiB buffer, and a flood
    of them (1,000 here) grew the process by 150 MB. Accepted as plain TCP, a connection past the
    cap is reset at once; the others are upgraded with ``loop.start_tls`` under the handshake
    deadline and handed to aiohttp's handler.
    """

    def __init__(self, server: GuardedServer, make_handler: Callable[[], _GuardedHandler]) -> None:
        self.server = server
        self.make_handler = make_handler

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        server = self.server
        if not server.admit():
            transport.abort()
            return
        handler = self.make_handler()
        context = server.ssl_context
        if context is None:
            transport.set_protocol(handler)
            handler.connection_made(transport)
            return
        transport.pause_reading()  # nothing is read until the TLS layer takes the transport
        task = asyncio.get_running_loop().create_task(self._shake_hands(transport, handler, context))
        server.handshakes[handler] = task
        server.waiting[handler] = None  # a handshake under way is waiting too
        task.add_done_callback(lambda _: server.handshakes.pop(handler, None))

    async def _shake_hands(
        self, transport: asyncio.Transport, handler: _GuardedHandler, context: ssl.SSLContext
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = await loop.start_tls(
                transport,
                handler,
                context,
                server_side=True,
                ssl_handshake_timeout=self.server.limits.handshake_seconds,
            )
        except asyncio.CancelledError:  # the server stops
            transport.abort()
            handler.closed()
            raise
        except Exception as exc:  # failed, or too slow: the connection never reached the handler
            transport.abort()
            handler.closed()
            logger.debug("%s: a TLS handshake failed: %s", self.server.name, exc)
            return
        if tls is None or not handler.counted:  # the peer went, or it was evicted meanwhile
            handler.closed()
            if tls is not None:
                tls.abort()
            return
        self.server.waiting.pop(handler, None)
        handler.connection_made(tls)

    def data_received(self, data: bytes) -> None:
        pass  # reading is paused until TLS takes over; a plain connection has its handler by now


@dataclass
class GuardedServer:
    """One application on one port, within :class:`Limits`."""

    app: web.Application
    host: str
    port: int
    name: str
    limits: Limits = field(default_factory=Limits)
    ssl_context: ssl.SSLContext | None = None
    # The webhook server's: bodies are read before a request takes one of the in-flight slots.
    read_body_first: bool = False
    refused: int = 0
    evicted: int = 0
    open: int = 0  # connections accepted and not yet closed, TLS handshakes under way included
    handshakes: dict[_GuardedHandler, asyncio.Task[None]] = field(default_factory=dict, repr=False)
    # Who goes first when the port is full, oldest first: connections still shaking hands or
    # sending a request head, then connections kept alive with nothing asked.
    waiting: dict[_GuardedHandler, None] = field(default_factory=dict, repr=False)
    idle: dict[_GuardedHandler, None] = field(default_factory=dict, repr=False)
    _runner: web.AppRunner | None = field(default=None, init=False, repr=False)
    _server: asyncio.AbstractServer | None = field(default=None, init=False, repr=False)

    async def start(self) -> None:
        limits = self.limits
        in_flight = asyncio.Semaphore(limits.max_in_flight)
        self.app.middlewares.insert(0, _request_begun(in_flight, limits, self.read_body_first))
        runner = web.AppRunner(
            self.app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=2.0,
        )
        await runner.setup()
        server = runner.server
        assert server is not None
        loop = asyncio.get_running_loop()

        def handler() -> _GuardedHandler:
            return _GuardedHandler(
                server,
                loop=loop,
                guard=self,
                head_seconds=limits.head_seconds,
                keepalive_timeout=limits.idle_seconds,
                max_headers=limits.max_headers,
                max_field_size=limits.max_field_size,
                max_line_size=limits.max_field_size,
                access_log=None,
            )

        self._runner = runner
        self._server = await loop.create_server(
            lambda: _Accepted(self, handler), self.host or None, self.port, reuse_address=True
        )
        sockets: list[Any] = list(self._server.sockets or [])
        if sockets:
            self.port = sockets[0].getsockname()[1]

    def admit(self) -> bool:
        """Count a new connection in. When ``max_connections`` are open, the oldest one that has
        not yet sent a whole request head (or is still shaking hands) goes to make room, else the
        oldest kept alive with nothing asked; only when every one is mid-request is the new one
        refused. Holding the port's connections open, sending nothing, then keeps nobody out: not
        the API server, not the kubelet's probe (whose failure would restart the pod)."""
        if self.open >= self.limits.max_connections:
            victims = self.waiting or self.idle
            if victims:
                victim = next(iter(victims))
                task = self.handshakes.get(victim)
                victim.evict()
                if task is not None:
                    task.cancel()
                self.evicted += 1
        if self.open < self.limits.max_connections:
            self.open += 1
            return True
        self.refused += 1
        if self.refused == 1 or self.refused % 1000 == 0:
            logger.warning(
                "%s: %d connections open, the most it takes: refusing new ones (%d so far)",
                self.name,
                self.open,
                self.refused,
            )
        return False

    @property
    def connections(self) -> int:
        return self.open

    def unwatch(self, handler: _GuardedHandler) -> None:
        self.waiting.pop(handler, None)
        self.idle.pop(handler, None)

    @property
    def serving(self) -> bool:
        """Listening: started, not stopped."""
        return self._server is not None and self._server.is_serving()

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self.handshakes.values()):
            task.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
