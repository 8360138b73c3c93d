"""The OptimizationJob's API: what the API server admits (the generated CRD's schema, defaults and
CEL rules, run by admission's ``check_schema`` as it runs a TrainJob's), and what admission adds
beyond them (trainer/optimization/validation.py), the TrainJob webhook's checks on the template
among them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from optimization_helpers import categorical, log_uniform, uniform

from trainer.admission.admit import admit, check_schema
from trainer.apimachinery.errors import AdmissionError, FieldError, is_rules_not_checked
from trainer.offline.cluster import OfflineCluster
from trainer.optimization.validation import template_trainjob, validate_optimizationjob
from trainer.runtime import framework

Obj = dict[str, Any]
NOW = "2026-01-01T00:00:00Z"


def optimizationjob(*parameters: Obj, **spec: Any) -> Obj:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "OptimizationJob",
        "metadata": {"name": "tune", "namespace": "default", "uid": "0b5c-uid"},
        "spec": {
            "objectives": [{"metric": "loss"}],
            "parameters": list(parameters) or [uniform("lr", "0.001", "0.1")],
            "trainJobTemplate": {"spec": {"runtimeRef": {"name": "torch-distributed"}}},
            **spec,
        },
    }


def admitted(obj: Obj, old: Obj | None = None) -> Obj:
    return check_schema(copy.deepcopy(obj), old, NOW)


def refused(obj: Obj, old: Obj | None = None) -> list[tuple[str, str]]:
    """(path, detail) of each reason the API server gives, its "rules not checked" note left out."""
    with pytest.raises(AdmissionError) as refusal:
        check_schema(copy.deepcopy(obj), old, NOW)
    return [(e.path, e.detail) for e in refusal.value.errors if not is_rules_not_checked(e)]


SPACE = "spec.parameters[0].searchSpace"


# --- defaults ---


def test_upstreams_defaults_are_applied() -> None:
    spec = admitted(optimizationjob(uniform("lr", "0.001", "0.1"), log_uniform("wd", "1e-5", "1e-2")))["spec"]
    assert spec["numTrials"] == 1
    assert spec["parallelTrials"] == 1
    assert spec["searchAlgorithm"] == {"random": {}}
    assert spec["objectives"] == [{"metric": "loss", "direction": "Minimize"}]
    assert spec["parameters"][0]["searchSpace"]["uniform"]["type"] == "Float"
    assert spec["parameters"][1]["searchSpace"]["logUniform"]["type"] == "Float"
    # The template's spec is a TrainJob's: its defaults apply too.
    assert spec["trainJobTemplate"]["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"


def test_an_algorithm_given_is_not_defaulted_to_random_beside_it() -> None:
    spec = admitted(optimizationjob(searchAlgorithm={"tpe": {"seed": 7}}))["spec"]
    assert spec["searchAlgorithm"] == {"tpe": {"seed": 7}}


# --- the search spaces ---


@pytest.mark.parametrize("low", ["0", "0.0", "-1", "1e-400"])
def test_a_log_uniform_min_must_be_above_zero(low: str) -> None:
    errors = refused(optimizationjob(log_uniform("lr", low, "0.1")))
    assert (f"{SPACE}.logUniform", "min must be strictly greater than 0") in errors


@pytest.mark.parametrize("kind", ["uniform", "logUniform"])
@pytest.mark.parametrize(("low", "high"), [("0.5", "0.1"), ("0.1", "0.1"), ("1e-1", "0.1")])
def test_min_must_be_below_max(kind: str, low: str, high: str) -> None:
    space = uniform if kind == "uniform" else log_uniform
    assert refused(optimizationjob(space("lr", low, high))) == [
        (f"{SPACE}.{kind}", "min must be strictly less than max")
    ]


@pytest.mark.parametrize("number", ["abc", "1.", ".5", "+1", "01", "1" * 65])
def test_a_double_is_a_decimal_number_of_at_most_64_characters(number: str) -> None:
    paths = {path for path, _ in refused(optimizationjob(uniform("lr", number, "1e100")))}
    assert f"{SPACE}.uniform.min" in paths


def test_a_parameter_sets_exactly_one_space() -> None:
    both = {
        "name": "lr",
        "searchSpace": {"uniform": {"min": "0", "max": "1"}, "categorical": {"choices": ["a"]}},
    }
    message = "exactly one of the fields in [uniform logUniform categorical] must be set"
    assert refused(optimizationjob(both)) == [(SPACE, message)]
    assert refused(optimizationjob({"name": "lr", "searchSpace": {}})) == [(SPACE, message)]


def test_choices_are_a_set_of_short_strings() -> None:
    assert [p for p, _ in refused(optimizationjob(categorical("opt", "adam", "adam")))] == [
        f"{SPACE}.categorical.choices[1]"
    ]
    assert [p for p, _ in refused(optimizationjob(categorical("opt", "x" * 65)))] == [
        f"{SPACE}.categorical.choices[0]"
    ]
    assert [p for p, _ in refused(optimizationjob(categorical("opt")))] == [f"{SPACE}.categorical.choices"]


def test_parameters_are_keyed_by_name_and_objectives_are_one() -> None:
    twice = refused(optimizationjob(categorical("opt", "a"), categorical("opt", "b")))
    assert [p for p, _ in twice] == ["spec.parameters[1]"]
    two_objectives = optimizationjob(objectives=[{"metric": "loss"}, {"metric": "acc"}])
    assert [p for p, _ in refused(two_objectives)] == ["spec.objectives"]
    assert [p for p, _ in refused(optimizationjob(objectives=[]))] == ["spec.objectives"]
    bad_direction = optimizationjob(objectives=[{"metric": "loss", "direction": "minimize"}])
    assert [p for p, _ in refused(bad_direction)] == ["spec.objectives[0].direction"]


# --- the step (ours) ---


def test_a_uniform_step_must_be_positive() -> None:
    assert refused(optimizationjob(uniform("lr", "0", "1", step="0"))) == [
        (f"{SPACE}.uniform", "step must be strictly greater than 0")
    ]


def test_a_log_uniform_step_is_a_factor_above_one() -> None:
    assert refused(optimizationjob(log_uniform("lr", "1e-4", "1", step="1"))) == [
        (f"{SPACE}.logUniform", "step must be strictly greater than 1: on a logUniform space it is a factor")
    ]
    admitted(optimizationjob(log_uniform("lr", "1e-4", "1", step="10")))


def test_an_int_uniform_step_is_whole() -> None:
    assert refused(optimizationjob(uniform("bs", "16", "128", type="Int", step="1.5"))) == [
        (f"{SPACE}.uniform", "step must be a whole number (digits only) when type is Int")
    ]
    admitted(optimizationjob(uniform("bs", "16", "128", type="Int", step="16")))
    admitted(optimizationjob(uniform("lr", "0", "1", step="0.25")))  # a Float step may be any


# --- the algorithm ---


GRID_MESSAGE = "Grid search requires every parameter to be Categorical or to have a step"


@pytest.mark.parametrize(
    "parameter",
    [uniform("lr", "0.001", "0.1"), log_uniform("lr", "0.001", "0.1")],
    ids=["uniform", "logUniform"],
)
def test_a_grid_over_a_numeric_space_without_step_is_refused(parameter: Obj) -> None:
    obj = optimizationjob(categorical("opt", "adam", "sgd"), parameter, searchAlgorithm={"grid": {}})
    assert refused(obj) == [("spec", GRID_MESSAGE)]


def test_a_grid_over_choices_and_steps_is_admitted() -> None:
    admitted(
        optimizationjob(
            categorical("opt", "adam", "sgd"),
            uniform("dropout", "0", "0.5", step="0.1"),
            log_uniform("lr", "1e-4", "1e-1", step="10"),
            searchAlgorithm={"grid": {}},
        )
    )


@pytest.mark.parametrize(
    "algorithm",
    [{"random": {}, "grid": {}}, {"random": {}, "tpe": {}}, {"grid": {}, "tpe": {}}, {}],
    ids=["random+grid", "random+tpe", "grid+tpe", "none"],
)
def test_exactly_one_algorithm(algorithm: Obj) -> None:
    errors = refused(optimizationjob(categorical("opt", "a"), searchAlgorithm=algorithm))
    assert errors == [("spec.searchAlgorithm", "exactly one of the fields in [random grid tpe] must be set")]


def test_parallel_trials_cannot_exceed_num_trials() -> None:
    assert refused(optimizationjob(numTrials=4, parallelTrials=5)) == [
        ("spec", "parallelTrials cannot exceed numTrials")
    ]
    assert refused(optimizationjob(parallelTrials=2)) == [("spec", "parallelTrials cannot exceed numTrials")]
    admitted(optimizationjob(numTrials=4, parallelTrials=4))


@pytest.mark.parametrize("field", ["numTrials", "parallelTrials"])
@pytest.mark.parametrize("value", [0, 101])
def test_trial_counts_are_1_to_100(field: str, value: int) -> None:
    assert f"spec.{field}" in [p for p, _ in refused(optimizationjob(**{field: value}))]


def test_max_failed_trials_is_ours_optional_and_within_num_trials() -> None:
    """Ours (docs/optimization.md): unset, no bound but numTrials; 0 fails the search at the first
    failed trial; one above numTrials is refused, as a parallelTrials above it is."""
    assert "maxFailedTrials" not in admitted(optimizationjob(numTrials=4))["spec"]
    admitted(optimizationjob(numTrials=4, maxFailedTrials=0))
    admitted(optimizationjob(numTrials=4, maxFailedTrials=4))
    assert refused(optimizationjob(numTrials=4, maxFailedTrials=5)) == [
        ("spec", "maxFailedTrials cannot exceed numTrials")
    ]
    assert "spec.maxFailedTrials" in [p for p, _ in refused(optimizationjob(maxFailedTrials=-1))]
    assert "spec.maxFailedTrials" in [
        p for p, _ in refused(optimizationjob(numTrials=100, maxFailedTrials=101))
    ]


# --- the template ---


@pytest.mark.parametrize("key", ["name", "namespace"])
def test_the_template_names_no_trainjob(key: str) -> None:
    obj = optimizationjob()
    obj["spec"]["trainJobTemplate"]["metadata"] = {key: "x", "labels": {"team": "a"}}
    assert refused(obj) == [
        ("spec.trainJobTemplate.metadata", "name and namespace cannot be set in a template.")
    ]


def test_the_templates_spec_is_checked_as_a_trainjobs() -> None:
    obj = optimizationjob()
    obj["spec"]["trainJobTemplate"]["spec"]["trainer"] = {"numNodes": -1}
    assert [p for p, _ in refused(obj)] == ["spec.trainJobTemplate.spec.trainer.numNodes"]


# --- updates ---


def test_the_spec_cannot_change() -> None:
    stored = admitted(optimizationjob(numTrials=4))
    update = copy.deepcopy(stored)
    update["spec"]["numTrials"] = 5
    assert refused(update, stored) == [
        ("spec", "OptimizationJobSpec is immutable and cannot be updated after creation")
    ]
    relabelled = copy.deepcopy(stored)
    relabelled["metadata"]["labels"] = {"team": "a"}
    admitted(relabelled, stored)


# --- status ---


def test_status_takes_the_result_and_our_trial_counts() -> None:
    obj = admitted(optimizationjob())
    obj["status"] = {
        "conditions": [
            {
                "type": "Complete",
                "status": "True",
                "reason": "TrialsFinished",
                "message": "",
                "lastTransitionTime": NOW,
            }
        ],
        "result": {"trainJobName": "tune-trial-3", "parameters": [{"name": "lr", "value": "0.01"}]},
        "trials": {"created": 4, "running": 0, "succeeded": 3, "failed": 1},
    }
    admitted(obj)
    obj["status"]["trials"]["failed"] = -1
    obj["status"]["result"]["trainJobName"] = "x" * 64
    assert sorted(p for p, _ in refused(obj)) == ["status.result.trainJobName", "status.trials.failed"]


# --- what admission adds (trainer/optimization/validation.py) ---


def test_two_names_giving_one_env_var_are_refused() -> None:
    obj = admitted(optimizationjob(uniform("learning-rate", "0", "1"), uniform("learning_rate", "0", "1")))
    errors = validate_optimizationjob(obj)
    assert [(e.path, e.value) for e in errors] == [("spec.parameters[1].name", "learning_rate")]
    assert "KUBEFLOW_TRAINER_OPT_LEARNING_RATE" in errors[0].detail
    assert (
        validate_optimizationjob(admitted(optimizationjob(uniform("lr", "0", "1"), uniform("LR2", "0", "1"))))
        == []
    )


def test_an_int_space_without_a_whole_number_is_refused() -> None:
    obj = admitted(optimizationjob(uniform("n", "0.2", "0.8", type="Int")))
    assert [e.path for e in validate_optimizationjob(obj)] == [f"{SPACE}.uniform.type"]
    assert validate_optimizationjob(admitted(optimizationjob(uniform("n", "0.2", "1", type="Int")))) == []


def test_a_bound_beyond_a_float64_is_refused_by_the_crd() -> None:
    """CEL's double() fails on it, so no search ever draws from an infinite range."""
    assert [p for p, _ in refused(optimizationjob(uniform("x", "0", "1e400")))] == [f"{SPACE}.uniform"]


