"""Everything we accept or write fits the schemas it will meet on a cluster."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from reference_data import needs_reference, params, reference_dir
from render_helpers import ROOT, render, trainjob
from test_views import assert_reads_alike

from trainer.api.runtime import ClusterTrainingRuntime, MLPolicy, TrainingRuntimeSpec
from trainer.offline.cluster import OfflineCluster
from trainer.runtime import framework

kubernetes_validate = pytest.importorskip("kubernetes_validate")

REFERENCE_RUNTIMES = sorted(
    p for p in (reference_dir() / "runtimes").rglob("*.yaml") if p.name != "kustomization.yaml"
)
JOBSET_CRD = "crds/jobset/jobset.x-k8s.io_jobsets.yaml"
TRAINJOB_CRD = "crds/trainer/trainer.kubeflow.org_trainjobs.yaml"
OUR_RUNTIMES = sorted((ROOT / "runtimes").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


@needs_reference("runtimes")
@pytest.mark.parametrize(
    "path", params(REFERENCE_RUNTIMES, within="runtimes"), ids=lambda p: getattr(p, "name", None)
)
def test_every_upstream_runtime_is_admitted_and_round_trips(path: Path) -> None:
    manifest = _load(path)
    cluster = render(manifest)
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    # The API model loses nothing a user wrote, and types what it names.
    model = ClusterTrainingRuntime.model_validate(manifest)
    assert model.model_dump(by_alias=True, exclude_unset=True) == manifest
    assert isinstance(model.spec, TrainingRuntimeSpec)
    assert model.spec.ml_policy is None or isinstance(model.spec.ml_policy, MLPolicy)
    # The view the render core reads it through reads it alike.
    assert_reads_alike(manifest)


@pytest.mark.parametrize("path", OUR_RUNTIMES, ids=lambda p: p.name)
def test_our_runtimes_render(path: Path) -> None:
    manifest = _load(path)
    assert manifest["metadata"]["labels"]["trainer.kubeflow.org/framework"]
    cluster = render(manifest, trainjob(runtime_name=manifest["metadata"]["name"]))
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    assert any(o["kind"] == "JobSet" for o in cluster.output())


def _crd_schema(path: Path) -> dict[str, Any]:
    schema: dict[str, Any] = _load(path)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _rendered_examples() -> list[dict[str, Any]]:
    cluster = OfflineCluster(framework=framework.default())
    cluster.load_default_runtimes()
    for path in EXAMPLES:
        cluster.apply(_load(path))
    assert not cluster.refusals
    return cluster.output()


@needs_reference(JOBSET_CRD, TRAINJOB_CRD)
def test_rendered_objects_validate_against_their_schemas() -> None:
    jobset_schema = _crd_schema(reference_dir() / JOBSET_CRD)
    trainjob_schema = _crd_schema(reference_dir() / TRAINJOB_CRD)
    seen = set()
    for obj in _rendered_examples():
        seen.add(obj["kind"])
        if obj["kind"] == "JobSet":
            jsonschema.validate(obj, jobset_schema)
        elif obj["kind"] == "TrainJob":
            jsonschema.validate(obj, trainjob_schema)
        else:
            kubernetes_validate.validate(copy.deepcopy(obj), "1.32", strict=True)
    assert {"TrainJob", "JobSet", "ConfigMap"} <= seen


def _rules_at(schema: dict[str, Any], value: Any, path: str = "") -> Any:
    """Each (path, rule, value) a schema's x-kubernetes-validations apply to in an object."""
    for rule in schema.get("x-kubernetes-validations") or []:
        yield path, rule, value
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                yield from _rules_at(sub, value[key], f"{path}.{key}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                yield from _rules_at(extra, item, f"{path}[{key}]")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _rules_at(schema["items"], item, f"{path}[{i}]")


@needs_reference(JOBSET_CRD, TRAINJOB_CRD)
def test_rendered_objects_pass_upstreams_cel_rules_by_an_independent_evaluator() -> None:
    """Our CEL evaluator is one implementation; cel-python is another: both must accept what we write."""
    celpy = pytest.importorskip("celpy")
    environment = celpy.Environment()
    schemas = {
        "JobSet": _crd_schema(reference_dir() / JOBSET_CRD),
        "TrainJob": _crd_schema(reference_dir() / TRAINJOB_CRD),
    }
    checked = 0
    for obj in _rendered_examples():
        schema = schemas.get(obj["kind"])
        if schema is None:
            continue
        for path, rule, value in _rules_at(schema, obj):
            if "oldSelf" in rule["rule"]:
                continue  # transition rules need an update
            program = environment.program(environment.compile(rule["rule"]))
            assert program.evaluate({"self": celpy.json_to_cel(value)}), (
                f"{obj['kind']} {path}: {rule['message']}"
            )
            checked += 1
    assert checked >= 3
