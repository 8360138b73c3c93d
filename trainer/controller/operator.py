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
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, cast

import kopf

from trainer.api import constants as c
from trainer.apimachinery.errors import AdmissionError
from trainer.controller import events
from trainer.controller.cache import Cache, owner_trainjob
from trainer.controller.client import ApiClient, ApiError, ResourceType
from trainer.controller.config import Configuration, split_address
from trainer.controller.metrics import Metrics
from trainer.controller.reconciler import Reconciler, utc_now
from trainer.runtime import framework as fw

Obj = dict[str, Any]
logger = logging.getLogger("trainer.operator")

TRAINJOBS = ResourceType(c.GROUP, c.VERSION, "trainjobs")
TRAINING_RUNTIMES = ResourceType(c.GROUP, c.VERSION, "trainingruntimes")
CLUSTER_RUNTIMES = ResourceType(c.GROUP, c.VERSION, "clustertrainingruntimes", namespaced=False)
JOBSETS = ResourceType("jobset.x-k8s.io", "v1alpha2", "jobsets")
CONFIGMAPS = ResourceType("", "v1", "configmaps")
SECRETS = ResourceType("", "v1", "secrets")
PODGROUPS = (
    ResourceType("scheduling.x-k8s.io", "v1alpha1", "podgroups"),
    ResourceType("scheduling.volcano.sh", "v1beta1", "podgroups"),
)
JOBSET_CRD = "jobsets.jobset.x-k8s.io"
CHILD_LABEL = {c.TRAINJOB_NAME_LABEL: kopf.PRESENT}

_KINDS = {
    TRAINJOBS.plural: (c.API_VERSION, c.TRAINJOB_KIND),
    TRAINING_RUNTIMES.plural: (c.API_VERSION, c.TRAINING_RUNTIME_KIND),
    CLUSTER_RUNTIMES.plural: (c.API_VERSION, c.CLUSTER_TRAINING_RUNTIME_KIND),
}


class StartupError(Exception):
    """The operator cannot run in this cluster as it is (a prerequisite is missing)."""


