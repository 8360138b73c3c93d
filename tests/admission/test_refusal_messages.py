"""What a refusal says (docs/decisions.md §7, §8): one line per error, the field, the reason, and
a hint where one helps; upstream's words kept where users search for them.

These run the full pipeline (``Mode.FULL``, what ``trainer render`` prints) and the webhook's
own rules (``Mode.WEBHOOK``); the exact lines a user reads are in tests/test_render_cli.py and
tests/controller/test_webhooks.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from render_helpers import replicated_job, runtime, trainjob

from trainer.admission.admit import Mode, admit
from trainer.apimachinery.errors import (
    RULES_NOT_CHECKED_NOTE,
    AdmissionError,
    FieldError,
    is_rules_not_checked,
    refusal_lines,
)
from trainer.offline.cluster import Refusal
from trainer.runtime import framework as fw
from trainer.runtime.info import Facts
from trainer.runtime.render import MAX_LISTED_RUNTIMES, runtime_suggestion

Obj = dict[str, Any]
NOW = "2026-01-01T00:00:00Z"
TORCH = {"numNodes": 1, "torch": {}}


def refusal(obj: Obj, *known: Obj, mode: Mode = Mode.FULL) -> list[FieldError]:
    facts = Facts()
    for fact in known:
        facts.put(copy.deepcopy(fact))
    with pytest.raises(AdmissionError) as refused:
        admit(copy.deepcopy(obj), None, facts, fw.default(), NOW, mode=mode)
    return refused.value.errors


# -- 1. the API server's "some validation rules were not checked" -------------------------------


def test_the_rules_not_checked_error_stays_in_what_admission_returns() -> None:
    """kube-apiserver adds it after a Required error when the CRD has CEL rules (the TrainJob's
    do): admission returns it as the server does, so the stand-in API server's answer keeps it."""
    job = trainjob()
    del job["spec"]["runtimeRef"]["name"]
    errors = refusal(job, runtime(ml_policy=TORCH))
    assert [e.path for e in errors] == ["spec.runtimeRef.name", "<nil>"]
    assert is_rules_not_checked(errors[-1])


def test_our_output_says_the_rules_not_checked_once_in_plain_words() -> None:
    job = trainjob()
    del job["spec"]["runtimeRef"]["name"]
    errors = refusal(job, runtime(ml_policy=TORCH))
    lines, note = refusal_lines(errors)
    assert lines == ["spec.runtimeRef.name: Required value"]
    assert note == RULES_NOT_CHECKED_NOTE
    printed = Refusal("TrainJob", "default", "job", errors)
    assert printed.lines() == ["TrainJob default/job: spec.runtimeRef.name: Required value"]
    assert printed.note() == f"Note: TrainJob default/job: {RULES_NOT_CHECKED_NOTE}"
    # A refusal whose errors did not stop the rules has no note.
    plain = refusal(trainjob(runtime_name="absent"), runtime(ml_policy=TORCH))
    assert refusal_lines(plain)[1] is None
    assert Refusal("TrainJob", "default", "job", plain).note() is None


# -- 2. the trainer's container ------------------------------------------------------------------


