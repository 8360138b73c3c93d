"""Extract the Kubernetes schemas of the built-in kinds the local API server serves.

The server validates built-in kinds against the real Kubernetes schema, taken from a real
kube-apiserver: the one ``cluster/`` builds from source (``trainer_sandbox.cluster``). This script
starts that control plane in a temporary directory (or talks to a running server), reads its
``/version`` and the OpenAPI v3 documents of the group-versions of the served kinds, keeps only the
definitions reachable from those kinds, drops descriptions and defaults, rewrites them in OpenAPI v2
form (``#/definitions/...`` references, one type per schema) and writes a small gzipped JSON file
that ships in the wheel, with the server's version in it. ``tests/testing/test_apiserver_assets.py``
fails when the committed file is stale.

Run: ``python -m trainer_sandbox.gen_k8s_schemas [OUTPUT]`` (needs Go to build the control plane;
the build is cached), or ``... --kubeconfig PATH [--server URL]`` to read a running server.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import json
import ssl
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# The version cluster/ builds; the file records the /version of the server it was generated from,
# and the tests check the two agree.
KUBERNETES_VERSION = "v1.36.3"
OUTPUT = Path(__file__).with_name("k8s_schemas.json.gz")

# GET a server path, JSON decoded.
Fetch = Callable[[str], Any]

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
    # Stored by the stand-in, as the chart installs them (never enforced there).
    "networking.k8s.io/v1/NetworkPolicy": "io.k8s.api.networking.v1.NetworkPolicy",
    "policy/v1/PodDisruptionBudget": "io.k8s.api.policy.v1.PodDisruptionBudget",
    "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy": (
        "io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicy"
    ),
    "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding": (
        "io.k8s.api.admissionregistration.v1.ValidatingAdmissionPolicyBinding"
    ),
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
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-int-or-string",
)


class SchemaSourceError(RuntimeError):
    """The server's OpenAPI is not what the extraction expects (a missing group-version, a
    definition that differs between documents, a schema form it cannot rewrite)."""


def openapi_v3_path(api_version: str) -> str:
    """The key of a group-version in the ``/openapi/v3`` index: ``api/v1``, ``apis/batch/v1``."""
    return "api/" + api_version if "/" not in api_version else "apis/" + api_version


def source_definitions(fetch: Fetch) -> tuple[str, dict[str, Any]]:
    """The server's ``gitVersion`` and the OpenAPI v3 schemas of the served kinds' group-versions.

    A definition shared by several documents (``ObjectMeta``...) is taken once; should two
    documents disagree on it, the name maps to ``None`` and ``build`` fails if it is reachable.
    """
    version = str(fetch("/version")["gitVersion"])
    index: dict[str, Any] = fetch("/openapi/v3")["paths"]
    schemas: dict[str, Any] = {}
    for api_version in sorted({kind.rsplit("/", 1)[0] for kind in KINDS}):
        key = openapi_v3_path(api_version)
        if key not in index:
            raise SchemaSourceError(f"the server publishes no OpenAPI v3 document for {api_version} ({key})")
        doc = fetch(index[key]["serverRelativeURL"])
        for name, schema in doc.get("components", {}).get("schemas", {}).items():
            if name in schemas and schemas[name] != schema:
                schemas[name] = None
            else:
                schemas.setdefault(name, schema)
    return version, schemas


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _convert(node: dict[str, Any], refs: set[str], top: bool = False) -> dict[str, Any]:
    if "$ref" in node:
        name = _ref_name(node["$ref"])
        refs.add(name)
        return {"$ref": "#/definitions/" + name}
    if "allOf" in node:
        # v3 wraps a reference that carries a description or a default: {"allOf": [{"$ref": ...}]}.
        parts = node["allOf"]
        if len(parts) != 1 or set(parts[0]) != {"$ref"}:
            raise SchemaSourceError(f"cannot rewrite allOf {json.dumps(parts)[:200]}")
        return _convert(parts[0], refs)
    if "oneOf" in node:
        # IntOrString (integer | string) and Quantity (string | number).
        types = {t for alt in node["oneOf"] for t in _types(alt)}
        if not types <= {"integer", "number", "string"}:
            raise SchemaSourceError(f"cannot rewrite oneOf {json.dumps(node['oneOf'])[:200]}")
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
            # apiVersion and kind: never pinned by an enum, whatever the source; the server sets them.
            if top and name in ("apiVersion", "kind"):
                converted.pop("enum", None)
            props[name] = converted
        out["properties"] = props
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(node["additionalProperties"], refs)
    if isinstance(node.get("items"), dict):
        out["items"] = _convert(node["items"], refs)
    if not out:
        # Any JSON value (apiextensions JSON): keep it open.
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _types(node: dict[str, Any]) -> list[str]:
    t = node.get("type")
    if t is None:
        return []
    return [t] if isinstance(t, str) else list(t)


def build(fetch: Fetch) -> dict[str, Any]:
    """The document the server loads: the server's version, the kinds, and the definitions
    reachable from them, from the server ``fetch`` reads."""
    version, source = source_definitions(fetch)
    out: dict[str, Any] = {}
    pending = sorted(set(KINDS.values()))
    while pending:
        name = pending.pop()
        if name in out:
            continue
        if name not in source:
            raise SchemaSourceError(f"{name} is not among the server's OpenAPI v3 schemas")
        if source[name] is None:
            raise SchemaSourceError(f"{name} differs between the server's OpenAPI v3 documents")
        refs: set[str] = set()
        out[name] = _convert(source[name], refs, top=name in KINDS.values())
        pending.extend(sorted(r for r in refs if r not in out))
    return {"kubernetesVersion": version, "kinds": KINDS, "definitions": dict(sorted(out.items()))}


def encode(doc: dict[str, Any]) -> bytes:
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return gzip.compress(raw, compresslevel=9, mtime=0)


def decode(data: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gzip.decompress(data))
    return doc


# -- reaching a server ---------------------------------------------------------------------------


def http_fetch(server: str, context: ssl.SSLContext, token: str | None = None) -> Fetch:
    """GET over HTTPS, never through a proxy (the servers this reads are on loopback)."""
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )

    def fetch(path: str) -> Any:
        request = urllib.request.Request(server.rstrip("/") + path)
        request.add_header("Accept", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with opener.open(request, timeout=60) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            raise SchemaSourceError(
                f"GET {path}: {e.code} {e.read().decode(errors='replace')[:300]}"
            ) from None

    return fetch


@contextlib.contextmanager
def kubeconfig_fetch(kubeconfig: Path, server: str | None = None) -> Iterator[Fetch]:
    """A ``Fetch`` as the current context's user of ``kubeconfig`` (client certificate or token;
    inline ``*-data`` or file paths); ``server`` overrides the kubeconfig's."""
    import yaml

    config: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
    contexts: dict[str, dict[str, Any]] = {c["name"]: c["context"] for c in config.get("contexts") or []}
    clusters: dict[str, dict[str, Any]] = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
    users: dict[str, dict[str, Any]] = {u["name"]: u["user"] for u in config.get("users") or []}
    context = contexts.get(config.get("current-context") or "") or next(iter(contexts.values()), {})
    cluster = clusters.get(context.get("cluster", "")) or next(iter(clusters.values()))
    user = users.get(context.get("user", "")) or next(iter(users.values()), {})
    base = kubeconfig.parent
    with tempfile.TemporaryDirectory(prefix="gen-k8s-schemas-") as scratch:

        def material(entry: dict[str, Any], key: str, name: str) -> Path | None:
            if entry.get(f"{key}-data"):
                path = Path(scratch) / name
                path.write_bytes(base64.b64decode(entry[f"{key}-data"]))
                return path
            return base / entry[key] if entry.get(key) else None

        ca = material(cluster, "certificate-authority", "ca.crt")
        tls = ssl.create_default_context(cafile=str(ca) if ca else None)
        if cluster.get("insecure-skip-tls-verify"):
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        cert = material(user, "client-certificate", "client.crt")
        key = material(user, "client-key", "client.key")
        if cert and key:
            tls.load_cert_chain(str(cert), str(key))
        yield http_fetch(server or cluster["server"], tls, user.get("token"))


