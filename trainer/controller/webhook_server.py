"""The admission webhooks' HTTPS server (kopf's webhook-server contract, on a guarded port), and
the webhook configurations that call it when the operator writes them itself (below).

kopf lets an operator bring its own server (``kopf.WebhookServerProtocol``: called with kopf's
admission function, it yields the client configuration the API server is to use). Ours exists
for what kopf's own cannot be told: it refused admission requests over 1 MiB (aiohttp's
default body limit), while the API server sends objects up to ~3 MiB and an UPDATE carries two
of them; and it had no head deadline, idle timeout or connection cap (controller/serving.py).
The body limit is controller-runtime's (7 MiB), so whatever upstream's webhooks take, ours do.

The TLS context is the operator's (controller/tls_certificates.py reloads renewed files into it
in place), so a renewal never closes the port.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import kopf
from aiohttp import web

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.controller.client import ApiClient, ApiError, ResourceType
from trainer.controller.config import Webhook
from trainer.controller.resources import CLUSTER_TRAINING_RUNTIMES, OWN, Resource, validated
from trainer.controller.serving import BODY, GuardedServer, Limits

logger = logging.getLogger("trainer.webhooks")

# controller-runtime's webhook server reads up to 7 MiB: two objects at the API server's 3 MiB
# request limit, and the AdmissionReview around them.
MAX_ADMISSION_BODY = 7 << 20
LIMITS = Limits(
    max_connections=128,
    head_seconds=10.0,
    # Longer than the API server's idle timeout for webhook connections (90 s): it closes first.
    idle_seconds=120.0,
    handshake_seconds=10.0,
    # The API server gives a webhook 10 s by default for the whole call: a body slower than that
    # is no API server's.
    body_seconds=10.0,
    max_body=MAX_ADMISSION_BODY,
    max_in_flight=16,
)


# Told the URL the API server is to call, the caBundle that trusts the certificate (None for a
# certificate not found on disk) and how many admission requests have been served (a function),
# once the port listens; and awaited before it closes.
OnServing = Callable[[str, str | None, Callable[[], int]], Awaitable[None]]
OnStopping = Callable[[], Awaitable[None]]


class WebhookServer:
    """Serve kopf's admission function at ``https://<host>:<port>/<webhook id>``.

    ``on_serving`` and ``on_stopping`` are where the operator registers its webhook
    configurations and removes them (``Registrar`` below): after the port listens,
    so the API server's first call finds it open, and before it closes, so no configuration is
    left calling a closed port by a clean exit. ``calls`` counts the admission requests served:
    the proof that the API server reached the port.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        context: ssl.SSLContext,
        certfile: str,
        keyfile: str,
        advertise_host: str | None = None,
        limits: Limits = LIMITS,
        on_serving: OnServing | None = None,
        on_stopping: OnStopping | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.context = context
        self.certfile = certfile
        self.keyfile = keyfile
        self.advertise_host = advertise_host
        self.limits = limits
        self.on_serving = on_serving
        self.on_stopping = on_stopping
        self.server: GuardedServer | None = None
        self.url: str | None = None  # what the API server is to call, once listening
        self.calls = 0

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        limits = self.limits

        async def handle(request: web.Request) -> web.Response:
            self.calls += 1
            try:
                review = json.loads(request[BODY])
            except ValueError as exc:
                return web.json_response({"message": f"not JSON: {exc}"}, status=400)
            peer = request.transport.get_extra_info("peercert") if request.transport else None
            try:
                response = await fn(
                    review, webhook=request.match_info.get("id"), headers=dict(request.headers), sslpeer=peer
                )
            except Exception as exc:  # kopf's WebhookError family: a request it cannot route or read
                logger.warning("webhooks: an admission request could not be served: %s", exc)
                return web.json_response({"message": str(exc)}, status=400)
            return web.json_response(response)

        # The files exist by now (written at start-up when the operator manages its certificate);
        # renewals are loaded into the same context in place, with no restart of the port.
        self.context.load_cert_chain(self.certfile, self.keyfile)
        app = web.Application(client_max_size=limits.max_body)
        app.router.add_post("/{id:.*}", handle)
        self.server = GuardedServer(
            app, self.host, self.port, "webhook server", limits, self.context, read_body_first=True
        )
        await self.server.start()
        serving = False
        try:
            self.url = _url(self.advertise_host or _reachable(self.host), self.server.port)
            config = kopf.WebhookClientConfig(url=self.url)
            # The certificate is its own CA when self-signed (webhook.manageConfiguration); with a
            # mounted certificate the configurations are the chart's, and this goes unused.
            with contextlib.suppress(FileNotFoundError):
                config["caBundle"] = base64.b64encode(Path(self.certfile).read_bytes()).decode("ascii")
            logger.debug("webhooks: serving at %s", self.url)
            if self.on_serving is not None:
                serving = True
                await self.on_serving(self.url, config.get("caBundle"), lambda: self.calls)
            yield config
            await asyncio.Event().wait()
        finally:
            try:
                if serving and self.on_stopping is not None:
                    await self.on_stopping()
            finally:
                await self.server.stop()


