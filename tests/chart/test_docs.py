"""The install and user docs say what works: their manifests pass the same admission as a cluster's,
their values are the chart's, and their Python uses the SDK's real names."""

from __future__ import annotations

import ast
import copy
import importlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import chart_harness as h
import helm_python as helm
import kubernetes_validate
import pytest
import yaml

DOCS = [h.ROOT / "docs" / name for name in ("install.md", "platform-guide.md", "user-guide.md")]
TRAINER_KINDS = {"TrainJob", "TrainingRuntime", "ClusterTrainingRuntime"}


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S)


def manifests(path: Path) -> list[dict[str, Any]]:
    found = []
    for block in blocks(path, "yaml"):
        found += [d for d in yaml.safe_load_all(block) if isinstance(d, dict) and "kind" in d]
    return found


def render(tmp_path: Path, objects: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    source = tmp_path / "input.yaml"
    source.write_text(yaml.safe_dump_all(objects))
    trainer = Path(sys.executable).parent / "trainer"
    return subprocess.run(
        [str(trainer), "render", "-f", str(source)], capture_output=True, text=True, timeout=120
    )


def doc_trainjob() -> dict[str, Any]:
    (trainjob,) = [m for m in manifests(h.ROOT / "docs" / "user-guide.md") if m["kind"] == "TrainJob"]
    return trainjob


def test_the_documented_trainjob_and_runtime_are_admitted(tmp_path: Path) -> None:
    trainjob = doc_trainjob()
    (runtime,) = [
        m for m in manifests(h.ROOT / "docs" / "platform-guide.md") if m["kind"] == "ClusterTrainingRuntime"
    ]
    on_runtime = copy.deepcopy(trainjob)
    on_runtime["metadata"]["name"] = "on-the-published-runtime"
    on_runtime["spec"]["runtimeRef"]["name"] = runtime["metadata"]["name"]
    result = render(tmp_path, [trainjob, runtime, on_runtime])
    assert result.returncode == 0, result.stderr
    assert "kind: JobSet" in result.stdout


def test_the_documented_refusal_is_what_a_cluster_says(tmp_path: Path) -> None:
    bad = doc_trainjob()
    bad["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "4"}]
    result = render(tmp_path, [bad])
    assert result.returncode == 1
    message = 'spec.trainer.env: Invalid value: ["PET_NNODES"]: must not have reserved envs, invalid envs configured: [PET_NNODES]'
    assert message in result.stderr
    assert message in (h.ROOT / "docs" / "user-guide.md").read_text()


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_documented_built_in_objects_are_valid(path: Path) -> None:
    for obj in manifests(path):
        if obj["kind"] in TRAINER_KINDS:
            continue
        kubernetes_validate.validate(obj, "1.29", strict=True)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_documented_values_are_the_charts(path: Path) -> None:
    text = path.read_text()
    values: dict[str, Any] = {}
    for key, value in re.findall(r"--set ([A-Za-z0-9_.]+)=([^\s`]+)", text):
        node = values
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        # As helm --set reads them: booleans and integers are typed.
        typed: Any = int(value) if value.isdigit() else {"true": True, "false": False}.get(value, value)
        node[last] = "x" if value.startswith('"$') else typed
    for block in blocks(path, "yaml"):
        doc = yaml.safe_load(block)
        # A values file (a fragment of an object's `spec:`, shown without its kind, is not one).
        if isinstance(doc, dict) and "kind" not in doc and "spec" not in doc:
            values = h.merge(values, doc)
    with helm.Chart.load(h.CHART) as chart:
        chart.validate_schema(values)
    for key in re.findall(
        r"`((?:runtimes|manager|webhook|certManager|serviceMonitor|metricsReader|crds|image)\.[A-Za-z0-9_.]+)",
        text,
    ):
        node: Any = yaml.safe_load((h.CHART / "values.yaml").read_text())
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, (
                f"{path.name}: `{key}` is not a value of the chart"
            )
            node = node[part]


def test_the_sdk_example_uses_the_sdks_names() -> None:
    examples = blocks(h.ROOT / "docs" / "user-guide.md", "python")
    assert len(examples) == 2, "submitting with the SDK, and reporting progress from a pod"
    for example in examples:
        for node in ast.walk(ast.parse(example)):
            if isinstance(node, ast.ImportFrom):
                module = pytest.importorskip(node.module or "", reason="the Kubeflow SDK is not installed")
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{node.module}.{alias.name}"
    sdk = importlib.import_module("kubeflow.trainer")
    for method in ("train", "get_runtime", "wait_for_job_status", "get_job_logs"):
        assert hasattr(sdk.TrainerClient, method)
