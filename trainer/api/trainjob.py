"""TrainJob: what an ML engineer submits (trainer.kubeflow.org/v1alpha1)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from trainer.api.constants import GROUP, MANAGED_BY_MULTIKUEUE, MANAGED_BY_TRAINER
from trainer.api.schema import IMMUTABLE, APIModel, Rule, Schema

EnvList = Annotated[
    list[dict[str, Any]],
    Schema(embed="EnvVar", max_items=128, list_type="map", map_keys=("name",)),
]
STORAGE_URI_RULE = Rule(
    "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')",
    "storageUri may be empty, or it must be a valid URI (scheme://...)",
)


LongString = Annotated[str, Schema(max_length=1048576)]


class RuntimeRef(APIModel):
    """Which runtime a TrainJob uses. kind and apiGroup default to the cluster-wide runtime."""

    name: Annotated[str, Schema(min_length=1, max_length=253)]
    api_group: Annotated[str, Schema(default=GROUP, max_length=253)] = Field(GROUP, alias="apiGroup")
    kind: Annotated[str, Schema(default="ClusterTrainingRuntime", max_length=253)] = "ClusterTrainingRuntime"


class SecretRef(APIModel):
    name: Annotated[str, Schema(default="")] = ""


class InitializerSource(APIModel):
    """Where a dataset or model comes from: handed to the initializer container as env."""

    storage_uri: Annotated[str | None, Schema(max_length=2048, rules=(STORAGE_URI_RULE,))] = Field(
        None, alias="storageUri"
    )
    env: EnvList | None = None
    secret_ref: Annotated[SecretRef | None, Schema(map_type="atomic")] = Field(None, alias="secretRef")


class Initializer(APIModel):
    dataset: InitializerSource | None = None
    model: InitializerSource | None = None


class Trainer(APIModel):
    """The TrainJob's overrides of the runtime's trainer node."""

    image: Annotated[str | None, Schema(max_length=500)] = None
    command: Annotated[list[LongString] | None, Schema(max_items=128, list_type="atomic")] = None
    args: Annotated[list[LongString] | None, Schema(max_items=128, list_type="atomic")] = None
    env: EnvList | None = None
    num_nodes: Annotated[int | None, Schema(format="int32", minimum=0)] = Field(None, alias="numNodes")
    resources_per_node: Annotated[dict[str, Any] | None, Schema(embed="ResourceRequirements")] = Field(
        None, alias="resourcesPerNode"
    )
    num_proc_per_node: Annotated[
        int | None,
        Schema(
            format="int32", rules=(Rule("self >= 1", "numProcPerNode must be greater than or equal to 1"),)
        ),
    ] = Field(None, alias="numProcPerNode")


# --- runtimePatches: a restricted JobSet spec a manager (Kueue, a user) overlays on the runtime ---


class TemplateMetadata(APIModel):
    """Labels and annotations a template carries to the object made from it."""

    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None
    finalizers: list[str] | None = None
    name: str | None = None
    namespace: str | None = None


class ContainerPatch(APIModel):
    name: Annotated[str, Schema(min_length=1, max_length=253)]
    env: EnvList | None = None
    security_context: Annotated[dict[str, Any] | None, Schema(embed="SecurityContext")] = Field(
        None, alias="securityContext"
    )
    volume_mounts: Annotated[
        list[dict[str, Any]] | None,
        Schema(embed="VolumeMount", max_items=128, list_type="map", map_keys=("name",)),
    ] = Field(None, alias="volumeMounts")


class PodSpecPatch(APIModel):
    """The pod fields a runtime patch may set. Scheduling fields stay mutable (Kueue moves jobs)."""

    affinity: Annotated[dict[str, Any] | None, Schema(embed="Affinity")] = None
    containers: Annotated[
        list[ContainerPatch] | None,
        Schema(max_items=64, list_type="map", map_keys=("name",), rules=(IMMUTABLE,)),
    ] = None
    image_pull_secrets: Annotated[
        list[dict[str, Any]] | None,
        Schema(
            embed="LocalObjectReference",
            max_items=64,
            list_type="map",
            map_keys=("name",),
            rules=(IMMUTABLE,),
        ),
    ] = Field(None, alias="imagePullSecrets")
    init_containers: Annotated[
        list[ContainerPatch] | None,
        Schema(max_items=64, list_type="map", map_keys=("name",), rules=(IMMUTABLE,)),
    ] = Field(None, alias="initContainers")
    node_selector: dict[str, str] | None = Field(None, alias="nodeSelector")
    scheduling_gates: Annotated[
        list[dict[str, Any]] | None,
        Schema(embed="PodSchedulingGate", max_items=16, list_type="map", map_keys=("name",)),
    ] = Field(None, alias="schedulingGates")
    security_context: Annotated[
        dict[str, Any] | None, Schema(embed="PodSecurityContext", rules=(IMMUTABLE,))
    ] = Field(None, alias="securityContext")
    service_account_name: Annotated[str | None, Schema(max_length=253, rules=(IMMUTABLE,))] = Field(
        None, alias="serviceAccountName"
    )
    termination_grace_period_seconds: Annotated[
        int | None, Schema(format="int64", minimum=0, rules=(IMMUTABLE,))
    ] = Field(None, alias="terminationGracePeriodSeconds")
    tolerations: Annotated[
        list[dict[str, Any]] | None, Schema(embed="Toleration", max_items=128, list_type="atomic")
    ] = None
    volumes: Annotated[
        list[dict[str, Any]] | None,
        Schema(embed="Volume", max_items=128, list_type="map", map_keys=("name",), rules=(IMMUTABLE,)),
    ] = None


class PodTemplatePatch(APIModel):
    metadata: TemplateMetadata | None = None
    spec: PodSpecPatch | None = None


class JobSpecPatch(APIModel):
    template: PodTemplatePatch | None = None


class JobTemplatePatch(APIModel):
    metadata: TemplateMetadata | None = None
    spec: JobSpecPatch | None = None


class ReplicatedJobPatch(APIModel):
    name: Annotated[str, Schema(min_length=1, max_length=253)]
    template: JobTemplatePatch | None = None


class JobSetSpecPatch(APIModel):
    replicated_jobs: Annotated[
        list[ReplicatedJobPatch] | None, Schema(max_items=100, list_type="map", map_keys=("name",))
    ] = Field(None, alias="replicatedJobs")


class JobSetTemplatePatch(APIModel):
    metadata: TemplateMetadata | None = None
    spec: JobSetSpecPatch | None = None


class TrainingRuntimeSpecPatch(APIModel):
    template: JobSetTemplatePatch | None = None


class RuntimePatch(APIModel):
    """One manager's overlay on the runtime; keyed by manager so several can coexist."""

    manager: Annotated[str, Schema(min_length=1, max_length=253, rules=(IMMUTABLE,))]
    time: Annotated[str | None, Schema(format="date-time")] = None
    training_runtime_spec: TrainingRuntimeSpecPatch | None = Field(None, alias="trainingRuntimeSpec")