def _reachable(host: str) -> str:
    """The address a local client reaches a listening address at (any-address: loopback)."""
    if not host:
        return "localhost"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.is_unspecified:
        return "127.0.0.1" if address.version == 4 else "::1"
    return host


def _url(host: str, port: int) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass
    return f"https://{host}:{port}"


# --- the configurations that call it, written by the operator itself ---------------------------
#
# In a cluster the chart ships the ValidatingWebhookConfiguration and MutatingWebhookConfiguration
# that call the operator through its Service. Outside one (README: a kubeconfig, a control plane
# on this machine) nothing would: the webhooks would be served and never called, and a TrainJob
# that sets PET_NNODES itself would be admitted, its value winning over the operator's. So there
# the operator writes both itself, named ``trainer.kubeflow.org`` (kopf's name for them, which
# earlier releases wrote) and labelled ``app.kubernetes.io/managed-by: trainer-run``, calling the
# URL it serves and trusting its self-signed certificate (docs/configuration.md, "Webhook
# configurations").

CONFIGURATION_NAME = "trainer.kubeflow.org"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "trainer-run"
DELETE_COMMAND = (
    f"kubectl delete validatingwebhookconfiguration,mutatingwebhookconfiguration -l {MANAGED_BY}={MANAGER}"
)
VALIDATING = ResourceType(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", namespaced=False
)
MUTATING = ResourceType(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", namespaced=False
)
# (the resource, its kind, the prefix of its webhooks' ids): controller/webhooks.py registers a
# validator and a defaulter for each kind of our API, as ids "<prefix>.<kind>", which kopf routes
# by the last segment of the URL's path.
CONFIGURATIONS = (
    (VALIDATING, "ValidatingWebhookConfiguration", "validator"),
    (MUTATING, "MutatingWebhookConfiguration", "defaulter"),
)
# What the API server is asked to admit, without storing it, to see that it reaches the webhooks:
# a ClusterTrainingRuntime (no namespace that might not exist) that admission takes as it is.
PROBE: Obj = {
    "apiVersion": c.API_VERSION,
    "kind": c.CLUSTER_TRAINING_RUNTIME_KIND,
    "metadata": {"name": "trainer-webhook-probe"},
    "spec": {"template": {"spec": {"replicatedJobs": []}}},
}
# How long the API server may take over one probe: its call to an address that drops packets
# would otherwise wait out the webhooks' 30 s.
PROBE_SECONDS = 10
# The API server applies configurations from a cache of its own, a moment after they are written:
# until then a probe meets the configurations there before (a killed run's, whose port is closed or
# whose certificate is not this run's), or none. So the probe is made again for this long before
# an answer that the webhooks were not called is believed.
PROBE_WINDOW = 5.0
PROBE_INTERVAL = 0.5


def webhook_ids() -> list[str]:
    """The ids of the webhooks controller/webhooks.py registers, validators first."""
    return [
        f"{prefix}.{resource.kind.lower()}"
        for _, _, prefix in CONFIGURATIONS
        for resource in _admitted(prefix)
    ]


def _admitted(prefix: str) -> tuple[Resource, ...]:
    """The kinds a configuration's webhooks admit: the validator's take OptimizationJobs too."""
    return validated() if prefix == "validator" else OWN