def test_a_missing_ancestor_container_is_named_with_the_names_found() -> None:
    rt = runtime(
        jobs=[
            replicated_job(
                "node", "trainer", [{"name": "trainer", "image": "i"}, {"name": "sidecar", "image": "i"}]
            )
        ]
    )
    for mode in (Mode.FULL, Mode.WEBHOOK):
        (error,) = refusal(rt, mode=mode)
        assert str(error) == (
            "spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers: "
            'Invalid value: ["trainer", "sidecar"]: must contain the required container for the '
            'ancestor: trainer, a container named "node"'
        )
    initializer = runtime(jobs=[replicated_job("dataset-initializer", "dataset-initializer")])
    initializer["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ] = [{"name": "init", "image": "i"}]
    (error,) = refusal(initializer)
    assert str(error).endswith(
        'Invalid value: ["init"]: must contain the required container for the ancestor: '
        'dataset-initializer, a container named "dataset-initializer"'
    )


# -- 3. a runtime's name in runtimeRef.kind -----------------------------------------------------

HINT = "put the runtime's name"


def test_a_runtime_name_in_kind_without_a_name_gets_the_hint_at_name() -> None:
    """The schema refuses the missing name; the hint says where the name in kind belongs."""
    job = trainjob(kind="torch-distributed")
    del job["spec"]["runtimeRef"]["name"]
    errors = refusal(job, runtime("torch-distributed", ml_policy=TORCH))
    lines, _ = refusal_lines(errors)
    assert lines == [
        "spec.runtimeRef.name: Required value: put the runtime's name here, not in kind "
        '("torch-distributed"), which must be TrainingRuntime or ClusterTrainingRuntime'
    ]


def test_a_runtime_name_in_kind_with_a_name_names_the_path_once() -> None:
    """The webhook refuses the runtime at spec.runtimeRef: the hint's words follow that path
    without naming the refused path again."""
    errors = refusal(trainjob("job", "torch-distributed", kind="torch-distributed"))
    lines, note = refusal_lines(errors)
    assert lines == [
        'spec.runtimeRef: Invalid value: "torch-distributed": kind must be TrainingRuntime or '
        "ClusterTrainingRuntime; put the runtime's name in spec.runtimeRef.name"
    ]
    assert note is None
    assert lines[0].count(HINT) == 1 and "spec.runtimeRef.kind" not in lines[0]


# -- 4. a misspelt runtime name ------------------------------------------------------------------

UPSTREAM_CLUSTER = "specified clusterTrainingRuntime must be created before the TrainJob is created"


@pytest.mark.parametrize("mode", [Mode.FULL, Mode.WEBHOOK])
def test_a_misspelt_cluster_runtime_gets_the_closest_and_the_list(mode: Mode) -> None:
    known = [runtime(name, ml_policy=TORCH) for name in ("torch-distributed", "jax-distributed", "mlx")]
    known.append(runtime("ns-runtime", kind="TrainingRuntime", ml_policy=TORCH))
    (error,) = refusal(trainjob("job", "torch-distributd"), *known, mode=mode)
    assert error.path == "spec.runtimeRef"
    assert str(error) == (
        'spec.runtimeRef: Invalid value: "torch-distributd": ClusterTrainingRuntime specified in '
        'TrainJob is not found: clustertrainingruntimes.trainer.kubeflow.org "torch-distributd" not '
        f'found: {UPSTREAM_CLUSTER}; did you mean "torch-distributed"? ClusterTrainingRuntimes '
        "that exist: jax-distributed, mlx, torch-distributed"
    )


def test_a_misspelt_namespaced_runtime_looks_in_its_namespace_only() -> None:
    known = [
        runtime("torch-mine", kind="TrainingRuntime", namespace="default", ml_policy=TORCH),
        runtime("torch-theirs", kind="TrainingRuntime", namespace="other", ml_policy=TORCH),
        runtime("torch-cluster", ml_policy=TORCH),
    ]
    (error,) = refusal(trainjob("job", "torch-mne", kind="TrainingRuntime"), *known)
    assert str(error).endswith(
        "specified trainingRuntime must be created before the TrainJob is created; "
        'did you mean "torch-mine"? TrainingRuntimes that exist in namespace "default": torch-mine'
    )
    (error,) = refusal(trainjob("job", "x", kind="TrainingRuntime"), known[1])
    assert str(error).endswith('; no TrainingRuntimes exist in namespace "default"')


def test_a_long_list_of_runtimes_is_cut_to_the_closest() -> None:
    names = [f"team-{i:02d}-runtime" for i in range(30)] + ["torch-distributed"]
    said = runtime_suggestion("torch-distributd", "ClusterTrainingRuntime", names)
    assert said.startswith('did you mean "torch-distributed"? ')
    listed = said.split(": ", 1)[1].split(", ")
    assert len(listed) == MAX_LISTED_RUNTIMES and "torch-distributed" in listed
    assert listed == sorted(listed)
    assert f"the {MAX_LISTED_RUNTIMES} closest of the 31 ClusterTrainingRuntimes that exist: " in said
    # Nothing close: no guess, only the list.
    assert runtime_suggestion("zzz", "ClusterTrainingRuntime", ["torch-distributed"]) == (
        "ClusterTrainingRuntimes that exist: torch-distributed"
    )
