"""The kopf layer: watch, feed the cache, queue TrainJobs, serve the webhooks.

Everything here is I/O glue. Decisions are made by the render core (``trainer.runtime``) and
admission (``trainer.admission``); the reconciler writes the difference.

No kopf finalizer, progress annotation, handler result in status or kopf-posted Event is used:
the handlers are ``on.event`` (fire-and-forget, no state kept on the objects), retries and
backoff are the work queue's, and Events are ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import tempfile
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import kopf

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.apimachinery.errors import AdmissionError
from trainer.controller import events
from trainer.controller.cache import Cache, owner_trainjob
from trainer.controller.certs import CertificateReloader
from trainer.controller.client import ApiClient, ApiError
from trainer.controller.config import Configuration, split_address
from trainer.controller.metrics import Metrics
from trainer.controller.reconciler import Reconciler, WorkQueue, utc_now
from trainer.controller.resources import CRDS, JOBSETS, WATCHED, Resource, Role
from trainer.runtime import framework as fw

logger = logging.getLogger("trainer.operator")

JOBSET_CRD = JOBSETS.type.name
CHILD_LABEL = {c.TRAINJOB_NAME_LABEL: kopf.PRESENT}


class StartupError(Exception):
    """The operator cannot run in this cluster as it is (a prerequisite is missing)."""


@dataclass
class Running:
    """What exists only once start-up has passed its checks: made in one piece, or not at all.

    Code that holds one has every part of it; code that may run before start-up (or after
    clean-up) has an ``Operator.running`` that is None, and its type says so.
    """

    connection: kopf.ConnectionInfo
    client: ApiClient
    recorder: events.Recorder
    reconciler: Reconciler
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks.clear()
        await self.recorder.stop()
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
    serve_metrics: bool = True
    kubeconfig: str | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    running: Running | None = field(default=None, init=False)
    tls: WebhookTLS | None = field(default=None, init=False)  # set by configure() when webhooks are on

    def __post_init__(self) -> None:
        plugins = self.config.plugins
        self.framework = fw.load(
            fw.PluginConfig(
                disabled=frozenset(plugins.disabled),
                allowed_external=frozenset(plugins.allowed),
                feature_gates=dict(self.config.feature_gates),
            )
        )

    # --- lifecycle ---

    async def startup(self, settings: kopf.OperatorSettings) -> None:
        settings.posting.enabled = False  # our Events only, with our reasons
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        connection = login(self.kubeconfig)
        budget = self.config.client_connection
        client = ApiClient.from_connection_info(connection, qps=budget.qps, burst=budget.burst)
        try:
            await _check_prerequisites(client)
            await self._prime(client)
        except BaseException:
            await client.close()
            raise
        # Events get a client and budget of their own, as controller-runtime's recorder does.
        recorder = events.Recorder(
            ApiClient.from_connection_info(connection, qps=budget.qps, burst=budget.burst)
        )
        recorder.start()
        reconciler = Reconciler(client, self.cache, self.framework, self.metrics, recorder, self.queue)
        self.running = running = Running(connection, client, recorder, reconciler)
        for key in list(self.cache.trainjobs):
            self.queue.add(key)
        for i in range(self.config.controller.trainjob_workers):
            running.tasks.append(asyncio.create_task(reconciler.worker(), name=f"trainjob-worker-{i}"))
        if self.serve_metrics:
            host, port = split_address(self.config.metrics.bind_address)
            self.metrics.serve(host, port)
        if self.tls is not None:
            running.tasks.append(asyncio.create_task(self.tls.reloader.watch(), name="certificate-reloader"))
        self.ready.set()

    async def cleanup(self) -> None:
        running, self.running = self.running, None
        if running is not None:
            await running.stop()
        self.queue.shutdown()
        if self.tls is not None and self.tls.self_signed is not None:
            self.tls.self_signed.cleanup()
            self.tls.self_signed = None

    async def _prime(self, client: ApiClient) -> None:
        """Fill the cache before any reconcile, so a restart never acts on a half-known world."""
        namespaces: list[str | None] = list(self.namespaces) or [None]
        for resource in WATCHED:
            for ns in namespaces if resource.type.namespaced else [None]:
                try:
                    listed = await client.list(resource.type, ns, label_selector=resource.label_selector)
                except ApiError as exc:
                    if exc.code == 404 and resource.optional:
                        break  # that API (a gang scheduler) is not installed
                    raise
                for item in listed.get("items") or []:
                    self.cache.observe(_typed(item, resource))

    # --- watch events ---

    def on_event(self, resource: Resource, event: kopf.RawEvent) -> None:
        """Keep the cache current and queue the TrainJobs the change concerns."""
        # kopf types the object as its RawBody TypedDict; it is the JSON the API server sent.
        obj = _typed(cast(Obj, event["object"]), resource)
        meta = obj["metadata"]
        deleted = event["type"] == "DELETED"
        if deleted:
            self.cache.forget(resource.kind, meta.get("namespace"), meta["name"], Cache.group_of(obj))
        else:
            self.cache.observe(obj)
        match resource.role:
            case Role.TRAINJOB:
                if not deleted:
                    self.queue.add((meta.get("namespace") or "default", meta["name"]))
            case Role.RUNTIME:
                if not deleted:
                    self._runtime_arrived(obj)
            case Role.CHILD:
                owner = owner_trainjob(obj)
                if owner is not None:
                    self.queue.add(owner)

    def _runtime_arrived(self, runtime: Obj) -> None:
        """A TrainJob waiting for this runtime (no snapshot yet) can go on now."""
        meta = runtime["metadata"]
        for key, trainjob in list(self.cache.trainjobs.items()):
            ref = trainjob.get("spec", {}).get("runtimeRef") or {}
            if (
                ref.get("name") != meta["name"]
                or (ref.get("kind") or c.CLUSTER_TRAINING_RUNTIME_KIND) != runtime["kind"]
            ):
                continue
            if runtime["kind"] == c.TRAINING_RUNTIME_KIND and key[0] != meta.get("namespace"):
                continue
            if self.cache.get("ConfigMap", key[0], key[1] + c.RUNTIME_SNAPSHOT_SUFFIX) is None:
                self.queue.add(key)

    # --- admission ---

    def validate(self, body: kopf.Body, old: kopf.Body | None, warnings: list[str]) -> None:
        from trainer.admission.admit import admit

        obj = _plain(body)
        try:
            _, found = admit(
                obj, _plain(old) if old is not None else None, self.cache, self.framework, utc_now()
            )
        except AdmissionError as exc:
            warnings.extend(exc.warnings)
            raise kopf.AdmissionError(_admission_message(exc), code=403) from exc
        warnings.extend(found)

    def default(self, body: kopf.Body, old: kopf.Body | None, patch: kopf.Patch) -> None:
        """The defaulting webhook: kopf diffs what ``default_object`` changes into a JSON patch."""
        from trainer.admission.admit import default_object

        stored = _plain(old) if old is not None else None
        now = utc_now()
        # kopf hands each function a deep copy of the body made of plain dicts and lists.
        patch.fns.append(lambda obj: default_object(cast(Obj, obj), stored, now))

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
        def _login_handler(**_: object) -> kopf.ConnectionInfo:
            return self.running.connection if self.running is not None else login(self.kubeconfig)

        for resource in WATCHED:
            rtype = resource.type
            on.event(
                rtype.group,
                rtype.version,
                rtype.plural,
                labels=CHILD_LABEL if resource.labelled else None,
                registry=registry,
                id=rtype.name,
            )(self._watch_handler(resource))

        if self.config.webhook.enabled:

            def _validate(
                *, body: kopf.Body, warnings: list[str], old: kopf.Body | None = None, **_: object
            ) -> None:
                self.validate(body, old, warnings)

            def _default(
                *, body: kopf.Body, patch: kopf.Patch, old: kopf.Body | None = None, **_: object
            ) -> None:
                self.default(body, old, patch)

            # A validator and a defaulter for each kind of our API. The defaulters write numbers
            # given for quantities as quantity strings, runtimes included (docs/decisions.md §9), and
            # stamp each TrainJob runtime patch with the time it last changed.
            for resource in WATCHED:
                rtype = resource.type
                if rtype.group != c.GROUP:
                    continue
                for register, handler, prefix in (
                    (on.validate, _validate, "validator"),
                    (on.mutate, _default, "defaulter"),
                ):
                    register(
                        rtype.group,
                        rtype.version,
                        rtype.plural,
                        registry=registry,
                        id=f"{prefix}.{resource.kind.lower()}",
                        operations=["CREATE", "UPDATE"],
                    )(handler)

        return registry

    def _watch_handler(self, resource: Resource) -> Callable[..., Coroutine[None, None, None]]:
        """A coroutine, so that kopf calls it on the operator's event loop.

        kopf runs a plain function in a thread pool, and a watch event changes the cache and the
        work queue, which the workers use on the loop (an asyncio.Queue fed from another thread
        may not wake a waiting worker until some other I/O happens).
        """

        async def handler(*, event: kopf.RawEvent, **_: object) -> None:
            self.on_event(resource, event)

        return handler

    def configure(self, settings: kopf.OperatorSettings) -> None:
        # The API server filters the ConfigMaps and Secrets it sends us: a handler's `labels=`
        # filters only after kopf has received every Secret of the cluster, keys and all.
        for resource in WATCHED:
            if resource.label_selector is not None:
                rtype = resource.type
                settings.watching.label_selectors[rtype.group, rtype.version, rtype.plural] = (
                    resource.label_selector
                )
        webhook = self.config.webhook
        if webhook.enabled:
            self_signed: tempfile.TemporaryDirectory[str] | None = None
            if webhook.cert_dir:
                cert_dir = webhook.cert_dir
            else:
                self_signed = _self_signed(webhook.advertise_host)
                cert_dir = self_signed.name
            certfile, pkeyfile = f"{cert_dir}/tls.crt", f"{cert_dir}/tls.key"
            self.tls = WebhookTLS(CertificateReloader(certfile, pkeyfile), self_signed)
            settings.admission.server = kopf.WebhookServer(
                addr=webhook.host,
                port=webhook.port,
                certfile=certfile,
                pkeyfile=pkeyfile,
                host=webhook.advertise_host,
                context=self.tls.reloader.context,
            )
            if webhook.manage_configuration:
                settings.admission.managed = "trainer.kubeflow.org"

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
        await kopf.operator(
            registry=self.registry(),
            settings=settings,
            standalone=True,
            clusterwide=clusterwide,
            namespaces=list(self.namespaces),
            liveness_endpoint=liveness_endpoint,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )


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


def _self_signed(advertise_host: str | None) -> tempfile.TemporaryDirectory[str]:
    """A certificate for a run without one (outside the chart, which mounts one).

    kopf would make one only with an optional package (certbuilder); ours uses cryptography,
    which the operator depends on anyway. The API server trusts it through the caBundle of the
    configurations the operator manages (webhook.manageConfiguration).
    """
    from trainer.controller.certs import write_self_signed

    certs = tempfile.TemporaryDirectory(prefix="trainer-webhook-")
    hosts = sorted({advertise_host or "localhost", "localhost", "127.0.0.1"})
    write_self_signed(Path(certs.name), hosts)
    logger.info("webhooks: no certDir configured; serving a self-signed certificate for %s", hosts)
    return certs


def login(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    """Credentials for one cluster (see :mod:`trainer.controller.credentials`).

    An explicit kubeconfig is allowed, so an operator embedded in a test or the demo never
    depends on the process environment.
    """
    from trainer.controller.credentials import CredentialsError
    from trainer.controller.credentials import login as resolve

    try:
        return resolve(kubeconfig)
    except CredentialsError as exc:
        raise StartupError(f"no Kubernetes credentials: {exc}") from exc


def _plain(body: kopf.Body) -> Obj:
    return copy.deepcopy(dict(body))


def _typed(obj: Obj, resource: Resource) -> Obj:
    """Lists and watch events may leave out each item's apiVersion and kind; the cache needs them."""
    obj.setdefault("apiVersion", resource.api_version)
    obj.setdefault("kind", resource.kind)
    return obj


def _admission_message(exc: AdmissionError) -> str:
    lines = [str(e) for e in exc.errors]
    return lines[0] if len(lines) == 1 else "[" + ", ".join(lines) + "]"
