"""TrainingRuntime and ClusterTrainingRuntime: what a platform team publishes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from trainer.api.constants import ML_POLICY_SOURCES
from trainer.api.schema import APIModel, Rule, Schema
from trainer.api.trainjob import TemplateMetadata

MPI_IMPLEMENTATIONS = ("OpenMPI", "Intel", "MPICH", "")


class EnvInjectionTarget(APIModel):
    job_name: Annotated[str, Schema(min_length=1, max_length=253)] = Field(alias="jobName")
    container_names: Annotated[
        list[Annotated[str, Schema(max_length=63)]],
        Schema(
            min_items=1,
            max_items=8,
            list_type="set",
            rules=(
                Rule(
                    "!self.exists(c, c == 'node')",
                    "containerNames must not include the main node container because PET_* envs are "
                    "always injected into it",
                ),
            ),
        ),
    ] = Field(alias="containerNames")


class EnvInjection(APIModel):
    targets: Annotated[
        list[EnvInjectionTarget] | None, Schema(max_items=16, list_type="map", map_keys=("jobName",))
    ] = None


class TorchPolicy(APIModel):
    env_injection: EnvInjection | None = Field(None, alias="envInjection")


class MPIPolicy(APIModel):
    num_proc_per_node: Annotated[
        int,
        Schema(
            default=1, format="int32", rules=(Rule("self >= 1", "NumProcPerNode in mpiPolicy must be >= 1"),)
        ),
    ] = Field(1, alias="numProcPerNode")
    # docs/decisions.md §5: Intel MPI and MPICH are accepted, unlike upstream's enum.
    mpi_implementation: Annotated[str, Schema(default="OpenMPI", enum=MPI_IMPLEMENTATIONS)] = Field(
        "OpenMPI", alias="mpiImplementation"
    )
    ssh_auth_mount_path: Annotated[str, Schema(default="/root/.ssh", max_length=4096)] = Field(
        "/root/.ssh", alias="sshAuthMountPath"
    )
    run_launcher_as_node: Annotated[bool, Schema(default=False)] = Field(False, alias="runLauncherAsNode")


class JAXPolicy(APIModel):
    pass


class XGBoostPolicy(APIModel):
    pass


class FluxPolicy(APIModel):
    num_proc_per_node: Annotated[
        int,
        Schema(
            default=1, format="int32", rules=(Rule("self >= 1", "NumProcPerNode in fluxPolicy must be >= 1"),)
        ),
    ] = Field(1, alias="numProcPerNode")


class MLPolicy(APIModel):
    num_nodes: Annotated[int | None, Schema(format="int32")] = Field(None, alias="numNodes")
    torch: TorchPolicy | None = None
    mpi: MPIPolicy | None = None
    jax: JAXPolicy | None = None
    xgboost: XGBoostPolicy | None = None
    flux: FluxPolicy | None = None

    def source(self) -> str | None:
        """The one configured framework policy, if any (the CRD allows at most one)."""
        for name in ML_POLICY_SOURCES:
            if getattr(self, name) is not None:
                return name
        return None


MLPolicyField = Annotated[
    MLPolicy | None,
    Schema(
        rules=(
            Rule(
                "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),"
                "has(self.flux)].filter(x, x).size() <= 1",
                # docs/decisions.md §8: upstream's words, grammar fixed.
                "Only one of the policies can be configured",
            ),
        )
    ),
]


class CoschedulingPolicy(APIModel):
    schedule_timeout_seconds: Annotated[int, Schema(default=60, format="int32")] = Field(
        60, alias="scheduleTimeoutSeconds"
    )


class NetworkTopology(APIModel):
    mode: Annotated[str, Schema(default="hard", enum=("hard", "soft"))] = "hard"
    highest_tier_allowed: Annotated[int, Schema(default=1)] = Field(1, alias="highestTierAllowed")


class VolcanoPolicy(APIModel):
    network_topology: NetworkTopology | None = Field(None, alias="networkTopology")


class WorkloadPolicy(APIModel):
    """Gang scheduling by kube-scheduler's own Workload and PodGroup (scheduling.k8s.io/v1alpha2,
    Kubernetes 1.36 behind its GenericWorkload and GangScheduling gates); ours, upstream has no
    such source (docs/scheduling.md)."""

    schedule_timeout_seconds: Annotated[int | None, Schema(format="int32", minimum=1)] = Field(
        None, alias="scheduleTimeoutSeconds"
    )


class PodGroupPolicy(APIModel):
    coscheduling: CoschedulingPolicy | None = None
    volcano: VolcanoPolicy | None = None
    workload: WorkloadPolicy | None = None


# Ours: the workload source is a gang of its own; upstream's two sources are left as upstream has
# them (it does not refuse both).
ONE_GANG = Rule(
    "!has(self.workload) || (!has(self.coscheduling) && !has(self.volcano))",
    "workload cannot be combined with coscheduling or volcano: a TrainJob's pods join one gang",
)


class JobSetTemplateSpec(APIModel):
    """The JobSet a runtime stamps out: metadata that propagates to the JobSet, and its spec."""

    metadata: TemplateMetadata | None = None
    spec: Annotated[dict[str, Any] | None, Schema(embed="JobSetSpec")] = None


class RunPolicy(APIModel):
    """Defaults for the runtime's TrainJobs, which their own fields override (ours, as upstream's
    issue #4052 plans it: docs/decisions.md §ttl)."""

    active_deadline_seconds: Annotated[int | None, Schema(format="int64", minimum=1)] = Field(
        None, alias="activeDeadlineSeconds"
    )
    ttl_seconds_after_finished: Annotated[int | None, Schema(format="int32", minimum=0)] = Field(
        None, alias="ttlSecondsAfterFinished"
    )


class TrainingRuntimeSpec(APIModel):
    ml_policy: MLPolicyField = Field(None, alias="mlPolicy")
    pod_group_policy: Annotated[PodGroupPolicy | None, Schema(rules=(ONE_GANG,))] = Field(
        None, alias="podGroupPolicy"
    )
    run_policy: RunPolicy | None = Field(None, alias="runPolicy")
    template: Annotated[JobSetTemplateSpec, Schema(min_properties=1)] = Field(
        default_factory=JobSetTemplateSpec
    )


class TrainingRuntime(APIModel):
    """Namespaced runtime; ClusterTrainingRuntime has the same shape, cluster-scoped."""

    api_version: str | None = Field(None, alias="apiVersion")
    kind: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: Annotated[TrainingRuntimeSpec, Schema(min_properties=1)] = Field(
        default_factory=TrainingRuntimeSpec
    )

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))


class ClusterTrainingRuntime(TrainingRuntime):
    pass
