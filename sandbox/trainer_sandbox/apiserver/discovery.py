"""Discovery and OpenAPI v3 documents.

kubectl needs discovery to map kinds to resources, and an OpenAPI v3 document per group-version
whose PATCH operations advertise ``fieldValidation``: then it leaves validation to the server
(which is where the real schema and CEL rules live) instead of failing client-side.
"""

from __future__ import annotations

from typing import Any

from trainer_sandbox.apiserver.resources import ALL_VERBS, Registry


def version_info(minor: int) -> dict[str, str]:
    return {
        "major": "1",
        "minor": str(minor),
        "gitVersion": f"v1.{minor}.0",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    }


def _group_entry(group: str, versions: list[str]) -> dict[str, Any]:
    gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list(registry: Registry) -> dict[str, Any]:
    groups = [_group_entry(g, vs) for g, vs in sorted(registry.groups().items()) if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    versions = registry.groups().get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    rts = sorted(registry.in_group_version(group, version), key=lambda r: r.plural)
    if not rts:
        return None
    resources: list[dict[str, Any]] = []
    for rt in rts:
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": ALL_VERBS,
        }
        if rt.short_names:
            entry["shortNames"] = rt.short_names
        if rt.categories:
            entry["categories"] = rt.categories
        resources.append(entry)
        if rt.has_status:
            resources.append(
                {
                    "name": f"{rt.plural}/status",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if rt.plural == "pods" and not rt.group:
            resources.append(
                {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]}
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_root(registry: Registry, generation: int) -> dict[str, Any]:
    paths = {}
    seen = set()
    for rt in registry.by_gvr.values():
        p = _gv_path(rt.group, rt.version)
        if p not in seen:
            seen.add(p)
            paths[p] = {"serverRelativeURL": f"/openapi/v3/{p}?hash={generation:016X}"}
    return {"paths": dict(sorted(paths.items()))}


_PARAMS = [
    {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
    {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": True}},
]


def openapi_gv(registry: Registry, group: str, version: str, k8s_version: str) -> dict[str, Any] | None:
    rts = registry.in_group_version(group, version)
    if not rts:
        return None
    prefix = "/" + _gv_path(group, version)
    paths: dict[str, Any] = {}
    for rt in rts:
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        op = {
            "operationId": f"patch{rt.kind}",
            "x-kubernetes-group-version-kind": gvk,
            "x-kubernetes-action": "patch",
            "parameters": _PARAMS,
            "responses": {"200": {"description": "OK"}},
        }
        base = f"{prefix}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{prefix}/{rt.plural}"
        paths[base + "/{name}"] = {"patch": op}
        if rt.has_status:
            paths[base + "/{name}/status"] = {"patch": {**op, "operationId": f"patch{rt.kind}Status"}}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": k8s_version},
        "paths": paths,
        "components": {"schemas": {}},
    }
