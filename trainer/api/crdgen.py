"""Generate the trainer CRDs from the pydantic models.

``trainer crds`` writes ``crds/*.yaml`` (for kubectl and the chart) and ``crds/openapi.json``
(the same schemas as JSON, which admission loads at run time: parsing JSON is much cheaper than
parsing YAML, and ``trainer render`` must start fast). A test regenerates both and fails when
the committed files differ.

Kubernetes sub-schemas (EnvVar, PodSpec inside a JobSet spec, ...) are not modelled field by
field: they are vendored, descriptions stripped, from the upstream CRDs into
``trainer/api/embedded_schemas.json`` by ``trainer crds --vendor-from <reference dir>``.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from trainer.api import constants as c
from trainer.api.schema import Schema

# Where each vendored sub-schema lives in the upstream CRDs: (file, dotted path to the node).
_SPEC = "spec.versions.0.schema.openAPIV3Schema.properties.spec"
_PATCH_POD = (
    _SPEC + ".properties.runtimePatches.items.properties.trainingRuntimeSpec.properties.template"
    ".properties.spec.properties.replicatedJobs.items.properties.template.properties.spec.properties"
    ".template.properties.spec.properties"
)
_TRAINJOBS = "crds/trainer/trainer.kubeflow.org_trainjobs.yaml"
VENDORED: dict[str, tuple[str, str]] = {
    "EnvVar": (_TRAINJOBS, _SPEC + ".properties.trainer.properties.env.items"),
    "ResourceRequirements": (_TRAINJOBS, _SPEC + ".properties.trainer.properties.resourcesPerNode"),
    "Affinity": (_TRAINJOBS, _PATCH_POD + ".affinity"),
    "LocalObjectReference": (_TRAINJOBS, _PATCH_POD + ".imagePullSecrets.items"),
    "PodSchedulingGate": (_TRAINJOBS, _PATCH_POD + ".schedulingGates.items"),
    "PodSecurityContext": (_TRAINJOBS, _PATCH_POD + ".securityContext"),
    "Toleration": (_TRAINJOBS, _PATCH_POD + ".tolerations.items"),
    "Volume": (_TRAINJOBS, _PATCH_POD + ".volumes.items"),
    "SecurityContext": (_TRAINJOBS, _PATCH_POD + ".containers.items.properties.securityContext"),
    "VolumeMount": (_TRAINJOBS, _PATCH_POD + ".containers.items.properties.volumeMounts.items"),
    "JobSetSpec": (
        "crds/trainer/trainer.kubeflow.org_clustertrainingruntimes.yaml",
        _SPEC + ".properties.template.properties.spec",
    ),
}
# Facets of a vendored node that belong to the field using it, not to the type.
_FIELD_FACETS = (
    "x-kubernetes-validations",
    "maxItems",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
)

# Vendored types whose rules belong to the type itself (JobSet's own spec rules), so they stay.
_TYPE_RULES = ("JobSetSpec",)

EMBEDDED_FILE = Path(__file__).with_name("embedded_schemas.json")


def strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def vendor(reference_dir: Path) -> dict[str, Any]:
    """Extract the Kubernetes sub-schemas we embed from upstream's CRDs (a development step)."""
    import yaml

    out: dict[str, Any] = {}
    loaded: dict[str, Any] = {}
    for name, (file, path) in VENDORED.items():
        if file not in loaded:
            loaded[file] = yaml.safe_load((reference_dir / file).read_text())
        node: Any = loaded[file]
        for part in path.split("."):
            node = node[int(part)] if isinstance(node, list) else node[part]
        node = strip_descriptions(node)
        for facet in _FIELD_FACETS:
            if not (facet == "x-kubernetes-validations" and name in _TYPE_RULES):
                node.pop(facet, None)
        out[name] = node
    return out


def _embedded() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EMBEDDED_FILE.read_text())
    return data