@dataclass
class Operator:
    config: Configuration
    namespaces: Collection[str] = ()
    cache: Cache = field(default_factory=Cache)
    metrics: Metrics = field(default_factory=Metrics)
    client: ApiClient | None = None
    reconciler: Reconciler | None = None
    recorder: events.Recorder | None = None
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    framework: fw.Framework = field(init=False)
    connection: Any = None
    serve_metrics: bool = True
    kubeconfig: str | None = None
    cert_reloader: Any = None
    _certs: Any = None  # a TemporaryDirectory holding a self-signed certificate, when we made one
    ready: asyncio.Event = field(default_factory=asyncio.Event)

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
        self.connection = login(self.kubeconfig)
        budget = {"qps": self.config.client_connection.qps, "burst": self.config.client_connection.burst}
        self.client = ApiClient.from_connection_info(self.connection, **budget)
        await self._check_prerequisites()
        await self._prime()
        # Events get a client and budget of their own, as controller-runtime's recorder does.
        self.recorder = events.Recorder(ApiClient.from_connection_info(self.connection, **budget))
        self.recorder.start()
        self.reconciler = Reconciler(self.client, self.cache, self.framework, self.metrics, self.recorder)
        for key in list(self.cache.trainjobs):
            self.reconciler.queue.add(key)
        for i in range(self.config.controller.trainjob_workers):
            self.workers.append(asyncio.create_task(self.reconciler.worker(), name=f"trainjob-worker-{i}"))
        if self.serve_metrics:
            host, port = split_address(self.config.metrics.bind_address)
            self.metrics.serve(host, port)
        if self.cert_reloader is not None:
            self.workers.append(asyncio.create_task(self.cert_reloader.watch(), name="certificate-reloader"))
        self.ready.set()

    async def cleanup(self) -> None:
        for task in self.workers:
            task.cancel()
        for task in self.workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.workers.clear()
        if self.reconciler is not None:
            self.reconciler.queue.shutdown()
        if self.recorder is not None:
            await self.recorder.stop()
        if self.client is not None:
            await self.client.close()
        if self._certs is not None:
            self._certs.cleanup()
            self._certs = None

    async def _check_prerequisites(self) -> None:
        assert self.client is not None
        crds = ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
        try:
            await self.client.request("GET", crds.path(None, JOBSET_CRD))
        except ApiError as exc:
            if exc.code == 404:
                raise StartupError(
                    f"the JobSet CRD ({JOBSET_CRD}) is not installed: install JobSet first "
                    "(see the install guide for supported versions)"
                ) from exc
            if exc.code != 403:  # without rights to read CRDs, the first JobSet write will tell
                raise

    async def _prime(self) -> None:
        """Fill the cache before any reconcile, so a restart never acts on a half-known world."""
        assert self.client is not None
        namespaces: list[str | None] = list(self.namespaces) or [None]
        lists: list[tuple[ResourceType, str | None, str | None]] = [(CLUSTER_RUNTIMES, None, None)]
        for ns in namespaces:
            lists += [
                (TRAINING_RUNTIMES, ns, None),
                (TRAINJOBS, ns, None),
                (JOBSETS, ns, None),
                (CONFIGMAPS, ns, c.TRAINJOB_NAME_LABEL),
                (SECRETS, ns, c.TRAINJOB_NAME_LABEL),
                *((pg, ns, None) for pg in PODGROUPS),
            ]
        for rtype, ns, selector in lists:
            try:
                listed = await self.client.list(rtype, ns, label_selector=selector)
            except ApiError as exc:
                if exc.code == 404 and rtype in PODGROUPS:
                    continue  # that gang scheduler is not installed
                raise
            api_version = listed.get("apiVersion", "v1")
            kind = str(listed.get("kind", "")).removesuffix("List")
            for item in listed.get("items") or []:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                self.cache.observe(item)

    # --- watch events ---

    def on_trainjob(self, event: Obj) -> None:
        obj = _typed(event["object"], TRAINJOBS.plural)
        meta = obj["metadata"]
        key = (meta.get("namespace") or "default", meta["name"])
        if event.get("type") == "DELETED":
            self.cache.forget(c.TRAINJOB_KIND, key[0], key[1])
            return
        self.cache.observe(obj)
        self._enqueue(key)

    def on_runtime(self, event: Obj, plural: str) -> None:
        obj = _typed(event["object"], plural)
        meta = obj["metadata"]
        if event.get("type") == "DELETED":
            self.cache.forget(obj["kind"], meta.get("namespace"), meta["name"])
            return
        self.cache.observe(obj)
        # A TrainJob waiting for this runtime (no snapshot yet) can go on now.
        for key, trainjob in list(self.cache.trainjobs.items()):
            ref = trainjob.get("spec", {}).get("runtimeRef") or {}
            if (
                ref.get("name") != meta["name"]
                or (ref.get("kind") or c.CLUSTER_TRAINING_RUNTIME_KIND) != obj["kind"]
            ):
                continue
            if obj["kind"] == c.TRAINING_RUNTIME_KIND and key[0] != meta.get("namespace"):
                continue
            if self.cache.get("ConfigMap", key[0], key[1] + c.RUNTIME_SNAPSHOT_SUFFIX) is None:
                self._enqueue(key)

    def on_child(self, event: Obj) -> None:
        obj = event["object"]
        meta = obj.get("metadata") or {}
        owner = owner_trainjob(obj)
        if event.get("type") == "DELETED":
            self.cache.forget(obj["kind"], meta.get("namespace"), meta["name"], Cache.group_of(obj))
        else:
            self.cache.observe(obj)
        if owner is not None:
            self._enqueue(owner)

    def _enqueue(self, key: tuple[str, str]) -> None:
        if self.reconciler is not None:
            self.reconciler.queue.add(key)

    # --- admission ---

    def validate(self, body: Obj, old: Obj | None, warnings: list[str]) -> None:
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

    def default(self, body: Obj, old: Obj | None, patch: kopf.Patch) -> None:
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

        @on.startup(registry=registry)
        async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
            try:
                await self.startup(settings)
            except StartupError as exc:
                raise kopf.PermanentError(str(exc)) from exc

        @on.cleanup(registry=registry)
        async def _cleanup(**_: Any) -> None:
            await self.cleanup()

        @on.login(registry=registry)
        def _login_handler(**_: Any) -> Any:
            return self.connection or login(self.kubeconfig)

        # Handlers take **kwargs only: kopf passes many keyword arguments and these need one.
        # They are coroutines so that kopf calls them on the operator's event loop: kopf runs a
        # plain function in a thread pool, and these change the cache and the work queue, which
        # the workers use on the loop (an asyncio.Queue fed from another thread may not wake a
        # waiting worker until some other I/O happens).
        async def _trainjob(**kwargs: Any) -> None:
            self.on_trainjob(kwargs["event"])

        on.event(c.GROUP, c.VERSION, "trainjobs", registry=registry, id="trainjobs")(_trainjob)

        async def _training_runtime(**kwargs: Any) -> None:
            self.on_runtime(kwargs["event"], TRAINING_RUNTIMES.plural)

        async def _cluster_runtime(**kwargs: Any) -> None:
            self.on_runtime(kwargs["event"], CLUSTER_RUNTIMES.plural)

        on.event(c.GROUP, c.VERSION, TRAINING_RUNTIMES.plural, registry=registry, id="trainingruntimes")(
            _training_runtime
        )
        on.event(
            c.GROUP, c.VERSION, CLUSTER_RUNTIMES.plural, registry=registry, id="clustertrainingruntimes"
        )(_cluster_runtime)

        async def _child(**kwargs: Any) -> None:
            self.on_child(kwargs["event"])

        on.event("jobset.x-k8s.io", "v1alpha2", "jobsets", registry=registry, id="jobsets")(_child)
        on.event("", "v1", "configmaps", labels=CHILD_LABEL, registry=registry, id="configmaps")(_child)
        on.event("", "v1", "secrets", labels=CHILD_LABEL, registry=registry, id="secrets")(_child)
        for pg in PODGROUPS:
            on.event(pg.group, pg.version, pg.plural, registry=registry, id=f"podgroups-{pg.group}")(_child)

        if self.config.webhook.enabled:

            def _validate(**kwargs: Any) -> None:
                self.validate(kwargs["body"], kwargs.get("old"), kwargs["warnings"])

            def _default(**kwargs: Any) -> None:
                self.default(kwargs["body"], kwargs.get("old"), kwargs["patch"])

            # A validator and a defaulter for each kind. The defaulters write numbers given for
            # quantities as quantity strings, runtimes included (DECISIONS.md §9), and stamp each
            # TrainJob runtime patch with the time it last changed.
            for plural in (TRAINJOBS.plural, TRAINING_RUNTIMES.plural, CLUSTER_RUNTIMES.plural):
                kind = _KINDS[plural][1].lower()
                for register, handler, prefix in (
                    (on.validate, _validate, "validator"),
                    (on.mutate, _default, "defaulter"),
                ):
                    register(
                        c.GROUP,
                        c.VERSION,
                        plural,
                        registry=registry,
                        id=f"{prefix}.{kind}",
                        operations=["CREATE", "UPDATE"],
                    )(handler)

        return registry

    def configure(self, settings: kopf.OperatorSettings) -> None:
        # The API server filters the ConfigMaps and Secrets it sends us: a handler's `labels=`
        # filters only after kopf has received every Secret of the cluster, keys and all.
        for plural in ("configmaps", "secrets"):
            settings.watching.label_selectors["v1", plural] = c.TRAINJOB_NAME_LABEL
        webhook = self.config.webhook
        if webhook.enabled:
            from trainer.controller.certs import CertificateReloader

            cert_dir = webhook.cert_dir or self._self_signed(webhook.advertise_host)
            certfile, pkeyfile = f"{cert_dir}/tls.crt", f"{cert_dir}/tls.key"
            self.cert_reloader = CertificateReloader(certfile, pkeyfile)
            context = self.cert_reloader.context
            settings.admission.server = kopf.WebhookServer(
                addr=webhook.host,
                port=webhook.port,
                certfile=certfile,
                pkeyfile=pkeyfile,
                host=webhook.advertise_host,
                context=context,
            )
            if webhook.manage_configuration:
                settings.admission.managed = "trainer.kubeflow.org"

    def _self_signed(self, advertise_host: str | None) -> str:
        """A certificate for a run without one (outside the chart, which mounts one).

        kopf would make one only with an optional package (certbuilder); ours uses cryptography,
        which the operator depends on anyway. The API server trusts it through the caBundle of the
        configurations the operator manages (webhook.manageConfiguration).
        """
        import tempfile
        from pathlib import Path

        from trainer.controller.certs import write_self_signed

        certs = tempfile.TemporaryDirectory(prefix="trainer-webhook-")
        self._certs = certs
        hosts = sorted({advertise_host or "localhost", "localhost", "127.0.0.1"})
        write_self_signed(Path(certs.name), hosts)
        logger.info("webhooks: no certDir configured; serving a self-signed certificate for %s", hosts)
        return certs.name

    async def run(
        self,
        *,
        clusterwide: bool,
        liveness_endpoint: str | None = None,
        stop_flag: Any = None,
        ready_flag: Any = None,
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


def _plain(body: Any) -> Obj:
    import copy

    return copy.deepcopy(dict(body)) if body is not None else {}


def _typed(obj: Obj, plural: str) -> Obj:
    api_version, kind = _KINDS[plural]
    obj.setdefault("apiVersion", api_version)
    obj.setdefault("kind", kind)
    return obj


def _admission_message(exc: AdmissionError) -> str:
    lines = [str(e) for e in exc.errors]
    return lines[0] if len(lines) == 1 else "[" + ", ".join(lines) + "]"