def _trainer_field_kept(name: str) -> str:
    """CEL: ``spec.trainer.<name>`` is what it was, set or unset alike (an unset trainer too)."""
    now, then = (
        f"has(self.trainer) && has(self.trainer.{name})",
        f"has(oldSelf.trainer) && has(oldSelf.trainer.{name})",
    )
    return f"(({now}) == ({then})) && (!({now}) || self.trainer.{name} == oldSelf.trainer.{name})"


# Ours (docs/decisions.md §resize; upstream #3995): upstream holds all of spec.trainer immutable.
# numNodes and resourcesPerNode may change while the TrainJob is suspended, before or by the
# update (the webhook also refuses it while the JobSet has active Jobs); the rest never.
RESIZABLE_TRAINER_FIELDS = ("numNodes", "resourcesPerNode")
# Every other field of Trainer, a field added later included.
FIXED_TRAINER_FIELDS = tuple(
    name
    for name in (f.alias or n for n, f in Trainer.model_fields.items())
    if name not in RESIZABLE_TRAINER_FIELDS
)
TRAINER_RULES = (
    Rule(
        " && ".join(_trainer_field_kept(f) for f in FIXED_TRAINER_FIELDS),
        "field is immutable",
        field_path=".trainer",
    ),
    Rule(
        " && ".join(_trainer_field_kept(f) for f in RESIZABLE_TRAINER_FIELDS)
        + " || (has(oldSelf.suspend) && oldSelf.suspend) || (has(self.suspend) && self.suspend)",
        "numNodes and resourcesPerNode can only be changed while the TrainJob is suspended",
        field_path=".trainer",
    ),
)


