"""Slow clients against the webhook port: kopf's own webhook server, then ours, side by side.

Each server runs alone in a child process serving a TLS webhook port as the operator does; this
process opens ``--clients`` TLS connections to it, each sending a request head a few KB at a time,
one line a second, for at most ``--seconds``, and watches the child's resident memory. Printed per
server: memory before and at its peak, how many connections were opened, and how long the server
held them (median, max). Nothing here is a test: it prints figures (docs/security.md, finding 6).

    .venv/bin/python bench/slow_connections.py [--clients 400] [--seconds 45]
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import ROOT, machine

SERVE = """
import asyncio, sys
from trainer.controller import tls_certificates
from trainer.controller.webhook_server import WebhookServer
import kopf

which, port, certs = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cert, key = f"{certs}/tls.crt", f"{certs}/tls.key"

async def main():
    if which == "kopf":
        server = kopf.WebhookServer(addr="127.0.0.1", port=port, certfile=cert, pkeyfile=key)
    else:
        context = tls_certificates.CertificateReloader(cert, key).context
        server = WebhookServer(host="127.0.0.1", port=port, context=context, certfile=cert, keyfile=key)
    async def admission(review, **_):
        return {}
    configs = server(admission)
    await configs.__anext__()
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def attack(port: int, clients: int, seconds: float, pid: int) -> tuple[float, float, int, list[float]]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    held: list[float] = []
    opened = 0

    async def client() -> None:
        nonlocal opened
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, ssl=context), 15
            )
        except (OSError, TimeoutError):
            return
        opened += 1
        began = time.monotonic()
        try:
            writer.write(b"POST /validator.trainjob HTTP/1.1\r\nHost: webhook\r\n")
            while time.monotonic() - began < seconds:
                writer.write(b"X-Slow: " + b"x" * 4000 + b"\r\n")
                await writer.drain()
                try:
                    await asyncio.wait_for(reader.read(1), 1.0)
                    break  # the server answered or closed: the connection is no longer held
                except TimeoutError:
                    continue
        except (OSError, ConnectionError):
            pass
        held.append(time.monotonic() - began)
        writer.close()

    before = rss_mb(pid)
    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    peak = before
    while not all(task.done() for task in tasks):
        await asyncio.sleep(0.5)
        peak = max(peak, rss_mb(pid))
    return before, peak, opened, sorted(held)


def run(which: str, clients: int, seconds: float) -> str:
    sys.path.insert(0, str(ROOT / "sandbox"))
    from trainer_sandbox.ports import free_port

    from trainer.controller import tls_certificates

    with tempfile.TemporaryDirectory() as certs:
        tls_certificates.write_self_signed(Path(certs), ["127.0.0.1"])
        port = free_port()
        child = subprocess.Popen(
            [sys.executable, "-c", SERVE, which, str(port), certs],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            before, peak, opened, held = asyncio.run(attack(port, clients, seconds, child.pid))
        finally:
            child.terminate()
            child.wait()
    median = held[len(held) // 2] if held else 0.0
    longest = held[-1] if held else 0.0
    return (
        f"{which:>4}: RSS {before:.0f} MB -> peak {peak:.0f} MB (+{peak - before:.0f} MB); "
        f"{opened}/{clients} connections opened; held median {median:.1f} s, max {longest:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=45.0)
    args = parser.parse_args()
    print(machine())
    print(f"{args.clients} TLS clients trickling a request head, for at most {args.seconds:g} s")
    for which in ("kopf", "ours"):
        print(run(which, args.clients, args.seconds), flush=True)


if __name__ == "__main__":
    main()
