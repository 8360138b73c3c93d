"""JobSet: turns the runtime's template into the JobSet that runs the TrainJob, and reads its status.

Also owns the admission checks on initializers and runtimePatches (they are about the JobSet
template).
"""

from __future__ import annotations

import copy
import re

from trainer.plugin import (
    Builds,
    Endpoints,
    Facts,
    FieldError,
    Info,
    Kind,
    Obj,
    PodSet,
    TrainingRuntimeSpec,
    ValidationContext,
    canonical_jobset_quantities,
    contains,
    controlled_by,
    dns1123_subdomain,
    find,
    forbidden,
    hookimpl,
    internal,
    invalid,
    upsert_env,
)
from trainer.plugin import constants as c

# The path part of a domain-prefixed path (Kubernetes' IsDomainPrefixedPath, which upstream uses
# for runtime patch managers).
_HTTP_PATH = r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+"
_ENVLESS_CONTAINERS = (c.DATASET_INITIALIZER, c.MODEL_INITIALIZER, c.NODE)


class JobSetPlugin:
    name = "JobSet"
    # The render core deletes the JobSet when the TrainJob's active deadline passes.
    kinds = (Builds(Kind(c.JOBSET_API_VERSION, c.JOBSET_KIND, "jobsets"), delete=True),)

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return True

    # --- admission ---

    @hookimpl
    def trainer_validate(self, ctx: ValidationContext) -> list[FieldError] | None:
        errors: list[FieldError] = []
        spec = ctx.trainjob.spec
        template = ctx.info.jobset_spec if ctx.info else (ctx.runtime.spec.template.spec or {})
        initializer = spec.initializer
        if initializer is not None:
            if initializer.dataset is not None:
                errors += _check_initializer(
                    template, c.DATASET_INITIALIZER, "datasetConfig", spec.runtime_ref.name
                )
            if initializer.model is not None:
                errors += _check_initializer(
                    template, c.MODEL_INITIALIZER, "modelConfig", spec.runtime_ref.name
                )
        for i, patch in enumerate(spec.runtime_patches or []):
            errors += _check_manager(f"spec.runtimePatches[{i}].manager", patch.manager)
            errors += _check_patch_targets(ctx, i)
        if ctx.old is not None:
            errors += _check_patch_update(ctx)
            errors += _check_resize(ctx)
        return errors or None

    # --- phases ---

    @hookimpl
    def trainer_pre_build_sync(self, info: Info) -> None:
        name = info.name
        subdomain = (info.jobset_spec.get("network") or {}).get("subdomain") or name
        for pod_set in info.pod_sets:
            pod_set.endpoints = Endpoints(
                f"{name}-{pod_set.name}", subdomain, pod_set.replicas, pod_set.count
            )
            job_spec = pod_set.replicated_job.setdefault("template", {}).setdefault("spec", {})
            job_spec["parallelism"] = pod_set.count
            job_spec["completions"] = pod_set.count

    @hookimpl
    def trainer_build(self, info: Info) -> list[Obj] | None:
        # Kept as it is while it runs: looked up as a kept child, so one this TrainJob does not
        # control stops the build (docs/decisions.md §11).
        existing = info.existing_child(c.JOBSET_KIND, info.name, group=c.JOBSET_GROUP)
        if existing is not None:
            if not info.trainjob.spec.suspend and not (existing.get("spec") or {}).get("suspend"):
                return None  # a running JobSet is never rewritten
            if (existing.get("metadata") or {}).get("deletionTimestamp"):
                return None  # being rebuilt (below): built afresh once it is gone
        elif info.scheduler.hold_pods:
            return None  # made once the group its pods join exists
        jobset = build_jobset(info)
        if existing is not None and not jobset_update_allowed(existing, jobset):
            if not (existing.get("spec") or {}).get("suspend"):
                # Being suspended: its Jobs as they are, so JobSet's webhook takes the suspend;
                # once suspended it is made again (below) if it still cannot take the rest.
                jobset["spec"]["replicatedJobs"] = copy.deepcopy(existing["spec"]["replicatedJobs"])
                return [jobset]
            # numNodes or resourcesPerNode changed while suspended (docs/decisions.md §resize):
            # JobSet's webhook refuses such an update, so the JobSet is made again.
            info.rebuild(existing)
            return None
        return [jobset]

    @hookimpl
    def trainer_compute_status(self, trainjob: Obj, facts: Facts) -> Obj | None:
        meta = trainjob.get("metadata") or {}
        jobset = facts.get(c.JOBSET_KIND, meta.get("namespace") or "default", meta.get("name", ""))
        if jobset is None or not controlled_by(jobset, trainjob):
            return None  # none, or another's of that name: its status is not this TrainJob's
        return jobset_status(jobset)


