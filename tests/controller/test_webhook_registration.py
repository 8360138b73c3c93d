"""Whether `trainer run` writes its own webhook configurations, what it writes, and where it binds.

The decision (``webhook_server.plan``) and the objects (``webhook_server.configurations``) are
pure; writing, replacing and removing them (``webhook_server.Registration``) run against the
stand-in here. A whole `trainer run` on both control planes, killed and restarted:
tests/operator/test_webhook_registration_e2e.py.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kopf
import pytest
from cryptography import x509
from kopf._cogs.structs import references
from kopf._core.engines import admission
from kopf._core.intents import causes
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.sandbox import local_apiserver

from trainer.controller import credentials as credentials_module
from trainer.controller import webhook_server
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.config import Configuration, Webhook
from trainer.controller.credentials import Credentials
from trainer.controller.operator import Operator, running_in_cluster
from trainer.controller.resources import validated
from trainer.controller.webhook_server import (
    CONFIGURATION_NAME,
    DELETE_COMMAND,
    Registrar,
    Registration,
    configurations,
    on_this_machine,
    plan,
)

URL = "https://127.0.0.1:9443"
CA = "Y2E="
LOCAL = "https://127.0.0.1:6443"
REMOTE = "https://203.0.113.7:6443"


# --- what is written -------------------------------------------------------------------------------


def test_the_configurations_are_what_kopfs_manager_wrote_for_the_operators_handlers() -> None:
    """Each webhook's URL ends with the id kopf routes by: the operator's handlers, as registered
    (controller/webhooks.py), built by kopf's own function for the same URL and caBundle."""
    registry = Operator(config=Configuration()).registry()
    handlers = list(registry._webhooks.get_all_handlers())
    resources = [
        references.Resource(
            group=r.type.group, version=r.type.version, plural=r.type.plural, namespaced=r.type.namespaced
        )
        for r in validated()
    ]
    written = dict(((rtype.plural, obj["kind"]), obj) for rtype, obj in configurations(URL, CA))
    for reason, kind in (
        (causes.WebhookType.VALIDATING, "ValidatingWebhookConfiguration"),
        (causes.WebhookType.MUTATING, "MutatingWebhookConfiguration"),
    ):
        kopfs = admission.build_webhooks(
            [h for h in handlers if h.reason == reason],
            resources=resources,
            name_suffix=CONFIGURATION_NAME,
            client_config=kopf.WebhookClientConfig(url=URL, caBundle=CA),
        )
        ours = next(obj for (_, k), obj in written.items() if k == kind)
        assert ours["metadata"] == {
            "name": "trainer.kubeflow.org",
            "labels": {"app.kubernetes.io/managed-by": "trainer-run"},
        }
        assert ours["webhooks"] == [{k: v for k, v in w.items() if v is not None} for w in kopfs]
        assert {w["failurePolicy"] for w in ours["webhooks"]} == {"Fail"}
    assert "-l app.kubernetes.io/managed-by=trainer-run" in DELETE_COMMAND


# --- whether it is written -------------------------------------------------------------------------


def decide(
    webhook: dict[str, Any], *, in_cluster: bool = False, local: bool = True, cert_management: bool = False
) -> Any:
    return plan(
        Webhook.model_validate(webhook),
        cert_management=cert_management,
        in_cluster=in_cluster,
        api_server=LOCAL if local else REMOTE,
        api_server_local=local,
    )


def test_unset_outside_a_cluster_registers_and_checks_when_the_api_server_is_on_this_machine() -> None:
    assert Configuration().webhook.manage_configuration is None
    assert (decide({}).register, decide({}).check) == (True, True)
    # An address named for the API server to call: registered, and checked.
    named = decide({"advertiseHost": "10.0.0.5"}, local=False)
    assert (named.register, named.check) == (True, True)


def test_unset_with_a_remote_api_server_says_why_and_how_with_a_warning() -> None:
    remote = decide({}, local=False)
    assert not remote.register and remote.warn
    assert f"the API server ({REMOTE}) is not on this machine" in remote.why
    assert "webhook.host" in remote.why and "webhook.advertiseHost" in remote.why


@pytest.mark.parametrize(
    ("webhook", "place", "because"),
    [
        ({}, {"in_cluster": True}, "in a cluster they are the chart's"),
        ({}, {"cert_management": True}, "certManagement"),
        ({"certDir": "/certs"}, {}, "webhook.certDir is set"),
        ({"manageConfiguration": False}, {}, "webhook.manageConfiguration is false"),
        ({"enabled": False}, {}, "webhook.enabled is false"),
    ],
)
def test_unset_elsewhere_and_false_never_register(
    webhook: dict[str, Any], place: dict[str, bool], because: str
) -> None:
    decided = decide(webhook, **place)
    assert not decided.register and not decided.warn
    assert because in decided.why


