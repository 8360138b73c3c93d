"""The operator process: its parts made at start-up, wired together, run by kopf, and stopped.

Each part does one thing elsewhere in this package: the watches and the cache
(``controller/informer.py``, ``controller/routing.py``), the reconciler, the admission webhooks
(``controller/webhooks.py``), the leader elector, the webhook certificate, the status server.
This module is where they meet: what is made, in what order, with which client and credentials,
and what is stopped at the end. Decisions are made by the render core (``trainer.runtime``) and
admission (``trainer.admission``); the reconciler writes the difference.

The watches are ours, so that the cache behaves like an informer through relists; kopf runs
start-up and clean-up, the login and the admission webhooks. No kopf finalizer, progress
annotation, handler result in status or kopf-posted Event is used: no state is kept on the
objects, retries and backoff are the work queue's, and Events are ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import tempfile
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import kopf
from aiohttp import web

from trainer.api import constants as c
from trainer.controller import events, tls_options
from trainer.controller.cache import Cache
from trainer.controller.certificate_secret import SelfManagedCertificate
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.config import Configuration
from trainer.controller.credentials import Credentials, CredentialsError, from_service_account
from trainer.controller.informer import Informer
from trainer.controller.leader import Elector, FencedClient, Timing, cancel_and_wait
from trainer.controller.metrics import CONTROLLER, Metrics
from trainer.controller.metrics_auth import MetricsAuth
from trainer.controller.optimization import OptimizationReconciler
from trainer.controller.reconciler import Reconciler, WorkQueue
from trainer.controller.resources import CRDS, JOBSETS, Resources
from trainer.controller.routing import Router
from trainer.controller.runtime_finalizers import RuntimeFinalizers
from trainer.controller.serving import GuardedServer, Limits
from trainer.controller.status_server import NotServing
from trainer.controller.status_server import Server as StatusServerApp
from trainer.controller.tls_certificates import CertificateReloader, write_self_signed
from trainer.controller.webhook_server import Registrar, WebhookServer
from trainer.controller.webhooks import Webhooks
from trainer.runtime import framework as fw

logger = logging.getLogger("trainer.operator")

JOBSET_CRD = JOBSETS.name
LOGIN_RETRY_SECONDS = 10  # kopf tries a failed login again after this long


class StartupError(Exception):
    """The operator cannot run in this cluster as it is (a prerequisite is missing)."""


C = TypeVar("C", bound=ApiClient)
# Requests the leader election's client may make each retry period at least: a try is a read and
# a write, and one more try fits within the period.
ELECTION_REQUESTS = 4
# The metrics server's own client, for its TokenReviews and SubjectAccessReviews: one per scraper
# a minute or so, once its verdicts are kept (controller/metrics_auth.py).
METRICS_AUTH_QPS = 5.0
METRICS_AUTH_BURST = 10
# The kubelet's probes: one request at a time, now and then.
HEALTH_LIMITS = Limits(max_connections=16, head_seconds=10.0, idle_seconds=60.0, max_body=0, max_in_flight=4)


@dataclass
class Running:
    """What exists only once start-up has passed its checks: made in one piece, or not at all.

    Code that holds one has every part of it; code that may run before start-up (or after
    clean-up) has an ``Operator.running`` that is None, and its type says so.
    """

    credentials: Credentials
    client: ApiClient
    recorder: events.Recorder
    reconciler: Reconciler
    informer: Informer
    optimizer: OptimizationReconciler | None = None  # the searches (docs/optimization.md)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # The reconcile workers: running while this replica reconciles (always, without leader election).
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    elector: Elector | None = None  # with leader election: starts and stops the workers
    certificate: SelfManagedCertificate | None = None  # with certManagement.enable
    # With the TrainJobStatus gate: the progress status server, its client, and a certificate of
    # its own when the webhooks (whose certificate it serves otherwise) are off.
    status_server: StatusServerApp | None = None
    status_client: ApiClient | None = None
    status_tls: tempfile.TemporaryDirectory[str] | None = None
    # The workers that remove upstream's leftover runtime finalizer start and stop with the others.
    runtime_finalizers: RuntimeFinalizers | None = None
    # The metrics server, the client its reviews go through (metrics.auth), and a certificate of
    # its own when the webhooks' is not there.
    metrics_server: GuardedServer | None = None
    metrics_client: ApiClient | None = None
    metrics_tls: tempfile.TemporaryDirectory[str] | None = None

    def start_workers(self, count: int, runtime_count: int = 1) -> None:
        """The TrainJob workers, and those removing upstream's runtime finalizer, which look at
        every runtime first (a replica that starts leading may find some nobody removed)."""
        if not self.workers:
            self.workers = [
                asyncio.create_task(self.reconciler.worker(), name=f"trainjob-worker-{i}")
                for i in range(count)
            ]
            if self.optimizer is not None:
                self.optimizer.started()
                self.workers.append(
                    asyncio.create_task(self.optimizer.worker(), name="optimizationjob-worker")
                )
            if self.runtime_finalizers is not None:
                self.runtime_finalizers.saw_all()
                self.workers += [
                    asyncio.create_task(
                        self.runtime_finalizers.worker(self.reconciler.client), name=f"runtime-finalizers-{i}"
                    )
                    for i in range(runtime_count)
                ]

    async def stop_workers(self) -> None:
        """Cancel the workers mid-reconcile (an in-flight request is cut) and wait until they are gone."""
        workers, self.workers = self.workers, []
        await cancel_and_wait(workers)

    async def stop(self) -> None:
        if self.elector is not None:
            await self.elector.stop()  # the workers stop first, then the Lease is released
        await self.stop_workers()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks.clear()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self.metrics_client is not None:
            await self.metrics_client.close()
        if self.metrics_tls is not None:
            self.metrics_tls.cleanup()
        if self.status_server is not None:
            await self.status_server.stop()
        if self.status_client is not None:
            await self.status_client.close()
        if self.status_tls is not None:
            self.status_tls.cleanup()
        await self.informer.close()
        await self.recorder.stop()
        if self.reconciler.client is not self.client:
            await self.reconciler.client.close()
        await self.client.close()


@dataclass
class WebhookTLS:
    """The webhook server's certificate: reloaded when it is renewed, removed if we made it."""

    reloader: CertificateReloader
    self_signed: tempfile.TemporaryDirectory[str] | None = None


