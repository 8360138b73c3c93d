"""``trainer render`` of an OptimizationJob: admitted as the API server and its webhook would, its
first wave of trials made as the controller's first step would make them, and each trial
rendered as any TrainJob is (trainer/offline/cluster.py, docs/optimization.md)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from render_helpers import ROOT, render

from trainer.optimization import search

Obj = dict[str, Any]


def optimizationjob(**spec: Any) -> Obj:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "OptimizationJob",
        "metadata": {"name": "tune", "namespace": "team-a"},
        "spec": {
            "objectives": [{"metric": "val_loss"}],
            "searchAlgorithm": {"random": {"seed": 42}},
            "parameters": [
                {"name": "learning_rate", "searchSpace": {"logUniform": {"min": "0.0001", "max": "0.1"}}},
                {"name": "batch_size", "searchSpace": {"categorical": {"choices": ["16", "32", "64"]}}},
            ],
            "numTrials": 10,
            "parallelTrials": 3,
            "trainJobTemplate": {
                "metadata": {"labels": {"team": "nlp"}},
                "spec": {
                    "runtimeRef": {"name": "torch-distributed"},
                    "trainer": {
                        "image": "tuner:1",
                        "command": ["python", "train.py", "--lr=${trainer.learning_rate}"],
                    },
                },
            },
            **spec,
        },
    }


def kinds_and_names(items: list[Obj]) -> list[tuple[str, str]]:
    return [(o["kind"], o["metadata"]["name"]) for o in items]


def test_the_first_wave_is_rendered_each_trial_as_a_trainjob() -> None:
    cluster = render(optimizationjob(), defaults=True)
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    items = cluster.output()
    assert kinds_and_names(items) == [
        ("OptimizationJob", "tune"),
        *[
            pair
            for i in range(3)
            for pair in [
                ("TrainJob", f"tune-trial-{i}"),
                ("JobSet", f"tune-trial-{i}"),
                ("ConfigMap", f"tune-trial-{i}-runtime-snapshot"),
            ]
        ],
    ]
    stored = items[0]
    assert stored["spec"]["parameters"][0]["searchSpace"]["logUniform"]["type"] == "Float", "CRD defaults"
    assert stored["status"]["trials"] == {"created": 3, "running": 3, "succeeded": 0, "failed": 0}
    assert [(c["type"], c["status"], c["message"]) for c in stored["status"]["conditions"]] == [
        ("Created", "True", "OptimizationJob is created"),
        ("Running", "True", "0 of 10 trials finished, 3 running"),
    ]
    # Each trial renders exactly as the same TrainJob applied on its own would.
    for i, trial in enumerate(o for o in items if o["kind"] == "TrainJob"):
        values = search.random_assignment(stored["spec"]["parameters"], 42, i)
        assert json.loads(trial["metadata"]["annotations"]["trainer.kubeflow.org/trial-parameters"]) == values
        assert trial["metadata"]["ownerReferences"][0]["uid"] == stored["metadata"]["uid"]
        alone = render(search.trial_trainjob(stored, i, values), defaults=True).output()
        ours = [o for o in items if o["metadata"]["name"].startswith(trial["metadata"]["name"])]
        assert ours == alone


def test_a_grid_smaller_than_the_wave_makes_only_its_combinations() -> None:
    grid = optimizationjob(
        searchAlgorithm={"grid": {}},
        parameters=[{"name": "batch_size", "searchSpace": {"categorical": {"choices": ["16", "32"]}}}],
        numTrials=5,
        parallelTrials=4,
    )
    items = render(grid, defaults=True).output()
    trials = [o for o in items if o["kind"] == "TrainJob"]
    assert [t["spec"]["trainer"]["env"][-1]["value"] for t in trials] == ["16", "32"]


def test_applying_the_optimizationjob_again_makes_no_more_trials() -> None:
    obj = optimizationjob()
    relabelled = copy.deepcopy(obj)
    relabelled["metadata"]["labels"] = {"run": "2"}
    cluster = render(obj, relabelled, defaults=True)
    assert not cluster.refusals
    assert len(cluster.trainjobs) == 3
    assert cluster.output()[0]["metadata"]["labels"] == {"run": "2"}


def test_refusals_name_the_optimizationjob_or_the_trial() -> None:
    too_parallel = render(optimizationjob(parallelTrials=11), defaults=True)
    assert [line for r in too_parallel.refusals for line in r.lines()] == [
        'OptimizationJob team-a/tune: spec: Invalid value: "object": parallelTrials cannot exceed numTrials'
    ]
    clash = optimizationjob()
    clash["spec"]["parameters"].append(
        {"name": "learning-rate", "searchSpace": {"uniform": {"min": "0", "max": "1"}}}
    )
    lines = [line for r in render(clash, defaults=True).refusals for line in r.lines()]
    assert len(lines) == 1 and lines[0].startswith("OptimizationJob team-a/tune: spec.parameters[2].name")
    missing = optimizationjob()
    missing["spec"]["trainJobTemplate"]["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    refused = render(missing, defaults=True).refusals
    assert {r.name for r in refused} == {"tune-trial-0", "tune-trial-1", "tune-trial-2"}
    assert all(r.kind == "TrainJob" and r.errors[0].path == "spec.runtimeRef" for r in refused)


def test_trainer_render_prints_the_optimizationjob_and_its_trials(tmp_path: Path) -> None:
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(optimizationjob(numTrials=2, parallelTrials=2)))
    command = [sys.executable, "-m", "trainer.cli", "render", "-f", str(path)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    again = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert first.stdout == again.stdout, "byte for byte"
    docs = list(yaml.safe_load_all(first.stdout))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs][:3] == [
        ("OptimizationJob", "tune"),
        ("TrainJob", "tune-trial-0"),
        ("JobSet", "tune-trial-0"),
    ]
    assert docs[1]["spec"]["trainer"]["command"][-1].startswith("--lr=0.")