def test_true_registers_unchecked_wherever_it_runs() -> None:
    for place in ({}, {"in_cluster": True}, {"local": False}):
        decided = decide({"manageConfiguration": True}, **place)
        assert (decided.register, decided.check) == (True, False)


def test_manage_configuration_and_cert_management_still_exclude_each_other() -> None:
    with pytest.raises(
        ValueError, match=r"certManagement\.enable and webhook\.manageConfiguration exclude each other"
    ):
        Configuration.model_validate(
            {"certManagement": {"enable": True}, "webhook": {"manageConfiguration": True}}
        )
    for unset_or_false in ({}, {"manageConfiguration": False}):
        Configuration.model_validate({"certManagement": {"enable": True}, "webhook": unset_or_false})


def test_the_api_server_is_on_this_machine_when_its_address_is_loopback_or_ours() -> None:
    async def check(server: str) -> bool:
        return await on_this_machine(server)

    assert asyncio.run(check("https://127.0.0.1:6443"))
    assert asyncio.run(check("https://localhost:6443"))
    assert not asyncio.run(check("https://192.0.2.1:6443"))  # TEST-NET-1: never an address of ours
    assert not asyncio.run(check("https://no-such-host.invalid:6443"))
    assert not asyncio.run(check("not a URL"))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        try:
            udp.connect(("192.0.2.1", 9))  # no packet is sent: the route picks this machine's address
        except OSError:
            return
        own = udp.getsockname()[0]
    assert asyncio.run(check(f"https://{own}:6443")), own


# --- where the servers bind ------------------------------------------------------------------------


def test_outside_a_cluster_unset_addresses_bind_loopback_and_set_ones_are_kept() -> None:
    unset = Configuration()
    assert unset.webhook.listen_host(in_cluster=False) == "127.0.0.1"
    assert unset.status_server.listen_host(in_cluster=False) == "127.0.0.1"
    assert unset.metrics.listen_address(in_cluster=False) == ("127.0.0.1", 8443)
    # In a pod, upstream's defaults: every interface.
    assert unset.webhook.listen_host(in_cluster=True) == "0.0.0.0"
    assert unset.status_server.listen_host(in_cluster=True) == "0.0.0.0"
    assert unset.metrics.listen_address(in_cluster=True) == ("0.0.0.0", 8443)
    given = Configuration.model_validate(
        {"webhook": {"host": "0.0.0.0"}, "statusServer": {"host": ""}, "metrics": {"bindAddress": ":9000"}}
    )
    assert given.webhook.listen_host(in_cluster=False) == "0.0.0.0"
    assert given.status_server.listen_host(in_cluster=False) == ""
    assert given.metrics.listen_address(in_cluster=False) == ("0.0.0.0", 9000)


def test_outside_a_cluster_an_advertised_address_is_where_the_webhooks_listen() -> None:
    """The API server is told to call ``advertiseHost``: loopback would never answer it there."""
    address = Configuration.model_validate({"webhook": {"advertiseHost": "10.1.2.3"}})
    assert address.webhook.listen_host(in_cluster=False) == "10.1.2.3"
    name = Configuration.model_validate({"webhook": {"advertiseHost": "operator.example"}})
    assert name.webhook.listen_host(in_cluster=False) == "0.0.0.0"
    both = Configuration.model_validate({"webhook": {"advertiseHost": "10.1.2.3", "host": "127.0.0.1"}})
    assert both.webhook.listen_host(in_cluster=False) == "127.0.0.1", "a host the file gives is kept"


def test_the_webhook_server_binds_by_placement_and_kopfs_own_manager_stays_off() -> None:
    for in_cluster, host in ((False, "127.0.0.1"), (True, "0.0.0.0")):
        settings = kopf.OperatorSettings()
        operator = Operator(config=Configuration(), in_cluster=in_cluster)
        operator.configure(settings)
        assert operator.webhook_server is not None and operator.webhook_server.host == host
        assert settings.admission.managed is None
        operator.tls.self_signed.cleanup()  # type: ignore[union-attr]