@dataclass
class Operator:
    config: Configuration
    namespaces: Collection[str] = ()
    cache: Cache = field(default_factory=Cache)
    metrics: Metrics = field(default_factory=Metrics)
    # Exists from the start, so a watch event that comes before the workers is kept, not lost.
    queue: WorkQueue = field(default_factory=WorkQueue)
    framework: fw.Framework = field(init=False)
    resources: Resources = field(init=False)  # what is watched and written: the plugins' kinds
    router: Router = field(init=False)  # the watches' sink: cache fed, TrainJobs queued
    runtime_finalizers: RuntimeFinalizers = field(init=False)  # upstream's leftover, removed
    webhooks: Webhooks = field(init=False)
    serve_metrics: bool = True
    kubeconfig: str | None = None
    # Whether the operator runs in a pod (its credentials a ServiceAccount's): the servers then
    # bind every interface unless told otherwise, and it leaves its webhook configurations to the
    # chart. None: told by the credentials it will use (running_in_cluster).
    in_cluster: bool | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # Made at start-up (or at kopf's login, whichever comes first) and kept fresh for the clients.
    credentials: Credentials | None = field(default=None, init=False)
    running: Running | None = field(default=None, init=False)
    tls: WebhookTLS | None = field(default=None, init=False)  # set by configure() when webhooks are on
    webhook_server: WebhookServer | None = field(default=None, init=False)  # the same
    # Whether and how this run writes its webhook configurations (controller/webhook_server.py):
    # made with the webhook server, decided at start-up once the API server's address is known.
    registrar: Registrar | None = field(default=None, init=False)

    @property
    def placed_in_cluster(self) -> bool:
        """``in_cluster``, found out from the credentials' source the first time it is asked."""
        if self.in_cluster is None:
            self.in_cluster = running_in_cluster(self.kubeconfig)
        return self.in_cluster

    def __post_init__(self) -> None:
        plugins = self.config.plugins
        self.framework = fw.load(
            fw.PluginConfig(
                disabled=frozenset(plugins.disabled),
                allowed_external=frozenset(plugins.allowed),
                feature_gates=dict(self.config.feature_gates),
            )
        )
        self.resources = Resources.of(self.framework)
        self.router = Router(self.cache, self.queue, self.resources, self.namespaces)
        self.router.runtime_finalizers = self.runtime_finalizers = RuntimeFinalizers(self.cache)
        if "h2" in self.config.tls.next_protos:
            logger.warning(
                "tls.nextProtos: HTTP/2 is not served (the servers speak HTTP/1.1); offering http/1.1"
            )
        self.webhooks = Webhooks(self.cache, self.framework)
        self.queue.metrics = self.metrics
        self.metrics.cr_workers.labels(controller=CONTROLLER).set(self.config.controller.trainjob_workers)

    def _observed(self, client: C) -> C:
        """``client`` with its requests counted and timed in the operator's metrics."""
        client.observer = self.metrics.api_request
        return client

    # --- lifecycle ---

    async def startup(self, settings: kopf.OperatorSettings) -> None:
        settings.posting.enabled = False  # our Events only, with our reasons
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        credentials = self.credentials = self.credentials or await login(self.kubeconfig)
        connection = credentials.info
        if self.registrar is not None:  # the webhook server, started after start-up, acts on it
            await self.registrar.decide(
                connection.server,
                in_cluster=self.placed_in_cluster,
                client=lambda: self._observed(ApiClient.from_credentials(credentials, qps=5.0, burst=10)),
            )
        elif not self.config.webhook.enabled:
            logger.info(
                "webhooks: off (webhook.enabled: false): TrainJobs and runtimes are admitted without "
                "the operator's validation and defaulting"
            )
        election = self.config.leader_election
        lease_namespace = election.resource_namespace or connection.default_namespace
        if election.leader_elect and not lease_namespace:
            raise StartupError(
                "leaderElection.resourceNamespace is not set, and there is no namespace to default it "
                "to (no in-cluster ServiceAccount, no namespace in the kubeconfig context)"
            )
        budget = self.config.client_connection
        client = self._observed(ApiClient.from_credentials(credentials, qps=budget.qps, burst=budget.burst))
        informer = Informer(client, self.router.scopes(), self.router)
        try:
            await _check_prerequisites(client)
            # The start-up LIST fills the cache before any worker runs, so a restart never acts on
            # a half-known world; each watch then starts from its LIST's resourceVersion.
            await informer.list_all()
        except BaseException:
            await informer.close()
            await client.close()
            raise
        elector: Elector | None = None
        if election.leader_elect and lease_namespace:
            elector = self._elector(credentials, lease_namespace)
        certificate: SelfManagedCertificate | None = None
        if self.tls is not None and self.config.cert_management.enable:
            try:
                certificate = await self._certificate(client, connection.default_namespace, elector)
            except BaseException:
                await informer.close()
                await client.close()
                raise
        # Events get a client and budget of their own, as controller-runtime's recorder does.
        events_client = self._observed(
            ApiClient.from_credentials(credentials, qps=budget.qps, burst=budget.burst)
        )
        reconciler_client = client
        if elector is not None:
            # The reconciler and its Events write only through the fence (controller/leader.py);
            # the watches share the reconciler's budget, not its fence.
            reconciler_client = self._observed(FencedClient.behind(elector.fence, client))
            events_client = self._observed(FencedClient.behind(elector.fence, events_client))
        recorder = events.Recorder(events_client)
        if elector is None:
            recorder.start()  # with leader election, it posts while this replica leads (below)
        reconciler = Reconciler(
            reconciler_client, self.cache, self.framework, self.resources, self.metrics, recorder, self.queue
        )
        reconciler.progress.seconds = self.config.controller.progress_batch_seconds
        reconciler.progress.qps = self.config.controller.progress_qps
        self.router.deferring = reconciler.deferring
        optimizer = OptimizationReconciler(reconciler_client, self.cache, recorder, self.queue)
        self.router.optimizer = optimizer
        self.running = running = Running(
            credentials,
            client,
            recorder,
            reconciler,
            informer,
            elector=elector,
            certificate=certificate,
            runtime_finalizers=self.runtime_finalizers,
            optimizer=optimizer,
        )
        if c.FEATURE_TRAINJOB_STATUS in self.framework.enabled:
            try:
                await self._start_status_server(running, connection.default_namespace)
            except BaseException:
                self.running = None
                await running.stop()
                raise
        self.router.queue_all()
        if elector is None:
            self.metrics.leader.labels(name=election.resource_name).set(1)
            running.start_workers(
                self.config.controller.trainjob_workers, self.config.controller.runtime_workers
            )
        else:
            self.metrics.leader.labels(name=election.resource_name).set(0)
            elector.start()
        running.tasks.extend(informer.start())
        period = self.config.controller.sync_period_seconds
        if period > 0:
            running.tasks.append(asyncio.create_task(self.router.resync(period), name="resync"))
        if self.serve_metrics and self.config.metrics.enabled:
            try:
                await self._start_metrics_server(running)
            except BaseException:
                self.running = None
                await running.stop()
                raise
        if self.tls is not None:
            running.tasks.append(asyncio.create_task(self.tls.reloader.watch(), name="certificate-reloader"))
        if certificate is not None:
            running.tasks.append(asyncio.create_task(certificate.run(), name="webhook-certificate"))
        self.ready.set()

    async def cleanup(self) -> None:
        running, self.running = self.running, None
        if running is not None:
            await running.stop()
            if running.optimizer is not None:
                running.optimizer.queue.shutdown()
        self.queue.shutdown()
        if self.tls is not None and self.tls.self_signed is not None:
            self.tls.self_signed.cleanup()
            self.tls.self_signed = None

    async def _certificate(
        self, client: ApiClient, default_namespace: str | None, elector: Elector | None
    ) -> SelfManagedCertificate:
        """The webhook certificate from its Secret (made now if there is none), in the files the
        webhook server serves before it starts (controller/certificate_secret.py)."""
        settings = self.config.cert_management
        namespace = settings.webhook_secret_namespace or default_namespace
        if not namespace:
            raise StartupError(
                "certManagement.webhookSecretNamespace is not set, and there is no namespace to default "
                "it to (no in-cluster ServiceAccount, no namespace in the kubeconfig context)"
            )
        assert self.tls is not None
        reloader = self.tls.reloader
        certificate = SelfManagedCertificate(
            client,
            settings,
            namespace,
            Path(reloader.certfile).parent,
            advertise_host=self.config.webhook.advertise_host,
            leading=lambda: elector is None or elector.leading,
            on_files_changed=reloader.reload_if_changed,
        )
        try:
            await certificate.sync()
        except ApiError as exc:
            raise StartupError(
                f"the webhook certificate Secret {namespace}/{settings.webhook_secret_name} cannot be "
                f"read or made: {exc}"
            ) from exc
        return certificate

    async def _start_status_server(self, running: Running, default_namespace: str | None) -> None:
        """The progress status server (``TrainJobStatus``; controller/status_server.py), on every
        replica, and the facts its plugin renders from: the URL pods are given and the CA."""
        from trainer.controller import status_server as ss

        settings, certs_config = self.config.status_server, self.config.cert_management
        namespace = certs_config.webhook_secret_namespace or default_namespace or "kubeflow-system"
        service = f"{certs_config.webhook_service_name}.{namespace}.svc"
        url = settings.advertised_url or f"https://{service}:{settings.port}"
        client = running.status_client = self._observed(
            ApiClient.from_credentials(running.credentials, qps=settings.qps, burst=settings.burst)
        )
        if self.tls is not None:  # the webhooks' certificate, renewed in place in this context
            reloader = self.tls.reloader
        else:
            running.status_tls, reloader = self._own_certificate(urlsplit(url).hostname, "status-server")
        certfile, keyfile, context = reloader.certfile, reloader.keyfile, reloader.context
        context.load_cert_chain(certfile, keyfile)  # the webhook server may not have loaded it yet
        authority = ss.CertificateAuthority(cert_dir=Path(certfile).parent)
        interval = 30.0
        if running.certificate is not None:
            authority = ss.CertificateAuthority(client, running.certificate.secret_path)
            interval = certs_config.check_interval_seconds
        await ss.refresh_facts(self.cache, url, authority)

        # When the CA changes, the <name>-tls-config ConfigMaps follow.
        keep = ss.keep_facts(self.cache, url, authority, interval, self.router.queue_all)
        running.tasks.append(asyncio.create_task(keep, name="status-ca"))
        server = ss.Server(
            ss.TokenReviewAuthenticator(client, self.cache),
            ss.status_writer(client),
            ssl_context=context,
            host=settings.listen_host(self.placed_in_cluster),
            port=settings.port,
        )
        await server.start()
        running.status_server = server

    def _tls_settings(self, context: ssl.SSLContext) -> None:
        """Upstream's ``tls`` (minimum version, cipher suites; HTTP/1.1 by ALPN) on a server's context."""
        settings = self.config.tls
        tls_options.apply(context, settings.min_version, settings.cipher_suites)

    def _own_certificate(
        self, host: str | None, purpose: str
    ) -> tuple[tempfile.TemporaryDirectory[str], CertificateReloader]:
        """A self-signed certificate for a server that cannot share the webhooks' (they are off),
        in a context with the ``tls`` settings; the directory goes when the server does."""
        directory = _self_signed(host, purpose)
        reloader = CertificateReloader(f"{directory.name}/tls.crt", f"{directory.name}/tls.key")
        self._tls_settings(reloader.context)
        return directory, reloader

    async def _start_metrics_server(self, running: Running) -> None:
        """``/metrics`` (controller/metrics.py), on every replica: over HTTPS with the webhooks'
        certificate, or one of its own for ``localhost`` when the webhooks are off (as
        controller-runtime makes one); to the callers the API server authorizes with ``auth``."""
        settings = self.config.metrics
        address = settings.bind_address
        context: ssl.SSLContext | None = None
        if settings.secure_serving:
            if self.tls is not None:  # renewed in place, with the webhooks'
                reloader = self.tls.reloader
            else:
                running.metrics_tls, reloader = self._own_certificate("localhost", "metrics")
            context = reloader.context
            context.load_cert_chain(reloader.certfile, reloader.keyfile)
        auth: MetricsAuth | None = None
        if settings.authenticated:
            # Its own client: scrapes never spend the reconciler's budget.
            client = running.metrics_client = self._observed(
                ApiClient.from_credentials(
                    running.credentials, qps=METRICS_AUTH_QPS, burst=METRICS_AUTH_BURST
                )
            )
            # A review holds one of a few slots: controller-runtime's 10 s, one retry, then a 500.
            client.timeout, client.retries = 10.0, 1
            auth = MetricsAuth(client)
        server = self.metrics.server(
            *settings.listen_address(self.placed_in_cluster), ssl_context=context, auth=auth
        )
        try:
            await server.start()
        except OSError as exc:
            raise StartupError(f"metrics.bindAddress {address}: cannot listen: {exc}") from exc
        running.metrics_server = server

    def _elector(self, credentials: Credentials, namespace: str) -> Elector:
        """The Lease campaign: while this replica leads, the workers run; the moment it stops, they stop.

        Its client is its own (a renewal never waits on the reconciler's budget) and makes one try
        per request: the elector retries on its own schedule, within the renew deadline. Its
        budget is never below what the campaign needs, two requests (read, write) each retry
        period with room to spare: a ``clientConnection`` of one request a second, sized for the
        reconciler, would have the leader miss its renewals and step down over and over.
        """
        election = self.config.leader_election
        budget = self.config.client_connection
        qps = max(budget.qps, ELECTION_REQUESTS / election.retry_period_seconds)
        client = self._observed(
            ApiClient.from_credentials(credentials, qps=qps, burst=max(budget.burst, ELECTION_REQUESTS))
        )
        client.retries = 0
        gauge = self.metrics.leader.labels(name=election.resource_name)

        async def started() -> None:
            running = self.running
            if running is None:
                return
            # What the watches queued while following is here already; a replica that led before
            # and lost the Lease looks at every TrainJob again, as a new leader would.
            self.router.queue_all()
            running.recorder.start()
            running.start_workers(
                self.config.controller.trainjob_workers, self.config.controller.runtime_workers
            )
            gauge.set(1)
            if running.certificate is not None:
                running.certificate.wake()  # renewals and the caBundle are the leader's now

        async def stopped() -> None:
            gauge.set(0)
            if self.running is not None:
                await self.running.recorder.halt()  # first: its queue is dropped, not refused by the fence
                await self.running.stop_workers()

        return Elector(
            client,
            namespace,
            election.resource_name,
            Timing(
                lease_duration=election.lease_duration_seconds,
                renew_deadline=election.renew_deadline_seconds,
                retry_period=election.retry_period_seconds,
            ),
            on_started_leading=started,
            on_stopped_leading=stopped,
        )

    # --- kopf wiring ---

    def registry(self) -> kopf.OperatorRegistry:
        registry = kopf.OperatorRegistry()
        on = kopf.on

        # kopf passes every handler many keyword arguments; each takes the ones it needs.
        @on.startup(registry=registry)
        async def _startup(settings: kopf.OperatorSettings, **_: object) -> None:
            try:
                await self.startup(settings)
            except StartupError as exc:
                raise kopf.PermanentError(str(exc)) from exc

        @on.cleanup(registry=registry)
        async def _cleanup(**_: object) -> None:
            await self.cleanup()

        @on.login(registry=registry)
        async def _login_handler(**_: object) -> kopf.ConnectionInfo:
            # kopf logs in again when its credentials expire or meet a 401: the same Credentials
            # as the operator's clients, fetched again unless they were already (for_kopf).
            try:
                self.credentials = self.credentials or await login(self.kubeconfig)
                return await self.credentials.for_kopf()
            except (StartupError, CredentialsError) as exc:
                raise kopf.TemporaryError(str(exc), delay=LOGIN_RETRY_SECONDS) from None

        if self.config.webhook.enabled:
            self.webhooks.register(registry)

        return registry

    def configure(self, settings: kopf.OperatorSettings) -> None:
        webhook = self.config.webhook
        if webhook.enabled:
            self_signed: tempfile.TemporaryDirectory[str] | None = None
            if webhook.cert_dir:
                cert_dir = webhook.cert_dir
            elif self.config.cert_management.enable:
                # Written from the certificate Secret at start-up (controller/certificate_secret.py).
                self_signed = tempfile.TemporaryDirectory(prefix="trainer-webhook-")
                cert_dir = self_signed.name
            else:
                # For the address the API server is told to call: advertiseHost, else a specific
                # bind address (an unspecified one is called at loopback, which it always names).
                called = webhook.advertise_host or webhook.listen_host(self.placed_in_cluster)
                self_signed = _self_signed(None if called in ("", "0.0.0.0", "::") else called)
                cert_dir = self_signed.name
            certfile, pkeyfile = f"{cert_dir}/tls.crt", f"{cert_dir}/tls.key"
            self.tls = WebhookTLS(CertificateReloader(certfile, pkeyfile), self_signed)
            self._tls_settings(self.tls.reloader.context)  # the status server and metrics share it
            # kopf's own configuration manager stays off (settings.admission.managed): the
            # operator writes its configurations itself, when and as webhook_server.plan says.
            self.registrar = Registrar(webhook, cert_management=self.config.cert_management.enable)
            settings.admission.server = self.webhook_server = WebhookServer(
                host=webhook.listen_host(self.placed_in_cluster),
                port=webhook.port,
                context=self.tls.reloader.context,
                certfile=certfile,
                keyfile=pkeyfile,
                advertise_host=webhook.advertise_host,
                on_serving=self.registrar.serving,
                on_stopping=self.registrar.stopping,
            )

    async def run(
        self,
        *,
        clusterwide: bool,
        liveness_endpoint: str | None = None,
        stop_flag: asyncio.Event | None = None,
        ready_flag: asyncio.Event | None = None,
    ) -> None:
        settings = kopf.OperatorSettings()
        self.configure(settings)
        # The health endpoint is ours, not kopf's: on a guarded port (controller/serving.py), up
        # from before start-up (a probe during it says so), and down only once kopf has stopped.
        health = self._health_server(liveness_endpoint) if liveness_endpoint else None
        if health is not None:
            await health.start()
        try:
            await kopf.operator(
                registry=self.registry(),
                settings=settings,
                standalone=True,
                # kopf would name us user@host, and looks the user up in /etc/passwd, where the
                # image's uid 65532 (or OpenShift's random uid) has no entry: it would stop at start.
                identity=cast("Any", socket.gethostname()),
                clusterwide=clusterwide,
                namespaces=list(self.namespaces),
                stop_flag=stop_flag,
                ready_flag=ready_flag,
            )
        finally:
            if health is not None:
                await health.stop()

    def _health_server(self, endpoint: str) -> GuardedServer:
        """``GET <path>`` at ``endpoint`` (``http://host:port/path``): 200 with each check's state
        while the operator is healthy, 500 naming the check that failed. The check is upstream's
        status-server-healthz (docs/upstream-behaviour.md §trainjob-status): with the
        ``TrainJobStatus`` gate, "starting" during start-up, then whether its port takes a TLS
        connection."""
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme != "http" or parts.port is None:
            raise StartupError(f"the liveness endpoint {endpoint!r} is not http://host:port/path")

        async def healthz(_: web.Request) -> web.Response:
            checks: dict[str, str] = {}
            if c.FEATURE_TRAINJOB_STATUS in self.framework.enabled:
                running = self.running
                if running is None or running.status_server is None:
                    checks["status-server"] = "starting"
                else:
                    try:
                        await running.status_server.check()
                    except NotServing as exc:
                        return web.json_response({"status-server": str(exc)}, status=500)
                    checks["status-server"] = "ok"
            return web.json_response(checks)

        async def readyz(_request: web.Request) -> web.Response:
            # Upstream's: ready once the webhook server listens (its certificate is there then).
            if not self.ready.is_set():
                return web.json_response({"operator": "starting"}, status=500)
            checks = {"operator": "ok"}
            if self.config.webhook.enabled:
                server = self.webhook_server.server if self.webhook_server is not None else None
                if server is None or not server.serving:
                    return web.json_response({**checks, "webhook-server": "not listening"}, status=500)
                checks["webhook-server"] = "ok"
            return web.json_response(checks)

        app = web.Application(client_max_size=1024)
        liveness = parts.path or "/"
        readiness = "/" + self.config.health.readiness_endpoint_name
        app.router.add_get(liveness, healthz)
        if readiness != liveness:
            app.router.add_get(readiness, readyz)
        return GuardedServer(app, parts.hostname or "", parts.port, "health server", HEALTH_LIMITS)


