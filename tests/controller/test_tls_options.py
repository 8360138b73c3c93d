"""Upstream's ``tls`` settings on the operator's TLS servers (controller/tls_options.py): what a
client can and cannot negotiate with a server the settings were applied to, and what the
Configuration refuses, naming the field."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from trainer.controller import tls_options
from trainer.controller.config import Configuration
from trainer.controller.tls_certificates import write_self_signed


def test_each_go_name_is_the_suite_openssl_lists_under_it() -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to list the standard names")
    listed = subprocess.run(
        [openssl, "ciphers", "-stdname", "ALL:@SECLEVEL=0"], capture_output=True, text=True, check=True
    ).stdout
    standard = {line.split()[0]: line.split()[2] for line in listed.splitlines() if " - " in line}
    known = {go: ours for go, ours in tls_options.CIPHER_SUITES.items() if go in standard}
    assert len(known) >= 14, "every suite this OpenSSL serves is listed by it"
    for go, ours in known.items():
        assert standard[go] == ours, go


@pytest.mark.parametrize(
    "tls,complaint",
    [
        (
            {"cipherSuites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA265"]},
            "not a cipher suite Go's crypto/tls knows",
        ),
        ({"cipherSuites": ["TLS_RSA_WITH_RC4_128_SHA"]}, "cannot serve it"),
        ({"minVersion": "1.4"}, "tls.minVersion"),
        ({"nextProtos": ["h2"]}, "speak http/1.1 only"),
    ],
)
def test_settings_it_cannot_honour_are_refused_by_name(tls: dict[str, object], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        Configuration.model_validate({"tls": tls})


def test_upstreams_own_example_loads() -> None:
    config = Configuration.model_validate(
        {
            "tls": {
                "minVersion": "1.2",
                "cipherSuites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"],
                "nextProtos": ["h2", "http/1.1"],
            }
        }
    )
    assert tls_options.openssl_ciphers(config.tls.cipher_suites) == "ECDHE-ECDSA-AES128-GCM-SHA256"


class Served:
    """A TLS echo of the negotiated version, suite and protocol, with ``tls`` applied."""

    def __init__(self, tmp: Path, min_version: str, suites: list[str]) -> None:
        cert, key = write_self_signed(tmp, ["127.0.0.1"])
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        tls_options.apply(self.context, min_version, suites)
        self.ca = str(cert)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            try:
                with self.context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    def connect(
        self, maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED
    ) -> tuple[str, str, str | None]:
        client = ssl.create_default_context(cafile=self.ca)
        client.maximum_version = maximum
        client.set_alpn_protocols(["h2", "http/1.1"])
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            cipher = tls.cipher()
            assert cipher is not None
            return str(tls.version()), cipher[0], tls.selected_alpn_protocol()


@pytest.fixture
def tls13_only(tmp_path: Path) -> Iterator[Served]:
    served = Served(tmp_path, "1.3", [])
    yield served
    served.listener.close()


def test_a_minimum_version_refuses_older_clients_and_alpn_offers_http11_only(tls13_only: Served) -> None:
    version, _, protocol = tls13_only.connect()
    assert (version, protocol) == ("TLSv1.3", "http/1.1"), "h2 is never chosen"
    with pytest.raises(ssl.SSLError):
        tls13_only.connect(maximum=ssl.TLSVersion.TLSv1_2)


def test_the_cipher_suites_are_the_only_ones_tls12_negotiates(tmp_path: Path) -> None:
    served = Served(tmp_path, "1.2", ["TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"])
    try:
        version, cipher, _ = served.connect(maximum=ssl.TLSVersion.TLSv1_2)
    finally:
        served.listener.close()
    assert (version, cipher) == ("TLSv1.2", "ECDHE-ECDSA-CHACHA20-POLY1305")


def test_versions_openssl_here_refuses_are_refused() -> None:
    for version in ("1.0", "1.1"):
        with pytest.raises(ValidationError, match=r"serves 1\.2 and 1\.3 only"):
            Configuration.model_validate({"tls": {"minVersion": version}})
