"""The types of the v1 fields migrate reads, checked before it reads them.

v1 jobs come from files and clusters without v1's schemas at hand, so a field of the wrong type
(a string for the containers, a list for metadata) is refused here, naming the field, instead of
failing somewhere inside a conversion.
"""

from __future__ import annotations

from typing import Any

from trainer.api.objects import Obj
from trainer.migrate.errors import Refusal

# What each Python type is called in a refusal.
_WHAT = {dict: "an object", list: "a list", str: "a string", int: "a whole number", bool: "true or false"}


def _expect(value: Any, kind: type, path: str) -> None:
    # bool is an int to Python, never to the API.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise Refusal(path, f"{value!r} is not {_WHAT[kind]}")


def _field(obj: Obj, key: str, kind: type, path: str) -> Any:
    """``obj[key]`` when set, of type ``kind``; None when unset."""
    value = obj.get(key)
    if value is not None:
        _expect(value, kind, f"{path}.{key}" if path else key)
    return value


def _objects(obj: Obj, key: str, path: str) -> list[Obj]:
    """``obj[key]`` as a list of objects; [] when unset."""
    items = _field(obj, key, list, path) or []
    for i, item in enumerate(items):
        _expect(item, dict, f"{path}.{key}[{i}]" if path else f"{key}[{i}]")
    return list(items)


def check_job(job: Obj) -> None:
    """metadata and status, as migrate reads them."""
    metadata = _field(job, "metadata", dict, "") or {}
    for key in ("name", "namespace"):
        _field(metadata, key, str, "metadata")
    for key in ("labels", "annotations"):
        _field(metadata, key, dict, "metadata")
    status = _field(job, "status", dict, "") or {}
    for i, condition in enumerate(_objects(status, "conditions", "status")):
        for key in ("type", "status"):
            _field(condition, key, str, f"status.conditions[{i}]")


def check_replica(rspec: Obj, path: str) -> None:
    """A replica's restart policy and pod template, and what is read from its containers."""
    _field(rspec, "restartPolicy", str, path)
    template = _field(rspec, "template", dict, path)
    if template is None:
        return  # the conversion says there is no pod template
    path = f"{path}.template"
    _field(template, "metadata", dict, path)
    spec = template.get("spec")
    _expect(spec, dict, f"{path}.spec")
    path = f"{path}.spec"
    for group in ("containers", "initContainers"):
        for i, container in enumerate(_objects(spec, group, path)):
            _check_container(container, f"{path}.{group}[{i}]")
    for key in ("volumes", "tolerations", "imagePullSecrets"):
        _objects(spec, key, path)
    for key in ("nodeSelector", "affinity", "securityContext"):
        _field(spec, key, dict, path)
    for key in ("restartPolicy", "schedulerName", "priorityClassName", "serviceAccountName"):
        _field(spec, key, str, path)


def _check_container(container: Obj, path: str) -> None:
    _expect(container.get("name"), str, f"{path}.name")
    for key in ("command", "args"):
        for i, item in enumerate(_field(container, key, list, path) or []):
            _expect(item, str, f"{path}.{key}[{i}]")
    for i, var in enumerate(_objects(container, "env", path)):
        _expect(var.get("name"), str, f"{path}.env[{i}].name")
    for i, port in enumerate(_objects(container, "ports", path)):
        _expect(port.get("containerPort"), int, f"{path}.ports[{i}].containerPort")
    _objects(container, "volumeMounts", path)
    _field(container, "securityContext", dict, path)
    resources = _field(container, "resources", dict, path) or {}
    for key in ("limits", "requests"):
        _field(resources, key, dict, f"{path}.resources")


def check_run_policy(spec: Obj) -> None:
    path = "spec.runPolicy"
    policy = _field(spec, "runPolicy", dict, "spec") or {}
    for key in ("activeDeadlineSeconds", "ttlSecondsAfterFinished", "backoffLimit"):
        if (_field(policy, key, int, path) or 0) < 0:
            raise Refusal(f"{path}.{key}", f"{policy[key]} is negative")
    _field(policy, "suspend", bool, path)
    for key in ("cleanPodPolicy", "managedBy"):
        _field(policy, key, str, path)
    scheduling = _field(policy, "schedulingPolicy", dict, path) or {}
    for key in ("minAvailable", "scheduleTimeoutSeconds"):
        _field(scheduling, key, int, f"{path}.schedulingPolicy")
    for key in ("queue", "priorityClass"):
        _field(scheduling, key, str, f"{path}.schedulingPolicy")
