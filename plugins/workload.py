"""Workload: gang scheduling by kube-scheduler itself, through its Workload and PodGroup.

Kubernetes 1.36 serves ``scheduling.k8s.io/v1alpha2`` behind the GenericWorkload and
GangScheduling gates: a PodGroup with a gang policy of ``minCount`` pods, which pods join through
their ``spec.schedulingGroup``. The scheduler admits none of a gang's pods to its queue until
``minCount`` of them exist, and binds none until all of them have a place, so a TrainJob never
holds part of its nodes while the rest wait. No scheduler of another project is needed
(docs/scheduling.md).

The gang is the pods that start together: initializers, which run to completion before the
trainer starts, are left out; a replicated job that waits for another to be Ready (the MPI
launcher waits for its nodes) joins the group after its quorum and does not count towards it.
Upstream has no such source (its proposal, kubeflow/trainer#3015, has no code).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from trainer.plugin import (
    Builds,
    Info,
    Kind,
    Obj,
    PodSet,
    TrainingRuntimeSpec,
    WorkloadPolicy,
    constants,
    contains,
    hookimpl,
)

c = constants
API_VERSION = "scheduling.k8s.io/v1alpha2"
GROUP = "scheduling.k8s.io"
WORKLOAD = Kind(API_VERSION, "Workload", "workloads")
POD_GROUP = Kind(API_VERSION, "PodGroup", "podgroups")
# The one PodGroupTemplate of a TrainJob's Workload, which its PodGroup names.
TEMPLATE_NAME = "gang"
SCHEDULED = "PodGroupScheduled"
REASON_TIMEOUT = "GangScheduleTimeout"
MAX_SCHEDULER_MESSAGE = 500


class WorkloadPlugin:
    name = "Workload"
    # Served only with the gates on. Both specs are immutable: never patched, made again instead.
    kinds = (
        Builds(WORKLOAD, label=c.TRAINJOB_NAME_LABEL, optional=True, patch=False, delete=True),
        Builds(POD_GROUP, label=c.TRAINJOB_NAME_LABEL, optional=True, patch=False, delete=True),
    )

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.pod_group_policy is not None and spec.pod_group_policy.workload is not None

    @hookimpl
    def trainer_enforce_pod_group_policy(self, info: Info) -> None:
        if _policy(info) is None:
            return
        for pod_set in gang(info):
            info.scheduler.scheduling_groups[pod_set.name] = info.name
        _, entries = plan(info)
        if any(action in (REBUILD, WAIT) for _, _, action in entries):
            # Pods made now would join the old PodGroup (or none): they wait for the new one.
            info.scheduler.hold_pods = True

    @hookimpl
    def trainer_build(self, info: Info) -> list[Obj] | None:
        policy = _policy(info)
        if policy is None:
            return None
        min_count, entries = plan(info)
        built: list[Obj] = []
        for obj, existing, action in entries:
            if action == BUILD:
                built.append(obj)  # new, or as it should be: then the writer writes nothing
            elif action == REBUILD and existing is not None:
                info.rebuild(existing)
        if not info.scheduler.hold_pods:
            _check_timeout(info, policy, min_count)
        return built


# What becomes of each of the gang's objects in one render.
BUILD, KEEP, REBUILD, WAIT = "build", "keep", "rebuild", "wait"


def plan(info: Info) -> tuple[int, list[tuple[Obj, Obj | None, str]]]:
    """``minCount``, and the Workload and the PodGroup as they should be, each with the one that
    exists and what to do. Both specs are immutable. While pods run, the scheduler acts on them: kept as they are.
    While none run (no JobSet, a suspended one, one being deleted), one whose spec is out of date
    (numNodes changed while suspended, docs/decisions.md §resize) or on which the scheduler has
    already given a verdict (a condition from the last run) is made again, and its pods wait."""
    min_count = quorum(info)
    idle = _pods_gone_or_going(info)
    found: list[tuple[Obj, Obj | None, str]] = []
    for obj in (build_workload(info, min_count), build_pod_group(info, min_count)):
        existing = info.existing_child(obj["kind"], info.name, group=GROUP)
        if existing is None:
            found.append((obj, None, BUILD))
            continue
        going = bool((existing.get("metadata") or {}).get("deletionTimestamp"))
        stale = not contains(existing.get("spec"), obj["spec"]) or bool(_conditions(existing))
        if idle and going:
            found.append((obj, existing, WAIT))  # made again once it is gone
        elif idle and stale:
            found.append((obj, existing, REBUILD))
        else:
            found.append((obj, existing, KEEP if stale or going else BUILD))
    return min_count, found


def _policy(info: Info) -> WorkloadPolicy | None:
    policy = info.pod_group_policy
    return policy.workload if policy is not None else None


def _depends_on(pod_set: PodSet) -> list[Obj]:
    return list(pod_set.replicated_job.get("dependsOn") or [])


def _stages(info: Info) -> dict[str, int]:
    """Each pod set's stage: how many replicated jobs must complete, one after another, before
    its pods are made. Waiting for another to be Ready keeps that one's stage."""
    by_name = {ps.name: ps for ps in info.pod_sets}
    found: dict[str, int] = {}

    def stage(name: str, seen: frozenset[str]) -> int:
        if name in found:
            return found[name]
        if name in seen or name not in by_name:
            return 0  # a cycle or an unknown name: JobSet's admission refuses both
        value = 0
        for dep in _depends_on(by_name[name]):
            before = stage(str(dep.get("name")), seen | {name})
            value = max(value, before + 1 if dep.get("status") == "Complete" else before)
        found[name] = value
        return value

    for name in by_name:
        stage(name, frozenset())
    return found


