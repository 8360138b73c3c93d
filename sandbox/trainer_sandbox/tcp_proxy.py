"""A TCP proxy on loopback that a test can pause, cut and resume: watch outages on demand.

Put between a client and a server (the operator and its API server), it forwards bytes both ways
untouched, so TLS passes through (a certificate for 127.0.0.1 still matches). A test then controls
the link:

- :meth:`TcpProxy.pause` holds the bytes: nothing more is read from either side until resumed,
  so the peers see a link that has gone silent (TCP's own flow control holds the rest);
  connections made meanwhile are accepted and held the same way.
- :meth:`TcpProxy.cut` closes every connection at once (a reset, as a failed link or a restarted
  load balancer does) and refuses new ones: each is reset as soon as it is accepted, so the
  listening port stays the proxy's.
- :meth:`TcpProxy.resume` lets bytes and new connections through again.

It runs an event loop in a thread of its own, so a synchronous test and an operator on another
loop can both use it, and it is bounded: at most ``max_connections`` at once (further ones are
reset), at most one read buffer (64 KiB) held per direction of a connection while paused.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from trainer_sandbox.ports import free_port

CHUNK = 64 * 1024


@dataclass(eq=False)  # hashed by identity, kept in a set
class _Link:
    """One client connection and its connection to the upstream server."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                _reset(writer)
        for task in self.tasks:
            task.cancel()


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``upstream`` (host, port); see the module's docstring."""

    def __init__(self, upstream: tuple[str, int], *, max_connections: int = 256) -> None:
        self.upstream = upstream
        self.max_connections = max_connections
        self.port = 0
        self.accepted = 0  # connections forwarded since start
        self.refused = 0  # connections reset because the link was cut or too many were open
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._cut = False

    @classmethod
    def to_url(cls, url: str, **kwargs: int) -> TcpProxy:
        """A proxy to the server of an ``https://host:port`` URL (not started)."""
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"no host in {url!r}")
        return cls((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)), **kwargs)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout: float = 10) -> TcpProxy:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:  # reported to start()
                failure.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._close_all())
                loop.close()

        self._thread = threading.Thread(target=run, name=f"tcp-proxy-{self.upstream[1]}", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise TimeoutError(f"the TCP proxy did not start within {timeout} s")
        if failure:
            raise failure[0]
        return self

    def stop(self, timeout: float = 10) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
        self._thread = None

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``: what a kubeconfig's server becomes to go through the proxy."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._links)

    # -- control (from any thread) -----------------------------------------------------------------
    def pause(self) -> None:
        """Hold every byte in both directions until :meth:`resume`; connections stay open."""
        self._call(self._pause)

    def cut(self) -> None:
        """Reset every connection and refuse new ones until :meth:`resume`."""
        self._call(self._do_cut)

    def resume(self) -> None:
        """Let bytes and new connections through again."""
        self._call(self._resume)

    def _call(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            raise RuntimeError("the TCP proxy is not running")

        async def run() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(run(), loop).result(10)

    def _pause(self) -> None:
        assert self._flowing is not None
        self._flowing.clear()

    def _do_cut(self) -> None:
        self._cut = True
        for link in list(self._links):
            link.abort()
        self._links.clear()

    def _resume(self) -> None:
        assert self._flowing is not None
        self._cut = False
        self._flowing.set()

    # -- the loop's side ---------------------------------------------------------------------------
    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        port = free_port()  # not port 0: see trainer_sandbox.ports
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port, reuse_address=True)
        self.port = port

    async def _close_all(self) -> None:
        self._do_cut()
        if self._server is not None:
            self._server.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut or len(self._links) >= self.max_connections:
            self.refused += 1
            _reset(writer)
            return
        link = _Link(writer)
        self._links.add(link)
        self.accepted += 1
        try:
            assert self._flowing is not None
            await self._flowing.wait()  # a connection made while paused is held too
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            link.upstream = up_writer
            if link not in self._links:  # cut while connecting
                up_writer.transport.abort()
                return
            link.tasks = [
                asyncio.create_task(self._pump(reader, up_writer)),
                asyncio.create_task(self._pump(up_reader, writer)),
            ]
            await asyncio.gather(*link.tasks, return_exceptions=True)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if link in self._links:
                self._links.discard(link)
                for end in (link.client, link.upstream):
                    if end is not None:
                        end.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        flowing = self._flowing
        assert flowing is not None
        try:
            while True:
                await flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                await flowing.wait()  # paused during the read: this chunk is held as well
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, asyncio.CancelledError):
            writer.transport.abort()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset rather than a graceful FIN: the client sees its connection refused."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
