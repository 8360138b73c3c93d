"""The types of the v1 fields migrate reads, checked before it reads them.

v1 jobs come from files and clusters without v1's schemas at hand, so a field of the wrong type
(a string for the containers, a list for metadata) is refused here, naming the field, instead of
failing somewhere inside a conversion.
"""

from __future__ import annotations

from typing import Any

from trainer.api.objects import Obj
from trainer.migrate.errors import Refusal

_CONTAINER_LISTS = ("containers", "initContainers")
_OBJECTS = ("resources", "securityContext")
_STRING_LISTS = ("command", "args")


def _expect(value: Any, kind: type | tuple[type, ...], path: str, what: str) -> None:
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise Refusal(path, f"{value!r} is not {what}")
    if not isinstance(value, kind):
        raise Refusal(path, f"{value!r} is not {what}")


def _objects(value: Any, path: str) -> list[Obj]:
    _expect(value, list, path, "a list")
    for i, item in enumerate(value):
        _expect(item, dict, f"{path}[{i}]", "an object")
    return list(value)


def check_job(job: Obj) -> None:
    """metadata and status, as migrate reads them."""
    metadata = job.get("metadata")
    if metadata is not None:
        _expect(metadata, dict, "metadata", "an object")
        for key in ("labels", "annotations"):
            if metadata.get(key) is not None:
                _expect(metadata[key], dict, f"metadata.{key}", "an object")
    status = job.get("status")
    if status is not None:
        _expect(status, dict, "status", "an object")
        if status.get("conditions") is not None:
            for i, condition in enumerate(_objects(status["conditions"], "status.conditions")):
                for key in ("type", "status"):
                    if condition.get(key) is not None:
                        _expect(condition[key], str, f"status.conditions[{i}].{key}", "a string")


def check_template(template: Any, path: str) -> None:
    """A replica's pod template: the pod spec's containers and what is read from them."""
    _expect(template, dict, path, "an object")
    if template.get("metadata") is not None:
        _expect(template["metadata"], dict, f"{path}.metadata", "an object")
    spec = template.get("spec")
    _expect(spec, dict, f"{path}.spec", "an object (the pod spec)")
    for group in _CONTAINER_LISTS:
        if spec.get(group) is None:
            continue
        for i, container in enumerate(_objects(spec[group], f"{path}.spec.{group}")):
            _check_container(container, f"{path}.spec.{group}[{i}]")
    for key in ("volumes", "tolerations", "imagePullSecrets"):
        if spec.get(key) is not None:
            _objects(spec[key], f"{path}.spec.{key}")
    for key in ("nodeSelector", "affinity", "securityContext"):
        if spec.get(key) is not None:
            _expect(spec[key], dict, f"{path}.spec.{key}", "an object")
    for key in ("restartPolicy", "schedulerName", "priorityClassName", "serviceAccountName"):
        if spec.get(key) is not None:
            _expect(spec[key], str, f"{path}.spec.{key}", "a string")


def _check_container(container: Obj, path: str) -> None:
    _expect(container.get("name"), str, f"{path}.name", "a container name")
    for key in _STRING_LISTS:
        if container.get(key) is not None:
            _expect(container[key], list, f"{path}.{key}", "a list of strings")
            for i, item in enumerate(container[key]):
                _expect(item, str, f"{path}.{key}[{i}]", "a string")
    if container.get("env") is not None:
        for i, var in enumerate(_objects(container["env"], f"{path}.env")):
            _expect(var.get("name"), str, f"{path}.env[{i}].name", "a variable name")
    if container.get("ports") is not None:
        for i, port in enumerate(_objects(container["ports"], f"{path}.ports")):
            _expect(port.get("containerPort"), int, f"{path}.ports[{i}].containerPort", "a port number")
    if container.get("volumeMounts") is not None:
        _objects(container["volumeMounts"], f"{path}.volumeMounts")
    for key in _OBJECTS:
        if container.get(key) is not None:
            _expect(container[key], dict, f"{path}.{key}", "an object")
    resources = container.get("resources") or {}
    for key in ("limits", "requests"):
        if resources.get(key) is not None:
            _expect(resources[key], dict, f"{path}.resources.{key}", "an object")


def check_replica(rspec: Obj, path: str) -> None:
    if rspec.get("restartPolicy") is not None:
        _expect(rspec["restartPolicy"], str, f"{path}.restartPolicy", "a restart policy")
    check_template(rspec.get("template"), f"{path}.template")


def check_run_policy(spec: Obj) -> None:
    policy = spec.get("runPolicy")
    if policy is None:
        return
    _expect(policy, dict, "spec.runPolicy", "an object")
    for key in ("activeDeadlineSeconds", "ttlSecondsAfterFinished", "backoffLimit"):
        if policy.get(key) is not None:
            _expect(policy[key], int, f"spec.runPolicy.{key}", "a whole number")
            if policy[key] < 0:
                raise Refusal(f"spec.runPolicy.{key}", f"{policy[key]} is negative")
    if policy.get("suspend") is not None:
        _expect(policy["suspend"], bool, "spec.runPolicy.suspend", "true or false")
    for key in ("cleanPodPolicy", "managedBy"):
        if policy.get(key) is not None:
            _expect(policy[key], str, f"spec.runPolicy.{key}", "a string")
    scheduling = policy.get("schedulingPolicy")
    if scheduling is not None:
        _expect(scheduling, dict, "spec.runPolicy.schedulingPolicy", "an object")
        for key in ("minAvailable", "scheduleTimeoutSeconds"):
            if scheduling.get(key) is not None:
                _expect(scheduling[key], int, f"spec.runPolicy.schedulingPolicy.{key}", "a whole number")
        for key in ("queue", "priorityClass"):
            if scheduling.get(key) is not None:
                _expect(scheduling[key], str, f"spec.runPolicy.schedulingPolicy.{key}", "a string")