def gang(info: Info) -> list[PodSet]:
    """The pod sets whose pods join the gang: those made when the trainer's are. What the trainer
    waits to complete (initializers) runs before it, what waits for it to complete after it."""
    stages = _stages(info)
    trainer = info.trainer_pod_set() or max(info.pod_sets, key=lambda ps: ps.count * ps.replicas)
    return [ps for ps in info.pod_sets if stages[ps.name] == stages[trainer.name]]


def quorum(info: Info) -> int:
    """``minCount``: every pod of the gang that is made at once; a pod set that waits for another
    of the gang to be Ready joins later and is not counted."""
    members = gang(info)
    names = {ps.name for ps in members}
    late = {
        ps.name
        for ps in members
        if any(d.get("status") == "Ready" and d.get("name") in names for d in _depends_on(ps))
    }
    return max(1, sum(ps.count * ps.replicas for ps in members if ps.name not in late))


def build_workload(info: Info, min_count: int) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": WORKLOAD.kind,
        "metadata": info.child_metadata(info.name),
        "spec": {
            "controllerRef": {"apiGroup": c.GROUP, "kind": c.TRAINJOB_KIND, "name": info.name},
            "podGroupTemplates": [{"name": TEMPLATE_NAME, "schedulingPolicy": _gang_policy(min_count)}],
        },
    }


def build_pod_group(info: Info, min_count: int) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": POD_GROUP.kind,
        "metadata": info.child_metadata(info.name),
        "spec": {
            "podGroupTemplateRef": {
                "workload": {"workloadName": info.name, "podGroupTemplateName": TEMPLATE_NAME}
            },
            "schedulingPolicy": _gang_policy(min_count),
        },
    }


def _gang_policy(min_count: int) -> Obj:
    return {"gang": {"minCount": min_count}}


def _pods_gone_or_going(info: Info) -> bool:
    """No JobSet runs the TrainJob's pods: none, a suspended one, or one being deleted."""
    jobset = info.facts.get(c.JOBSET_KIND, info.namespace, info.name, group=c.JOBSET_GROUP)
    if jobset is None:
        return True
    return bool((jobset.get("spec") or {}).get("suspend")) or bool(
        (jobset.get("metadata") or {}).get("deletionTimestamp")
    )


def _check_timeout(info: Info, policy: WorkloadPolicy, min_count: int) -> None:
    """A gang kube-scheduler found it could not place (``PodGroupScheduled`` False: all its pods
    exist, and they do not fit) and has not placed ``scheduleTimeoutSeconds`` later fails the
    TrainJob; until then it is looked at again when the time is up. The clock is the scheduler's
    own condition, so initializers' time, a suspension or an operator restart count for nothing."""
    seconds = policy.schedule_timeout_seconds
    if seconds is None or info.trainjob.spec.suspend:
        return
    pod_group = info.facts.get(POD_GROUP.kind, info.namespace, info.name, group=GROUP)
    scheduled = next((x for x in _conditions(pod_group) if x.get("type") == SCHEDULED), None)
    if scheduled is None or scheduled.get("status") == "True" or not scheduled.get("lastTransitionTime"):
        return
    waited = _time(info.now) - _time(str(scheduled["lastTransitionTime"]))
    remaining = (timedelta(seconds=seconds) - waited).total_seconds()
    if remaining > 0:
        info.requeue_within(max(1.0, remaining))
        return
    said = str(scheduled.get("message") or "")
    if len(said) > MAX_SCHEDULER_MESSAGE:
        said = said[:MAX_SCHEDULER_MESSAGE] + " ..."
    info.fail(
        REASON_TIMEOUT,
        f"the gang of {min_count} pods (PodGroup {info.name}) was not scheduled within "
        f"scheduleTimeoutSeconds ({seconds}s)" + (f": {said}" if said else ""),
    )


def _conditions(obj: Obj | None) -> list[Obj]:
    return list(((obj or {}).get("status") or {}).get("conditions") or [])


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


plugin = WorkloadPlugin()
