"""The webhook server picks up a renewed certificate without a restart."""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from pathlib import Path

from trainer.controller.tls_certificates import CertificateReloader, write_self_signed


async def _served_name(context: ssl.SSLContext) -> str:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    server.close()
    await server.wait_closed()
    from cryptography import x509

    return str(x509.load_der_x509_certificate(der).subject.rfc4514_string())


def test_renewed_files_are_served_after_reload(tmp_path: Path) -> None:
    cert, key = write_self_signed(tmp_path, ["first.example"])
    reloader = CertificateReloader(str(cert), str(key))
    reloader.context.load_cert_chain(str(cert), str(key))  # what the webhook server does at start
    assert asyncio.run(_served_name(reloader.context)) == "CN=first.example"
    assert reloader.reload_if_changed() is False, "unchanged files are not reloaded"
    time.sleep(0.01)
    write_self_signed(tmp_path, ["second.example"])
    later = time.time() + 5
    os.utime(cert, (later, later))
    os.utime(key, (later, later))
    assert reloader.reload_if_changed() is True
    assert asyncio.run(_served_name(reloader.context)) == "CN=second.example"


def test_half_written_files_keep_the_old_certificate(tmp_path: Path) -> None:
    cert, key = write_self_signed(tmp_path, ["kept.example"])
    reloader = CertificateReloader(str(cert), str(key))
    reloader.context.load_cert_chain(str(cert), str(key))
    cert.write_text("-----BEGIN CERTIFICATE-----\ntruncated")
    later = time.time() + 5
    os.utime(cert, (later, later))
    assert reloader.reload_if_changed() is False
    assert asyncio.run(_served_name(reloader.context)) == "CN=kept.example"
