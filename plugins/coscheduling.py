"""Coscheduling: gang scheduling by the scheduler-plugins scheduler, through its PodGroup.

The scheduler starts a TrainJob's pods only when all of them fit, so a half-placed job never
holds GPUs while it waits for the rest. Pods join the group by label; the PodGroup says how many
pods and how many resources the whole gang needs (docs/upstream-behaviour.md §coscheduling).
"""

from __future__ import annotations

from trainer.plugin import (
    Builds,
    CoschedulingPolicy,
    Info,
    Kind,
    Obj,
    TrainingRuntimeSpec,
    gang_totals,
    hookimpl,
)

POD_GROUP_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
POD_GROUP_KIND = "PodGroup"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


class CoSchedulingPlugin:
    name = "CoScheduling"
    # Its PodGroup CRD comes with scheduler-plugins, which a cluster may not have.
    kinds = (Builds(Kind(POD_GROUP_API_VERSION, POD_GROUP_KIND, "podgroups"), optional=True),)

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.pod_group_policy is not None and spec.pod_group_policy.coscheduling is not None

    @hookimpl
    def trainer_enforce_pod_group_policy(self, info: Info) -> None:
        if _policy(info) is None:
            return
        # Every pod, initializers and launcher included: the gang is the whole TrainJob.
        info.scheduler.pod_labels[POD_GROUP_LABEL] = info.name

    @hookimpl
    def trainer_build(self, info: Info) -> list[Obj] | None:
        policy = _policy(info)
        if policy is None:
            return None
        if info.frozen(POD_GROUP_API_VERSION, POD_GROUP_KIND, info.name):
            # A PodGroup the scheduler is already acting on is not rewritten while the TrainJob
            # runs; only a suspended TrainJob (no pods) may change it.
            return None
        return [build_pod_group(info, policy)]


def _policy(info: Info) -> CoschedulingPolicy | None:
    policy = info.pod_group_policy
    return policy.coscheduling if policy is not None else None


def build_pod_group(info: Info, policy: CoschedulingPolicy) -> Obj:
    members, resources = gang_totals(info)
    return {
        "apiVersion": POD_GROUP_API_VERSION,
        "kind": POD_GROUP_KIND,
        "metadata": info.child_metadata(info.name),
        "spec": {
            "minMember": members,
            "minResources": resources,
            "scheduleTimeoutSeconds": policy.schedule_timeout_seconds,
        },
    }


plugin = CoSchedulingPlugin()
