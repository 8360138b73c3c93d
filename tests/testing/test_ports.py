"""The sandbox's port chooser never hands out a port twice, so a component told its port early
(an operator child's health port) cannot lose it to one that binds later (a proxy)."""

from __future__ import annotations

import socket

from trainer_sandbox.ports import free_port, free_ports
from trainer_sandbox.tcp_proxy import TcpProxy


def test_ports_are_never_handed_out_twice() -> None:
    # The kernel picks a random free port for port 0; among ~14,000 candidates, 1,500 draws with
    # every socket closed in between repeat one almost surely unless the chooser remembers.
    seen = [free_port() for _ in range(1500)] + free_ports(50)
    assert len(seen) == len(set(seen))


def test_a_proxy_does_not_take_a_port_promised_to_another_component() -> None:
    promised = set(free_ports(200))  # closed again, as an operator's health port is until start
    proxies = [TcpProxy(("127.0.0.1", 9)).start() for _ in range(20)]
    try:
        assert not promised & {p.port for p in proxies}
        with socket.create_connection(proxies[0].address, timeout=5):
            pass  # each proxy listens on the port it reports
    finally:
        for proxy in proxies:
            proxy.stop()
