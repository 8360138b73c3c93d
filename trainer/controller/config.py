"""The operator's configuration file (``trainer run --config FILE``).

Field names follow upstream's ``config.trainer.kubeflow.org/v1alpha1`` Configuration where the
same setting exists (``clientConnection``, ``controller``, ``webhook``, ``metrics``, ``health``,
``leaderElection``, ``featureGates``, ``statusServer``), so a platform team can carry its values over; ``plugins`` is ours.
"""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import re
import ssl
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from trainer.controller import tls_options


class _Section(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class ClientConnection(_Section):
    qps: float = 50.0
    burst: int = 100


# The groupKindConcurrency keys upstream's manager has controllers for, as ours reads them.
CONTROLLED_KINDS = (
    "TrainJob.trainer.kubeflow.org",
    "TrainingRuntime.trainer.kubeflow.org",
    "ClusterTrainingRuntime.trainer.kubeflow.org",
)


class UnknownKeyError(ValueError):
    """A key of a free-form mapping (``controller.groupKindConcurrency``) that is not one of the
    keys the operator reads: raised by a field validator, so that the error printed for the file
    (``explain``) can name the key and suggest the nearest allowed one, as for a misspelt field."""

    def __init__(self, key: str, allowed: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.key, self.allowed = key, tuple(allowed)


class Controller(_Section):
    # How many TrainJobs reconcile at once (upstream: groupKindConcurrency per kind).
    group_kind_concurrency: dict[str, int] = Field(
        default_factory=lambda: {"TrainJob.trainer.kubeflow.org": 4}, alias="groupKindConcurrency"
    )
    # How often every TrainJob is reconciled though nothing was seen to change (controller-runtime's
    # SyncPeriod, and its default): a Go duration; "0s" turns the resync off.
    sync_period: str = Field("10h", alias="syncPeriod")
    # Ours (docs/decisions.md §batch): how long a status write that only follows the children's
    # progress (jobsStatus, startTime) waits, later progress folded into it, as kube's Job
    # controller batches its pods' updates for 1s; "0s" writes every step as it is seen.
    progress_batch_period: str = Field("1s", alias="progressBatchPeriod")
    # Ours (docs/decisions.md §batch): at most this many such progress writes a second across all
    # TrainJobs, each carrying every step since its wait began; conditions never wait. 0: no limit.
    progress_qps: float = Field(10.0, alias="progressQPS", ge=0)

    @field_validator("sync_period", "progress_batch_period")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    @field_validator("group_kind_concurrency")
    @classmethod
    def _known_kinds(cls, value: dict[str, int]) -> dict[str, int]:
        for key, count in value.items():
            if key not in CONTROLLED_KINDS:
                raise UnknownKeyError(
                    key,
                    CONTROLLED_KINDS,
                    f"{key!r}: not a kind this operator reconciles (one of {', '.join(CONTROLLED_KINDS)})",
                )
            if count < 1:
                raise ValueError(f"{key}: {count}: at least 1")
        return value

    @property
    def trainjob_workers(self) -> int:
        return int(self.group_kind_concurrency.get("TrainJob.trainer.kubeflow.org", 4))

    @property
    def runtime_workers(self) -> int:
        """Upstream's two runtime controllers only remove a finalizer its earlier releases left
        (controller/runtime_finalizers.py): their concurrency sizes the workers that do it here."""
        return max(
            self.group_kind_concurrency.get("TrainingRuntime.trainer.kubeflow.org", 1),
            self.group_kind_concurrency.get("ClusterTrainingRuntime.trainer.kubeflow.org", 1),
        )

    @property
    def sync_period_seconds(self) -> float:
        return parse_duration(self.sync_period)

    @property
    def progress_batch_seconds(self) -> float:
        return parse_duration(self.progress_batch_period)


# What a server binds when the file does not say and the operator runs outside a cluster (a
# kubeconfig's credentials): the machine's own loopback, not every interface of a laptop or a
# shared host. In a pod, the defaults below (every interface: the Service reaches the pod's IP).
LOOPBACK = "127.0.0.1"


class Webhook(_Section):
    port: int = 9443
    # Unset: 0.0.0.0 in a pod, 127.0.0.1 outside a cluster (``listen_host``).
    host: str = "0.0.0.0"
    cert_dir: str | None = Field(None, alias="certDir")
    # Whether the operator writes its own webhook configurations (controller/webhook_server.py).
    # Unset: outside a cluster, with the certificate it makes itself, when the API server can call
    # the webhooks' address, checked; true: always, unchecked (the sandbox); false: never (the
    # chart ships them).
    manage_configuration: bool | None = Field(None, alias="manageConfiguration")
    # The address the API server calls when the operator manages the configurations.
    advertise_host: str | None = Field(None, alias="advertiseHost")
    enabled: bool = True

    def listen_host(self, in_cluster: bool) -> str:
        """The address the webhook server binds: ``host`` as the file gives it, else every
        interface in a pod; elsewhere loopback, or the address ``advertiseHost`` names (the API
        server is told to call it there: every interface when it is a name, not an address)."""
        if in_cluster or "host" in self.model_fields_set:
            return self.host
        if self.advertise_host:
            try:
                return str(ipaddress.ip_address(self.advertise_host))
            except ValueError:
                return "0.0.0.0"
        return LOOPBACK


class CertManagement(_Section):
    """Upstream's ``certManagement`` (``enable``, ``webhookServiceName``, ``webhookSecretName``): the
    operator makes the webhooks' CA and serving certificate itself, keeps them in one Secret, renews
    them before they expire and writes the CA into the webhook configurations' ``caBundle``
    (``controller/certificate_secret.py``). The other fields are ours."""

    enable: bool = False
    webhook_service_name: str = Field(
        "kubeflow-trainer-controller-manager", alias="webhookServiceName", min_length=1
    )
    webhook_secret_name: str = Field("kubeflow-trainer-webhook-cert", alias="webhookSecretName", min_length=1)
    # Empty: the namespace of the operator's ServiceAccount (in a pod), else the kubeconfig context's.
    # The Service is in the same namespace.
    webhook_secret_namespace: str = Field("", alias="webhookSecretNamespace")
    validating_webhook_configuration_name: str = Field(
        "validator.trainer.kubeflow.org", alias="validatingWebhookConfigurationName", min_length=1
    )
    mutating_webhook_configuration_name: str = Field(
        "defaulter.trainer.kubeflow.org", alias="mutatingWebhookConfigurationName", min_length=1
    )
    # Go durations. Each certificate is renewed when a third of its lifetime is left, as
    # cert-manager does by default; the CA's renewal keeps the old CA in the caBundle until it expires.
    ca_validity: str = Field("87600h", alias="caValidity")
    cert_validity: str = Field("8760h", alias="certValidity")
    # How often every replica reads the Secret, and the leader checks expiry and the caBundle.
    check_interval: str = Field("10s", alias="checkInterval")

    @field_validator("ca_validity", "cert_validity", "check_interval")
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError(f"{value!r}: a certManagement duration must be above zero")
        return value

    @property
    def ca_validity_seconds(self) -> float:
        return parse_duration(self.ca_validity)

    @property
    def cert_validity_seconds(self) -> float:
        return parse_duration(self.cert_validity)

    @property
    def check_interval_seconds(self) -> float:
        return parse_duration(self.check_interval)


class MetricsAuth(_Section):
    # Upstream's field; its default is off. Ours follows secureServing: on over HTTPS, and refused
    # over plain HTTP, where a scraper's token would cross the network in the clear.
    enabled: bool | None = None


class Metrics(_Section):
    """Upstream's ``metrics``: ``/metrics`` on ``bindAddress`` ("0": no metrics server), over HTTPS
    unless ``secureServing`` is false, and with ``auth`` to callers the API server authenticates
    and authorizes (controller/metrics_auth.py; docs/configuration.md, "Metrics")."""

    bind_address: str = Field(":8443", alias="bindAddress", min_length=1, max_length=255)
    secure_serving: bool = Field(True, alias="secureServing")
    auth: MetricsAuth = Field(default_factory=MetricsAuth)

    @field_validator("bind_address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value != "0":
            try:
                split_address(value)
            except ValueError:
                raise ValueError(f"{value!r} is not an address: host:port, :port, or 0 for none") from None
        return value

    @model_validator(mode="after")
    def _auth_over_tls(self) -> Metrics:
        if self.auth.enabled and not self.secure_serving:
            raise ValueError(
                "metrics.auth.enabled needs metrics.secureServing: the scrapers' tokens would be sent in the clear"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.bind_address != "0"

    def listen_address(self, in_cluster: bool) -> tuple[str, int]:
        """Where the metrics server binds: ``bindAddress`` as the file gives it; unset, upstream's
        ``:8443`` (every interface) in a pod and ``127.0.0.1:8443`` elsewhere."""
        host, port = split_address(self.bind_address)
        return (host if in_cluster or "bind_address" in self.model_fields_set else LOOPBACK), port

    @property
    def authenticated(self) -> bool:
        return self.secure_serving if self.auth.enabled is None else self.auth.enabled


_ENDPOINT_NAME = r"^[A-Za-z0-9._~-]{1,63}$"  # one path segment (. and .. refused below)


class Health(_Section):
    """Upstream's ``health``: ``GET /<livenessEndpointName>`` and ``GET /<readinessEndpointName>``
    on ``healthProbeBindAddress`` ("0" or "": none)."""

    health_probe_bind_address: str = Field(":8081", alias="healthProbeBindAddress")
    readiness_endpoint_name: str = Field("readyz", alias="readinessEndpointName", pattern=_ENDPOINT_NAME)
    liveness_endpoint_name: str = Field("healthz", alias="livenessEndpointName", pattern=_ENDPOINT_NAME)

    def listen_address(self, in_cluster: bool) -> tuple[str, int]:
        """Where the probes are served: ``healthProbeBindAddress`` as the file gives it; unset,
        upstream's ``:8081`` (every interface) in a pod and ``127.0.0.1:8081`` elsewhere."""
        host, port = split_address(self.health_probe_bind_address)
        return (
            host if in_cluster or "health_probe_bind_address" in self.model_fields_set else LOOPBACK
        ), port

    @model_validator(mode="after")
    def _two_paths(self) -> Health:
        for field, name in (
            ("readinessEndpointName", self.readiness_endpoint_name),
            ("livenessEndpointName", self.liveness_endpoint_name),
        ):
            if name in (".", ".."):
                raise ValueError(f"health.{field}: {name!r} is not a path segment")
        if self.readiness_endpoint_name == self.liveness_endpoint_name:
            raise ValueError("health.readinessEndpointName and health.livenessEndpointName must differ")
        return self


class TLS(_Section):
    """Upstream's ``tls``, on every TLS server of the operator (controller/tls_options.py)."""

    min_version: Literal["", "1.0", "1.1", "1.2", "1.3"] = Field("", alias="minVersion")
    cipher_suites: list[str] = Field(default_factory=list, alias="cipherSuites", max_length=100)
    next_protos: list[str] = Field(default_factory=list, alias="nextProtos", max_length=10)

    @field_validator("min_version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value in ("1.0", "1.1"):
            # Go would serve them; OpenSSL 3 at its default security level refuses them anyway.
            raise ValueError(
                f"{value!r}: this operator's TLS library ({ssl.OPENSSL_VERSION}) serves 1.2 and 1.3 only"
            )
        return value

    @field_validator("cipher_suites")
    @classmethod
    def _suites(cls, value: list[str]) -> list[str]:
        tls_options.openssl_ciphers(value)
        return value

    @field_validator("next_protos")
    @classmethod
    def _protocols(cls, value: list[str]) -> list[str]:
        tls_options.check_next_protos(value)
        return value


class LeaderElection(_Section):
    """Upstream's ``leaderElection`` (component-base's LeaderElectionConfiguration, which
    controller-runtime reads): one replica, the holder of a ``coordination.k8s.io/v1`` Lease,
    reconciles; every replica serves the webhooks, health and metrics. Off unless ``leaderElect``,
    as upstream's is when the section is absent; the chart turns it on."""

    leader_elect: bool = Field(False, alias="leaderElect")
    resource_name: str = Field("trainer.kubeflow.org", alias="resourceName", min_length=1)
    # Empty: the namespace of the operator's ServiceAccount (in a pod), else the kubeconfig context's.
    resource_namespace: str = Field("", alias="resourceNamespace")
    resource_lock: Literal["leases"] = Field("leases", alias="resourceLock")
    # Go durations; client-go's (and upstream's) defaults.
    lease_duration: str = Field("15s", alias="leaseDuration")
    renew_deadline: str = Field("10s", alias="renewDeadline")
    retry_period: str = Field("2s", alias="retryPeriod")

    @field_validator("lease_duration", "renew_deadline", "retry_period")
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError(f"{value!r}: a leader election duration must be above zero")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElection:
        # client-go's NewLeaderElector refuses the same: the holder must give up (renewDeadline)
        # before the others may take over (leaseDuration), and retry at least once before that.
        if self.lease_duration_seconds <= self.renew_deadline_seconds:
            raise ValueError("leaderElection.leaseDuration must be longer than renewDeadline")
        if self.renew_deadline_seconds <= 1.2 * self.retry_period_seconds:
            raise ValueError("leaderElection.renewDeadline must be longer than 1.2 x retryPeriod")
        return self

    @property
    def lease_duration_seconds(self) -> float:
        return parse_duration(self.lease_duration)

    @property
    def renew_deadline_seconds(self) -> float:
        return parse_duration(self.renew_deadline)

    @property
    def retry_period_seconds(self) -> float:
        return parse_duration(self.retry_period)


class StatusServer(_Section):
    """Upstream's ``statusServer`` (``port``, ``qps``, ``burst``): where training pods report progress
    when the ``TrainJobStatus`` gate is on (``controller/status_server.py``). ``advertisedURL`` is
    ours: the base URL pods are given; empty, the operator's Service
    (``https://<certManagement.webhookServiceName>.<namespace>.svc:<port>``)."""

    port: int = Field(10443, ge=1, le=65535)
    # Unset: 0.0.0.0 in a pod, 127.0.0.1 outside a cluster (``listen_host``).
    host: str = "0.0.0.0"
    # The server's own API client (TokenReview, pods, the status writes): upstream's defaults.
    qps: float = Field(5.0, gt=0)
    burst: int = Field(10, ge=1)
    advertised_url: str = Field("", alias="advertisedURL", pattern=r"^(https://[^/?#]+)?$")

    def listen_host(self, in_cluster: bool) -> str:
        """The address the status server binds: ``host`` as the file gives it, else every
        interface in a pod and loopback elsewhere."""
        return self.host if in_cluster or "host" in self.model_fields_set else LOOPBACK


class Plugins(_Section):
    # Built-in plugins to turn off (what the v1 operator's enable-scheme flag did for job kinds).
    disabled: list[str] = Field(default_factory=list)
    # Plugins from other packages allowed to load (entry-point group trainer.plugins).
    allowed: list[str] = Field(default_factory=list)


class Configuration(_Section):
    api_version: str = Field("config.trainer.kubeflow.org/v1alpha1", alias="apiVersion")
    kind: str = "Configuration"
    client_connection: ClientConnection = Field(default_factory=ClientConnection, alias="clientConnection")
    controller: Controller = Field(default_factory=Controller)
    webhook: Webhook = Field(default_factory=Webhook)
    cert_management: CertManagement = Field(default_factory=CertManagement, alias="certManagement")
    metrics: Metrics = Field(default_factory=Metrics)
    health: Health = Field(default_factory=Health)
    leader_election: LeaderElection = Field(default_factory=LeaderElection, alias="leaderElection")
    feature_gates: dict[str, bool] = Field(default_factory=dict, alias="featureGates")
    status_server: StatusServer = Field(default_factory=StatusServer, alias="statusServer")
    plugins: Plugins = Field(default_factory=Plugins)
    tls: TLS = Field(default_factory=TLS)

    @model_validator(mode="after")
    def _distinct_ports(self) -> Configuration:
        # Caught here, naming both fields, rather than as a bind failure once everything else started.
        listeners: list[tuple[str, str, int]] = []
        if self.webhook.enabled:
            listeners.append(("webhook.port", self.webhook.host, self.webhook.port))
        for field, address in (
            ("metrics.bindAddress", self.metrics.bind_address),
            ("health.healthProbeBindAddress", self.health.health_probe_bind_address),
        ):
            if address not in ("", "0"):
                with contextlib.suppress(ValueError):  # the field's own check names a bad address
                    listeners.append((field, *split_address(address)))
        if self.feature_gates.get("TrainJobStatus"):
            listeners.append(("statusServer.port", self.status_server.host, self.status_server.port))
        for i, (field, host, port) in enumerate(listeners):
            for other, other_host, other_port in listeners[:i]:
                wildcard = {host, other_host} & {"", "0.0.0.0", "::"}
                if port and port == other_port and (wildcard or host == other_host):
                    raise ValueError(f"{other} and {field} both listen on port {port}")
        return self

    @model_validator(mode="after")
    def _one_certificate_source(self) -> Configuration:
        if self.cert_management.enable and self.webhook.manage_configuration is True:
            # kopf would write configurations of its own, trusting the serving certificate itself.
            raise ValueError("certManagement.enable and webhook.manageConfiguration exclude each other")
        return self


class ConfigError(ValueError):
    """The configuration file cannot be used: its message, one paragraph naming the file and
    each problem by its key's path, is what ``trainer run`` prints before exiting 2."""


def load(path: str | None) -> Configuration:
    """The Configuration in the YAML file ``path`` (every default without one).

    Whatever is wrong with the file is raised as a ConfigError written for the person who edits
    it (``explain``), not as pydantic's or PyYAML's report: the file usually comes from a Helm
    values file through the chart's ConfigMap, and whoever reads the pod's log must be able to
    find the key at fault without knowing the model.
    """
    if not path:
        return Configuration()
    import yaml

    try:
        text = Path(path).read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        data: object = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {_yaml_problem(exc)}") from None
    try:
        return Configuration.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(explain(exc, path)) from None


def _yaml_problem(exc: Exception) -> str:
    """PyYAML's reason and position on one line (its own text spans several, with a caret)."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{problem}{where}"


def explain(error: ValidationError, path: str) -> str:
    """What is wrong with the file ``path``, one line per problem, each starting with the path of
    the key at fault (``webhook.port``): pydantic's own report names its types and links its
    website, and says nothing of the key that was meant. An unknown key is given the closest
    allowed key (the usual cause is a typo) and every key allowed where it stands."""
    lines = [_problem(item) for item in error.errors(include_url=False)]
    if len(lines) == 1:
        return f"{path}: {lines[0]}"
    return "\n".join([f"{path}: {len(lines)} problems:", *(f"  {line}" for line in lines)])


def _problem(item: ErrorDetails) -> str:
    loc: tuple[str | int, ...] = tuple(item["loc"])
    cause = (item.get("ctx") or {}).get("error")
    if item["type"] == "extra_forbidden":
        return _unknown_key(loc[:-1], str(loc[-1]), _section_keys(loc[:-1]))
    if isinstance(cause, UnknownKeyError):
        return _unknown_key(loc, cause.key, cause.allowed)
    where = key_path(loc)
    if isinstance(cause, Exception):  # a validator of ours: its message is written for the file
        reason = str(cause)
        # A check across a section's fields names them itself (leaderElection.leaseDuration ...).
        if not where or reason.startswith((f"{where}.", f"{where} ")):
            return reason
        return f"{where}: {reason}"
    if item["type"] in ("model_type", "model_attributes_type", "dict_type"):
        reason = f"should be a mapping of keys, not {_shown(item.get('input'))}"
    else:
        reason = str(item["msg"]).replace("Input should", "should", 1)
        if "input" in item and not isinstance(item["input"], dict | list):
            reason += f" (got {_shown(item['input'])})"
    return f"{where}: {reason}" if where else f"the file {reason}"


def _unknown_key(parent: tuple[str | int, ...], key: str, allowed: Iterable[str]) -> str:
    """``parent.key: unknown key; did you mean <closest>? (the keys of <parent>: ...)``."""
    allowed = list(allowed)
    where = key_path((*parent, key))
    closest = closest_key(key, allowed)
    guess = f"; did you mean {closest}?" if closest else ""
    if not allowed:
        return f"{where}: unknown key{guess}"
    level = f"the keys of {key_path(parent)}" if parent else "the keys at the top level"
    return f"{where}: unknown key{guess} ({level}: {', '.join(allowed)})"


def closest_key(key: str, allowed: Iterable[str]) -> str | None:
    """The allowed key ``key`` most likely misspells, if one is close enough: compared without
    case, ``_`` and ``-``, so that ``bind_adress`` and ``BindAddress`` find ``bindAddress``."""

    def plain(name: str) -> str:
        return name.casefold().replace("_", "").replace("-", "")

    by_plain = {plain(name): name for name in allowed}
    match = difflib.get_close_matches(plain(key), list(by_plain), n=1, cutoff=0.6)
    return by_plain[match[0]] if match else None


def _section_keys(loc: tuple[str | int, ...]) -> list[str]:
    """The keys the file may hold at ``loc`` (the names the docs use: the fields' aliases)."""
    model: type[BaseModel] = Configuration
    for part in loc:
        for name, field in model.model_fields.items():
            if part in (name, field.alias):
                annotation = field.annotation
                if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                    model = annotation
                    break
        else:
            return []
    return [field.alias or name for name, field in model.model_fields.items()]


def key_path(loc: Sequence[str | int]) -> str:
    """``loc`` as the file's path to the key: ``metrics.auth.enabled``, ``tls.cipherSuites[0]``,
    and keys that are not plain names in brackets (``controller.groupKindConcurrency[TrainJob.trainer.kubeflow.org]``)."""
    out = ""
    for part in loc:
        if isinstance(part, int) or not re.fullmatch(r"[A-Za-z0-9_-]+", part):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _shown(value: object) -> str:
    """A value as the message quotes it: YAML's words for a mapping, a list and nothing, else short."""
    if value is None:
        return "empty (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(value: str) -> float:
    """Seconds in a Go duration (``time.ParseDuration``: "10h", "1h30m", "90s", "0"), never negative."""
    text = value.strip()
    if text in ("0", "+0"):
        return 0.0
    body = text.removeprefix("+")
    parts = _DURATION_PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"{value!r} is not a duration (a Go duration such as 10h, 30m or 1h30m)")
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def split_address(address: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``host:port`` or ``:port``; raises ValueError for anything else."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{address!r}: not host:port")
    return (host or default_host), int(port)
