"""Upstream's ``tls`` settings (``minVersion``, ``cipherSuites``, ``nextProtos``) on every TLS
server of the operator: the webhooks, the status server and the metrics (docs/configuration.md,
"TLS").

Upstream names cipher suites as Go's ``crypto/tls`` does (the IANA names); OpenSSL, which serves
ours, names them its own way, so they are looked up here. A name Go does not know is refused when
the Configuration is read, as is one OpenSSL here cannot serve (RC4 and 3DES are gone from
OpenSSL 3's default build): upstream logs a warning and serves without it, which leaves a typo in
a hardened configuration unnoticed. As in Go, the list applies to TLS 1.2 and earlier: TLS 1.3's
suites are not configurable, so their names are accepted and change nothing.

``nextProtos`` is the ALPN list. Upstream offers only ``http/1.1`` unless told otherwise, keeping
HTTP/2 off (CVE-2023-44487, CVE-2023-39325); our servers speak HTTP/1.1 only, so ``http/1.1`` is
all they offer whatever the list says, and a list without it is refused.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence

# Go's TLS version names (upstream's enum) and what OpenSSL calls them.
VERSIONS: dict[str, ssl.TLSVersion] = {
    "1.0": ssl.TLSVersion.TLSv1,
    "1.1": ssl.TLSVersion.TLSv1_1,
    "1.2": ssl.TLSVersion.TLSv1_2,
    "1.3": ssl.TLSVersion.TLSv1_3,
}

# Every suite crypto/tls knows for TLS 1.0-1.2 (tls.CipherSuites and tls.InsecureCipherSuites),
# by its IANA name, with OpenSSL's name for it (`openssl ciphers -stdname` lists both).
CIPHER_SUITES: dict[str, str] = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    # Go's insecure ones: served when OpenSSL here still can.
    "TLS_RSA_WITH_RC4_128_SHA": "RC4-SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": "ECDHE-ECDSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": "ECDHE-RSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
}
# TLS 1.3's, which Go (and so upstream) does not let a configuration choose.
TLS13_SUITES = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"})
HTTP11 = "http/1.1"


def openssl_ciphers(names: Sequence[str]) -> str | None:
    """The OpenSSL cipher string for Go's suite names, None when the list sets none (empty, or
    only TLS 1.3's). Raises ValueError naming a suite Go does not know or OpenSSL cannot serve."""
    chosen: list[str] = []
    for name in names:
        if name in TLS13_SUITES:
            continue
        openssl = CIPHER_SUITES.get(name)
        if openssl is None:
            raise ValueError(
                f"{name!r}: not a cipher suite Go's crypto/tls knows (IANA names, e.g. {next(iter(CIPHER_SUITES))})"
            )
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(openssl)
        except ssl.SSLError:
            raise ValueError(
                f"{name!r}: this operator's TLS library ({ssl.OPENSSL_VERSION}) cannot serve it"
            ) from None
        chosen.append(openssl)
    return ":".join(chosen) if chosen else None


def check_next_protos(protocols: Sequence[str]) -> None:
    if protocols and HTTP11 not in protocols:
        raise ValueError(
            f"{list(protocols)}: the operator's servers speak {HTTP11} only, and the list leaves it out"
        )


def apply(context: ssl.SSLContext, min_version: str | None, cipher_suites: Sequence[str]) -> None:
    """The settings on a server's context (before it serves: a context is shared by the servers
    that use the same certificate, and renewed certificates are loaded into it in place)."""
    if min_version:
        context.minimum_version = VERSIONS[min_version]  # 1.2 or 1.3: the Configuration allows no other
    ciphers = openssl_ciphers(cipher_suites)
    if ciphers is not None:
        context.set_ciphers(ciphers)
    context.set_alpn_protocols([HTTP11])
