"""The OptimizationJob webhook (docs/optimization.md, "Admission"): what its CRD cannot say, and
its template judged as trial 0's TrainJob, each refusal at the OptimizationJob's own field."""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

import pytest
import yaml

from trainer.admission.admit import Mode, admit
from trainer.apimachinery.errors import AdmissionError
from trainer.runtime import framework as fw
from trainer.runtime.info import Facts

Obj = dict[str, Any]
API = "trainer.kubeflow.org/v1alpha1"
NOW = "2026-01-01T00:00:00Z"
RUNTIME: Obj = yaml.safe_load(
    resources.files("trainer.runtimes").joinpath("torch_distributed.yaml").read_text()
)


def search(
    runtime: str = "torch-distributed", *, env: list[Obj] | None = None, names: tuple[str, ...] = ("lr",)
) -> Obj:
    """An OptimizationJob as the API server sends it to the validating webhook (defaults written)."""
    trainer: Obj = {"image": "docker.io/me/train:1"}
    if env is not None:
        trainer["env"] = env
    return {
        "apiVersion": API,
        "kind": "OptimizationJob",
        "metadata": {"name": "tune", "namespace": "default", "uid": "0b1c"},
        "spec": {
            "objectives": [{"metric": "loss", "direction": "Minimize"}],
            "searchAlgorithm": {"random": {"seed": 1}},
            "parameters": [
                {"name": name, "searchSpace": {"uniform": {"min": "0.1", "max": "0.2", "type": "Float"}}}
                for name in names
            ],
            "numTrials": 2,
            "parallelTrials": 1,
            "trainJobTemplate": {
                "spec": {
                    "runtimeRef": {
                        "name": runtime,
                        "kind": "ClusterTrainingRuntime",
                        "apiGroup": "trainer.kubeflow.org",
                    },
                    "trainer": trainer,
                }
            },
        },
    }


def refused(obj: Obj, old: Obj | None = None) -> list[str]:
    """What the webhook refuses, as "path: detail" lines; [] when it admits."""
    facts = Facts()
    facts.put(copy.deepcopy(RUNTIME))
    try:
        admit(copy.deepcopy(obj), old, facts, fw.default(), NOW, mode=Mode.WEBHOOK)
    except AdmissionError as exc:
        return [f"{e.path}: {e.detail}" for e in exc.errors]
    return []


def test_a_search_the_webhook_admits() -> None:
    assert refused(search()) == []


@pytest.mark.parametrize(
    ("obj", "path", "says"),
    [
        (search("no-such-runtime"), "spec.trainJobTemplate.spec.runtimeRef", "no-such-runtime"),
        (
            search(env=[{"name": "PET_NNODES", "value": "3"}]),
            "spec.trainJobTemplate.spec.trainer.env",
            "PET_NNODES",
        ),
        (search(names=("lr", "LR")), "spec.parameters[1].name", "KUBEFLOW_TRAINER_OPT_LR"),
    ],
    ids=["runtime-missing", "reserved-env", "one-env-var-for-two"],
)
def test_what_every_trial_would_be_refused_for_is_refused_at_the_search(
    obj: Obj, path: str, says: str
) -> None:
    lines = refused(obj)
    assert any(line.startswith(path) and says in line for line in lines), lines


def test_an_update_that_leaves_the_spec_is_not_judged_again() -> None:
    """Its spec is immutable: a label or status change is never refused for a runtime removed since."""
    gone = search("no-such-runtime")
    assert refused(gone, old=copy.deepcopy(gone)) == []
