"""Admission of trainer objects: what the API server and our webhooks together accept.

One pipeline serves ``trainer render``, the operator's webhooks and the local API server:
hints for seed-style mistakes, then the CRD schema (unknown fields, defaults, OpenAPI and CEL
rules, transition rules on update), then the webhook rules (the runtime exists, plugin rules).
"""

from __future__ import annotations

import copy

from trainer.admission.hints import api_version_hint, hints
from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.apimachinery import structural
from trainer.apimachinery.errors import AdmissionError, FieldError, invalid, required
from trainer.apimachinery.openapi import schemas
from trainer.runtime.framework import Framework
from trainer.runtime.info import Facts, PluginError, ValidationContext

KINDS = (c.TRAINJOB_KIND, c.TRAINING_RUNTIME_KIND, c.CLUSTER_TRAINING_RUNTIME_KIND)
_ANCESTOR_CONTAINERS = {
    c.ANCESTOR_TRAINER: c.NODE,
    c.DATASET_INITIALIZER: c.DATASET_INITIALIZER,
    c.MODEL_INITIALIZER: c.MODEL_INITIALIZER,
}


def check_schema(obj: Obj, old: Obj | None, now: str) -> Obj:
    """Refuse unknown fields, apply CRD defaults, check OpenAPI and CEL rules; return the object."""
    kind = obj.get("kind", "")
    schema = schemas()[kind]
    errors = hints(obj)
    if errors:
        raise AdmissionError(errors)
    unknown = structural.unknown_fields(schema, obj)
    if unknown:
        raise AdmissionError(
            [
                FieldError(path.lstrip("."), "Invalid value", f'unknown field "{path.lstrip(".")}"')
                for path in unknown
            ]
        )
    admitted: Obj = structural.apply_defaults(schema, copy.deepcopy(obj))
    default_object(admitted, old, now)
    errors = structural.validate(schema, admitted, old)
    if errors:
        raise AdmissionError(errors)
    return admitted


def default_object(obj: Obj, old: Obj | None, now: str) -> None:
    """The defaulting webhooks: what they change before the schema is checked.

    docs/decisions.md §9: numbers are accepted where the CRDs take quantity strings (the Kubeflow SDK
    sends ``cpu: 2.0``; a runtime author writes ``cpu: 0.5``); they are written as canonical
    quantity strings, since the API server checks the schema after the mutating webhooks. For a
    TrainJob, each runtime patch gets the time it was last changed (docs/upstream-behaviour.md §defaulting).
    Any field may still have any type here: what is not of the expected shape is left for the
    schema to refuse.
    """
    from trainer.apimachinery import quantities

    kind = obj.get("kind", "")
    schema = schemas().get(kind)
    if schema is not None:
        quantities.accept_numbers(quantities.quantity_fields(schema), obj, old)
    if kind == c.TRAINJOB_KIND:
        stamp_runtime_patches(obj, old, now)


def stamp_runtime_patches(trainjob: Obj, old: Obj | None, now: str) -> None:
    """Upstream's runtimePatches defaulting: when each manager's patch last changed.

    On create a patch without a time gets ``now``. On update a manager's patch that is unchanged
    but for its time keeps the stored time (so re-applying a manifest is no change), a changed one
    gets ``now``, and a new manager's patch keeps a time it brings or gets ``now``.
    """
    spec = trainjob.get("spec")
    patches = spec.get("runtimePatches") if isinstance(spec, dict) else None
    if not isinstance(patches, list):
        return
    old_spec = (old or {}).get("spec")
    old_patches = old_spec.get("runtimePatches") if isinstance(old_spec, dict) else None
    before = {
        p["manager"]: p
        for p in old_patches or []
        if isinstance(p, dict) and isinstance(p.get("manager"), str)
    }
    for patch in patches:
        if not isinstance(patch, dict):
            continue
        manager = patch.get("manager")
        previous = before.get(manager) if isinstance(manager, str) else None
        if previous is None:
            if patch.get("time") is None:
                patch["time"] = now
        elif _without_time(previous) == _without_time(patch):
            if previous.get("time") is None:
                patch.pop("time", None)
            else:
                patch["time"] = previous["time"]
        else:
            patch["time"] = now