def test_a_grid_of_any_size_is_no_error() -> None:
    """The search takes what it needs and stops when the grid runs out."""
    huge = [categorical(f"p{i}", *(str(v) for v in range(100))) for i in range(100)]
    assert validate_optimizationjob(admitted(optimizationjob(*huge, searchAlgorithm={"grid": {}}))) == []
    small = optimizationjob(categorical("opt", "adam"), numTrials=50, searchAlgorithm={"grid": {}})
    assert validate_optimizationjob(admitted(small)) == []


def _trainjob_refusal(obj: Obj) -> list[FieldError]:
    """The TrainJob webhook's verdict on trial 0's TrainJob, on the default runtimes."""
    cluster = OfflineCluster(framework=framework.default(), now=NOW)
    cluster.load_default_runtimes()
    with pytest.raises(AdmissionError) as refusal:
        admit(template_trainjob(admitted(obj)), None, cluster.facts, cluster.framework, NOW)
    return refusal.value.errors


def test_a_template_the_trainjob_webhook_refuses_is_refused() -> None:
    obj = optimizationjob()
    obj["spec"]["trainJobTemplate"]["spec"]["trainer"] = {"env": [{"name": "PET_NNODES", "value": "2"}]}
    assert [e.path for e in _trainjob_refusal(obj)] == ["spec.trainer.env"]
    missing = optimizationjob()
    missing["spec"]["trainJobTemplate"]["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    assert [e.path for e in _trainjob_refusal(missing)] == ["spec.runtimeRef"]


def test_a_good_templates_trial_is_admitted_as_a_trainjob() -> None:
    cluster = OfflineCluster(framework=framework.default(), now=NOW)
    cluster.load_default_runtimes()
    obj = optimizationjob(categorical("opt", "adam"), uniform("lr", "0.001", "0.1", step="0.001"))
    obj["spec"]["trainJobTemplate"]["spec"]["trainer"] = {"args": ["--optimizer=${trainer.opt}"]}
    trainjob, _ = admit(template_trainjob(admitted(obj)), None, cluster.facts, cluster.framework, NOW)
    assert trainjob["metadata"]["name"] == "tune-trial-0"
    assert trainjob["spec"]["trainer"]["args"] == ["--optimizer=adam"]
