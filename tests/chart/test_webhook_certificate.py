"""The webhooks' certificate through the API server: the operator's own (the chart's default), and a
Secret the user provides (``webhook.existingSecret``). cert-manager is not here: render tests only.

The chart is rendered as ``helm template`` renders it (offline, twice), and what it renders for the
webhooks is applied: the ServiceAccount and its RBAC, the empty certificate Secret and the two
webhook configurations, without a caBundle. The operator runs out of cluster (``trainer run``,
its own process), so each webhook is called by URL on loopback instead of through the Service, and
is limited to the test's namespace; everything else is as rendered (``failurePolicy: Fail``). A
webhook call that succeeds proves the API server trusted the serving certificate through the
caBundle the operator wrote: a TLS failure is a "failed calling webhook" refusal instead.

Runs on the stand-in and on the real control plane (``--backend``); on the real one, the operator
acts with the chart's RBAC alone, and the API server refuses it nothing.
"""

from __future__ import annotations

import base64
import concurrent.futures
import copy
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import chart_harness as h
import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.backends import Cluster
from trainer_sandbox.operator_process import OperatorProcess

Obj = dict[str, Any]

pytestmark = pytest.mark.timeout(240)

RELEASE = "kubeflow-trainer-certs"  # its own names, so it never meets the install tests' release
WEBHOOK_API = "admissionregistration.k8s.io/v1"
WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
CONFIGURATIONS = {
    "ValidatingWebhookConfiguration": "validator.trainer.kubeflow.org",
    "MutatingWebhookConfiguration": "defaulter.trainer.kubeflow.org",
}
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
DENIED = 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request'


# --- what the chart renders, applied ----------------------------------------------------------------


