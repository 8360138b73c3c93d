"""Loopback ports for the components a test or the sandbox starts, never the same one twice.

A port picked by binding port 0 and closing the socket is free only until someone binds it. An
operator child is told its metrics and health ports when its configuration is written and binds
them seconds later, at start; a TCP proxy or an API server started in between, binding port 0
itself, may be handed the same port by the kernel (it happened: a chaos run's proxy took a
replica's health port, and the replica could not start). So every port this process hands out is
remembered, and everything here that listens asks this module rather than binding port 0. A port
held by another program is still possible; the component that then fails to bind says so.
"""

from __future__ import annotations

import socket
import threading

_lock = threading.Lock()
_handed_out: set[int] = set()
_ATTEMPTS = 200


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free a moment ago and not handed out before by this process.

    All sockets stay open until every port is chosen, so one call never returns a port twice.
    """
    sockets: list[socket.socket] = []
    chosen: list[int] = []
    try:
        with _lock:
            for _ in range(count * _ATTEMPTS):
                if len(chosen) == count:
                    break
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(s)
                s.bind((host, 0))
                port: int = s.getsockname()[1]
                if port not in _handed_out:
                    chosen.append(port)
            else:
                raise RuntimeError(f"no {count} unused loopback ports after {count * _ATTEMPTS} tries")
            _handed_out.update(chosen)
            return chosen
    finally:
        for s in sockets:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One port, as :func:`free_ports` chooses them."""
    return free_ports(1, host)[0]
