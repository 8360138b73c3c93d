"""The certificates and keys of a loopback control plane, made fresh for every ``up``.

Every component authenticates with a client certificate signed by one CA, so the API server's
audit log names each writer the way a real cluster would (the JobSet controller under its
in-cluster service-account name, the controller manager's controllers under theirs through
``--use-service-account-credentials``). ECDSA P-256 keys keep generation to milliseconds; the
service-account key is RSA because RS256 is what token signers and verifiers expect by default.
Private keys are written 0600 and never printed.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Service CIDR of the cluster: the API server's serving certificate carries its first address, the
# ClusterIP of the `kubernetes` Service.
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)

# Who each client is. kwok and JobSet are bound to cluster-admin by a ClusterRoleBinding (see
# install.py) rather than put in system:masters, so RBAC is in the path of every request they make.
ADMIN_USER = "kubernetes-admin"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
SCHEDULER_USER = "system:kube-scheduler"
KWOK_USER = "kwok-controller"
JOBSET_USER = "system:serviceaccount:jobset-system:jobset-controller-manager"
JOBSET_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:jobset-system")

_LOOPBACK = ipaddress.ip_address("127.0.0.1")
LOCAL_NAMES = ("localhost",)
LOCAL_IPS = (_LOOPBACK,)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its key on disk."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every file ``up`` hands to a component."""

    ca: KeyPair
    apiserver: KeyPair
    admin: KeyPair
    controller_manager: KeyPair
    scheduler: KeyPair
    kwok: KeyPair
    jobset: KeyPair
    controller_manager_serving: KeyPair
    scheduler_serving: KeyPair
    jobset_webhook: KeyPair
    # kwok's server, the kubelet endpoint of every fake node (logs), on loopback.
    kwok_serving: KeyPair
    sa_key: Path
    sa_pub: Path
    # The API server's identity to kubelets (logs, exec), and, with real nodes, each kubelet's
    # (``system:node:<name>``, which the Node authorizer admits) and kube-proxy's.
    kubelet_client: KeyPair | None = None
    kubelets: tuple[KeyPair, ...] = ()
    kube_proxy: KeyPair | None = None


def _name(cn: str, orgs: Sequence[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class _Issuer:
    """The cluster CA: signs one certificate per call, valid for a year (clusters are short-lived)."""

    @classmethod
    def load(cls, directory: Path) -> _Issuer:
        """The CA ``up`` made in ``directory``, to sign one more certificate for a running cluster."""
        issuer = cls.__new__(cls)
        issuer.directory = directory
        issuer.cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{directory / 'ca.key'} is not the EC key up writes")
        issuer.key = key
        issuer.not_before = issuer.cert.not_valid_before_utc
        issuer.not_after = issuer.cert.not_valid_after_utc
        issuer.pair = KeyPair(directory / "ca.crt", directory / "ca.key")
        return issuer

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.not_before = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        self.not_after = self.not_before + dt.timedelta(days=365)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = _name("trainer-cluster-ca")
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.not_before)
            .not_valid_after(self.not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.pair = self._write("ca", self.cert, self.key)

    def _write(
        self, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, where: Path | None = None
    ) -> KeyPair:
        where = where or self.directory
        where.mkdir(parents=True, exist_ok=True)
        cert_path = where / f"{stem}.crt"
        key_path = where / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)
        return KeyPair(cert_path, key_path)

    def issue(
        self,
        stem: str,
        cn: str,
        *,
        orgs: Sequence[str] = (),
        client: bool = False,
        dns: Sequence[str] = (),
        ips: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address] = (),
        where: Path | None = None,
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, orgs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.not_before)
            .not_valid_after(self.not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        if dns or ips:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(i) for i in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return self._write(stem, builder.sign(self.key, hashes.SHA256()), key, where)


def make_pki(
    directory: Path, sa_dir: Path, *, node_names: Sequence[str] = (), apiserver_ips: Sequence[str] = ()
) -> Pki:
    """Write a fresh CA and every certificate into ``directory``; the service-account key pair into
    ``sa_dir`` (the cluster directory itself, where tests look for ``sa.key`` to sign tokens).
    ``node_names`` are real nodes (a kubelet certificate each); ``apiserver_ips`` are addresses the
    API server serves on besides loopback."""
    ca = _Issuer(directory)
    service_ip = next(ipaddress.IPv4Network(SERVICE_CIDR).hosts())
    sa_key_path, sa_pub_path = _service_account_keys(sa_dir)
    extra_ips = tuple(ipaddress.ip_address(i) for i in apiserver_ips)
    return Pki(
        ca=ca.pair,
        apiserver=ca.issue(
            "kube-apiserver", "kube-apiserver", dns=SERVICE_NAMES, ips=(_LOOPBACK, service_ip, *extra_ips)
        ),
        admin=ca.issue("admin", ADMIN_USER, orgs=("system:masters",), client=True),
        controller_manager=ca.issue("kube-controller-manager", CONTROLLER_MANAGER_USER, client=True),
        scheduler=ca.issue("kube-scheduler", SCHEDULER_USER, client=True),
        kwok=ca.issue("kwok", KWOK_USER, client=True),
        jobset=ca.issue("jobset", JOBSET_USER, orgs=JOBSET_GROUPS, client=True),
        controller_manager_serving=ca.issue(
            "kube-controller-manager-serving", "kube-controller-manager", dns=LOCAL_NAMES, ips=LOCAL_IPS
        ),
        scheduler_serving=ca.issue(
            "kube-scheduler-serving", "kube-scheduler", dns=LOCAL_NAMES, ips=LOCAL_IPS
        ),
        # tls.crt / tls.key in a directory of their own: what controller-runtime's webhook server reads.
        jobset_webhook=ca.issue(
            "tls", "jobset-webhook", dns=LOCAL_NAMES, ips=LOCAL_IPS, where=directory / "jobset-webhook"
        ),
        kwok_serving=ca.issue("kwok-serving", "kwok", dns=LOCAL_NAMES, ips=LOCAL_IPS),
        sa_key=sa_key_path,
        sa_pub=sa_pub_path,
        kubelet_client=ca.issue(
            "kube-apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            orgs=("system:masters",),
            client=True,
        ),
        kubelets=tuple(
            ca.issue(f"kubelet-{name}", f"system:node:{name}", orgs=("system:nodes",), client=True)
            for name in node_names
        ),
        kube_proxy=ca.issue("kube-proxy", "system:kube-proxy", client=True) if node_names else None,
    )


def webhook_serving_pair(pki_dir: Path, name: str, where: Path) -> KeyPair:
    """``tls.crt`` and ``tls.key`` in ``where`` for a webhook server on loopback, signed by the
    running cluster's CA: what controller-runtime's webhook server reads from its certificate
    directory, for a controller started after ``up`` (Kueue, upstream's trainer)."""
    return _Issuer.load(pki_dir).issue("tls", name, dns=LOCAL_NAMES, ips=LOCAL_IPS, where=where)


def _service_account_keys(directory: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_path, pub_path = directory / "sa.key", directory / "sa.pub"
    _write_key(key_path, key)
    pub_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key_path, pub_path


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca: Path, client: KeyPair, user: str) -> Path:
    """A kubeconfig with everything embedded, so it still works when copied out of the directory."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "trainer-cluster", "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": _b64(client.cert), "client-key-data": _b64(client.key)},
            }
        ],
        "contexts": [{"name": "trainer-cluster", "context": {"cluster": "trainer-cluster", "user": user}}],
        "current-context": "trainer-cluster",
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    return path
