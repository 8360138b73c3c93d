"""v1's runPolicy and per-replica restartPolicy, in the places v2 decides the same things.

The TrainJob has activeDeadlineSeconds, ttlSecondsAfterFinished and suspend; the rest lives in a
runtime: the gang (podGroupPolicy, the Volcano queue annotation), the Job's backoffLimit and the
pods' restartPolicy. A job that needs any of these gets a TrainingRuntime of its own
(docs/migration.md §runtimes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.api.objects import Obj
from trainer.migrate.common import Notes

RUN_POLICY = "spec.runPolicy"
VOLCANO = "volcano"
COSCHEDULING = "coscheduling"
QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
# v1's ExitCode policy: exit codes 1-127 are permanent (the job fails), 128-255 are retried.
PERMANENT_EXIT_CODES = list(range(1, 128))


@dataclass
class Lifecycle:
    """What one v1 job's runPolicy becomes."""

    trainjob: Obj = field(default_factory=dict)  # TrainJob spec fields
    backoff_limit: int | None = None  # every Job of the generated runtime
    pod_group_policy: Obj | None = None
    queue: str | None = None  # the Volcano queue, as the runtime template's annotation
    priority_class: str | None = None  # the pods' priorityClassName, where the template has none

    @property
    def needs_runtime(self) -> bool:
        return self.backoff_limit is not None or self.pod_group_policy is not None


def run_policy(spec: Obj, templates: list[Obj], pods: int, notes: Notes) -> Lifecycle:
    """``spec.runPolicy`` (and the older top-level fields some kinds still accept)."""
    out = Lifecycle()
    policy: Obj = spec.get("runPolicy") or {}  # its types are checked before (shapes.py)
    for key in ("activeDeadlineSeconds", "ttlSecondsAfterFinished"):
        value = policy.get(key)
        if value is not None:
            out.trainjob[key] = value
    if policy.get("suspend"):
        out.trainjob["suspend"] = True
    clean = policy.get("cleanPodPolicy", spec.get("cleanPodPolicy"))
    if clean == "All":
        notes.warn(
            f"{RUN_POLICY}.cleanPodPolicy",
            "'All' is not carried: v2 stops a finished job's running pods and keeps the finished ones "
            "until the TrainJob is deleted (ttlSecondsAfterFinished deletes it)",
        )
    if policy.get("backoffLimit") is not None:
        out.backoff_limit = policy["backoffLimit"]
    scheduling = policy.get("schedulingPolicy")
    if isinstance(scheduling, dict):
        _gang(scheduling, templates, pods, out, notes)
    managed = policy.get("managedBy")
    if managed not in (None, "kubeflow.org/training-operator", "kubeflow.org/mpi-operator"):
        notes.warn(
            f"{RUN_POLICY}.managedBy", f"{managed!r} is not carried: the TrainJob is managed by the trainer"
        )
    return out


def _gang(scheduling: Obj, templates: list[Obj], pods: int, out: Lifecycle, notes: Notes) -> None:
    """schedulingPolicy: v1 made a PodGroup for the gang scheduler its operator was started with."""
    base = f"{RUN_POLICY}.schedulingPolicy"
    scheduler = notes.options.gang_scheduler
    if scheduler is None:
        names = {(t.get("spec") or {}).get("schedulerName") for t in templates}
        scheduler = VOLCANO if VOLCANO in names else COSCHEDULING
    if scheduler == VOLCANO:
        out.pod_group_policy = {"volcano": {}}
        if scheduling.get("queue"):
            out.queue = str(scheduling["queue"])
        if scheduling.get("priorityClass"):
            out.priority_class = str(scheduling["priorityClass"])
    else:
        policy: Obj = {}
        if scheduling.get("scheduleTimeoutSeconds") is not None:
            policy["scheduleTimeoutSeconds"] = scheduling["scheduleTimeoutSeconds"]
        out.pod_group_policy = {"coscheduling": policy}
        for key in ("queue", "priorityClass"):
            if scheduling.get(key):
                notes.warn(f"{base}.{key}", "is not carried: the coscheduling PodGroup has no such field")
    if scheduler == VOLCANO and scheduling.get("scheduleTimeoutSeconds") is not None:
        notes.warn(f"{base}.scheduleTimeoutSeconds", "is not carried: Volcano's PodGroup has no timeout")
    minimum = scheduling.get("minAvailable")
    if minimum is not None and minimum != pods:
        notes.warn(
            f"{base}.minAvailable",
            f"{minimum} is not carried: v2's gang is every pod of the job ({pods})",
        )
    if scheduling.get("minResources"):
        notes.warn(f"{base}.minResources", "is not carried: v2 sums the pods' requests for the PodGroup")


@dataclass
class Restart:
    """A v1 restartPolicy as a Job can say it: the pods' policy and, for ExitCode, a failure policy."""

    pod: str
    pod_failure_policy: Obj | None = None


def restart_policy(value: Any, default: str, path: str, notes: Notes) -> Restart:
    value = default if value in (None, "") else value
    if value in ("OnFailure", "Never"):
        return Restart(str(value))
    if value == "Always":
        notes.warn(
            path, "'Always' becomes 'OnFailure': a Job's pods cannot restart a container that succeeded"
        )
        return Restart("OnFailure")
    if value == "ExitCode":
        # Permanent exit codes fail the Job at once; the others are retried up to backoffLimit.
        return Restart(
            "Never",
            {
                "rules": [
                    {"action": "FailJob", "onExitCodes": {"operator": "In", "values": PERMANENT_EXIT_CODES}}
                ]
            },
        )
    notes.loss(path, f"{value!r} is not a v1 restart policy")
    return Restart("OnFailure")