class _Emitter:
    def __init__(self, embedded: Mapping[str, Any]) -> None:
        self.embedded = embedded

    def model(self, model: type[BaseModel]) -> dict[str, Any]:
        props: dict[str, Any] = {}
        required: list[str] = []
        for name, info in model.model_fields.items():
            wire_name = info.alias or name
            schema = self.field(info.annotation, [m for m in info.metadata if isinstance(m, Schema)])
            props[wire_name] = schema
            if info.is_required():
                required.append(wire_name)
        out: dict[str, Any] = {"type": "object"}
        if props:
            out["properties"] = dict(sorted(props.items()))
        if required:
            out["required"] = sorted(required)
        return out

    def field(self, annotation: Any, facets: list[Schema]) -> dict[str, Any]:
        annotation, inner = _unwrap(annotation)
        facets = facets + inner
        embed = next((f.embed for f in facets if f.embed), None)
        origin = get_origin(annotation)
        if embed and origin is list:
            schema: dict[str, Any] = {"type": "array", "items": copy.deepcopy(self.embedded[embed])}
        elif embed:
            schema = copy.deepcopy(self.embedded[embed])
        else:
            schema = self.type(annotation)
        for f in facets:
            schema.update(f.facets())
        return schema

    def type(self, annotation: Any) -> dict[str, Any]:
        origin = get_origin(annotation)
        if origin is list:
            (item,) = get_args(annotation)
            return {"type": "array", "items": self.field(item, [])}
        if origin is dict:
            _, value = get_args(annotation)
            if value is str:
                return {"type": "object", "additionalProperties": {"type": "string"}}
            return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return self.model(annotation)
        simple = {str: "string", int: "integer", bool: "boolean", float: "number"}
        if annotation in simple:
            return {"type": simple[annotation]}
        raise TypeError(f"no CRD schema for {annotation!r}")