def template(namespace: str) -> list[Obj]:
    """``helm template`` twice: the same manifests both times (nothing generated, nothing looked up)."""
    first = h.render_files(release=RELEASE, namespace=namespace)
    second = h.render_files(release=RELEASE, namespace=namespace)
    assert first == second, "two renders of the chart differ"
    return [
        doc
        for name, text in sorted(first.items())
        if not name.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def operator_settings(objects: list[Obj]) -> Obj:
    settings: Obj = yaml.safe_load(h.one(objects, "ConfigMap", f"{RELEASE}-config")["data"]["config.yaml"])
    return settings


def by_url(config: Obj, port: int, namespace: str, *, keep_ca_bundle: bool = False) -> Obj:
    """The rendered configuration, each webhook called at the operator's loopback port (it runs out
    of cluster) for the test's namespace only; the rest as rendered (the operator's certificate: no
    caBundle rendered)."""
    config = copy.deepcopy(config)
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        ca_bundle = hook["clientConfig"].get("caBundle")
        assert keep_ca_bundle or ca_bundle is None
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
        if ca_bundle is not None:
            hook["clientConfig"]["caBundle"] = ca_bundle
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return config


def resync(cluster: Cluster, objects: list[Obj], ports: dict[str, int]) -> set[str | None]:
    """What a GitOps tool's sync does to the configurations: the rendered webhooks replace the live
    ones, caBundle and all (a merge patch replaces the whole list). The caBundles just after it."""
    after: set[str | None] = set()
    for kind in WEBHOOK_KINDS:
        config = by_url(h.one(objects, kind), ports[kind], cluster.namespace)
        synced = cluster.patch(
            WEBHOOK_API, kind, config["metadata"]["name"], {"webhooks": config["webhooks"]}
        )
        after |= {hook["clientConfig"].get("caBundle") for hook in synced["webhooks"]}
    return after


def ca_bundles(cluster: Cluster) -> set[str | None]:
    return {
        hook["clientConfig"].get("caBundle")
        for kind in WEBHOOK_KINDS
        for config in [cluster.get(WEBHOOK_API, kind, CONFIGURATIONS[kind])]
        for hook in config["webhooks"]
    }


def secret_data(cluster: Cluster) -> dict[str, str]:
    data: dict[str, str] = (
        cluster.get("v1", "Secret", f"{RELEASE}-webhook-cert", cluster.namespace).get("data") or {}
    )
    return data


def served(port: int) -> bytes | None:
    """The certificate the webhook server presents now (DER; None while nothing listens)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw) as tls,
        ):
            return tls.getpeercert(binary_form=True)
    except OSError:
        return None


def der_of(pem_b64: str) -> bytes:
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(base64.b64decode(pem_b64))
    return cert.public_bytes(serialization.Encoding.DER)


def untrusted(der: bytes | None, bundle: str | None) -> str | None:
    """Why an API server opening a new connection would refuse this served certificate with this
    caBundle (None: it would trust it). The API server keeps its connections to a webhook open, so
    calls alone would not notice a caBundle that no longer trusts what is served."""
    import datetime as dt

    if der is None:
        return "nothing served"
    if not bundle:
        return "no caBundle"
    cert = x509.load_der_x509_certificate(der)
    now = dt.datetime.now(dt.UTC)
    if not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
        return f"served certificate outside its validity ({cert.not_valid_after_utc})"
    for ca in x509.load_pem_x509_certificates(base64.b64decode(bundle)):
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        if ca.not_valid_before_utc <= now < ca.not_valid_after_utc:
            return None
    return f"no CA in the caBundle issued the served certificate {cert.serial_number}"


def signing_ca(data: dict[str, str]) -> bytes:
    """The first certificate of the Secret's ``ca.crt`` bundle: the CA that signs now."""
    return base64.b64decode(data["ca.crt"]).split(b"-----END CERTIFICATE-----")[0]


def trainjob(namespace: str, name: str, runtime: str, **trainer: Any) -> Obj:
    return {
        "apiVersion": h.TRAINER_API,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": 1, **trainer}},
    }


def admission(cluster: Cluster, name: str) -> str:
    """The API server's answer to a TrainJob only the validating webhook refuses (no such runtime),
    after the defaulting webhook has seen it: the webhook's refusal means both calls went through."""
    try:
        cluster.create(trainjob(cluster.namespace, name, "no-such-runtime"))
    except APIError as exc:
        return str(exc)
    return "created"


def _allowed(call: Any) -> bool:
    try:
        call()
    except APIError as exc:
        if exc.code == 403:
            return False
        raise
    return True


def wait_for(what: str, check: Any, timeout: float = 30, interval: float = 0.1) -> Any:
    return h.wait_for(what, check, timeout=timeout, interval=interval)


# --- the tests -----------------------------------------------------------------------------------------


def test_rendered_twice_the_webhooks_work_with_the_operators_certificate(
    cluster: Cluster, tmp_path: Path
) -> None:
    ns = cluster.namespace
    objects = template(ns)
    settings = operator_settings(objects)
    cert_settings = settings["certManagement"]
    assert cert_settings["enable"] and cert_settings["webhookSecretNamespace"] == ns
    port = h.free_port()
    ports = dict.fromkeys(WEBHOOK_KINDS, port)
    # The ServiceAccount and exactly the chart's RBAC for it; the empty Secret; the configurations.
    for obj in objects:
        if obj["kind"] in RBAC_KINDS:
            cluster.create(obj)
    cluster.create(h.one(objects, "Secret"))
    sa = h.one(objects, "ServiceAccount")["metadata"]["name"]
    user = f"system:serviceaccount:{ns}:{sa}"
    if cluster.backend == "real":  # the authorizer sees new roles through a watch: wait for them
        real: Any = cluster
        wait_for(
            "the chart's RBAC in effect",
            lambda: _allowed(lambda: real.get("v1", "Secret", f"{RELEASE}-webhook-cert", ns, user=user)),
        )
    for kind in WEBHOOK_KINDS:
        cluster.create(by_url(h.one(objects, kind), port, ns))
    assert ca_bundles(cluster) == {None}
    mark = cluster.audit_mark()
    operator = OperatorProcess(
        cluster,
        tmp_path / "operator",
        user=user,
        namespaces=[ns],
        config={
            "webhook": {
                **settings["webhook"],
                "host": "127.0.0.1",
                "port": port,
                "advertiseHost": "127.0.0.1",  # the address the API server calls it at here
                "certDir": str(tmp_path / "operator" / "serving-certs"),
            },
            "certManagement": {**cert_settings, "checkInterval": "1s"},
            "leaderElection": settings["leaderElection"],
        },
    )
    with operator:
        # The operator filled the Secret the chart rendered empty, and wrote its CA into every webhook.
        data = wait_for(
            "the certificate in its Secret",
            lambda: secret_data(cluster).get("tls.crt") and secret_data(cluster),
        )
        assert sorted(data) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
        wait_for("the caBundle written", lambda: ca_bundles(cluster) == {data["ca.crt"]})
        assert wait_for("the served certificate", lambda: served(port) == der_of(data["tls.crt"]))
        cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"{RELEASE}-controller-manager.{ns}.svc" in names.get_values_for_type(x509.DNSName)

        # Webhook calls through the API server: a refusal by the validator, a default by the defaulter.
        assert DENIED in admission(cluster, "refused-1")
        defaulted = cluster.create(
            trainjob(ns, "defaulted", "torch-distributed", resourcesPerNode={"requests": {"cpu": 0.5}})
        )
        assert defaulted["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] == "500m"

        # The next sync applies the second render: the caBundle is gone, and the operator puts it back
        # within its check interval, with the same certificate (no new CA per sync).
        assert resync(cluster, template(ns), ports) == {None}
        wait_for("the caBundle restored", lambda: ca_bundles(cluster) == {data["ca.crt"]}, timeout=15)
        assert wait_for("a webhook call after the restore", lambda: DENIED in admission(cluster, "refused-2"))
        assert secret_data(cluster) == data
    if cluster.backend == "real":
        # The certificate's calls, each within the chart's grants by name. (kopf lists namespaces
        # when given some with -n, as here; the chart runs the operator with --all-namespaces.)
        calls = [
            r
            for r in cluster.audit_since(mark)
            if r.user == user and r.resource in ("secrets", *(f"{k.lower()}s" for k in WEBHOOK_KINDS))
        ]
        refused = [f"{r.verb} {r.path}" for r in calls if r.status == 403]
        assert not refused, f"the chart's RBAC refused the operator: {refused}"
        on_names = {(r.resource, r.name, r.verb) for r in calls}
        assert ("secrets", f"{RELEASE}-webhook-cert", "update") in on_names  # filled the empty Secret
        assert ("validatingwebhookconfigurations", "validator.trainer.kubeflow.org", "patch") in on_names
        assert ("mutatingwebhookconfigurations", "defaulter.trainer.kubeflow.org", "patch") in on_names


def test_two_replicas_share_one_secret_and_every_rotation_keeps_the_webhooks_working(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Short lifetimes (serving 6 s, CA 14 s): the leader renews, both replicas serve each new
    certificate, the caBundle follows each CA, and no webhook call fails meanwhile."""
    ns = cluster.namespace
    objects = template(ns)
    settings = operator_settings(objects)
    ports = {
        kind: h.free_port() for kind in WEBHOOK_KINDS
    }  # validator on one replica, defaulter on the other
    cluster.create(h.one(objects, "Secret"))
    for kind in WEBHOOK_KINDS:
        cluster.create(by_url(h.one(objects, kind), ports[kind], ns))
    replicas = []
    for name, kind in zip(("a", "b"), WEBHOOK_KINDS, strict=True):
        user = f"system:serviceaccount:{ns}:trainer-{name}"  # two users: the audit log tells them apart
        replicas.append(
            OperatorProcess(
                cluster,
                tmp_path / name,
                user=user,
                namespaces=[ns],
                config={
                    "webhook": {
                        "enabled": True,
                        "host": "127.0.0.1",
                        "port": ports[kind],
                        "advertiseHost": "127.0.0.1",
                        "certDir": str(tmp_path / name / "serving-certs"),
                    },
                    "certManagement": {
                        **settings["certManagement"],
                        "certValidity": "6s",
                        "caValidity": "14s",
                        "checkInterval": "500ms",
                    },
                    # The chart's durations: one leader for the whole test on a busy machine.
                    "leaderElection": settings["leaderElection"],
                },
            )
        )
        cluster.grant(user)
    mark = cluster.audit_mark()
    # Both start at once: both find the rendered Secret empty and race to fill it.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda r: r.start(), replicas))
    try:
        leader = wait_for("a leader", lambda: next((r for r in replicas if r.leads()), None))
        lease = settings["leaderElection"]["resourceName"]
        transitions = cluster.get("coordination.k8s.io/v1", "Lease", lease, ns)["spec"].get(
            "leaseTransitions"
        )
        first = secret_data(cluster)
        assert first.get("tls.crt"), "the Secret was filled"
        seen_certs, seen_cas, failures, calls = {first["tls.crt"]}, {signing_ca(first)}, [], 0
        deadline = time.monotonic() + 22
        while time.monotonic() < deadline:
            answer = admission(cluster, f"refused-{calls}")
            calls += 1
            if DENIED not in answer:  # which round, when: a start-up race and a rotation differ
                failures.append(f"round {calls} at {22 - (deadline - time.monotonic()):.2f} s: {answer}")
            # What each replica serves now, then what the API server trusts now: trusted still.
            served_now = {kind: served(ports[kind]) for kind in WEBHOOK_KINDS}
            bundles = {
                kind: cluster.get(WEBHOOK_API, kind, CONFIGURATIONS[kind])["webhooks"][0]["clientConfig"].get(
                    "caBundle"
                )
                for kind in WEBHOOK_KINDS
            }
            for kind in WEBHOOK_KINDS:
                why = untrusted(served_now[kind], bundles[kind])
                if why is not None:
                    failures.append(f"{kind}: {why}")
            data = secret_data(cluster)
            seen_certs.add(data["tls.crt"])
            seen_cas.add(signing_ca(data))
            time.sleep(0.2)
        assert not failures, f"{len(failures)} failures in {calls} rounds: {failures[:3]}"
        assert len(seen_certs) >= 3, "the serving certificate was renewed (6 s lifetime, 22 s watched)"
        assert len(seen_cas) >= 2, "the CA was renewed (14 s lifetime)"
        # Both replicas serve what the one Secret holds now, and the webhooks trust its CA.
        data = secret_data(cluster)
        for kind in WEBHOOK_KINDS:
            wait_for(
                f"{kind}'s replica serving the current certificate",
                lambda kind=kind: served(ports[kind]) == der_of(secret_data(cluster)["tls.crt"]),
                timeout=5,
            )
        wait_for(
            "the caBundle of the current CA", lambda: ca_bundles(cluster) == {secret_data(cluster)["ca.crt"]}
        )
        assert all(r.alive() for r in replicas)
        assert leader.leads(), "the leader stayed the leader"
        after = cluster.get("coordination.k8s.io/v1", "Lease", lease, ns)["spec"].get("leaseTransitions")
        assert after == transitions, "the Lease changed hands during the test"
        stopping = time.time()  # then the follower takes the Lease over, and may renew in turn
    finally:
        for replica in replicas:
            replica.stop()
    secret = f"{RELEASE}-webhook-cert"
    writes = [
        r
        for r in cluster.audit_since(mark)
        if r.resource == "secrets"
        and r.name == secret
        and r.verb == "update"
        and 200 <= r.status < 300
        and r.time < stopping
    ]
    # One fill of the empty Secret (whoever won), then renewals by the leader only.
    assert writes and all(r.user == leader.user for r in writes[1:]), (
        leader.user,
        [(r.user.rsplit(":", 1)[-1], r.status, round(r.time - writes[0].time, 1)) for r in writes],
    )
    assert not [
        r
        for r in cluster.audit_since(mark)
        if r.resource == "secrets" and r.verb == "create" and r.name == secret
    ]


def test_an_existing_secret_is_served_with_the_ca_bundle_given_and_reloaded_when_renewed(
    cluster: Cluster, tmp_path: Path
) -> None:
    """``webhook.existingSecret``: the user's Secret, mounted (here: its files, as the kubelet writes
    them), and the caBundle given in the values; a renewed pair is served without a restart."""
    import datetime as dt

    from trainer.controller import tls_certificates

    ns = cluster.namespace
    service = f"{RELEASE}-controller-manager"
    now = dt.datetime.now(dt.UTC)
    ca_pem, ca_key = tls_certificates.new_ca("corp-ca", dt.timedelta(days=30), now)
    hosts = tls_certificates.service_hosts(service, ns, "127.0.0.1")
    tls_crt, tls_key = tls_certificates.new_serving(ca_pem, ca_key, hosts, dt.timedelta(days=3), now)
    values = {
        "webhook": {
            "existingSecret": {"name": "corp-webhook-tls", "caBundle": base64.b64encode(ca_pem).decode()}
        }
    }
    first = h.render_files(values, release=RELEASE, namespace=ns)
    assert first == h.render_files(values, release=RELEASE, namespace=ns)
    objects = [
        doc
        for name, text in sorted(first.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    settings = operator_settings(objects)
    assert not settings["certManagement"]["enable"]
    pod = h.one(objects, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "webhook-cert")
    assert volume["secret"]["secretName"] == "corp-webhook-tls"
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "corp-webhook-tls", "namespace": ns},
            "type": "kubernetes.io/tls",
            "data": {
                "tls.crt": base64.b64encode(tls_crt).decode(),
                "tls.key": base64.b64encode(tls_key).decode(),
            },
        }
    )
    mounted = tmp_path / "webhook-certs"  # what the kubelet writes where the Deployment mounts it
    mounted.mkdir()
    (mounted / "tls.crt").write_bytes(tls_crt)
    (mounted / "tls.key").write_bytes(tls_key)
    port = h.free_port()
    for kind in WEBHOOK_KINDS:
        config = by_url(h.one(objects, kind), port, ns, keep_ca_bundle=True)
        assert {hook["clientConfig"]["caBundle"] for hook in config["webhooks"]} == {
            values["webhook"]["existingSecret"]["caBundle"]
        }
        cluster.create(config)
    user = f"system:serviceaccount:{ns}:trainer-existing-secret"
    cluster.grant(user)
    operator = OperatorProcess(
        cluster,
        tmp_path / "operator",
        user=user,
        namespaces=[ns],
        config={
            "webhook": {**settings["webhook"], "host": "127.0.0.1", "port": port, "certDir": str(mounted)},
            "certManagement": settings["certManagement"],
        },
    )
    with operator:
        assert wait_for(
            "the user's certificate served",
            lambda: served(port) == der_of(base64.b64encode(tls_crt).decode()),
        )
        assert DENIED in admission(cluster, "refused-1")
        # The user renews the pair (same CA); the kubelet swaps the files: served within the
        # reloader's interval (30 s), and the webhooks keep working meanwhile.
        renewed_crt, renewed_key = tls_certificates.new_serving(
            ca_pem, ca_key, hosts, dt.timedelta(days=3), dt.datetime.now(dt.UTC)
        )
        for name, content in (("tls.key", renewed_key), ("tls.crt", renewed_crt)):
            (mounted / f".{name}").write_bytes(content)
            (mounted / f".{name}").replace(mounted / name)
        wait_for(
            "the renewed certificate served",
            lambda: served(port) == der_of(base64.b64encode(renewed_crt).decode()),
            timeout=45,
            interval=0.5,
        )
        assert DENIED in admission(cluster, "refused-2")
        assert ca_bundles(cluster) == {values["webhook"]["existingSecret"]["caBundle"]}
