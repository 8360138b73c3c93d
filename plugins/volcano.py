"""Volcano: gang scheduling by the Volcano scheduler, through its PodGroup.

Pods join the group by annotation. Beyond the gang size and resources, Volcano's PodGroup takes
the queue (from the runtime's template annotations, which a TrainJob may patch), the priority
class of the pods and the network topology constraint (docs/upstream-behaviour.md §volcano).
"""

from __future__ import annotations

from trainer.plugin import (
    Builds,
    FieldError,
    Info,
    Kind,
    Obj,
    Reads,
    TrainingRuntimeSpec,
    ValidationContext,
    VolcanoPolicy,
    gang_totals,
    hookimpl,
    invalid,
)

POD_GROUP_API_VERSION = "scheduling.volcano.sh/v1beta1"
POD_GROUP_KIND = "PodGroup"
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
PRIORITY_CLASS = Kind("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", namespaced=False)
# Priority classes every cluster has; Volcano accepts them without a PriorityClass object.
SYSTEM_PRIORITY_CLASSES = ("system-cluster-critical", "system-node-critical")


class VolcanoPlugin:
    name = "Volcano"
    # Its PodGroup CRD comes with Volcano; admission checks that the pods' PriorityClass exists.
    kinds = (
        Builds(Kind(POD_GROUP_API_VERSION, POD_GROUP_KIND, "podgroups"), optional=True),
        Reads(PRIORITY_CLASS),
    )

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.pod_group_policy is not None and spec.pod_group_policy.volcano is not None

    @hookimpl
    def trainer_enforce_pod_group_policy(self, info: Info) -> None:
        if _policy(info) is None:
            return
        info.scheduler.pod_annotations[GROUP_NAME_ANNOTATION] = info.name

    @hookimpl
    def trainer_build(self, info: Info) -> list[Obj] | None:
        policy = _policy(info)
        if policy is None:
            return None
        if info.frozen(POD_GROUP_API_VERSION, POD_GROUP_KIND, info.name):
            return None  # frozen while the TrainJob runs, as for coscheduling
        return [build_pod_group(info, policy)]

    @hookimpl
    def trainer_validate(self, ctx: ValidationContext) -> list[FieldError] | None:
        policy = ctx.runtime.spec.pod_group_policy
        if policy is None or policy.volcano is None:
            return None
        errors = _check_queue(ctx)
        errors += _check_priority_classes(ctx)
        return errors or None


def _policy(info: Info) -> VolcanoPolicy | None:
    policy = info.pod_group_policy
    return policy.volcano if policy is not None else None


def priority_class_name(jobset_spec: Obj) -> str | None:
    """The pods' priority class: the last replicated job that names one wins, as upstream."""
    found = None
    for rjob in jobset_spec.get("replicatedJobs") or []:
        name = _pod_spec(rjob).get("priorityClassName")
        if name:
            found = str(name)
    return found


def build_pod_group(info: Info, policy: VolcanoPolicy) -> Obj:
    members, resources = gang_totals(info)
    spec: Obj = {"minMember": members, "minResources": resources}
    if QUEUE_ANNOTATION in info.annotations:
        spec["queue"] = info.annotations[QUEUE_ANNOTATION]
    priority = priority_class_name(info.jobset_spec)
    if priority:
        spec["priorityClassName"] = priority
    if policy.network_topology is not None:
        spec["networkTopology"] = {
            "mode": policy.network_topology.mode,
            "highestTierAllowed": policy.network_topology.highest_tier_allowed,
        }
    return {
        "apiVersion": POD_GROUP_API_VERSION,
        "kind": POD_GROUP_KIND,
        "metadata": info.child_metadata(info.name),
        "spec": spec,
    }


# --- admission ---


def _pod_spec(rjob: Obj) -> Obj:
    spec: Obj = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    return spec


def _check_queue(ctx: ValidationContext) -> list[FieldError]:
    """An empty queue name would send the PodGroup nowhere; name where the empty value comes from."""
    patches = ctx.trainjob_obj.get("spec", {}).get("runtimePatches") or []
    for i in reversed(range(len(patches))):
        template = (patches[i].get("trainingRuntimeSpec") or {}).get("template") or {}
        annotations = (template.get("metadata") or {}).get("annotations") or {}
        if QUEUE_ANNOTATION in annotations:
            if annotations[QUEUE_ANNOTATION] != "":
                return []
            path = f"spec.runtimePatches[{i}].trainingRuntimeSpec.template.metadata.annotations[{QUEUE_ANNOTATION}]"
            return [invalid(path, "", "Volcano queue name must not be empty")]
    template_meta = ctx.runtime.spec.template.metadata
    annotations = (template_meta.annotations if template_meta is not None else None) or {}
    if annotations.get(QUEUE_ANNOTATION) == "":
        return [
            invalid(
                "spec.runtimeRef.name",
                ctx.trainjob.spec.runtime_ref.name,
                f"Volcano queue name must not be empty: the runtime sets "
                f'spec.template.metadata.annotations[{QUEUE_ANNOTATION}] to ""',
            )
        ]
    return []


def _check_priority_classes(ctx: ValidationContext) -> list[FieldError]:
    jobset_spec = ctx.info.jobset_spec if ctx.info is not None else (ctx.runtime.spec.template.spec or {})
    errors: list[FieldError] = []
    for i, rjob in enumerate(jobset_spec.get("replicatedJobs") or []):
        name = _pod_spec(rjob).get("priorityClassName")
        if not name:
            continue
        if name in SYSTEM_PRIORITY_CLASSES:
            break  # upstream stops at the first system class; the errors found so far stand
        if ctx.facts.get("PriorityClass", None, name) is None:
            errors.append(
                invalid(
                    "spec.runtimeRef.name",
                    ctx.trainjob.spec.runtime_ref.name,
                    f'PriorityClass "{name}" doesn\'t exist: priorityclasses.scheduling.k8s.io "{name}" not found '
                    f"(set by the runtime's spec.template.spec.replicatedJobs[{i}].template.spec.template.spec"
                    ".priorityClassName)",
                )
            )
    return errors


plugin = VolcanoPlugin()
