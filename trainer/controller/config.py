"""The operator's configuration file (``trainer run --config FILE``).

Field names follow upstream's ``config.trainer.kubeflow.org/v1alpha1`` Configuration where the
same setting exists (``clientConnection``, ``controller``, ``webhook``, ``metrics``, ``health``,
``featureGates``), so a platform team can carry its values over; ``plugins`` is ours.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class ClientConnection(_Section):
    qps: float = 50.0
    burst: int = 100


class Controller(_Section):
    # How many TrainJobs reconcile at once (upstream: groupKindConcurrency per kind).
    group_kind_concurrency: dict[str, int] = Field(
        default_factory=lambda: {"TrainJob.trainer.kubeflow.org": 4}, alias="groupKindConcurrency"
    )

    @property
    def trainjob_workers(self) -> int:
        return max(1, int(self.group_kind_concurrency.get("TrainJob.trainer.kubeflow.org", 4)))


class Webhook(_Section):
    port: int = 9443
    host: str = "0.0.0.0"
    cert_dir: str | None = Field(None, alias="certDir")
    # Whether the operator writes its own webhook configurations (the sandbox does; the chart ships them).
    manage_configuration: bool = Field(False, alias="manageConfiguration")
    # The address the API server calls when the operator manages the configurations.
    advertise_host: str | None = Field(None, alias="advertiseHost")
    enabled: bool = True


class Metrics(_Section):
    bind_address: str = Field(":8080", alias="bindAddress")


class Health(_Section):
    health_probe_bind_address: str = Field(":8081", alias="healthProbeBindAddress")


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
    metrics: Metrics = Field(default_factory=Metrics)
    health: Health = Field(default_factory=Health)
    feature_gates: dict[str, bool] = Field(default_factory=dict, alias="featureGates")
    plugins: Plugins = Field(default_factory=Plugins)


def load(path: str | None) -> Configuration:
    if not path:
        return Configuration()
    import yaml

    data: object = yaml.safe_load(Path(path).read_text()) or {}
    return Configuration.model_validate(data)


def split_address(address: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host or default_host), int(port)
