"""The generated CRDs: fresh, structural, small enough for kubectl, and upstream's contract."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from reference_data import needs_reference, reference_dir
from render_helpers import ROOT

from trainer.api import crdgen, viewgen

CRDS = ROOT / "crds"


def test_committed_crds_are_fresh() -> None:
    """`trainer crds` regenerates exactly the committed files: nobody edits them by hand."""
    for name, content in crdgen.crd_files().items():
        assert (CRDS / name).read_text() == content, f"crds/{name} is stale: run `trainer crds`"


def test_committed_views_are_fresh() -> None:
    """The typed views are generated from the same models, by the same command."""
    files = viewgen.generate()
    assert sorted(p.name for p in files) == ["__init__.py", "runtime.py", "trainjob.py"]
    for path, content in files.items():
        assert path.read_text() == content, f"trainer/api/views/{path.name} is stale: run `trainer crds`"
    generated = set(files) | {viewgen.VIEWS_DIR / "base.py"}
    assert set(viewgen.VIEWS_DIR.glob("*.py")) == generated, (
        "views/ holds what the generator writes, and base.py"
    )


@needs_reference("crds")
def test_vendored_subschemas_are_fresh() -> None:
    assert crdgen.vendor(reference_dir()) == json.loads(crdgen.EMBEDDED_FILE.read_text())


def _walk(schema: dict[str, Any], path: str = "") -> Any:
    """Every schema node, following the schema's structure (a field may be called "items")."""
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _walk(schema[key], f"{path}[{key}]")


@pytest.mark.parametrize("path", sorted(CRDS.glob("*.yaml")), ids=lambda p: p.name)
def test_crd_is_structural_and_appliable(path: Path) -> None:
    crd = yaml.safe_load(path.read_text())
    assert crd["spec"]["names"]["categories"] == ["kubeflow"]
    assert crd["spec"]["names"]["shortNames"]
    version = crd["spec"]["versions"][0]
    for where, node in _walk(version["schema"]["openAPIV3Schema"]):
        assert "$ref" not in node, f"{where}: structural schemas have no $ref"
        untyped_ok = node.get("x-kubernetes-int-or-string") or node.get(
            "x-kubernetes-preserve-unknown-fields"
        )
        assert "type" in node or untyped_ok, f"{where}: structural schemas type every node"
    # kubectl's client-side apply keeps the whole object in a 256 KiB annotation.
    assert len(json.dumps(crd, separators=(",", ":"))) < 256 * 1024


def test_trainjob_status_subresource_and_columns() -> None:
    crd = yaml.safe_load((CRDS / "trainer.kubeflow.org_trainjobs.yaml").read_text())
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "State",
        "Progress %",
        "Seconds Left",
        "Runtime",
        "Nodes",
        "Age",
    ]


def test_the_four_crds() -> None:
    assert sorted(p.name for p in CRDS.glob("*.yaml")) == [
        "trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "trainer.kubeflow.org_optimizationjobs.yaml",
        "trainer.kubeflow.org_trainingruntimes.yaml",
        "trainer.kubeflow.org_trainjobs.yaml",
    ]


def test_optimizationjob_status_subresource_and_columns() -> None:
    """docs/optimization.md: State (the last condition: Created, Running, then Succeeded or
    Failed), the trial counts (ours), the best trial."""
    crd = yaml.safe_load((CRDS / "trainer.kubeflow.org_optimizationjobs.yaml").read_text())
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["shortNames"] == ["oj"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]] == [
        ("State", ".status.conditions[-1:].type"),
        ("Trials", ".spec.numTrials"),
        ("Parallel", ".spec.parallelTrials"),
        ("Succeeded", ".status.trials.succeeded"),
        ("Failed", ".status.trials.failed"),
        ("Running", ".status.trials.running"),
        ("Best", ".status.result.trainJobName"),
        ("Age", ".metadata.creationTimestamp"),
    ]


# Where our schemas deliberately differ from upstream's: docs/decisions.md §5, §8, §ttl,
# §resize and §trainjob-spec-required, and docs/scheduling.md.
ALLOWED = {
    # Ours: a TrainJob without spec names no runtime. Upstream's webhook refuses it as an
    # unsupported runtime; the schema says what is actually wrong ("spec: Required value").
    ("TrainJob", ".required"),
    (
        "TrainingRuntime",
        ".properties.spec.properties.mlPolicy.properties.mpi.properties.mpiImplementation.enum",
    ),  # docs/decisions.md §5
    (
        "TrainingRuntime",
        ".properties.spec.properties.mlPolicy.x-kubernetes-validations[0].message",
    ),  # docs/decisions.md §8 grammar
    # docs/decisions.md §ttl: upstream's issue #4052, planned there, built here.
    ("TrainJob", ".properties.spec.properties.ttlSecondsAfterFinished"),
    ("TrainJob", ".properties.status.properties.startTime"),
    ("TrainJob", ".properties.status.properties.completionTime"),
    ("TrainingRuntime", ".properties.spec.properties.runPolicy"),
    # docs/decisions.md §resize: upstream's issue #3995. spec.trainer's "field is immutable" rule
    # moves up to spec, where it reads spec.suspend, and leaves numNodes and resourcesPerNode out.
    ("TrainJob", ".properties.spec.properties.trainer.x-kubernetes-validations"),
    ("TrainJob", ".properties.spec.x-kubernetes-validations"),
    # docs/scheduling.md: kube-scheduler's own gang, a source of ours, alone in its policy.
    ("TrainingRuntime", ".properties.spec.properties.podGroupPolicy.properties.workload"),
    ("TrainingRuntime", ".properties.spec.properties.podGroupPolicy.x-kubernetes-validations"),
}


def _diff(ours: Any, theirs: Any, path: str, out: list[str]) -> None:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs)):
            if key not in ours or key not in theirs:
                out.append(f"{path}.{key}")
            else:
                _diff(ours[key], theirs[key], f"{path}.{key}", out)
    elif (
        isinstance(ours, list)
        and isinstance(theirs, list)
        and len(ours) == len(theirs)
        and all(isinstance(x, dict) for x in ours)
    ):
        for i, (x, y) in enumerate(zip(ours, theirs, strict=True)):
            _diff(x, y, f"{path}[{i}]", out)
    elif ours != theirs:
        out.append(path)


@needs_reference("crds/trainer")
@pytest.mark.parametrize(
    ("kind", "plural"),
    [
        ("TrainJob", "trainjobs"),
        ("TrainingRuntime", "trainingruntimes"),
        ("ClusterTrainingRuntime", "clustertrainingruntimes"),
    ],
)
def test_schema_is_upstreams_but_for_the_decisions(kind: str, plural: str) -> None:
    upstream = yaml.safe_load(
        (reference_dir() / f"crds/trainer/trainer.kubeflow.org_{plural}.yaml").read_text()
    )
    theirs = crdgen.strip_descriptions(upstream["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    ours = json.loads((CRDS / "openapi.json").read_text())[kind]
    differences: list[str] = []
    _diff(ours, theirs, "", differences)
    family = "TrainJob" if kind == "TrainJob" else "TrainingRuntime"
    assert [d for d in differences if (family, d) not in ALLOWED] == []
