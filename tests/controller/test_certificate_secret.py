"""The operator's own webhook certificate: what the Secret should hold (``tls_certificates.renewed``), and one
Secret shared by replicas against the stand-in (``certificate.SelfManagedCertificate``). The same
through the real API server, with the chart's objects: tests/chart/test_webhook_certificate.py."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.sandbox import local_apiserver

from trainer.controller import tls_certificates
from trainer.controller.certificate_secret import SelfManagedCertificate
from trainer.controller.client import ApiClient
from trainer.controller.config import CertManagement, Configuration
from trainer.controller.credentials import Credentials

T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
HOSTS = ["svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local", "127.0.0.1"]
LIFETIMES = {"ca_validity": dt.timedelta(days=30), "cert_validity": dt.timedelta(days=9)}


def renewed(
    data: dict[str, bytes] | None, now: dt.datetime, hosts: list[str] = HOSTS
) -> dict[str, bytes] | None:
    return tls_certificates.renewed(data, hosts=hosts, ca_name="svc-webhook-ca", now=now, **LIFETIMES)


def bundle(data: dict[str, bytes]) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(data[tls_certificates.CA_CERT])


def serving(data: dict[str, bytes]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data[tls_certificates.TLS_CERT])


def test_a_new_certificate_names_every_host_and_is_signed_by_its_ca() -> None:
    data = renewed(None, T0)
    assert data is not None and sorted(data) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    (ca,) = bundle(data)
    cert = serving(data)
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) | {
        str(a) for a in san.get_values_for_type(x509.IPAddress)
    } == set(HOSTS)
    assert renewed(data, T0) is None, "nothing to do while it is young"


def test_the_serving_certificate_is_renewed_from_the_same_ca_when_a_third_is_left() -> None:
    data = renewed(None, T0)
    assert data is not None
    assert renewed(data, T0 + dt.timedelta(days=5)) is None  # 9 days (+ backdating): due after 6
    later = renewed(data, T0 + dt.timedelta(days=6, hours=12))
    assert later is not None
    assert (
        later[tls_certificates.CA_CERT] == data[tls_certificates.CA_CERT]
        and later[tls_certificates.CA_KEY] == data[tls_certificates.CA_KEY]
    )
    assert later[tls_certificates.TLS_CERT] != data[tls_certificates.TLS_CERT]
    serving(later).verify_directly_issued_by(bundle(data)[0])


def test_a_renewed_ca_keeps_the_old_one_in_the_bundle_until_it_expires() -> None:
    data = renewed(None, T0)
    assert data is not None
    old_ca = bundle(data)[0]
    rotated = renewed(data, T0 + dt.timedelta(days=21))  # the CA (30 days) is due after 20
    assert rotated is not None
    new_ca, kept = bundle(rotated)
    assert kept == old_ca and new_ca != old_ca
    serving(rotated).verify_directly_issued_by(new_ca)
    # Once the old CA has expired, it leaves the bundle (and nothing else changes unless due).
    pruned = renewed(rotated, T0 + dt.timedelta(days=30, hours=1))
    assert pruned is not None and bundle(pruned) == [new_ca]


def test_a_serving_certificate_never_outlives_its_ca() -> None:
    data = renewed(None, T0)
    assert data is not None
    near_end = renewed(data, T0 + dt.timedelta(days=19, hours=23), hosts=[*HOSTS, "new.example"])
    assert near_end is not None
    assert serving(near_end).not_valid_after_utc <= bundle(near_end)[0].not_valid_after_utc


@pytest.mark.parametrize(
    "damage",
    [
        {tls_certificates.TLS_CERT: b"junk"},
        {tls_certificates.CA_KEY: b""},
        {tls_certificates.TLS_KEY: None},  # missing
    ],
)
def test_anything_unreadable_starts_again_from_a_new_ca(damage: dict[str, bytes | None]) -> None:
    data = renewed(None, T0)
    assert data is not None
    broken = {k: v for k, v in {**data, **damage}.items() if v is not None}
    again = renewed(broken, T0)
    assert again is not None and bundle(again)[0] != bundle(data)[0]


def test_a_certificate_from_another_ca_or_for_other_hosts_is_replaced() -> None:
    data = renewed(None, T0)
    other = renewed(None, T0)
    assert data is not None and other is not None
    mixed = {
        **data,
        tls_certificates.TLS_CERT: other[tls_certificates.TLS_CERT],
        tls_certificates.TLS_KEY: other[tls_certificates.TLS_KEY],
    }
    fixed = renewed(mixed, T0)
    assert fixed is not None and fixed[tls_certificates.CA_CERT] == data[tls_certificates.CA_CERT]
    serving(fixed).verify_directly_issued_by(bundle(data)[0])
    moved = renewed(data, T0, hosts=["elsewhere.svc"])
    assert moved is not None and moved[tls_certificates.CA_CERT] == data[tls_certificates.CA_CERT]


def test_configuration_refuses_two_sources_and_bad_durations() -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        Configuration.model_validate(
            {"certManagement": {"enable": True}, "webhook": {"manageConfiguration": True}}
        )
    with pytest.raises(ValueError, match="duration"):
        CertManagement.model_validate({"certValidity": "0s"})
    parsed = CertManagement.model_validate({"enable": True, "checkInterval": "500ms"})
    assert parsed.check_interval_seconds == 0.5 and parsed.ca_validity_seconds == 87600 * 3600


# --- one Secret, several replicas (against the stand-in) ----------------------------------------------

NAMESPACE = "kubeflow-system"
SECRET = "kubeflow-trainer-webhook-cert"
SETTINGS = CertManagement.model_validate(
    {
        "enable": True,
        "webhookServiceName": "svc",
        "webhookSecretName": SECRET,
        "webhookSecretNamespace": NAMESPACE,
    }
)
WEBHOOKS = {
    "ValidatingWebhookConfiguration": "validator.trainer.kubeflow.org",
    "MutatingWebhookConfiguration": "defaulter.trainer.kubeflow.org",
}


@pytest.fixture
def server() -> Iterator[LocalAPIServer]:
    api = local_apiserver().start()
    try:
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        # As the chart renders them: the Secret empty, the configurations without a caBundle.
        api.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": SECRET, "namespace": NAMESPACE},
                "type": "Opaque",
            }
        )
        for kind, name in WEBHOOKS.items():
            hook: dict[str, Any] = {
                "name": f"{name.split('.')[0]}.trainjob.trainer.kubeflow.org",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "clientConfig": {"url": "https://127.0.0.1:1/nowhere"},
                "rules": [],
            }
            api.create(
                {
                    "apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": kind,
                    "metadata": {"name": name},
                    "webhooks": [hook, {**hook, "name": "second." + hook["name"]}],
                }
            )
        yield api
    finally:
        api.stop()


def ca_bundles(server: LocalAPIServer) -> set[str | None]:
    return {
        hook["clientConfig"].get("caBundle")
        for kind, name in WEBHOOKS.items()
        for hook in server.get("admissionregistration.k8s.io/v1", kind, name)["webhooks"]
    }


def secret(server: LocalAPIServer) -> dict[str, str]:
    data: dict[str, str] = server.get("v1", "Secret", SECRET, NAMESPACE).get("data") or {}
    return data


async def replicas(
    server: LocalAPIServer, tmp_path: Path, leaders: list[bool], now: Any = None
) -> list[SelfManagedCertificate]:
    credentials = Credentials.of(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    await credentials.current()
    out = []
    for i, lead in enumerate(leaders):
        extra = {"now": now} if now is not None else {}
        out.append(
            SelfManagedCertificate(
                ApiClient.from_credentials(credentials, qps=100, burst=100),
                SETTINGS,
                NAMESPACE,
                tmp_path / f"replica-{i}",
                advertise_host="127.0.0.1",
                leading=lambda lead=lead: lead,
                **extra,
            )
        )
    return out


def test_replicas_racing_to_fill_the_empty_secret_serve_the_one_that_won(
    server: LocalAPIServer, tmp_path: Path
) -> None:
    async def main() -> list[SelfManagedCertificate]:
        managers = await replicas(server, tmp_path, [False, False, False])
        await asyncio.gather(*(m.sync() for m in managers))
        for m in managers:
            await m.client.close()
        return managers

    managers = asyncio.run(main())
    data = secret(server)
    assert sum(m.rotations for m in managers) == 1, "one write won; the others took it"
    for m in managers:
        assert (m.cert_dir / "tls.crt").read_bytes() == base64.b64decode(data["tls.crt"])
        assert (m.cert_dir / "tls.key").read_bytes() == base64.b64decode(data["tls.key"])
    assert ca_bundles(server) == {data["ca.crt"]}, "trusted: the losers wrote the winner's CA last"


def test_only_the_leader_renews_and_puts_a_blanked_ca_bundle_back(
    server: LocalAPIServer, tmp_path: Path
) -> None:
    clock = [dt.datetime.now(dt.UTC)]

    async def main() -> None:
        follower, leader = await replicas(server, tmp_path, [False, True], now=lambda: clock[0])
        await follower.sync()  # fills the empty Secret
        first = secret(server)
        assert ca_bundles(server) == {first["ca.crt"]}
        # A GitOps sync blanks the caBundle: the follower leaves it, the leader puts it back.
        for kind, name in WEBHOOKS.items():
            live = server.get("admissionregistration.k8s.io/v1", kind, name)
            for hook in live["webhooks"]:
                del hook["clientConfig"]["caBundle"]
            server.patch("admissionregistration.k8s.io/v1", kind, name, {"webhooks": live["webhooks"]})
        await follower.sync()
        assert ca_bundles(server) == {None}
        await leader.sync()
        assert ca_bundles(server) == {first["ca.crt"]}
        assert secret(server) == first, "restoring the caBundle renews nothing"
        # A year on, the serving certificate is due: the follower waits, the leader renews it.
        clock[0] += dt.timedelta(days=300)
        await follower.sync()
        assert secret(server) == first
        await leader.sync()
        renewed_data = secret(server)
        assert renewed_data["tls.crt"] != first["tls.crt"] and renewed_data["ca.crt"] == first["ca.crt"]
        await follower.sync()  # every replica serves the new one
        assert (follower.cert_dir / "tls.crt").read_bytes() == base64.b64decode(renewed_data["tls.crt"])
        for m in (follower, leader):
            await m.client.close()

    asyncio.run(main())
