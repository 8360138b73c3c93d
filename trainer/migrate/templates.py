"""v1 pod templates as v2 carries them: the TrainJob's trainer fields plus a runtime patch when a
bundled runtime fits, or whole in a TrainingRuntime of the job's own when it does not.

v2's plugins set their env and mounts on the container named ``node``, so the v1 training
container takes that name in a generated runtime (docs/migration.md §runtimes).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.migrate.common import PATCH_MANAGER, TRAINJOB_API, Notes
from trainer.migrate.errors import Refusal

# Container fields the TrainJob's trainer carries, and those a runtime patch carries.
TRAINER_FIELDS = ("image", "command", "args", "env", "resources")
CONTAINER_PATCH_FIELDS = ("volumeMounts", "securityContext")
# Pod fields a runtime patch carries (trainer/api/trainjob.py PodSpecPatch).
POD_PATCH_FIELDS = (
    "affinity",
    "imagePullSecrets",
    "nodeSelector",
    "schedulingGates",
    "securityContext",
    "serviceAccountName",
    "terminationGracePeriodSeconds",
    "tolerations",
    "volumes",
)
# What a bundled runtime's pods get without a patch: the JobSet's default restart policy.
BUNDLED_RESTART = "OnFailure"


@dataclass
class Split:
    """A v1 template on a bundled runtime: ``blockers`` name what only a TrainingRuntime carries."""

    trainer: Obj = field(default_factory=dict)
    patch: Obj = field(default_factory=dict)
    blockers: list[str] = field(default_factory=list)


def main_container(template: Obj, container: str, base: str, notes: Notes | None = None) -> Obj:
    """v1's training container, by v1's name for it. A pod of one container named otherwise (as
    some upstream examples have it) is taken as the training container, with a Warning: v1 looked
    its port and env up by the name."""
    containers = [x for x in (template.get("spec") or {}).get("containers") or [] if isinstance(x, dict)]
    for candidate in containers:
        if candidate.get("name") == container:
            return candidate
    if notes is not None and len(containers) == 1:
        notes.warn(
            f"{base}.spec.containers[{containers[0].get('name')}]",
            f"is not named {container!r}, the name v1 looked its training container up by; it is "
            "taken as the training container",
        )
        return containers[0]
    raise Refusal(f"{base}.spec.containers", f"no container named {container!r} (v1's training container)")


def user_env(main: Obj, reserved: tuple[str, ...], path: str, notes: Notes) -> list[Obj]:
    """The container's env without what the v2 plugin sets itself (a TrainJob may not set it)."""
    env = []
    for var in main.get("env") or []:
        if isinstance(var, dict) and var.get("name") in reserved:
            notes.warn(f"{path}.env[{var['name']}]", "is not carried: v2's plugin sets it, with v1's meaning")
        else:
            env.append(copy.deepcopy(var))
    return env


def with_v1_env(env: list[Obj], added: list[Obj]) -> list[Obj]:
    """v1's controller appended its env after the user's, so a duplicated name saw v1's value."""
    ours = {a["name"] for a in added}
    return [*[e for e in env if e.get("name") not in ours], *added]


def split(template: Obj, container: str, base: str, env: list[Obj]) -> Split:
    """The trainer fields and the node job's pod template patch for a bundled runtime."""
    out = Split()
    pod = template.get("spec") or {}
    main = main_container(template, container, base)
    for other in pod.get("containers") or []:
        if other is not main:
            out.blockers.append(
                f"{base}.spec.containers[{other.get('name') if isinstance(other, dict) else '?'}]"
            )
    for key in ("image", "command", "args", "resources"):
        if main.get(key):
            out.trainer["resourcesPerNode" if key == "resources" else key] = copy.deepcopy(main[key])
    if env:
        out.trainer["env"] = env
    container_patch = {k: copy.deepcopy(main[k]) for k in CONTAINER_PATCH_FIELDS if main.get(k)}
    for key in main:
        if key not in (*TRAINER_FIELDS, *CONTAINER_PATCH_FIELDS, "name") and main[key] not in (
            None,
            [],
            {},
            "",
        ):
            out.blockers.append(f"{base}.spec.containers[{container}].{key}")
    spec_patch: Obj = {}
    for key, value in pod.items():
        if key in ("containers", "restartPolicy") or value in (None, [], {}, ""):
            continue
        if key in POD_PATCH_FIELDS:
            spec_patch[key] = copy.deepcopy(value)
        else:
            out.blockers.append(f"{base}.spec.{key}")
    if container_patch:
        spec_patch["containers"] = [{"name": c.NODE, **container_patch}]
    meta = {
        k: copy.deepcopy(v)
        for k, v in (template.get("metadata") or {}).items()
        if k in ("labels", "annotations") and v
    }
    for key in template.get("metadata") or {}:
        if key not in ("labels", "annotations") and (template.get("metadata") or {})[key]:
            out.blockers.append(f"{base}.metadata.{key}")
    if meta:
        out.patch["metadata"] = meta
    if spec_patch:
        out.patch["spec"] = spec_patch
    return out


