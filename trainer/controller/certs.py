"""Self-signed serving certificates for the webhook server when nothing provides one.

The chart mounts real certificates (self-managed or cert-manager); an operator embedded in the
demo, the sandbox or a test makes its own.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path


def write_self_signed(directory: Path, hosts: list[str]) -> tuple[Path, Path]:
    """Write ``tls.crt`` and ``tls.key`` for these host names or addresses; return their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


class CertificateReloader:
    """Keep a server's TLS context on the certificate files as they are now.

    cert-manager renews the serving certificate in the mounted Secret; the kubelet swaps the files
    in place. Loading the new pair into the same SSLContext makes new connections use it, with no
    restart and no dropped webhook calls.
    """

    def __init__(self, certfile: str, keyfile: str) -> None:
        import ssl

        self.certfile = certfile
        self.keyfile = keyfile
        self.context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        self._stamp = self._read_stamp()

    def _read_stamp(self) -> tuple[float, float]:
        import os

        try:
            return (os.stat(self.certfile).st_mtime, os.stat(self.keyfile).st_mtime)
        except OSError:
            return (0.0, 0.0)

    def reload_if_changed(self) -> bool:
        import ssl

        stamp = self._read_stamp()
        if stamp == self._stamp or stamp == (0.0, 0.0):
            return False
        try:
            self.context.load_cert_chain(self.certfile, self.keyfile)
        except (OSError, ssl.SSLError):
            return False  # half-written files: the next look will find them whole
        self._stamp = stamp
        return True

    async def watch(self, interval: float = 30.0) -> None:
        import asyncio
        import logging

        while True:
            await asyncio.sleep(interval)
            if self.reload_if_changed():
                logging.getLogger("trainer.operator").info("reloaded the webhook serving certificate")