def _without_time(patch: Obj) -> Obj:
    return {k: v for k, v in patch.items() if k != "time"}


def check_version(obj: Obj) -> None:
    api_version = str(obj.get("apiVersion", ""))
    hint = api_version_hint(api_version)
    if hint:
        raise AdmissionError([invalid("apiVersion", api_version, hint)])


def check_metadata(obj: Obj) -> None:
    """ObjectMeta as the API server decodes it, before anything reads it: types and a name."""
    meta = obj.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise AdmissionError([invalid("metadata", meta, "must be an object")])
    errors: list[FieldError] = []
    name = meta.get("name")
    if name is None or name == "":
        if not meta.get("generateName"):
            errors.append(required("metadata.name", "name or generateName is required"))
    elif not isinstance(name, str):
        errors.append(invalid("metadata.name", name, "must be a string"))
    for key in ("namespace", "generateName"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            errors.append(invalid(f"metadata.{key}", meta[key], "must be a string"))
    for key in ("labels", "annotations"):
        values = meta.get(key)
        if values is None:
            continue
        if not isinstance(values, dict):
            errors.append(invalid(f"metadata.{key}", values, "must be a map of strings to strings"))
            continue
        errors += [
            invalid(f"metadata.{key}[{k}]", v, "must be a string")
            for k, v in values.items()
            if not isinstance(v, str)
        ]
    if errors:
        raise AdmissionError(errors)


def admit(obj: Obj, old: Obj | None, facts: Facts, framework: Framework, now: str) -> tuple[Obj, list[str]]:
    """Admit a create (``old`` None) or an update at ``now``; return the stored form and warnings.

    Raises AdmissionError with every reason found.
    """
    check_version(obj)
    check_metadata(obj)
    admitted = check_schema(obj, old, now)
    kind = admitted["kind"]
    # Upstream's webhooks decode the object into Go structs, where an integer that does not fit
    # its int32 or int64 field fails (the API server itself stores it): refuse it here too.
    overflows = structural.integer_overflows(schemas()[kind], admitted)
    if overflows:
        raise AdmissionError(overflows)
    if kind == c.TRAINJOB_KIND:
        warnings = validate_trainjob(admitted, old, facts, framework)
    else:
        warnings = validate_runtime(admitted, old, framework)
    return admitted, warnings


def validate_runtime(runtime_obj: Obj, old: Obj | None, framework: Framework) -> list[str]:
    """The runtime webhook: ancestor jobs have one replica and the container they need."""
    from trainer.api.runtime import TrainingRuntime

    errors: list[FieldError] = []
    # Upstream checks TrainingRuntimes on create only and ClusterTrainingRuntimes always.
    if old is None or runtime_obj["kind"] == c.CLUSTER_TRAINING_RUNTIME_KIND:
        jobs = ((runtime_obj.get("spec") or {}).get("template") or {}).get("spec", {}).get(
            "replicatedJobs"
        ) or []
        for i, rjob in enumerate(jobs):
            template = rjob.get("template") or {}
            ancestor = ((template.get("metadata") or {}).get("labels") or {}).get(c.ANCESTOR_LABEL)
            if ancestor not in _ANCESTOR_CONTAINERS:
                continue
            path = f"spec.template.spec.replicatedJobs[{i}]"
            if rjob.get("replicas", 1) != 1:
                # Upstream's words, which read well enough and which users search for.
                errors.append(invalid(f"{path}.replicas", rjob.get("replicas"), "always must be 1"))
            pod = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
            names = {ct.get("name") for ct in pod.get("containers") or []}
            if _ANCESTOR_CONTAINERS[ancestor] not in names:
                errors.append(
                    invalid(
                        f"{path}.template.spec.template.spec.containers",
                        "array",
                        f"must contain the required container for the ancestor: {ancestor}",
                    )
                )
    runtime = TrainingRuntime.view(runtime_obj)
    missing = framework.missing_for(runtime.spec)
    if missing:
        errors.append(
            invalid(
                "spec", "object", f"needs plugins that are disabled in this operator: {', '.join(missing)}"
            )
        )
    if errors:
        raise AdmissionError(errors)
    meta = runtime_obj.get("metadata") or {}
    if (
        old is None
        and runtime_obj["kind"] == c.CLUSTER_TRAINING_RUNTIME_KIND
        and (meta.get("labels") or {}).get(c.SUPPORT_LABEL) == c.SUPPORT_DEPRECATED
    ):
        return [deprecation_warning(meta.get("name"))]
    return []


def deprecation_warning(runtime_name: object) -> str:
    return (
        f'ClusterTrainingRuntime "{runtime_name}" is deprecated and will be removed in a future release '
        f"of Kubeflow Trainer. See runtime deprecation policy: {c.DEPRECATION_DOC_URL}"
    )


def validate_trainjob(trainjob_obj: Obj, old: Obj | None, facts: Facts, framework: Framework) -> list[str]:
    """The TrainJob webhook: the runtime exists, then every plugin's rules on the rendered Info."""
    from trainer.api.runtime import TrainingRuntime
    from trainer.api.trainjob import TrainJob
    from trainer.runtime.build import build_info
    from trainer.runtime.render import SUPPORTED_RUNTIMES, RuntimeNotFound, lookup_runtime, runtime_key

    spec = trainjob_obj["spec"]
    ref = spec.get("runtimeRef") or {}
    key = runtime_key(ref)
    if key not in SUPPORTED_RUNTIMES:
        raise AdmissionError([invalid("spec.runtimeRef", ref.get("kind"), f"unsupported runtime: {key}")])
    namespace = trainjob_obj["metadata"].get("namespace") or "default"
    try:
        runtime_obj = lookup_runtime(facts, ref, namespace)
    except RuntimeNotFound as exc:
        which = "trainingRuntime" if ref.get("kind") == c.TRAINING_RUNTIME_KIND else "clusterTrainingRuntime"
        raise AdmissionError(
            [
                invalid(
                    "spec.runtimeRef",
                    ref.get("name"),
                    f"{exc}: specified {which} must be created before the TrainJob is created",
                )
            ]
        ) from exc
    warnings: list[str] = []
    runtime_meta = runtime_obj.get("metadata") or {}
    if (
        runtime_obj.get("kind") == c.CLUSTER_TRAINING_RUNTIME_KIND
        and (runtime_meta.get("labels") or {}).get(c.SUPPORT_LABEL) == c.SUPPORT_DEPRECATED
    ):
        warnings.append("Referenced " + deprecation_warning(runtime_meta.get("name")))
    runtime = TrainingRuntime.view(runtime_obj)
    missing = framework.missing_for(runtime.spec)
    if missing:
        raise AdmissionError(
            [
                invalid(
                    "spec.runtimeRef",
                    ref.get("name"),
                    f"the runtime needs plugins that are disabled: {', '.join(missing)}",
                )
            ]
        )
    trainjob = TrainJob.view(trainjob_obj)
    old_model = TrainJob.view(old) if old is not None else None
    try:
        info = build_info(trainjob, trainjob_obj, runtime, runtime_obj, facts)
    except (PluginError, ValueError, KeyError, TypeError):
        info = None
    ctx = ValidationContext(
        trainjob=trainjob,
        trainjob_obj=trainjob_obj,
        old=old_model,
        old_obj=old,
        runtime=runtime,
        info=info,
        facts=facts,
        warnings=warnings,
    )
    errors: list[FieldError] = []
    for found in framework.hook.trainer_validate(ctx=ctx):
        errors.extend(found or [])
    if errors:
        raise AdmissionError(errors, ctx.warnings)
    return ctx.warnings
