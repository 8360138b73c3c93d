"""Certificates for the webhook server, and their reloading.

- ``write_self_signed``: a certificate for a run that has none (the demo, the sandbox, a test).
- ``renewed``: what the operator's own certificate Secret should hold (``certManagement``; its
  I/O is ``controller/certificate_secret.py``): a CA and a serving certificate, each renewed when
  a third of its lifetime is left.
- ``CertificateReloader``: files renewed in place (cert-manager's, the user's, the operator's own)
  loaded into the running server's TLS context.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature


def write_self_signed(directory: Path, hosts: list[str]) -> tuple[Path, Path]:
    """Write ``tls.crt`` and ``tls.key`` for these host names or addresses; return their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
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
        .add_extension(x509.SubjectAlternativeName(_general_names(hosts)), critical=False)  # type: ignore[arg-type]
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_pem_key(key))
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


# --- a certificate the operator makes, rotates and shares through one Secret ---------------------

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
RENEW_FRACTION = 1 / 3  # renewed when a third of the lifetime is left (cert-manager's default)


def service_hosts(service: str, namespace: str, extra: str | None = None) -> list[str]:
    """The names the API server may call a Service by, and one more (an address the tests use)."""
    hosts = [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
    hosts.append(f"{service}.{namespace}.svc.cluster.local")
    if extra and extra not in hosts:
        hosts.append(extra)
    return hosts


def _general_names(hosts: list[str]) -> list[object]:
    from cryptography import x509

    names: list[object] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _pem_key(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_ca(common_name: str, validity: datetime.timedelta, now: datetime.datetime) -> tuple[bytes, bytes]:
    """A self-signed CA certificate and its key (PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _backdate(validity))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def new_serving(
    ca_pem: bytes, ca_key_pem: bytes, hosts: list[str], validity: datetime.timedelta, now: datetime.datetime
) -> tuple[bytes, bytes]:
    """A serving certificate for ``hosts`` signed by the CA, never outliving it (PEM cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    not_after = min(now + validity, ca.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _backdate(validity))
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(_general_names(hosts)), critical=False)  # type: ignore[arg-type]
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _backdate(validity: datetime.timedelta) -> datetime.timedelta:
    """Valid from a little before now (clocks differ), by at most a tenth of the lifetime."""
    return min(datetime.timedelta(minutes=5), validity / 10)


def _due(cert: x509.Certificate, now: datetime.datetime) -> bool:
    """Expired, or less than a third of its lifetime left."""
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now <= lifetime * RENEW_FRACTION


def renewed(
    data: dict[str, bytes] | None,
    *,
    hosts: list[str],
    ca_name: str,
    ca_validity: datetime.timedelta,
    cert_validity: datetime.timedelta,
    now: datetime.datetime,
) -> dict[str, bytes] | None:
    """What the certificate Secret should hold now, or None when what it holds is good.

    ``ca.crt`` is the trust bundle: the signing CA first (its key is ``ca.key``), then earlier CAs
    until they expire, so a replica still serving a certificate of the old CA is trusted while the
    others move on. A CA falls due a third of its lifetime before it expires, and a serving
    certificate likewise; one that does not name every host or was not signed by the CA is
    replaced at once. Anything unreadable starts again from a new CA.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    bundle: list[x509.Certificate] = []
    try:
        if data is None:
            raise ValueError("no Secret")
        bundle = x509.load_pem_x509_certificates(data[CA_CERT])
        signer = bundle[0]
        ca_key = serialization.load_pem_private_key(data[CA_KEY], password=None)
        serving = x509.load_pem_x509_certificate(data[TLS_CERT])
        serving_key = serialization.load_pem_private_key(data[TLS_KEY], password=None)
        if ca_key.public_key() != signer.public_key():
            raise ValueError("ca.key is not the key of the first certificate in ca.crt")
    except (KeyError, ValueError, TypeError, IndexError):
        ca_pem, ca_key_pem = new_ca(ca_name, ca_validity, now)
        earlier = [c for c in bundle if c.not_valid_after_utc > now]
        return _material(ca_pem, ca_key_pem, earlier, hosts, cert_validity, now)
    earlier = [c for c in bundle[1:] if c.not_valid_after_utc > now]
    if _due(signer, now):
        ca_pem, ca_key_pem = new_ca(ca_name, ca_validity, now)
        return _material(ca_pem, ca_key_pem, [signer, *earlier], hosts, cert_validity, now)
    signer_pem = signer.public_bytes(serialization.Encoding.PEM)
    if (
        _due(serving, now)
        or serving_key.public_key() != serving.public_key()
        or not _names(serving) >= set(hosts)
        or not _issued_by(serving, signer)
    ):
        return _material(signer_pem, data[CA_KEY], earlier, hosts, cert_validity, now)
    if len(earlier) != len(bundle) - 1:  # an earlier CA expired: out of the bundle
        return {**data, CA_CERT: _bundle(signer_pem, earlier)}
    return None


def _material(
    ca_pem: bytes,
    ca_key_pem: bytes,
    earlier: list[x509.Certificate],
    hosts: list[str],
    cert_validity: datetime.timedelta,
    now: datetime.datetime,
) -> dict[str, bytes]:
    cert_pem, key_pem = new_serving(ca_pem, ca_key_pem, hosts, cert_validity, now)
    return {CA_CERT: _bundle(ca_pem, earlier), CA_KEY: ca_key_pem, TLS_CERT: cert_pem, TLS_KEY: key_pem}


def _bundle(signer_pem: bytes, earlier: list[x509.Certificate]) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pems = [signer_pem]
    for cert in earlier:
        pem = cert.public_bytes(serialization.Encoding.PEM)
        if pem not in pems:
            pems.append(pem)
    return b"".join(pems)


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName)) | {
        str(a) for a in san.get_values_for_type(x509.IPAddress)
    }


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