async def _check_prerequisites(client: ApiClient) -> None:
    try:
        await client.request("GET", CRDS.path(None, JOBSET_CRD))
    except ApiError as exc:
        if exc.code == 404:
            raise StartupError(
                f"the JobSet CRD ({JOBSET_CRD}) is not installed: install JobSet first "
                "(see the install guide for supported versions)"
            ) from exc
        if exc.code != 403:  # without rights to read CRDs, the first JobSet write will tell
            raise


def _self_signed(advertise_host: str | None, purpose: str = "webhook") -> tempfile.TemporaryDirectory[str]:
    """A certificate for a run without one (outside the chart, which mounts one).

    kopf would make one only with an optional package (certbuilder); ours uses cryptography,
    which the operator depends on anyway. The API server trusts it through the caBundle of the
    configurations the operator manages (webhook.manageConfiguration).
    """
    directory = tempfile.TemporaryDirectory(prefix=f"trainer-{purpose}-")
    hosts = sorted({advertise_host or "localhost", "localhost", "127.0.0.1"})
    write_self_signed(Path(directory.name), hosts)
    logger.info("%s: no certificate configured; serving a self-signed one for %s", purpose, hosts)
    return directory


def running_in_cluster(kubeconfig: str | None) -> bool:
    """Whether the operator's credentials will be a pod's ServiceAccount: credentials.source's
    own rule (an explicit kubeconfig, else the ServiceAccount, else KUBECONFIG)."""
    if kubeconfig:
        return False
    try:
        return from_service_account() is not None
    except OSError:  # the token is there and cannot be read: login will say so
        return True


async def login(kubeconfig: str | None = None) -> Credentials:
    """Credentials for one cluster, fetched (see :mod:`trainer.controller.credentials`).

    An explicit kubeconfig is allowed, so an operator embedded in a test or the demo never
    depends on the process environment.
    """
    try:
        credentials = Credentials.of(kubeconfig)
        await credentials.current()
    except CredentialsError as exc:
        raise StartupError(f"no Kubernetes credentials: {exc}") from exc
    return credentials