def _unwrap(annotation: Any) -> tuple[Any, list[Schema]]:
    """Strip Optional and Annotated, collecting Schema facets found on the way."""
    facets: list[Schema] = []
    while True:
        if get_origin(annotation) is typing.Annotated:
            args = get_args(annotation)
            annotation = args[0]
            facets.extend(m for m in args[1:] if isinstance(m, Schema))
            continue
        if get_origin(annotation) in (typing.Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation, facets


def _root_schema(model: type[BaseModel], embedded: Mapping[str, Any]) -> dict[str, Any]:
    schema = _Emitter(embedded).model(model)
    props = schema["properties"]
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    props["metadata"] = {"type": "object"}
    schema["required"] = [
        r for r in schema.get("required", []) if r not in ("apiVersion", "kind", "metadata")
    ]
    if not schema["required"]:
        del schema["required"]
    schema["properties"] = dict(sorted(props.items()))
    return schema


def build_crds() -> list[dict[str, Any]]:
    """The four CRDs, in a fixed order, as plain data."""
    from trainer.api.optimization import OptimizationJob
    from trainer.api.runtime import ClusterTrainingRuntime, TrainingRuntime
    from trainer.api.trainjob import NAME_RULES, TrainJob

    embedded = _embedded()
    trainjob_schema = _root_schema(TrainJob, embedded)
    trainjob_schema["x-kubernetes-validations"] = [r.to_schema() for r in NAME_RULES]
    runtime_schema = _root_schema(TrainingRuntime, embedded)
    cluster_schema = _root_schema(ClusterTrainingRuntime, embedded)
    optimization_schema = _root_schema(OptimizationJob, embedded)

    age = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    # docs/decisions.md §10: the condition that is True, not the last one whatever its status.
    state = {"name": "State", "type": "string", "jsonPath": '.status.conditions[?(@.status=="True")].type'}
    framework = {
        "name": "Framework",
        "type": "string",
        "jsonPath": ".metadata.labels.trainer\\.kubeflow\\.org/framework",
    }
    return [
        _crd(
            c.TRAINJOB_KIND,
            "trainjobs",
            "Namespaced",
            ["tj"],
            trainjob_schema,
            status=True,
            columns=[
                state,
                # docs/decisions.md §10: what the training pods last reported (the TrainJobStatus gate).
                {
                    "name": "Progress %",
                    "type": "integer",
                    "description": "Percent done, as the training last reported it",
                    "jsonPath": ".status.trainerStatus.progressPercentage",
                },
                {
                    "name": "Seconds Left",
                    "type": "integer",
                    "description": "The training's estimate of the seconds it has left",
                    "jsonPath": ".status.trainerStatus.estimatedRemainingSeconds",
                },
                {"name": "Runtime", "type": "string", "jsonPath": ".spec.runtimeRef.name"},
                {"name": "Nodes", "type": "integer", "jsonPath": ".spec.trainer.numNodes"},
                age,
            ],
        ),
        _crd(
            c.TRAINING_RUNTIME_KIND,
            "trainingruntimes",
            "Namespaced",
            ["tr"],
            runtime_schema,
            False,
            [framework, age],
        ),
        _crd(
            c.CLUSTER_TRAINING_RUNTIME_KIND,
            "clustertrainingruntimes",
            "Cluster",
            ["ctr"],
            cluster_schema,
            False,
            [framework, age],
        ),
        _crd(
            c.OPTIMIZATIONJOB_KIND,
            "optimizationjobs",
            "Namespaced",
            ["oj"],
            optimization_schema,
            status=True,
            # docs/optimization.md: the trials by state are ours (status.trials).
            columns=[
                # Created stays True while Running is, and Succeeded or Failed come last (the
                # controller adds them in that order: trainer/optimization/plan.py): the last
                # condition is the state, where the True ones would read "Created Running".
                {"name": "State", "type": "string", "jsonPath": ".status.conditions[-1:].type"},
                {"name": "Trials", "type": "integer", "jsonPath": ".spec.numTrials"},
                {"name": "Parallel", "type": "integer", "jsonPath": ".spec.parallelTrials"},
                {"name": "Succeeded", "type": "integer", "jsonPath": ".status.trials.succeeded"},
                {"name": "Failed", "type": "integer", "jsonPath": ".status.trials.failed"},
                {"name": "Running", "type": "integer", "jsonPath": ".status.trials.running"},
                {
                    "name": "Best",
                    "type": "string",
                    "description": "The TrainJob of the best trial so far",
                    "jsonPath": ".status.result.trainJobName",
                },
                age,
            ],
        ),
    ]


def _crd(
    kind: str,
    plural: str,
    scope: str,
    short: list[str],
    schema: dict[str, Any],
    status: bool,
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": c.VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
        "additionalPrinterColumns": columns,
    }
    if status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{c.GROUP}"},
        "spec": {
            "group": c.GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
                "categories": ["kubeflow"],
            },
            "scope": scope,
            "versions": [version],
        },
    }


def crd_files() -> dict[str, str]:
    """File name -> content, exactly as ``trainer crds`` writes them."""
    import yaml

    files: dict[str, str] = {}
    schemas: dict[str, Any] = {}
    for crd in build_crds():
        name = f"{crd['spec']['group']}_{crd['spec']['names']['plural']}.yaml"
        files[name] = "# Generated by `trainer crds` from trainer/api; do not edit.\n" + yaml.safe_dump(
            crd, sort_keys=False, width=1000
        )
        schemas[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    files["openapi.json"] = json.dumps(schemas, separators=(",", ":"), sort_keys=True) + "\n"
    return files


def crds_dir() -> Path:
    return Path(str(resources.files("trainer.crds")))


def write(target: Path | None = None) -> list[Path]:
    target = target or crds_dir()
    written = []
    for name, content in crd_files().items():
        path = target / name
        path.write_text(content)
        written.append(path)
    return written