class TrainJobSpec(APIModel):
    runtime_ref: Annotated[RuntimeRef, Schema(rules=(IMMUTABLE,))] = Field(alias="runtimeRef")
    initializer: Annotated[Initializer | None, Schema(rules=(IMMUTABLE,))] = None
    trainer: Trainer | None = None  # TRAINER_RULES, on spec: they read spec.suspend
    runtime_patches: Annotated[
        list[RuntimePatch] | None, Schema(max_items=16, list_type="map", map_keys=("manager",))
    ] = Field(None, alias="runtimePatches")
    suspend: Annotated[bool | None, Schema(default=False)] = False
    managed_by: Annotated[
        str | None,
        Schema(
            default=MANAGED_BY_TRAINER,
            max_length=253,
            rules=(
                Rule(
                    f"self in ['{MANAGED_BY_TRAINER}', '{MANAGED_BY_MULTIKUEUE}']",
                    f"ManagedBy must be {MANAGED_BY_TRAINER} or {MANAGED_BY_MULTIKUEUE} if set",
                ),
                IMMUTABLE,
            ),
        ),
    ] = Field(MANAGED_BY_TRAINER, alias="managedBy")
    active_deadline_seconds: Annotated[int | None, Schema(format="int64", minimum=1, rules=(IMMUTABLE,))] = (
        Field(None, alias="activeDeadlineSeconds")
    )
    # Ours, as upstream's issue #4052 plans it (docs/decisions.md §ttl): mutable, so a TTL can be
    # set or changed after the TrainJob finished; 0 deletes it as soon as it finishes.
    ttl_seconds_after_finished: Annotated[int | None, Schema(format="int32", minimum=0)] = Field(
        None, alias="ttlSecondsAfterFinished"
    )


# --- status ---


CONDITION_TYPE_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"


class Condition(APIModel):
    type: Annotated[str, Schema(max_length=316, pattern=CONDITION_TYPE_PATTERN)]
    status: Annotated[str, Schema(enum=("True", "False", "Unknown"))]
    reason: Annotated[
        str, Schema(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    ]
    message: Annotated[str, Schema(max_length=32768)]
    last_transition_time: Annotated[str, Schema(format="date-time")] = Field(alias="lastTransitionTime")
    observed_generation: Annotated[int | None, Schema(format="int64", minimum=0)] = Field(
        None, alias="observedGeneration"
    )


Count = Annotated[int, Schema(format="int32", minimum=0)]


class JobStatus(APIModel):
    name: Annotated[str, Schema(min_length=1, max_length=253)]
    ready: Count
    succeeded: Count
    failed: Count
    active: Count
    suspended: Count


class Metric(APIModel):
    name: Annotated[str, Schema(min_length=1, max_length=64)]
    value: Annotated[str, Schema(min_length=1, max_length=64)]


class TrainerStatus(APIModel):
    progress_percentage: Annotated[int | None, Schema(format="int32", minimum=0, maximum=100)] = Field(
        None, alias="progressPercentage"
    )
    estimated_remaining_seconds: Annotated[int | None, Schema(format="int32", minimum=0)] = Field(
        None, alias="estimatedRemainingSeconds"
    )
    metrics: Annotated[list[Metric] | None, Schema(max_items=256, list_type="atomic")] = None
    last_updated_time: Annotated[str | None, Schema(format="date-time")] = Field(
        None, alias="lastUpdatedTime"
    )


class TrainJobStatus(APIModel):
    # batch/v1 Job's meaning (docs/decisions.md §ttl): set when the TrainJob runs unsuspended,
    # reset on resume; completionTime only when it completes successfully.
    start_time: Annotated[str | None, Schema(format="date-time")] = Field(None, alias="startTime")
    completion_time: Annotated[str | None, Schema(format="date-time")] = Field(None, alias="completionTime")
    conditions: Annotated[
        list[Condition] | None, Schema(max_items=8, list_type="map", map_keys=("type",))
    ] = None
    jobs_status: Annotated[
        list[JobStatus] | None, Schema(max_items=100, list_type="map", map_keys=("name",))
    ] = Field(None, alias="jobsStatus")
    trainer_status: Annotated[
        TrainerStatus | None,
        Schema(
            rules=(
                Rule(
                    "has(self.lastUpdatedTime)",
                    "lastUpdatedTime is required when trainerStatus is present",
                ),
            )
        ),
    ] = Field(None, alias="trainerStatus")


NAME_RULES = (
    Rule(
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "metadata.name must match RFC 1035 DNS label format",
    ),
    Rule("size(self.metadata.name) <= 63", "metadata.name must be no more than 63 characters"),
)


class TrainJob(APIModel):
    api_version: str | None = Field(None, alias="apiVersion")
    kind: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: Annotated[TrainJobSpec, Schema(rules=TRAINER_RULES)]
    status: Annotated[TrainJobStatus | None, Schema(min_properties=1)] = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "default")