def configurations(url: str, ca_bundle: str | None) -> list[tuple[ResourceType, Obj]]:
    """Both configurations, calling ``url``: what kopf's own manager wrote, plus our label.

    ``failurePolicy: Fail``, upstream's and the chart's: an object the webhooks have not seen is
    never admitted. ``sideEffects: None``, so dry-run requests (kubectl's, the probe) call them too.
    """
    client_config: Obj = {"url": url}
    if ca_bundle:
        client_config["caBundle"] = ca_bundle
    out: list[tuple[ResourceType, Obj]] = []
    for rtype, kind, prefix in CONFIGURATIONS:
        webhooks = []
        for resource in _admitted(prefix):
            webhook_id = f"{prefix}.{resource.kind.lower()}"
            webhooks.append(
                {
                    "name": f"{webhook_id}.{CONFIGURATION_NAME}",
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "matchPolicy": "Equivalent",
                    "rules": [
                        {
                            "apiGroups": [resource.type.group],
                            "apiVersions": [resource.type.version],
                            "resources": [resource.type.plural],
                            "operations": ["CREATE", "UPDATE"],
                            "scope": "*",
                        }
                    ],
                    "clientConfig": {**client_config, "url": f"{url}/{webhook_id}"},
                    "timeoutSeconds": 30,
                    "admissionReviewVersions": ["v1", "v1beta1"],
                }
            )
        out.append(
            (
                rtype,
                {
                    "apiVersion": rtype.api_version,
                    "kind": kind,
                    "metadata": {"name": CONFIGURATION_NAME, "labels": {MANAGED_BY: MANAGER}},
                    "webhooks": webhooks,
                },
            )
        )
    return out


@dataclass(frozen=True)
class Plan:
    """Whether this run writes its webhook configurations (``register``), whether it then checks
    that the API server reaches them (``check``), and, when it does not write them, why and how
    to have them written (``why``); ``warn``: where a user would expect them written."""

    register: bool
    check: bool = False
    why: str = ""
    warn: bool = False


def plan(
    webhook: Webhook, *, cert_management: bool, in_cluster: bool, api_server: str, api_server_local: bool
) -> Plan:
    """What ``webhook.manageConfiguration`` means for this run.

    true: write them, unchecked (the caller says the API server reaches the address). false: never.
    Unset: outside a cluster, with the certificate the operator makes itself (the caBundle is
    then known), when the API server can reach the address: it runs on this machine (its address
    is loopback or one of this machine's, so it reaches this machine's loopback), or
    ``advertiseHost`` names the address it calls; checked once written (:meth:`Registration.probe`).
    """
    if not webhook.enabled:
        return Plan(False, why="webhook.enabled is false")
    if webhook.manage_configuration is True:
        return Plan(True)
    how = "webhook.manageConfiguration: true has the operator write them"
    if webhook.manage_configuration is False:
        return Plan(False, why=f"webhook.manageConfiguration is false: they are the chart's or yours ({how})")
    if in_cluster:
        return Plan(False, why=f"in a cluster they are the chart's ({how}, calling webhook.advertiseHost)")
    if cert_management:
        return Plan(
            False,
            why="with certManagement.enable the operator writes only the caBundle of the configurations "
            "certManagement names",
        )
    if webhook.cert_dir:
        return Plan(
            False, why=f"webhook.certDir is set: they are yours to write ({how}, trusting its tls.crt)"
        )
    if not api_server_local and not webhook.advertise_host:
        return Plan(
            False,
            why=f"the API server ({api_server}) is not on this machine, so it cannot call this address; "
            "serve where it can (webhook.host) and name that address in webhook.advertiseHost to have "
            "them written and checked",
            warn=True,
        )
    return Plan(True, check=True)


async def on_this_machine(server: str) -> bool:
    """Whether the API server at ``server`` (a URL) runs on this machine: its host resolves to a
    loopback address, or to one this machine can bind (one of its interfaces')."""
    host = urlsplit(server).hostname
    if not host:
        return False
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, sockaddr in found:
        address = str(sockaddr[0]).partition("%")[0]
        with contextlib.suppress(ValueError):
            if ipaddress.ip_address(address).is_loopback:
                return True
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((sockaddr[0], 0))
        except OSError:
            continue
        return True
    return False


@dataclass(frozen=True)
class Outcome:
    """What the probe showed: ``reached`` True (the server was called), False (the API server
    could not call it), None (it could not tell: the probe itself was refused); ``detail``: why."""

    reached: bool | None
    detail: str = ""


