"""The generated assets the server ships: Kubernetes schemas and description-stripped CRDs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backend_plugin import _go_missing, selected_backends
from reference_data import needs_reference, reference_dir
from trainer_sandbox import gen_crds, gen_k8s_schemas
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.backends import Cluster, RealCluster


def _committed_schemas() -> dict[str, Any]:
    return gen_k8s_schemas.decode(gen_k8s_schemas.OUTPUT.read_bytes())


def test_k8s_schemas_are_current(request: pytest.FixtureRequest) -> None:
    """The committed schemas are what the real kube-apiserver built from cluster/ publishes; where
    that server cannot run, only the file's structure is checked."""
    committed = _committed_schemas()
    _check_schema_structure(committed)
    if "real" not in selected_backends(request.config):
        why = (
            _go_missing() if request.config.getoption("--backend") is None else "--backend=standin was given"
        )
        pytest.skip(
            f"structure of k8s_schemas.json.gz checked; not compared with the schemas of kube-apiserver "
            f"{gen_k8s_schemas.KUBERNETES_VERSION} (the real control plane is skipped: {why})"
        )
    plane: RealCluster = request.getfixturevalue("control_plane")
    fresh = gen_k8s_schemas.build(lambda path: plane.http.request("GET", path))
    assert fresh["kubernetesVersion"] == gen_k8s_schemas.KUBERNETES_VERSION
    assert committed == fresh, "run: python -m trainer_sandbox.gen_k8s_schemas"


def _check_schema_structure(doc: dict[str, Any]) -> None:
    """What the stand-in relies on: the version, every kind's definition, every reference resolving,
    the OpenAPI v2 form (``#/definitions/`` references, one type per schema, no descriptions)."""
    assert doc["kubernetesVersion"] == gen_k8s_schemas.KUBERNETES_VERSION
    assert doc["kinds"] == gen_k8s_schemas.KINDS
    definitions = doc["definitions"]
    assert set(doc["kinds"].values()) <= set(definitions)
    reached: set[str] = set()
    pending = sorted(set(doc["kinds"].values()))
    while pending:
        name = pending.pop()
        if name in reached:
            continue
        reached.add(name)
        for node in _schema_nodes(definitions[name]):
            assert "description" not in node and "allOf" not in node and "oneOf" not in node, name
            assert isinstance(node.get("type", ""), str), name
            if "$ref" in node:
                assert set(node) == {"$ref"} and node["$ref"].startswith("#/definitions/"), name
                target = node["$ref"].removeprefix("#/definitions/")
                assert target in definitions, f"{name} refers to {target}, which is missing"
                pending.append(target)
    assert reached == set(definitions), f"unreachable definitions: {sorted(set(definitions) - reached)}"


def _schema_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for sub in (node.get("properties") or {}).values():
        yield from _schema_nodes(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _schema_nodes(node[key])


def test_k8s_schemas_cover_every_served_builtin_kind() -> None:
    from trainer_sandbox.apiserver.resources import builtin_types

    kinds = _committed_schemas()["kinds"]
    for rt in builtin_types():
        assert f"{rt.api_version}/{rt.kind}" in kinds


def test_builtin_enums_are_checked_as_the_real_server_does(cluster: Cluster) -> None:
    """v1.36 publishes the enums of built-in fields: a value outside one is 422 Unsupported value,
    and "" is the unset Go string (defaulted, or meaningful: a toleration of every effect)."""

    def pod(name: str, **spec: Any) -> dict[str, Any]:
        containers = [{"name": "c", "image": "busybox", **spec.pop("container", {})}]
        meta = {"name": name, "namespace": cluster.namespace}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"containers": containers, **spec},
        }

    with pytest.raises(APIError) as err:
        cluster.create(pod("bad-pull-policy", container={"imagePullPolicy": "Sometimes"}))
    assert (err.value.code, err.value.reason) == (422, "Invalid")
    assert 'spec.containers[0].imagePullPolicy: Unsupported value: "Sometimes"' in err.value.message
    cluster.create(pod("empty-pull-policy", container={"imagePullPolicy": ""}))
    cluster.create(pod("any-effect", tolerations=[{"key": "k", "operator": "Exists", "effect": ""}]))


@needs_reference("crds")
def test_bundled_crds_are_current(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gen_crds, "TARGET", tmp_path)
    gen_crds.main([str(reference_dir() / "crds")])
    bundled = Path(gen_crds.__file__).with_name("crds")
    for fresh in tmp_path.glob("*.json"):
        assert json.loads(fresh.read_text()) == json.loads((bundled / fresh.name).read_text()), fresh.name


def test_strip_descriptions_keeps_fields_named_description() -> None:
    schema = {"description": "x", "properties": {"description": {"type": "string", "description": "y"}}}
    assert gen_crds.strip_descriptions(schema) == {"properties": {"description": {"type": "string"}}}