def runtime_patches(node_patch: Obj) -> list[Obj]:
    if not node_patch:
        return []
    rjob = {"name": c.NODE, "template": {"spec": {"template": node_patch}}}
    return [
        {
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [rjob]}}},
        }
    ]


def pod_template(
    template: Obj,
    container: str | None,
    env: list[Obj] | None,
    restart: str,
    priority_class: str | None = None,
    *,
    base: str,
    others_env: list[Obj] | None = None,
) -> Obj:
    """The v1 template whole, for a generated runtime: the training container renamed ``node``
    with ``env`` as its env, and the restart policy a Job can have. ``others_env`` is v1's env for
    every other container, for the kinds whose v1 controller set it on all of them."""
    out = copy.deepcopy(template)
    meta = {
        k: v for k, v in (out.pop("metadata", None) or {}).items() if k in ("labels", "annotations") and v
    }
    if meta:
        out = {"metadata": meta, **out}
    spec = out["spec"]
    for each in spec.get("containers") or []:
        if not isinstance(each, dict):
            continue
        if container is not None and each.get("name") == container:
            each["name"] = c.NODE
            if env:
                each["env"] = env
            else:
                each.pop("env", None)
            continue
        if container is not None and each.get("name") == c.NODE:
            raise Refusal(
                f"{base}.spec.containers[{c.NODE}]",
                f"v2 renames the training container {container!r} to {c.NODE!r}, the name its "
                "plugins set env and mounts on; another container of that name cannot stay beside it",
            )
        if others_env:
            each["env"] = with_v1_env(list(each.get("env") or []), copy.deepcopy(others_env))
    spec["restartPolicy"] = restart
    if priority_class and not spec.get("priorityClassName"):
        spec["priorityClassName"] = priority_class
    return out


def replicated_job(
    name: str,
    pod: Obj,
    *,
    replicas_per_job: int | None = None,
    backoff_limit: int | None = None,
    pod_failure_policy: Obj | None = None,
    trainer: bool = False,
    depends_on: list[Obj] | None = None,
) -> Obj:
    """One replicated job of a generated runtime (one Job; its parallelism from the counts)."""
    job_spec: Obj = {}
    if replicas_per_job is not None:
        job_spec["parallelism"] = replicas_per_job
        job_spec["completions"] = replicas_per_job
    if backoff_limit is not None:
        job_spec["backoffLimit"] = backoff_limit
    if pod_failure_policy is not None:
        job_spec["podFailurePolicy"] = copy.deepcopy(pod_failure_policy)
    job_spec["template"] = pod
    template: Obj = {"spec": job_spec}
    if trainer:
        template = {"metadata": {"labels": {c.ANCESTOR_LABEL: c.ANCESTOR_TRAINER}}, **template}
    out: Obj = {"name": name}
    if depends_on:
        out["dependsOn"] = depends_on
    out["template"] = template
    return out


def training_runtime(
    metadata: Obj,
    framework: str,
    ml_policy: Obj,
    replicated_jobs: list[Obj],
    *,
    pod_group_policy: Obj | None = None,
    queue: str | None = None,
    jobset_spec: Obj | None = None,
) -> Obj:
    """A TrainingRuntime in the job's namespace, named after it."""
    spec: Obj = {"mlPolicy": ml_policy}
    if pod_group_policy is not None:
        spec["podGroupPolicy"] = pod_group_policy
    template: Obj = {}
    if queue:
        template["metadata"] = {"annotations": {"scheduling.volcano.sh/queue-name": queue}}
    template["spec"] = {**(jobset_spec or {}), "replicatedJobs": replicated_jobs}
    spec["template"] = template
    meta: Obj = {"name": metadata["name"]}
    if metadata.get("namespace"):
        meta["namespace"] = metadata["namespace"]
    meta["labels"] = {"trainer.kubeflow.org/framework": framework}
    return {"apiVersion": TRAINJOB_API, "kind": "TrainingRuntime", "metadata": meta, "spec": spec}


def own_runtime_ref(name: str) -> Obj:
    return {"name": name, "kind": "TrainingRuntime"}