def test_in_a_cluster_means_a_service_account_and_no_kubeconfig_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(credentials_module, "SERVICE_ACCOUNT", tmp_path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert not running_in_cluster(None)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert not running_in_cluster(None), "no token: not a pod"
    (tmp_path / "token").write_text("t")
    assert running_in_cluster(None)
    assert not running_in_cluster(str(tmp_path / "kubeconfig")), "an explicit kubeconfig wins, as at login"


# --- written, replaced, removed (the stand-in) -----------------------------------------------------


@pytest.fixture
def server() -> Iterator[LocalAPIServer]:
    api = local_apiserver().start()
    try:
        yield api
    finally:
        api.stop()


def written(server: LocalAPIServer) -> dict[str, set[str]]:
    """Each configuration of ours there, with the URLs its webhooks call."""
    out: dict[str, set[str]] = {}
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        for item in server.list("admissionregistration.k8s.io/v1", kind):
            if item["metadata"]["name"] == CONFIGURATION_NAME:
                out[kind] = {w["clientConfig"]["url"].rpartition("/")[0] for w in item["webhooks"]}
    return out


def test_a_later_run_replaces_them_and_an_earlier_ones_exit_leaves_the_later_ones(
    server: LocalAPIServer, tmp_path: Path
) -> None:
    """Two runs against one cluster: the newer start owns the configurations; the older one's
    clean exit must not remove what the newer one serves."""
    credentials = Credentials.of(str(server.write_kubeconfig(tmp_path / "kubeconfig")))

    async def scenario() -> None:
        await credentials.current()
        client = ApiClient.from_credentials(credentials, qps=100, burst=100)
        try:
            first = Registration(client, "https://127.0.0.1:1001", CA)
            second = Registration(client, "https://127.0.0.1:1002", "b3RoZXI=")
            assert await first.register() == []
            assert await second.register() == ["https://127.0.0.1:1001"]
            both = {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
            assert written(server) == {kind: {"https://127.0.0.1:1002"} for kind in both}
            assert await first.unregister() == []
            assert written(server) == {kind: {"https://127.0.0.1:1002"} for kind in both}
            assert sorted(await second.unregister()) == sorted(both)
            assert written(server) == {}
            assert await second.unregister() == []  # gone already: nothing to do, no error
        finally:
            await client.close()

    asyncio.run(scenario())


def test_the_self_signed_certificate_names_the_address_the_api_server_is_told_to_call() -> None:
    for webhook, called in (
        ({"host": "127.0.0.5"}, "127.0.0.5"),
        ({"advertiseHost": "10.0.0.5"}, "10.0.0.5"),
    ):
        operator = Operator(config=Configuration.model_validate({"webhook": webhook}), in_cluster=False)
        operator.configure(kopf.OperatorSettings())
        assert operator.tls is not None and operator.tls.self_signed is not None
        cert = x509.load_pem_x509_certificate(Path(operator.tls.reloader.certfile).read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert called in {str(a) for a in names.get_values_for_type(x509.IPAddress)}
        operator.tls.self_signed.cleanup()


class ProbedClient:
    """An API client whose dry-run answers are scripted: each ``"call"`` is an admission that
    went through the webhooks, each ``"admit"`` one that did not, each other one a refusal."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.calls = 0

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        assert (method, path) == ("POST", "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes")
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer == "call":
            self.calls += 1
        elif answer != "admit":
            raise ApiError(500, {"reason": "InternalError", "message": answer})
        return {}


STALE = (
    'failed calling webhook "defaulter.clustertrainingruntime.trainer.kubeflow.org": x509: unknown authority'
)


@pytest.mark.parametrize(
    ("answers", "reached"),
    [
        # The API server still applies the killed run's configurations, then ours.
        ([STALE, STALE, "call"], True),
        # Not applied yet, then applied.
        (["admit", "call"], True),
        # Never reached: believed once the window is over.
        ([STALE], False),
        # Never applied: left as written, unchecked.
        (["admit"], None),
        # The probe itself refused (RBAC): unchecked.
        (["forbidden"], None),
    ],
)
def test_the_probe_believes_a_webhook_not_called_only_after_its_window(
    answers: list[str], reached: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook_server, "PROBE_INTERVAL", 0.01)
    client = ProbedClient(answers)
    registration = Registration(cast(ApiClient, client), URL, CA)
    outcome = asyncio.run(registration.probe(lambda: client.calls, window=0.2))
    assert outcome.reached is reached, outcome
    if reached is False:
        assert "x509: unknown authority" in outcome.detail


def test_a_registration_written_in_part_is_taken_back(server: LocalAPIServer, tmp_path: Path) -> None:
    """The validating configuration written, the mutating one refused: the run serves without
    webhooks and says so, so the one written must not stay live, unchecked, with failurePolicy
    Fail (nor, after exit, call a closed port)."""
    credentials = Credentials.of(str(server.write_kubeconfig(tmp_path / "kubeconfig")))

    async def scenario() -> None:
        await credentials.current()
        client = ApiClient.from_credentials(credentials, qps=100, burst=100)
        real = client.request

        async def refuse_mutating(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            if method == "POST" and path.endswith("/mutatingwebhookconfigurations"):
                raise ApiError(500, {"reason": "InternalError", "message": "etcd is unhappy"})
            return await real(method, path, *args, **kwargs)

        client.request = refuse_mutating  # type: ignore[method-assign]
        registrar = Registrar(Webhook(), cert_management=False)
        await registrar.decide(server.url, in_cluster=False, client=lambda: client)
        assert registrar.plan is not None and registrar.plan.register and registrar.plan.check
        await registrar.serving(URL, CA, lambda: 0)
        assert written(server) == {}, "the validating configuration written first is gone again"
        assert registrar.registration is None

    asyncio.run(scenario())