@contextlib.contextmanager
def control_plane_fetch(echo: Callable[[str], None] | None = None) -> Iterator[Fetch]:
    """Start the control plane ``cluster/`` builds in a temporary directory; stop it on the way out."""
    from trainer_sandbox.cluster import ControlPlane

    with tempfile.TemporaryDirectory(prefix="gen-k8s-schemas-") as directory:
        plane = ControlPlane.start(directory, echo=echo)
        try:
            client = plane.client()
            yield client.get
        finally:
            plane.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_sandbox.gen_k8s_schemas", description=__doc__)
    parser.add_argument("output", nargs="?", type=Path, default=OUTPUT, help=f"default: {OUTPUT}")
    parser.add_argument("--kubeconfig", type=Path, help="read a running server instead of starting one")
    parser.add_argument("--server", help="the server's URL (default: the kubeconfig's)")
    args = parser.parse_args(argv)
    if args.server and not args.kubeconfig:
        parser.error("--server needs --kubeconfig (for the credentials)")

    def echo(line: str) -> None:
        print(line, file=sys.stderr)

    source = kubeconfig_fetch(args.kubeconfig, args.server) if args.kubeconfig else control_plane_fetch(echo)
    with source as fetch:
        doc = build(fetch)
    if doc["kubernetesVersion"] != KUBERNETES_VERSION:
        echo(
            f"warning: the server is {doc['kubernetesVersion']}, not {KUBERNETES_VERSION} (KUBERNETES_VERSION)"
        )
    args.output.write_bytes(encode(doc))
    size = args.output.stat().st_size
    print(
        f"wrote {args.output} ({size} bytes, Kubernetes {doc['kubernetesVersion']}, "
        f"{len(doc['definitions'])} definitions)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
