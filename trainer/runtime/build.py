"""Build the Info of one TrainJob from its runtime: patches applied, pod sets counted, resources merged."""

from __future__ import annotations

from typing import Any

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.api.views import TrainingRuntime, TrainJob
from trainer.apimachinery.strategic_merge import jobset_merge_keys, strategic_merge
from trainer.runtime.info import Facts, Info, PluginError, PodSet
from trainer.runtime.podspec import find, merge_resources


def _unshared(value: Any) -> Any:
    """A deep copy in which no two places hold the same object. copy.deepcopy keeps aliases, and a
    runtime read from YAML with anchors (``containers: *same``) shares one dict between replicated
    jobs: a plugin changing the launcher's container would change the nodes' too."""
    if isinstance(value, dict):
        return {key: _unshared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unshared(item) for item in value]
    return value


def build_info(
    trainjob: TrainJob,
    trainjob_obj: Obj,
    runtime: TrainingRuntime,
    runtime_obj: Obj,
    facts: Facts,
    *,
    now: str = "1970-01-01T00:00:00Z",
) -> Info:
    template = runtime_obj.get("spec", {}).get("template") or {}
    if "spec" in template and not isinstance(template["spec"], dict):
        raise PluginError("unsupported runtimeTemplateSpec")
    meta = template.get("metadata") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    annotations: dict[str, str] = dict(meta.get("annotations") or {})
    jobset_spec: Obj = _unshared(template.get("spec") or {})
    original_order = [rj.get("name") for rj in jobset_spec.get("replicatedJobs") or []]

    for patch in trainjob_obj.get("spec", {}).get("runtimePatches") or []:
        patch_template = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
        patch_meta = patch_template.get("metadata") or {}
        labels.update(patch_meta.get("labels") or {})
        annotations.update(patch_meta.get("annotations") or {})
        if patch_template.get("spec"):
            jobset_spec = strategic_merge(jobset_spec, patch_template["spec"], jobset_merge_keys)
    if "replicatedJobs" in jobset_spec:
        position = {name: i for i, name in enumerate(original_order)}
        jobset_spec["replicatedJobs"] = sorted(
            jobset_spec["replicatedJobs"], key=lambda rj: position.get(rj.get("name"), 0)
        )

    ml_policy = runtime.spec.ml_policy
    mpi = ml_policy.mpi if ml_policy else None
    trainer = trainjob.spec.trainer
    pod_sets: list[PodSet] = []
    for rjob in jobset_spec.get("replicatedJobs") or []:
        ancestor = (
            ((rjob.get("template") or {}).get("metadata") or {}).get("labels", {}).get(c.ANCESTOR_LABEL)
        )
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        count = job_spec.get("parallelism")
        count = 1 if count is None else int(count)
        if ancestor == c.ANCESTOR_TRAINER and ml_policy is not None:
            count = ml_policy.num_nodes if ml_policy.num_nodes is not None else 1
        pod_set = PodSet(
            name=rjob.get("name", ""), ancestor=ancestor, count=max(count, 1), replicated_job=rjob
        )
        merge_here = (ancestor == c.ANCESTOR_TRAINER and ml_policy is not None) or (
            pod_set.name == c.NODE and mpi is not None and mpi.run_launcher_as_node
        )
        if trainer is not None and trainer.resources_per_node is not None and merge_here:
            node = find(pod_set.pod_spec.get("containers"), c.NODE)
            if node is not None:
                node["resources"] = merge_resources(node.get("resources"), trainer.resources_per_node)
        pod_sets.append(pod_set)

    return Info(
        trainjob=trainjob,
        trainjob_obj=trainjob_obj,
        runtime=runtime,
        runtime_obj=runtime_obj,
        runtime_kind=runtime_obj.get("kind", ""),
        labels=labels,
        annotations=annotations,
        jobset_spec=jobset_spec,
        pod_sets=pod_sets,
        facts=facts,
        now=now,
    )


def runtime_resources(info: Info) -> Obj | None:
    """The trainer node's resources as the runtime gives them (after the TrainJob merge).

    The first replicated job named ``node`` or with the trainer ancestor whose ``node`` container
    has a resources block; what upstream reads for process and GPU counts.
    """
    for pod_set in info.pod_sets:
        if pod_set.name == c.NODE or pod_set.ancestor == c.ANCESTOR_TRAINER:
            node = pod_set.container(c.NODE)
            if node is not None and node.get("resources") is not None:  # `{}` is a block too
                resources: Obj = node["resources"]
                return resources
    return None


def effective_resources(info: Info) -> Obj | None:
    """The TrainJob's resourcesPerNode alone when set, else the runtime's (docs/upstream-behaviour.md
    §torch-nproc, §quirks)."""
    trainer = info.trainjob.spec.trainer
    if trainer is not None and trainer.resources_per_node is not None:
        return trainer.resources_per_node
    return runtime_resources(info)


def gang_totals(info: Info) -> tuple[int, dict[str, str]]:
    """Pods and resources the whole TrainJob needs at once: what a gang scheduler's PodGroup asks
    for (docs/upstream-behaviour.md §coscheduling, §volcano). Every pod set counts, initializers and
    launcher included, with its final count; resources requested by no pod are absent; quantities
    are canonical strings."""
    from trainer.api.quantity import Quantity, pod_requests

    members = 0
    totals: dict[str, Quantity] = {}
    for pod_set in info.pod_sets:
        members += pod_set.count
        try:
            requests = pod_requests(pod_set.pod_spec)
        except ValueError as exc:
            raise PluginError(f"replicatedJob {pod_set.name}: cannot read resource requests: {exc}") from exc
        for name, quantity in requests.items():
            scaled = quantity * pod_set.count
            totals[name] = totals[name] + scaled if name in totals else scaled
    return members, {name: totals[name].canonical() for name in sorted(totals)}