def build_jobset(info: Info) -> Obj:
    """The JobSet for the TrainJob, from the template every phase has worked on."""
    spec = info.jobset_spec
    trainjob = info.trainjob.spec
    for pod_set in info.pod_sets:
        if pod_set.ancestor in (c.DATASET_INITIALIZER, c.MODEL_INITIALIZER):
            pod_set.replicated_job["replicas"] = 1
            _apply_initializer(info, pod_set)
        trainer_env_here = pod_set.ancestor == c.ANCESTOR_TRAINER or (
            pod_set.name == c.NODE
            and info.ml_policy is not None
            and info.ml_policy.mpi is not None
            and info.ml_policy.mpi.run_launcher_as_node
        )
        if pod_set.ancestor == c.ANCESTOR_TRAINER:
            pod_set.replicated_job["replicas"] = 1
        node = pod_set.container(c.NODE)
        if trainjob.trainer is not None and node is not None:
            if pod_set.ancestor == c.ANCESTOR_TRAINER:
                _apply_trainer_overrides(info, node)
            if trainer_env_here and trainjob.trainer.env:
                upsert_env(node, trainjob.trainer.env)
        if info.scheduler.pod_labels or info.scheduler.pod_annotations:
            pod_meta = pod_set.replicated_job["template"]["spec"]["template"].setdefault("metadata", {})
            if info.scheduler.pod_labels:
                pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **info.scheduler.pod_labels}
            if info.scheduler.pod_annotations:
                pod_meta["annotations"] = {
                    **(pod_meta.get("annotations") or {}),
                    **info.scheduler.pod_annotations,
                }
        group = info.scheduler.scheduling_groups.get(pod_set.name)
        if group is not None:
            pod_set.pod_spec["schedulingGroup"] = {"podGroupName": group}
    canonical_jobset_quantities(spec)
    # Kept suspended while the group its pods join is made again (the Workload plugin).
    spec["suspend"] = trainjob.suspend or info.scheduler.hold_pods
    metadata: Obj = {"name": info.name, "namespace": info.namespace}
    if info.labels:
        metadata["labels"] = dict(info.labels)
    if info.annotations:
        metadata["annotations"] = dict(info.annotations)
    metadata["ownerReferences"] = [info.owner_reference()]
    return {"apiVersion": c.JOBSET_API_VERSION, "kind": c.JOBSET_KIND, "metadata": metadata, "spec": spec}


# What JobSet's update webhook lets change in the replicatedJobs of a JobSet that is, or is being,
# suspended (what Kueue needs): the pod template's labels and annotations, nodeSelector,
# tolerations and schedulingGates. Everything else in them is immutable.
_MUTABLE_POD_METADATA = ("labels", "annotations")
_MUTABLE_POD_SPEC = ("nodeSelector", "tolerations", "schedulingGates")