class Registration:
    """This run's two configurations, calling ``url``: written, checked, removed."""

    def __init__(self, client: ApiClient, url: str, ca_bundle: str | None) -> None:
        self.client = client
        self.url = url
        self.ca_bundle = ca_bundle
        self.objects = configurations(url, ca_bundle)

    async def register(self) -> list[str]:
        """Write both, replacing configurations of that name already there (one a killed run left
        calls a port nothing answers, and its failurePolicy refuses every TrainJob write until
        then). Returns the URLs the replaced ones called."""
        replaced: list[str] = []
        for rtype, obj in self.objects:
            try:
                await self.client.request("POST", rtype.path(None), obj)
                continue
            except ApiError as exc:
                if exc.code != 409:
                    raise
            for _ in range(3):  # each replacement carries the version read: a write between is seen
                found = await self.client.request("GET", rtype.path(None, CONFIGURATION_NAME))
                body = {
                    **obj,
                    "metadata": {**obj["metadata"], "resourceVersion": found["metadata"]["resourceVersion"]},
                }
                try:
                    await self.client.request("PUT", rtype.path(None, CONFIGURATION_NAME), body)
                except ApiError as exc:
                    if exc.code != 409:
                        raise
                    continue
                replaced.extend(url for url in _urls(found) if url not in replaced)
                break
            else:
                raise ApiError(409, {"reason": "Conflict", "message": f"{CONFIGURATION_NAME} kept changing"})
        return replaced

    async def probe(self, calls: Callable[[], int], window: float = PROBE_WINDOW) -> Outcome:
        """Ask the API server to admit :data:`PROBE` without storing it (``dryRun``), and see
        whether the server was called meanwhile (``calls``, the admission requests it served);
        again, for ``window`` seconds, while the answer is that it was not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + window
        while True:
            outcome = await self._probe_once(calls)
            if outcome.reached is not False or loop.time() >= deadline:
                break
            await asyncio.sleep(PROBE_INTERVAL)
        if outcome.reached is False and "failed calling webhook" not in outcome.detail:
            # Admitted, and never through them: the API server has not applied them (yet). They
            # are left as written: they refuse nothing they are not applied to.
            return Outcome(None, f"{outcome.detail} within {window:g} s")
        return outcome

    async def _probe_once(self, calls: Callable[[], int]) -> Outcome:
        before = calls()
        params = {"dryRun": "All", "timeout": f"{PROBE_SECONDS}s"}
        try:
            await self.client.request("POST", CLUSTER_TRAINING_RUNTIMES.type.path(None), PROBE, params=params)
        except ApiError as exc:
            if calls() > before:
                return Outcome(True)
            message = str(exc.status.get("message") or exc)
            if "failed calling webhook" in message:
                return Outcome(False, message)
            return Outcome(None, f"the probe was refused: {exc}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            return Outcome(None, f"the probe went unanswered: {exc or type(exc).__name__}")
        if calls() > before:
            return Outcome(True)
        return Outcome(False, "the API server admitted a dry-run ClusterTrainingRuntime without calling them")

    async def unregister(self) -> list[str]:
        """Delete both, each only while it still calls this run's URL with this run's caBundle
        (another run may have replaced it since: that one's stays). Returns what was deleted."""
        deleted: list[str] = []
        for rtype, obj in self.objects:
            try:
                found = await self.client.request("GET", rtype.path(None, CONFIGURATION_NAME))
            except ApiError as exc:
                if exc.code == 404:
                    continue
                raise
            if not self._ours(found):
                logger.info(
                    "webhooks: %s %s is left in place: another run has replaced it since (it calls %s)",
                    obj["kind"],
                    CONFIGURATION_NAME,
                    ", ".join(_urls(found)) or "nothing",
                )
                continue
            options: Obj = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "preconditions": {"resourceVersion": found["metadata"]["resourceVersion"]},
            }
            try:
                await self.client.request("DELETE", rtype.path(None, CONFIGURATION_NAME), options)
            except ApiError as exc:
                if exc.code not in (404, 409):  # gone, or replaced between the read and the delete
                    raise
                continue
            deleted.append(obj["kind"])
        return deleted

    def _ours(self, found: Obj) -> bool:
        webhooks = found.get("webhooks") or []
        return bool(webhooks) and all(
            str((w.get("clientConfig") or {}).get("url", "")).startswith(self.url + "/")
            and (w.get("clientConfig") or {}).get("caBundle") == self.ca_bundle
            for w in webhooks
        )


def _urls(found: Obj) -> list[str]:
    """The base URLs (without the webhook's id) a configuration calls."""
    urls: list[str] = []
    for webhook in found.get("webhooks") or []:
        url = str((webhook.get("clientConfig") or {}).get("url") or "").rpartition("/")[0]
        if url and url not in urls:
            urls.append(url)
    return urls


class RegistrationError(Exception):
    """``webhook.manageConfiguration: true`` and the configurations cannot be written: the
    operator stops, as it did when kopf's manager wrote them."""


