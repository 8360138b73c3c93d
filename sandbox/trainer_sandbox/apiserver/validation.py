"""Schema validation of stored objects.

Custom resources go through ``trainer.apimachinery``'s schema modules, the project's one implementation of
OpenAPI and CEL rules (the render core uses the same code), so a TrainJob refused by the operator's
own checks is refused here with the same message. Built-in kinds are checked against the Kubernetes
schema shipped in ``k8s_schemas.json.gz``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trainer.apimachinery import defaulting, object_meta, pruning, schema_validation
from trainer.apimachinery.errors import FieldError, invalid, required, unsupported
from trainer_sandbox.apiserver.errors import bad_request
from trainer_sandbox.apiserver.errors import invalid as invalid_error
from trainer_sandbox.apiserver.resources import ResourceType
from trainer_sandbox.apiserver.schema import check_builtin

ANNOTATIONS_LIMIT = 256 * 1024

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Kinds whose names must be DNS labels rather than subdomains.
_LABEL_NAMED = {("", "namespaces"), ("", "services")}


def default_and_prune(
    rt: ResourceType, obj: dict[str, Any], field_validation: str, warnings: list[str]
) -> None:
    """Decode-time handling of a custom resource: defaults, then unknown fields per ``fieldValidation``."""
    if rt.builtin or rt.crd_schema is None:
        return
    if field_validation == "Strict":
        unknown = [p.lstrip(".") for p in pruning.unknown_fields(rt.crd_schema, obj)]
        if unknown:
            raise bad_request("strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in unknown))
    removed = pruning.prune(rt.crd_schema, obj)
    if field_validation == "Warn":
        warnings.extend(f'unknown field "{p.lstrip(".")}"' for p in removed)
    defaulting.drop_non_nullable_nulls(rt.crd_schema, obj)
    defaulting.apply_defaults(rt.crd_schema, obj)


def check_builtin_decoding(
    rt: ResourceType, obj: dict[str, Any], field_validation: str, warnings: list[str]
) -> list[FieldError]:
    """Type errors and unknown fields of a built-in object, as the Go decoder reports them.

    Returns the schema's field errors (required, enum) for ``validate``, so that the object is walked
    once per request.
    """
    if not rt.builtin:
        return []
    decode, field_errors, unknown = check_builtin(rt.view, obj)
    if decode:
        raise bad_request(
            f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: ' + "; ".join(decode)
        )
    if unknown:
        if field_validation == "Strict":
            raise bad_request("strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in unknown))
        for path in unknown:
            if field_validation == "Warn":
                warnings.append(f'unknown field "{path}"')
            _drop(obj, path)
    return field_errors


def _drop(obj: dict[str, Any], path: str) -> None:
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    cur: Any = obj
    for part in parts[:-1]:
        if part.startswith("["):
            idx = int(part[1:-1])
            cur = cur[idx] if isinstance(cur, list) and idx < len(cur) else None
        else:
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is None:
            return
    if isinstance(cur, dict):
        cur.pop(parts[-1], None)


def validate(
    rt: ResourceType,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    builtin_errors: list[FieldError] | None = None,
) -> None:
    """Raise 422 Invalid with every field error of ``obj`` (metadata, schema, CEL).

    ``builtin_errors``: the schema errors of a built-in object already walked while decoding it.
    """
    errors = validate_meta(rt, obj.get("metadata") or {})
    if rt.builtin:
        if builtin_errors is None:
            _, builtin_errors, _ = check_builtin(rt.view, obj)
        errors.extend(builtin_errors)
        seen = {e.path for e in errors}
        errors.extend(e for e in builtin_rules(rt, obj) if e.path not in seen)
    elif rt.crd_schema is not None:
        # ObjectMeta's errors go first, and a blocking one (a missing name) stops the CEL rules.
        errors = schema_validation.validate(rt.crd_schema, obj, old, meta=errors)
    if errors:
        name = (obj.get("metadata") or {}).get("name", "")
        raise invalid_error(rt.kind, rt.group, name, errors)


_JOB_RESTART_POLICIES = ["OnFailure", "Never"]


def builtin_rules(rt: ResourceType, obj: dict[str, Any]) -> list[FieldError]:
    """The few of Kubernetes' hand-written rules for built-in kinds that clients of this project
    run into; the schema alone accepts what these refuse."""
    if (rt.group, rt.plural) == ("batch", "jobs"):
        return _job_rules(obj)
    return []


def _job_rules(job: dict[str, Any]) -> list[FieldError]:
    """A Job's pods must say how they restart: OnFailure or Never, never Always.

    PodSpec defaulting turns an unset restartPolicy into Always, so both read as "Required value",
    the wording kube-apiserver uses; Never alone goes with a podFailurePolicy.
    """
    spec = job.get("spec")
    tmpl = spec.get("template") if isinstance(spec, dict) else None
    pspec = tmpl.get("spec") if isinstance(tmpl, dict) else None
    if not isinstance(spec, dict) or not isinstance(pspec, dict):
        return []
    errors = _mounted_volumes(pspec)
    path = "spec.template.spec.restartPolicy"
    policy = pspec.get("restartPolicy") or ""
    if policy in ("", "Always"):
        errors.append(required(path, "valid values: " + ", ".join(f'"{p}"' for p in _JOB_RESTART_POLICIES)))
    elif policy not in _JOB_RESTART_POLICIES:
        errors.append(unsupported(path, policy, _JOB_RESTART_POLICIES))
    elif spec.get("podFailurePolicy") is not None and policy != "Never":
        errors.append(invalid(path, policy, 'only "Never" is supported when podFailurePolicy is specified'))
    return errors


def _mounted_volumes(pspec: dict[str, Any]) -> list[FieldError]:
    """Every volumeMount names a volume of the pod (kube-apiserver's "Not found", which a
    JobSet's Job creation then fails with)."""
    volumes = {v.get("name") for v in pspec.get("volumes") or [] if isinstance(v, dict)}
    errors = []
    for group in ("initContainers", "containers"):
        for i, container in enumerate(pspec.get(group) or []):
            if not isinstance(container, dict):
                continue
            for j, mount in enumerate(container.get("volumeMounts") or []):
                name = mount.get("name") if isinstance(mount, dict) else None
                if name not in volumes:
                    path = f"spec.template.spec.{group}[{i}].volumeMounts[{j}].name"
                    errors.append(FieldError(path, "Not found", json.dumps(name)))
    return errors


def validate_meta(rt: ResourceType, meta: dict[str, Any]) -> list[FieldError]:
    # Built-in kinds name objects by their own rules (RBAC allows "system:..."): checked below.
    checked = meta if not rt.builtin else {k: v for k, v in meta.items() if k != "name"}
    errors = list(object_meta.validate_object_meta(checked, require_name=not rt.builtin))
    name = meta.get("name")
    if not name:
        if not any(e.path == "metadata.name" for e in errors):
            errors.append(required("metadata.name", "name or generateName is required"))
    else:
        pattern = _DNS_LABEL if (rt.group, rt.plural) in _LABEL_NAMED else _DNS_SUBDOMAIN
        limit = 63 if pattern is _DNS_LABEL else 253
        # Role and binding names may hold ':' (system:...), as Kubernetes' path-segment rule allows.
        path_segment_only = rt.group == "rbac.authorization.k8s.io"
        bad = (
            ("/" in name or "%" in name or name in (".", ".."))
            if path_segment_only
            else not pattern.match(name)
        )
        if (bad or len(name) > limit) and not any(e.path == "metadata.name" for e in errors):
            detail = (
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must"
                " start and end with an alphanumeric character"
                if pattern is _DNS_LABEL
                else "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or"
                " '.', and must start and end with an alphanumeric character"
            )
            errors.append(invalid("metadata.name", name, detail))
    annotations = meta.get("annotations") or {}
    size = sum(len(k) + len(str(v)) for k, v in annotations.items())
    if size > ANNOTATIONS_LIMIT and not any(e.path == "metadata.annotations" for e in errors):
        errors.append(
            FieldError("metadata.annotations", "Too long", f"must have at most {ANNOTATIONS_LIMIT} bytes")
        )
    return errors