def jobset_update_allowed(existing: Obj, desired: Obj) -> bool:
    """Whether JobSet's webhook lets an update of ``existing`` (suspended, or being suspended)
    set what ``desired`` sets. ``existing`` holds the server's defaults besides what was sent, so
    what ``desired`` sets must be in it; container resources must match exactly, since a request
    or limit taken away is a change no default explains."""
    old = _fixed_part(existing)
    new = _fixed_part(desired)
    if not contains(old, new):
        return False
    for old_rj, new_rj in zip(old, new, strict=True):
        old_pod = (((old_rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        new_pod = (((new_rj.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        for key in ("containers", "initContainers"):
            for old_c, new_c in zip(old_pod.get(key) or [], new_pod.get(key) or [], strict=False):
                if (old_c.get("resources") or {}) != (new_c.get("resources") or {}):
                    return False
    return True


def _fixed_part(jobset: Obj) -> list[Obj]:
    """The JobSet's replicatedJobs less what JobSet's webhook lets a suspended JobSet change."""
    out: list[Obj] = []
    for rj in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        rj = copy.deepcopy(rj)
        pod = ((rj.get("template") or {}).get("spec") or {}).get("template")
        if isinstance(pod, dict):
            meta = pod.get("metadata")
            if isinstance(meta, dict):
                for key in _MUTABLE_POD_METADATA:
                    meta.pop(key, None)
                if not meta:
                    del pod["metadata"]  # as if never set: a template given labels alone
            pod_spec = pod.get("spec")
            if isinstance(pod_spec, dict):
                for key in _MUTABLE_POD_SPEC:
                    pod_spec.pop(key, None)
        out.append(rj)
    return out


def _check_manager(path: str, manager: str) -> list[FieldError]:
    """``host/path`` with host a DNS-1123 subdomain, as Kubernetes checks a domain-prefixed path."""
    host, slash, rest = manager.partition("/")
    if not slash or not host or not rest:
        return [invalid(path, manager, 'must be a domain-prefixed path (such as "acme.io/foo")')]
    errors = [invalid(path, host, problem) for problem in dns1123_subdomain(host)]
    if not re.fullmatch(_HTTP_PATH, rest):
        errors.append(invalid(path, rest, f"Invalid path (regex used for validation is '{_HTTP_PATH}')"))
    return errors


def _apply_initializer(info: Info, pod_set: PodSet) -> None:
    initializer = info.trainjob.spec.initializer
    if initializer is None:
        return
    source = initializer.dataset if pod_set.ancestor == c.DATASET_INITIALIZER else initializer.model
    container = pod_set.container(pod_set.ancestor or "")
    if source is None or container is None:
        return
    if source.storage_uri is not None:  # set, even when empty (upstream tests the pointer)
        upsert_env(container, [{"name": c.STORAGE_URI_ENV, "value": source.storage_uri}])
    if source.env:
        upsert_env(container, source.env)
    if source.secret_ref is not None:
        container.setdefault("envFrom", []).append({"secretRef": {"name": source.secret_ref.name}})


def _apply_trainer_overrides(info: Info, node: Obj) -> None:
    trainer = info.trainjob.spec.trainer
    assert trainer is not None
    if trainer.image:
        node["image"] = trainer.image
    command = info.trainer_command if info.trainer_command is not None else trainer.command
    if command is not None:
        node["command"] = list(command)
    if trainer.args is not None and not info.trainer_args_cleared:
        node["args"] = list(trainer.args)


def jobset_status(jobset: Obj) -> Obj:
    """What the TrainJob's status takes from its JobSet: terminal conditions and per-job counts."""
    status = jobset.get("status") or {}
    conditions = []
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Completed":
            conditions.append({**cond, "type": c.COND_COMPLETE})
        elif cond.get("type") == "Failed":
            conditions.append({**cond, "type": c.COND_FAILED})
    jobs = [
        {
            "name": rj.get("name"),
            "ready": int(rj.get("ready") or 0),
            "succeeded": int(rj.get("succeeded") or 0),
            "failed": int(rj.get("failed") or 0),
            "active": int(rj.get("active") or 0),
            "suspended": int(rj.get("suspended") or 0),
        }
        for rj in status.get("replicatedJobsStatus") or []
    ]
    return {"conditions": conditions, "jobsStatus": jobs}


# --- admission helpers ---


def _containers_by_job(jobset_spec: Obj) -> dict[str, set[str]]:
    jobs: dict[str, set[str]] = {}
    for rjob in jobset_spec.get("replicatedJobs") or []:
        pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        names = {
            ct.get("name") for ct in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
        }
        jobs[rjob.get("name", "")] = {n for n in names if n}
    return jobs


def _check_initializer(jobset_spec: Obj, job: str, config: str, runtime: str) -> list[FieldError]:
    rjob = find(jobset_spec.get("replicatedJobs"), job)
    if rjob is None:
        detail = f"must have a {job} job when trainJob is configured with input {config}"
        return [invalid("spec.runtimeRef", runtime, detail)]
    pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    container = find([*(pod.get("initContainers") or []), *(pod.get("containers") or [])], job)
    if container is None:
        return [
            invalid("spec.runtimeRef", runtime, f"must have a container with name {job} in the {job} job")
        ]
    if find(container.get("volumeMounts"), c.INITIALIZER_VOLUME) is None:
        detail = (
            f"must have a volumeMount with name {c.INITIALIZER_VOLUME} in container {job} of the {job} job"
        )
        return [invalid("spec.runtimeRef", runtime, detail)]
    return []


def _check_patch_targets(ctx: ValidationContext, index: int) -> list[FieldError]:
    """docs/decisions.md §2: a patch that names what the runtime lacks is refused, naming it."""
    errors: list[FieldError] = []
    patch = (ctx.trainjob_obj["spec"]["runtimePatches"][index].get("trainingRuntimeSpec") or {}).get(
        "template"
    ) or {}
    runtime_jobs = _containers_by_job(ctx.runtime.spec.template.spec or {})
    for j, rjob in enumerate((patch.get("spec") or {}).get("replicatedJobs") or []):
        path = f"spec.runtimePatches[{index}].trainingRuntimeSpec.template.spec.replicatedJobs[{j}]"
        name = rjob.get("name", "")
        if name not in runtime_jobs:
            errors.append(
                invalid(
                    f"{path}.name",
                    name,
                    "must not have a replicated job that doesn't exist in the runtime job template",
                )
            )
            continue
        pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        for field, what in (("initContainers", "an initContainer"), ("containers", "a container")):
            for k, container in enumerate(pod.get(field) or []):
                cname = container.get("name", "")
                cpath = f"{path}.template.spec.template.spec.{field}[{k}]"
                if cname not in runtime_jobs[name]:
                    errors.append(
                        invalid(
                            f"{cpath}.name",
                            cname,
                            f"must not have {what} that doesn't exist in the runtime job {name}",
                        )
                    )
                elif cname in _ENVLESS_CONTAINERS and container.get("env"):
                    errors.append(
                        invalid(
                            f"{cpath}.env",
                            None,
                            "must not have envs for the dataset-initializer, model-initializer, node containers",
                        )
                    )
    return errors


def _check_resize(ctx: ValidationContext) -> list[FieldError]:
    """docs/decisions.md §resize: the CRD lets numNodes and resourcesPerNode change while the
    TrainJob is suspended; not while its JobSet still has active Jobs (pods being stopped), whose
    replacement would overlap them."""
    assert ctx.old_obj is not None
    old_trainer = (ctx.old_obj.get("spec") or {}).get("trainer") or {}
    new_trainer = (ctx.trainjob_obj.get("spec") or {}).get("trainer") or {}
    changed = [f for f in ("numNodes", "resourcesPerNode") if old_trainer.get(f) != new_trainer.get(f)]
    if not changed:
        return []
    jobset = ctx.facts.get(c.JOBSET_KIND, ctx.trainjob.namespace, ctx.trainjob.name)
    if jobset is None:
        return []
    statuses = (jobset.get("status") or {}).get("replicatedJobsStatus") or []
    return [
        forbidden(
            f"spec.trainer.{changed[0]}",
            f"{' and '.join(changed)} cannot be changed while the JobSet's ReplicatedJob "
            f"{rj.get('name')} is still active",
        )
        for rj in statuses
        if isinstance(rj, dict) and isinstance(rj.get("active"), int) and rj["active"] > 0
    ]


def _check_patch_update(ctx: ValidationContext) -> list[FieldError]:
    assert ctx.old_obj is not None
    old_patches = ctx.old_obj.get("spec", {}).get("runtimePatches")
    new_patches = ctx.trainjob_obj.get("spec", {}).get("runtimePatches")
    if (old_patches or None) == (new_patches or None):
        return []
    old_suspended = bool(ctx.old_obj.get("spec", {}).get("suspend"))
    if not old_suspended and not ctx.trainjob.spec.suspend:
        return [
            forbidden(
                "spec.runtimePatches",
                "RuntimePatches can only be modified when the TrainJob is suspended before or after the update",
            )
        ]
    jobset = ctx.facts.get(c.JOBSET_KIND, ctx.trainjob.namespace, ctx.trainjob.name)
    if jobset is None:
        return []
    try:
        statuses = (jobset.get("status") or {}).get("replicatedJobsStatus") or []
        return [
            forbidden(
                "spec.runtimePatches",
                f"RuntimePatches cannot be modified when the JobSet's ReplicatedJob {rj.get('name')} is still active",
            )
            for rj in statuses
            if int(rj.get("active") or 0) > 0
        ]
    except (TypeError, ValueError) as exc:
        return [internal("spec.runtimePatches", f"cannot read the JobSet status: {exc}")]


plugin = JobSetPlugin()