# Each write, the probe and each removal may take this long; the removal at exit, all of it.
REGISTRATION_TIMEOUT = 15.0
UNREGISTER_SECONDS = 10.0


class Registrar:
    """The operator's side of its webhook configurations: at start-up it decides (:meth:`decide`,
    once the API server's address is known); when the port listens (:meth:`serving`) it writes
    them, checks them and says in one line which webhooks are live, or why none is registered;
    before the port closes (:meth:`stopping`) it removes them, within a bound, so a clean exit
    with the API server gone still ends in time (a pod's grace period, a user's Ctrl+C)."""

    def __init__(self, webhook: Webhook, *, cert_management: bool) -> None:
        self.webhook = webhook
        self.cert_management = cert_management
        self.plan: Plan | None = None
        self.registration: Registration | None = None
        self._client: Callable[[], ApiClient] | None = None

    async def decide(self, api_server: str, *, in_cluster: bool, client: Callable[[], ApiClient]) -> None:
        """``client`` makes the API client the writes go through (the operator's credentials)."""
        local = False
        if self.webhook.manage_configuration is None and not in_cluster:
            local = await on_this_machine(api_server)
        self._client = client
        self.plan = plan(
            self.webhook,
            cert_management=self.cert_management,
            in_cluster=in_cluster,
            api_server=api_server,
            api_server_local=local,
        )

    async def serving(self, url: str, ca_bundle: str | None, calls: Callable[[], int]) -> None:
        """The port listens at ``url`` (``calls``: the admission requests it has served)."""
        decided = self.plan
        if decided is None or self._client is None:
            return
        if not decided.register:
            log = logger.warning if decided.warn else logger.info
            log("webhooks: serving at %s; not registered: %s", url, decided.why)
            return
        client = self._client()
        client.retries, client.timeout = 1, REGISTRATION_TIMEOUT
        registration = self.registration = Registration(client, url, ca_bundle)
        try:
            replaced = await registration.register()
        except (ApiError, TimeoutError, aiohttp.ClientError) as exc:
            if not decided.check:
                raise RegistrationError(
                    f"webhook.manageConfiguration: {CONFIGURATION_NAME} cannot be written: {exc}"
                ) from exc
            logger.warning(
                "webhooks: serving at %s; not registered: the configurations %s cannot be written: %s",
                url,
                CONFIGURATION_NAME,
                exc,
            )
            # One of the two may have been written before the other failed: not left calling
            # this port unchecked (or a closed one after exit) with failurePolicy Fail.
            await self.stopping()
            return
        for left in replaced:
            logger.info(
                "webhooks: replaced the configurations %s an earlier run left behind, which called %s",
                CONFIGURATION_NAME,
                left,
            )
        checked = "not checked: webhook.manageConfiguration is true"
        if decided.check:
            outcome = await registration.probe(calls)
            if outcome.reached is False:
                await self.stopping()
                logger.warning(
                    "webhooks: serving at %s; not registered: the API server could not call it (%s). It "
                    "runs where this address does not reach this process (in a container or a VM?): "
                    "serve where it can (webhook.host) and name that address in webhook.advertiseHost",
                    url,
                    outcome.detail,
                )
                return
            checked = "the API server's call checked" if outcome.reached else f"not checked: {outcome.detail}"
        logger.info(
            "webhooks: live at %s: %s (ValidatingWebhookConfiguration and MutatingWebhookConfiguration "
            "%s, removed on a clean exit; %s)",
            url,
            ", ".join(webhook_ids()),
            CONFIGURATION_NAME,
            checked,
        )

    async def stopping(self) -> None:
        """Remove what :meth:`serving` wrote, so no configuration is left calling a closed port
        with ``failurePolicy: Fail``; if that fails, the log names what is left and how to remove it."""
        registration, self.registration = self.registration, None
        if registration is None:
            return
        try:
            deleted = await asyncio.wait_for(registration.unregister(), UNREGISTER_SECONDS)
        except (ApiError, TimeoutError, aiohttp.ClientError) as exc:
            logger.warning(
                "webhooks: the configurations %s calling %s could not be removed (%s): the API server "
                "refuses TrainJob and runtime writes until the next start replaces them, or until `%s`",
                CONFIGURATION_NAME,
                registration.url,
                exc or type(exc).__name__,
                DELETE_COMMAND,
            )
        else:
            if deleted:
                logger.info("webhooks: removed %s %s", " and ".join(deleted), CONFIGURATION_NAME)
        finally:
            await registration.client.close()
