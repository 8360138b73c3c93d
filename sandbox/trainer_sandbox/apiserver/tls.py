"""A self-signed serving certificate for the local server.

kubectl sends a kubeconfig's credentials only over TLS, so the server must serve HTTPS even on
loopback. One CA and certificate are made per process (ECDSA keys are cheap) and shared by every
server it starts.
"""

from __future__ import annotations

import datetime as dt
import ssl
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from trainer.controller import tls_certificates


@dataclass(frozen=True)
class ServingCert:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as d:
            cert, key = Path(d) / "tls.crt", Path(d) / "tls.key"
            cert.write_bytes(self.cert_pem + self.ca_pem)
            key.write_bytes(self.key_pem)
            ctx.load_cert_chain(cert, key)
        return ctx


@cache
def serving_cert() -> ServingCert:
    """A CA and a certificate for loopback (and the in-cluster name clients may dial), a year
    each, made as the operator makes its own (trainer/controller/tls_certificates.py)."""
    now = dt.datetime.now(dt.UTC)
    year = dt.timedelta(days=365)
    ca_pem, ca_key_pem = tls_certificates.new_ca("local-apiserver-ca", year, now)
    hosts = ["localhost", "kubernetes.default.svc", "127.0.0.1", "::1"]
    cert_pem, key_pem = tls_certificates.new_serving(ca_pem, ca_key_pem, hosts, year, now)
    return ServingCert(ca_pem=ca_pem, cert_pem=cert_pem, key_pem=key_pem)
