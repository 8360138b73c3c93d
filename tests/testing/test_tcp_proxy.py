"""The TCP proxy tests put between the operator and its API server: forward, pause, cut, resume."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
from trainer_sandbox.tcp_proxy import TcpProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = _Server(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ("127.0.0.1", server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[TcpProxy]:
    with TcpProxy(echo) as started:
        yield started


def _connect(proxy: TcpProxy) -> socket.socket:
    sock = socket.create_connection(proxy.address, timeout=5)
    sock.settimeout(5)
    return sock


def _echoes(sock: socket.socket, data: bytes = b"ping") -> bool:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            return False
        got += chunk
    return got == data


def _closed(sock: socket.socket) -> bool:
    """The peer closed or reset the connection (and nothing else arrived)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _refused(proxy: TcpProxy) -> bool:
    """A new connection is reset at once (as soon as accepted: at times before connect() returns)."""
    try:
        sock = _connect(proxy)
    except ConnectionResetError:
        return True
    with sock:
        try:
            sock.sendall(b"ping")
        except (ConnectionResetError, BrokenPipeError):
            return True
        return _closed(sock)


def test_forwards_both_ways(proxy: TcpProxy) -> None:
    with _connect(proxy) as sock:
        assert _echoes(sock, b"x" * 200_000)
    assert proxy.accepted == 1
    assert proxy.url == f"https://127.0.0.1:{proxy.port}"


def test_pause_holds_bytes_until_resume(proxy: TcpProxy) -> None:
    with _connect(proxy) as sock:
        assert _echoes(sock)
        proxy.pause()
        sock.sendall(b"held")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(4)
        # A connection made while paused is accepted and held as well.
        with _connect(proxy) as late:
            late.sendall(b"late")
            late.settimeout(0.3)
            with pytest.raises(TimeoutError):
                late.recv(4)
            proxy.resume()
            late.settimeout(5)
            assert late.recv(4) == b"late"
        sock.settimeout(5)
        assert sock.recv(4) == b"held"
        assert _echoes(sock)


def test_cut_closes_every_connection_and_refuses_new_ones_until_resume(proxy: TcpProxy) -> None:
    first, second = _connect(proxy), _connect(proxy)
    with first, second:
        assert _echoes(first) and _echoes(second)
        proxy.cut()
        assert _closed(first) and _closed(second)
    assert proxy.open_connections == 0
    # Refused: reset as soon as accepted (the port stays the proxy's).
    for _ in range(3):
        assert _refused(proxy)
    assert proxy.refused == 3
    proxy.resume()
    with _connect(proxy) as sock:
        assert _echoes(sock)


def test_connections_are_bounded(echo: tuple[str, int]) -> None:
    with TcpProxy(echo, max_connections=2) as proxy:
        first, second = _connect(proxy), _connect(proxy)
        with first, second:
            assert _echoes(first) and _echoes(second)
            assert _refused(proxy)
        assert proxy.refused == 1


def test_stop_closes_connections_and_the_port(echo: tuple[str, int]) -> None:
    proxy = TcpProxy(echo).start()
    sock = _connect(proxy)
    assert _echoes(sock)
    proxy.stop()
    with sock:
        assert _closed(sock)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=5).close()


def test_to_url_parses_the_server_of_a_kubeconfig() -> None:
    assert TcpProxy.to_url("https://127.0.0.1:6443").upstream == ("127.0.0.1", 6443)
    assert TcpProxy.to_url("https://localhost").upstream == ("localhost", 443)
