"""Extract the Kubernetes schemas of the built-in kinds the local API server serves.

The server validates built-in kinds against the real Kubernetes schema, but the package that ships
it (``kubernetes_validate``, a development dependency) is over 100 MB. This script keeps only the
definitions reachable from the served kinds, drops descriptions, rewrites them in OpenAPI v2 form
(``#/definitions/...`` references, one type per schema) and writes a small gzipped JSON file that
ships in the wheel. ``tests/testing/test_k8s_schemas.py`` fails when the committed file is stale.

Run: ``python -m trainer_sandbox.gen_k8s_schemas`` (needs ``kubernetes_validate`` installed).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

KUBERNETES_VERSION = "v1.32.0"
OUTPUT = Path(__file__).with_name("k8s_schemas.json.gz")

# "apiVersion/Kind" -> definition name, for every built-in kind the server serves.
KINDS: dict[str, str] = {
    "v1/Namespace": "io.k8s.api.core.v1.Namespace",
    "v1/Event": "io.k8s.api.core.v1.Event",
    "v1/ConfigMap": "io.k8s.api.core.v1.ConfigMap",
    "v1/Secret": "io.k8s.api.core.v1.Secret",
    "v1/Service": "io.k8s.api.core.v1.Service",
    "v1/ServiceAccount": "io.k8s.api.core.v1.ServiceAccount",
    "v1/Pod": "io.k8s.api.core.v1.Pod",
    "v1/Endpoints": "io.k8s.api.core.v1.Endpoints",
    "v1/Node": "io.k8s.api.core.v1.Node",
    "events.k8s.io/v1/Event": "io.k8s.api.events.v1.Event",
    "batch/v1/Job": "io.k8s.api.batch.v1.Job",
    "apps/v1/Deployment": "io.k8s.api.apps.v1.Deployment",
    "rbac.authorization.k8s.io/v1/Role": "io.k8s.api.rbac.v1.Role",
    "rbac.authorization.k8s.io/v1/RoleBinding": "io.k8s.api.rbac.v1.RoleBinding",
    "rbac.authorization.k8s.io/v1/ClusterRole": "io.k8s.api.rbac.v1.ClusterRole",
    "rbac.authorization.k8s.io/v1/ClusterRoleBinding": "io.k8s.api.rbac.v1.ClusterRoleBinding",
    "admissionregistration.k8s.io/v1/ValidatingWebhookConfiguration": (
        "io.k8s.api.admissionregistration.v1.ValidatingWebhookConfiguration"
    ),
    "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration": (
        "io.k8s.api.admissionregistration.v1.MutatingWebhookConfiguration"
    ),
    "apiextensions.k8s.io/v1/CustomResourceDefinition": (
        "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition"
    ),
    "scheduling.k8s.io/v1/PriorityClass": "io.k8s.api.scheduling.v1.PriorityClass",
    "coordination.k8s.io/v1/Lease": "io.k8s.api.coordination.v1.Lease",
}

_KEPT = (
    "type",
    "format",
    "required",
    "enum",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-patch-strategy",
    "x-kubernetes-patch-merge-key",
)


def _source_definitions() -> dict[str, Any]:
    import kubernetes_validate

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = base / f"{KUBERNETES_VERSION}-local-strict" / "_definitions.json"
    with path.open() as f:
        defs: dict[str, Any] = json.load(f)["$defs"]
    return defs


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _convert(node: dict[str, Any], refs: set[str], top: bool = False) -> dict[str, Any]:
    if "$ref" in node:
        name = _ref_name(node["$ref"])
        refs.add(name)
        return {"$ref": "#/definitions/" + name}
    if "oneOf" in node:
        types = {t for alt in node["oneOf"] for t in _types(alt)}
        out: dict[str, Any] = {"x-kubernetes-int-or-string": True}
        if "number" in types:
            out["format"] = "quantity"
        return out
    out = {}
    for key in _KEPT:
        if key not in node:
            continue
        value = node[key]
        if key == "type":
            kinds = [t for t in _types(node) if t != "null"]
            if len(kinds) != 1:
                continue
            value = kinds[0]
        out[key] = value
    if "properties" in node:
        props = {}
        for name, sub in sorted(node["properties"].items()):
            converted = _convert(sub, refs)
            # apiVersion and kind are pinned by enums in the strict schemas; the server sets them.
            if top and name in ("apiVersion", "kind"):
                converted.pop("enum", None)
            props[name] = converted
        out["properties"] = props
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(node["additionalProperties"], refs)
    if isinstance(node.get("items"), dict):
        out["items"] = _convert(node["items"], refs)
    if not out:
        # Any JSON value (apiextensions JSON, RawExtension): keep it open.
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _types(node: dict[str, Any]) -> list[str]:
    t = node.get("type")
    if t is None:
        return []
    return [t] if isinstance(t, str) else list(t)


def build() -> dict[str, Any]:
    """The document the server loads: kinds, and the definitions reachable from them."""
    source = _source_definitions()
    out: dict[str, Any] = {}
    pending = sorted(set(KINDS.values()))
    while pending:
        name = pending.pop()
        if name in out:
            continue
        refs: set[str] = set()
        out[name] = _convert(source[name], refs, top=name in KINDS.values())
        pending.extend(sorted(r for r in refs if r not in out))
    return {"kubernetesVersion": KUBERNETES_VERSION, "kinds": KINDS, "definitions": dict(sorted(out.items()))}


def encode(doc: dict[str, Any]) -> bytes:
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return gzip.compress(raw, compresslevel=9, mtime=0)


def main(argv: list[str] | None = None) -> int:
    target = Path(argv[0]) if argv else OUTPUT
    target.write_bytes(encode(build()))
    print(f"wrote {target} ({target.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
