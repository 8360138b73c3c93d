"""Upserts on pod spec lists, with the keys Kubernetes and upstream use.

A match is replaced in place (so an env var keeps its position), anything new is appended. Every
plugin that adds env vars, ports, volumes or mounts goes through these, so the resulting order is
the same whoever adds what.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from trainer.api.objects import Obj


def _upsert(items: list[Obj], new: Mapping[str, Any], match: tuple[str, ...]) -> None:
    for i, existing in enumerate(items):
        if any(k in new and existing.get(k) == new.get(k) for k in match):
            items[i] = copy.deepcopy(dict(new))
            return
    items.append(copy.deepcopy(dict(new)))


def upsert_env(container: Obj, env: Iterable[Mapping[str, Any]]) -> None:
    items: list[Obj] = container.setdefault("env", [])
    for var in env:
        _upsert(items, var, ("name",))


def upsert_ports(container: Obj, ports: Iterable[Mapping[str, Any]]) -> None:
    items: list[Obj] = container.setdefault("ports", [])
    for port in ports:
        _upsert(items, port, ("containerPort", "name"))


def upsert_volume_mounts(container: Obj, mounts: Iterable[Mapping[str, Any]]) -> None:
    items: list[Obj] = container.setdefault("volumeMounts", [])
    for mount in mounts:
        _upsert(items, mount, ("mountPath",))


def upsert_volumes(pod_spec: Obj, volumes: Iterable[Mapping[str, Any]]) -> None:
    items: list[Obj] = pod_spec.setdefault("volumes", [])
    for volume in volumes:
        _upsert(items, volume, ("name",))


def env_value(name: str, value: str) -> Obj:
    return {"name": name, "value": value}


def env_field_ref(name: str, field_path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def find(items: Iterable[Obj] | None, name: str) -> Obj | None:
    return next((item for item in items or () if item.get("name") == name), None)


def merge_resources(runtime: Mapping[str, Any] | None, trainjob: Mapping[str, Any]) -> Obj:
    """Overlay a TrainJob's resourcesPerNode on the runtime's: limits and requests per resource
    name (the TrainJob wins), claims by name."""
    merged: Obj = copy.deepcopy(dict(runtime or {}))
    for key in ("limits", "requests"):
        if key in trainjob and trainjob[key] is not None:
            merged[key] = {**(merged.get(key) or {}), **trainjob[key]}
    if trainjob.get("claims"):
        claims: list[Obj] = merged.setdefault("claims", [])
        for claim in trainjob["claims"]:
            _upsert(claims, claim, ("name",))
    for key, value in trainjob.items():
        if key not in ("limits", "requests", "claims"):
            merged[key] = copy.deepcopy(value)
    return merged


def canonical_jobset_quantities(jobset_spec: Obj) -> None:
    """Write every quantity in a JobSet spec canonically (``cpu: 0.5`` becomes ``500m``).

    The places are read from the runtime CRD's template schema, so a quantity field Kubernetes
    adds (pod overhead, an emptyDir's sizeLimit) is covered without a list of our own.
    """
    from trainer.api import constants as c
    from trainer.apimachinery.openapi import schemas
    from trainer.apimachinery.schema_quantities import canonicalize, quantity_fields

    template = schemas()[c.TRAINING_RUNTIME_KIND]["properties"]["spec"]["properties"]["template"]
    canonicalize(quantity_fields(template["properties"]["spec"]), jobset_spec)
