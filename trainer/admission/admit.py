"""Admission of trainer objects: what the API server and our webhooks together accept.

One pipeline, in two modes (:class:`Mode`; docs/architecture.md, Admission). ``FULL`` is what a
cluster does as a whole, for ``trainer render``: ObjectMeta decoding, strict decoding (unknown
fields), nulls dropped, CRD defaults, the defaulting webhook, ObjectMeta, OpenAPI and CEL rules
(transition rules on update), then the webhook rules (the runtime exists, plugin rules); hints
for seed-style mistakes reword the refusal. ``WEBHOOK`` is the operator's validating webhook: the
API server has decoded the object, applied the CRD's defaults, run the mutating webhooks and
checked the schema and its CEL rules before it calls us, so only the rules no CRD can state
remain (Go integer decoding, the runtime lookup, plugin rules, update rules outside CEL). Running
our copy of the schema there again could only refuse what the server accepted.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
from typing import Any

from trainer.admission.hints import Hint, api_version_hint, hints
from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.apimachinery import defaulting, formats, object_meta, pruning, schema_validation
from trainer.apimachinery.errors import AdmissionError, FieldError, forbidden, invalid
from trainer.apimachinery.openapi import schemas
from trainer.runtime.framework import Framework
from trainer.runtime.info import Facts, PluginError, ValidationContext

KINDS = (c.TRAINJOB_KIND, c.TRAINING_RUNTIME_KIND, c.CLUSTER_TRAINING_RUNTIME_KIND)
_ANCESTOR_CONTAINERS = {
    c.ANCESTOR_TRAINER: c.NODE,
    c.DATASET_INITIALIZER: c.DATASET_INITIALIZER,
    c.MODEL_INITIALIZER: c.MODEL_INITIALIZER,
}


class Mode(enum.Enum):
    """Which stages of the pipeline run (the module's docstring)."""

    FULL = "full"  # offline: everything a cluster's API server and our webhooks do
    WEBHOOK = "webhook"  # after the API server: only what our webhooks alone can check

    @property
    def checks_schema(self) -> bool:
        """Hints, metadata decoding, unknown fields, CRD defaults, defaulting, OpenAPI and CEL."""
        return self is Mode.FULL


def check_schema(obj: Obj, old: Obj | None, now: str) -> Obj:
    """What the API server does with a custom resource, in its order; return the object to store.

    Strict decoding (unknown fields, in ``metadata`` too), nulls of non-nullable fields dropped,
    CRD defaults, the defaulting webhook, then one validation stage: ObjectMeta (a name, a DNS
    subdomain; labels and annotations), the OpenAPI schema and the CEL rules (transition rules on
    update). ``hints`` reword an error of the stage that refuses (``admit``).
    """
    kind = obj.get("kind", "")
    schema = schemas()[kind]
    unknown = pruning.unknown_meta_fields(obj) + pruning.unknown_fields(schema, obj)
    if unknown:
        raise AdmissionError(
            [
                FieldError(path.lstrip("."), "Invalid value", f'unknown field "{path.lstrip(".")}"')
                for path in sorted(unknown)
            ]
        )
    admitted: Obj = copy.deepcopy(obj)
    if admitted.get("metadata") is None:
        admitted["metadata"] = {}  # decoded into ObjectMeta: null is empty
    meta = admitted["metadata"]
    if not isinstance(meta, dict):  # check_metadata refuses it first
        raise AdmissionError([invalid("metadata", meta, "must be an object")])
    for key in ("labels", "annotations"):
        values = meta.get(key)
        if isinstance(values, dict):
            # ObjectMeta is decoded into Go structs, where a null string is the empty string.
            meta[key] = {k: "" if v is None else v for k, v in values.items()}
    defaulting.drop_non_nullable_nulls(schema, admitted)
    defaulting.apply_defaults(schema, admitted)
    before = copy.deepcopy(admitted)
    default_object(admitted, old, now)
    if admitted != before:
        # The API server applies a mutating webhook's patch to the object encoded as JSON and
        # decodes the result: Go writes an integral float64 as an integer (1.0 as 1), so from
        # there on the integer fields' CEL rules see an int where they would see a float64.
        admitted = integral_floats_as_ints(admitted)
    meta_errors = object_meta.validate_object_meta(admitted["metadata"], require_name=True)
    errors = schema_validation.validate(schema, admitted, old, meta=meta_errors)
    if errors:
        raise AdmissionError(errors)
    return admitted


def integral_floats_as_ints(value: Any) -> Any:
    """``value`` as Go's encoding/json writes it and decodes it again: a float that is an integer
    (and not written in exponent form, below 1e21) comes back an integer."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 1e21 else value
    if isinstance(value, dict):
        return {k: integral_floats_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral_floats_as_ints(v) for v in value]
    return value


def with_hints(errors: list[FieldError], hinted: list[Hint]) -> list[FieldError]:
    """``errors`` with the ones a hint explains told what to write instead.

    The hints (docs/decisions.md §7) reword the refusal of whichever stage refuses first: the field
    paths stay those the API server and the webhooks name. An error at the hinted field takes the
    hint's wording; one at a field the hint has words for (``Hint.elsewhere``) keeps its path,
    type and value and takes those words; one at another parent of the hinted field gets the
    hint's words after the rest of the path below it. Each hint is given once, at the first error
    it explains, so a line never repeats it nor a path.
    """
    if not hinted:
        return errors
    out: list[FieldError] = []
    unused = list(hinted)
    for error in errors:
        for hint in unused:
            if hint.path == error.path:
                reworded = hint.error
            elif error.path in hint.elsewhere:
                reworded = FieldError(error.path, error.type, hint.elsewhere[error.path], error.value)
            elif hint.path.startswith(error.path + "."):
                below = hint.path[len(error.path) + 1 :]
                reworded = FieldError(error.path, error.type, f"{below}: {hint.error.detail}", error.value)
            else:
                continue
            unused.remove(hint)
            out.append(reworded)
            break
        else:
            out.append(error)
    return out


def default_object(obj: Obj, old: Obj | None, now: str) -> None:
    """The defaulting webhooks: what they change before the schema is checked.

    docs/decisions.md §9: numbers are accepted where the CRDs take quantity strings (the Kubeflow SDK
    sends ``cpu: 2.0``; a runtime author writes ``cpu: 0.5``). A whole number is the schema's
    int-or-string integer and is kept as written; a fraction is written as a quantity string,
    since the API server checks the schema after the mutating webhooks. For a
    TrainJob, each runtime patch gets the time it was last changed (docs/upstream-behaviour.md §defaulting).
    On an update, a field of ours beyond upstream's API that the update leaves out keeps its stored
    value (admission/extensions.py: clients built on upstream's types drop it). Any field may still
    have any type here: what is not of the expected shape is left for the schema to refuse.
    """
    from trainer.admission.extensions import keep_extensions
    from trainer.apimachinery import schema_quantities

    keep_extensions(obj, old)
    kind = obj.get("kind", "")
    schema = schemas().get(kind)
    if schema is not None:
        schema_quantities.accept_numbers(schema_quantities.quantity_fields(schema), obj, old)
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
    """ObjectMeta as the API server decodes it (into Go structs), before anything reads it: the
    types of the fields we read, named as the decoder names them. A null string is the empty
    string there; the name itself is checked with the schema (``check_schema``)."""
    meta = obj.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise AdmissionError([invalid("metadata", meta, "must be an object")])
    # The server decodes metadata from a map it marshals again, keys sorted, and Go's decoder
    # reports the first type error it meets: one error, the first in that order.
    for key in sorted(("name", "namespace", "generateName", "labels", "annotations")):
        value = meta.get(key)
        if value is None:
            continue
        if key in ("name", "namespace", "generateName"):
            if not isinstance(value, str):
                raise AdmissionError([invalid(f"metadata.{key}", value, "must be a string")])
            continue
        if not isinstance(value, dict):
            raise AdmissionError([invalid(f"metadata.{key}", value, "must be a map of strings to strings")])
        for k in sorted(value):
            if value[k] is not None and not isinstance(value[k], str):
                raise AdmissionError(
                    [invalid(f"metadata.{key}", value[k], f"the value of {json.dumps(k)} must be a string")]
                )


def admit(
    obj: Obj, old: Obj | None, facts: Facts, framework: Framework, now: str, mode: Mode = Mode.FULL
) -> tuple[Obj, list[str]]:
    """Admit a create (``old`` None) or an update at ``now``; return the stored form and warnings.

    In ``Mode.WEBHOOK`` ``obj`` is what the API server sends a validating webhook (decoded,
    defaulted, mutated, schema and CEL checked); it is returned as it came. Raises
    AdmissionError with every reason found.
    """
    if not mode.checks_schema:
        return _webhook_rules(old, facts, framework, obj, now)
    hinted = hints(obj)
    try:
        check_version(obj)
        check_metadata(obj)
        admitted = check_schema(obj, old, now)
        return _webhook_rules(old, facts, framework, admitted, now)
    except AdmissionError as exc:
        if not hinted:
            raise
        raise AdmissionError(with_hints(exc.errors, hinted), exc.warnings) from None


def _webhook_rules(
    old: Obj | None, facts: Facts, framework: Framework, admitted: Obj, now: str
) -> tuple[Obj, list[str]]:
    """The webhooks' own rules, on the object the API server's stages made."""
    kind = admitted["kind"]
    # Upstream's webhooks decode the object into Go structs, where an integer that does not fit
    # its int32 or int64 field fails. A 1.36 API server refuses it first; an older one stores it.
    overflows = formats.integer_overflows(schemas()[kind], admitted)
    if overflows:
        raise AdmissionError(overflows)
    if kind == c.TRAINJOB_KIND:
        warnings = validate_trainjob(admitted, old, facts, framework)
    elif kind == c.OPTIMIZATIONJOB_KIND:
        warnings = validate_optimization(admitted, old, facts, framework, now)
    else:
        warnings = validate_runtime(admitted, old, framework)
    return admitted, warnings


def validate_optimization(
    obj: Obj, old: Obj | None, facts: Facts, framework: Framework, now: str
) -> list[str]:
    """The OptimizationJob webhook (docs/optimization.md, "Admission"): what its CRD cannot say,
    then its template admitted as trial 0's TrainJob, as the API server and the TrainJob webhook
    would admit it, so a template every trial would be refused for is refused here, at its field.
    Its spec is immutable (the CRD says so): an update that leaves it as it was is not judged again,
    so a search is never refused a status or label change for a runtime removed since."""
    from trainer.optimization.validation import template_trainjob, validate_optimizationjob

    if old is not None and old.get("spec") == obj.get("spec"):
        return []
    errors = validate_optimizationjob(obj)
    if errors:
        raise AdmissionError(errors)
    try:
        _, warnings = admit(template_trainjob(obj), None, facts, framework, now)
    except AdmissionError as exc:
        raise AdmissionError([_in_template(e) for e in exc.errors], exc.warnings) from None
    return warnings


def _in_template(error: FieldError) -> FieldError:
    """A refusal of trial 0's TrainJob, at its field in the OptimizationJob's template. Its name
    and namespace are the OptimizationJob's own (trial names are made from its name)."""
    path = error.path
    own = path.startswith(("metadata.name", "metadata.namespace"))
    if path == "spec" or (path.startswith(("spec.", "metadata.")) and not own):
        path = "spec.trainJobTemplate." + path
    return dataclasses.replace(error, path=path)


def validate_runtime(runtime_obj: Obj, old: Obj | None, framework: Framework) -> list[str]:
    """The runtime webhook: ancestor jobs have one replica and the container they need."""
    from trainer.api.views import TrainingRuntime

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
            names = [ct.get("name") for ct in pod.get("containers") or [] if isinstance(ct, dict)]
            wanted = _ANCESTOR_CONTAINERS[ancestor]
            if wanted not in names:
                # Upstream's words name the ancestor only; the container's name is what to write
                # (the trainer's is "node", not "trainer"), and the value shows the names found.
                errors.append(
                    invalid(
                        f"{path}.template.spec.template.spec.containers",
                        [n for n in names if isinstance(n, str)],
                        f"must contain the required container for the ancestor: {ancestor}, "
                        f'a container named "{wanted}"',
                    )
                )
    warnings: list[str] = []
    # Ours (a Job's own deadline; plugins this operator has turned off) judge a spec as it is
    # written. An update that leaves the spec as it was (a label, a finalizer removed: the one
    # upstream's earlier releases left, controller/runtime_finalizers.py) is not refused for a
    # spec it did not write, or a runtime accepted before could never be changed or deleted.
    if old is None or old.get("spec") != runtime_obj.get("spec"):
        lifetime_errors, warnings = _lifetime_rules(runtime_obj)
        errors += lifetime_errors
        missing = framework.missing_for(TrainingRuntime(runtime_obj).spec)
        if missing:
            errors.append(
                invalid(
                    "spec",
                    "object",
                    f"needs plugins that are disabled in this operator: {', '.join(missing)}",
                )
            )
    if errors:
        raise AdmissionError(errors, warnings)
    meta = runtime_obj.get("metadata") or {}
    if (
        old is None
        and runtime_obj["kind"] == c.CLUSTER_TRAINING_RUNTIME_KIND
        and (meta.get("labels") or {}).get(c.SUPPORT_LABEL) == c.SUPPORT_DEPRECATED
    ):
        warnings.insert(0, deprecation_warning(meta.get("name")))
    return warnings


def _lifetime_rules(runtime_obj: Obj) -> tuple[list[FieldError], list[str]]:
    """docs/decisions.md §ttl: a Job's own deadline is refused (the TrainJob's or runPolicy's counts);
    a JobSet-level TTL stays valid, with a warning that the TrainJob's TTL is the one to use."""
    errors: list[FieldError] = []
    warnings: list[str] = []
    jobset = ((runtime_obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    if not isinstance(jobset, dict):
        return errors, warnings
    for i, rjob in enumerate(jobset.get("replicatedJobs") or []):
        job = ((rjob or {}).get("template") or {}).get("spec") or {}
        if isinstance(job, dict) and job.get("activeDeadlineSeconds") is not None:
            errors.append(
                forbidden(
                    f"spec.template.spec.replicatedJobs[{i}].template.spec.activeDeadlineSeconds",
                    "a Job's own deadline is not allowed: set activeDeadlineSeconds on the TrainJob "
                    "or in the runtime's runPolicy",
                )
            )
    if jobset.get("ttlSecondsAfterFinished") is not None:
        warnings.append(
            "spec.template.spec.ttlSecondsAfterFinished removes only the JobSet once it finishes; the "
            "TrainJob and its other children stay: use the TrainJob's ttlSecondsAfterFinished or the "
            "runtime's runPolicy.ttlSecondsAfterFinished, which remove the TrainJob with all it made"
        )
    return errors, warnings


def deprecation_warning(runtime_name: object) -> str:
    return (
        f'ClusterTrainingRuntime "{runtime_name}" is deprecated and will be removed in a future release '
        f"of Kubeflow Trainer. See runtime deprecation policy: {c.DEPRECATION_DOC_URL}"
    )


def validate_trainjob(trainjob_obj: Obj, old: Obj | None, facts: Facts, framework: Framework) -> list[str]:
    """The TrainJob webhook: the runtime exists, then every plugin's rules on the rendered Info."""
    from trainer.api.views import TrainingRuntime, TrainJob
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
        # Upstream's words first, whole (users search for them), then which runtimes there are.
        detail = f"{exc.reason}: specified {which} must be created before the TrainJob is created"
        detail += f"; {exc.suggestion()}"
        raise AdmissionError([invalid("spec.runtimeRef", ref.get("name"), detail)]) from exc
    warnings: list[str] = []
    runtime_meta = runtime_obj.get("metadata") or {}
    if (
        runtime_obj.get("kind") == c.CLUSTER_TRAINING_RUNTIME_KIND
        and (runtime_meta.get("labels") or {}).get(c.SUPPORT_LABEL) == c.SUPPORT_DEPRECATED
    ):
        warnings.append("Referenced " + deprecation_warning(runtime_meta.get("name")))
    runtime = TrainingRuntime(runtime_obj)
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
    trainjob = TrainJob(trainjob_obj)
    old_view = TrainJob(old) if old is not None else None
    try:
        info = build_info(trainjob, trainjob_obj, runtime, runtime_obj, facts)
    except (PluginError, ValueError, KeyError, TypeError):
        info = None
    ctx = ValidationContext(
        trainjob=trainjob,
        trainjob_obj=trainjob_obj,
        old=old_view,
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
