"""The OptimizationJob's search core (trainer/optimization/search.py): which values each trial gets,
the TrainJob it runs as, and which trial is best. Pure functions, so every property is checked
directly: the grid's order and completeness, random search's reproducibility and bounds, trial
names at the longest OptimizationJob name, and what reaches the training code."""

from __future__ import annotations

import copy
import itertools
import json
import math
import re
import statistics
from decimal import Decimal
from typing import Any

import pytest

from trainer.admission.admit import check_schema
from trainer.optimization import search
from trainer.optimization.spaces import numeric

Obj = dict[str, Any]
NOW = "2026-01-01T00:00:00Z"


def uniform(name: str, low: str, high: str, **extra: Any) -> Obj:
    return {"name": name, "searchSpace": {"uniform": {"min": low, "max": high, "type": "Float", **extra}}}


def log_uniform(name: str, low: str, high: str, **extra: Any) -> Obj:
    return {"name": name, "searchSpace": {"logUniform": {"min": low, "max": high, "type": "Float", **extra}}}


def categorical(name: str, *choices: str) -> Obj:
    return {"name": name, "searchSpace": {"categorical": {"choices": list(choices)}}}


# --- grid ---


def test_the_grid_has_every_combination_once_first_parameter_outermost() -> None:
    parameters = [
        categorical("opt", "adam", "sgd", "rmsprop"),
        uniform("dropout", "0", "0.5", step="0.1"),
        log_uniform("lr", "1e-4", "1e-1", step="10"),
    ]
    found = search.grid(parameters)
    as_tuples = [tuple(a.values()) for a in found]
    expected = list(
        itertools.product(
            ["adam", "sgd", "rmsprop"],
            ["0", "0.1", "0.2", "0.3", "0.4", "0.5"],
            ["0.0001", "0.001", "0.01", "0.1"],
        )
    )
    assert as_tuples == expected
    assert all(list(a) == ["opt", "dropout", "lr"] for a in found)  # spec order


def test_the_grid_finds_the_exact_argmax_of_a_known_objective() -> None:
    parameters = [
        uniform("x", "-1", "1", step="0.05"),
        log_uniform("y", "1", "1e6", step="10"),
        categorical("z", "a", "b", "c"),
    ]

    def objective(a: dict[str, str]) -> float:
        return -((float(a["x"]) - 0.35) ** 2) - (math.log10(float(a["y"])) - 2) ** 2 + (a["z"] == "b")

    results = [(f"t{i}", a, objective(a)) for i, a in enumerate(search.grid(parameters))]
    assert len(results) == 41 * 7 * 3
    chosen = search.best("Maximize", results)
    assert chosen is not None
    assert chosen[1] == {"x": "0.35", "y": "100", "z": "b"}


def test_a_grid_combination_is_the_same_whatever_the_limit() -> None:
    parameters = [categorical("a", "1", "2", "3"), uniform("b", "0", "1", step="0.25")]
    whole = search.grid(parameters)
    for limit in range(len(whole) + 3):
        assert search.grid(parameters, limit) == whole[:limit]


def test_a_grid_too_large_to_list_costs_only_what_is_taken() -> None:
    parameters = [categorical(f"p{i}", *(str(v) for v in range(100))) for i in range(100)]
    first = search.grid(parameters, limit=3)
    assert [a["p99"] for a in first] == ["0", "1", "2"]
    assert {a["p0"] for a in first} == {"0"}
    # A numeric lattice of 10**12 points is not enumerated either.
    assert search.grid([uniform("x", "0", "1", step="1e-12")], limit=2) == [{"x": "0"}, {"x": "1e-12"}]


def test_grid_lattices_are_exact_and_end_at_max() -> None:
    def values(parameter: Obj) -> list[str]:
        return [a["v"] for a in search.grid([parameter])]

    assert values(uniform("v", "0.1", "0.3", step="0.1")) == ["0.1", "0.2", "0.3"]
    assert values(uniform("v", "0", "1", step="0.3")) == ["0", "0.3", "0.6", "0.9"]
    assert values(uniform("v", "16", "128", step="16", type="Int")) == [str(16 * k) for k in range(1, 9)]
    assert values(uniform("v", "0.5", "7", step="2", type="Int")) == ["1", "3", "5", "7"]
    assert values(log_uniform("v", "16", "1024", step="2", type="Int")) == [
        "16",
        "32",
        "64",
        "128",
        "256",
        "512",
        "1024",
    ]
    # Rounding repeats integers on a fine factor: each is listed once, ascending.
    ints = values(log_uniform("v", "1", "20", step="1.5", type="Int"))
    assert ints == ["1", "2", "3", "5", "8", "11", "17"]


def test_a_grid_refuses_a_numeric_space_without_a_step() -> None:
    with pytest.raises(ValueError, match="step"):
        search.grid([uniform("x", "0", "1")])


# --- random ---


PARAMETERS = [
    uniform("dropout", "0.1", "0.5"),
    log_uniform("lr", "1e-5", "1e-1"),
    uniform("layers", "2", "8", type="Int"),
    log_uniform("batch", "16", "512", type="Int"),
    uniform("warmup", "0", "1000", step="100", type="Int"),
    categorical("opt", "adam", "sgd"),
]


def test_random_search_is_reproducible_from_its_seed() -> None:
    first = search.random_assignments(PARAMETERS, seed=42, count=20)
    assert search.random_assignments(PARAMETERS, seed=42, count=20) == first
    assert search.random_assignments(PARAMETERS, seed=43, count=20) != first
    assert len({json.dumps(a, sort_keys=True) for a in first}) == 20


def test_trial_i_is_the_same_however_many_were_asked_for() -> None:
    """A controller restarted mid-search makes trial 7 again exactly as before."""
    all_of_them = search.random_assignments(PARAMETERS, seed=5, count=12)
    assert search.random_assignments(PARAMETERS, seed=5, count=3, start=7) == all_of_them[7:10]
    assert search.random_assignment(PARAMETERS, 5, 11) == all_of_them[11]
    assert search.random_assignments(PARAMETERS, seed=5, count=1) == all_of_them[:1]


def test_random_values_stay_in_bounds_and_ints_are_integers() -> None:
    draws = search.random_assignments(PARAMETERS, seed=1, count=400)
    for parameter in PARAMETERS[:5]:
        space = next(iter(parameter["searchSpace"].values()))
        low, high = Decimal(space["min"]), Decimal(space["max"])
        values = [a[parameter["name"]] for a in draws]
        assert all(low <= Decimal(v) <= high for v in values), parameter["name"]
        if space["type"] == "Int":
            assert all(re.fullmatch(r"-?[0-9]+", v) for v in values), parameter["name"]
    assert {a["layers"] for a in draws} == {str(n) for n in range(2, 9)}  # both ends drawn
    assert {a["warmup"] for a in draws} <= {str(n) for n in range(0, 1001, 100)}
    assert {a["opt"] for a in draws} == {"adam", "sgd"}
    # A logUniform Int reaches both ends, and every integer between.
    small = search.random_assignments([log_uniform("k", "1", "10", type="Int")], seed=1, count=400)
    assert {a["k"] for a in small} == {str(n) for n in range(1, 11)}


def test_log_uniform_draws_spread_over_the_decades() -> None:
    draws = [float(a["lr"]) for a in search.random_assignments(PARAMETERS, seed=9, count=2000)]
    geometric_mean = math.sqrt(1e-5 * 1e-1)
    assert 0.7 < statistics.median(draws) / geometric_mean < 1.4
    per_decade = [sum(10**e <= d < 10 ** (e + 1) for d in draws) for e in range(-5, -1)]
    assert all(400 < n < 600 for n in per_decade), per_decade


def test_a_random_draw_with_a_step_is_a_lattice_point() -> None:
    parameters = [uniform("x", "0", "1", step="0.25"), log_uniform("y", "1e-3", "1", step="10")]
    draws = search.random_assignments(parameters, seed=3, count=200)
    assert {a["x"] for a in draws} == {"0", "0.25", "0.5", "0.75", "1"}
    assert {a["y"] for a in draws} == {"0.001", "0.01", "0.1", "1"}


def test_a_float_is_written_in_12_digits_and_never_past_its_bounds() -> None:
    space = numeric({"min": "0.1000000000004", "max": "0.3", "type": "Float"}, "uniform")
    assert space.text(0.1 + 0.2) == "0.3"  # not 0.30000000000000004
    assert space.text(1 / 7) == "0.142857142857"
    # 12 digits would write 0.1, below min: the shortest round-trip form is used instead.
    assert space.text(0.10000000000041) == "0.10000000000041"
    # Even that may leave the bounds when they are written with more digits than a float has.
    # The float nearest 0.1 is above this min, but "0.1" is below it: the bound is written instead.
    tight = numeric({"min": "0.10000000000000000001", "max": "0.2", "type": "Float"}, "uniform")
    assert tight.text(0.1) == "0.10000000000000000001"
    assert numeric({"min": "1e-7", "max": "1", "type": "Float"}, "logUniform").text(1e-5) == "1e-05"
    assert numeric({"min": "0", "max": "9", "type": "Int"}, "uniform").text(3) == "3"


def test_the_seed_comes_from_the_algorithm_else_the_uid() -> None:
    obj: Obj = {"metadata": {"uid": "abc"}, "spec": {"searchAlgorithm": {"random": {"seed": 11}}}}
    assert search.seed_of(obj) == 11
    obj["spec"]["searchAlgorithm"] = {"tpe": {"seed": 12}}
    assert search.seed_of(obj) == 12
    obj["spec"]["searchAlgorithm"] = {"random": {}}
    assert search.seed_of(obj) == search.seed_from_uid("abc") != search.seed_from_uid("abd")
    assert 0 <= search.seed_from_uid("abc") < 2**63


# --- trial names ---


DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_a_short_name_gives_the_plain_trial_name() -> None:
    assert search.trial_name("tune", 0) == "tune-trial-0"
    assert search.trial_name("a" * 50, 99) == "a" * 50 + "-trial-99"  # 59 characters


@pytest.mark.parametrize(
    "name",
    ["a" * 253, "a" * 54, "x" + ".y" * 126, "9lives", "1234", "a.b", "tune." + "9" * 200],
    ids=["253", "54", "dots", "digit", "digits", "dot", "long-dot"],
)
def test_every_trial_name_is_a_valid_trainjob_name(name: str) -> None:
    for index in (0, 7, 99):
        trial = search.trial_name(name, index)
        assert DNS_1035.match(trial) and len(trial) <= 63, trial
        assert trial.endswith(f"-trial-{index}")
        assert search.trial_name(name, index) == trial  # deterministic


def test_long_names_sharing_a_prefix_give_different_trials() -> None:
    assert search.trial_name("a" * 252 + "b", 0) != search.trial_name("a" * 252 + "c", 0)
    assert search.trial_name("a.b", 0) != search.trial_name("a-b", 0)


def test_the_trial_at_the_longest_name_is_admitted_as_a_trainjob() -> None:
    """The TrainJob's own rules (NAME_RULES, ObjectMeta's label values) judge the trial."""
    longest = "o" * 200 + "." + "p" * 52  # 253 characters, a DNS subdomain
    obj = optimizationjob(name=longest)
    trainjob = check_schema(search.trial_trainjob(obj, 99, {"lr": "0.1"}), None, NOW)
    assert len(trainjob["metadata"]["name"]) <= 63
    label = trainjob["metadata"]["labels"]["trainer.kubeflow.org/optimizationjob-name"]
    assert len(label) == 63 and label == search.label_value(longest)


# --- the trial's TrainJob ---


def optimizationjob(name: str = "tune", trainer: Obj | None = None, template_meta: Obj | None = None) -> Obj:
    template: Obj = {"spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": False}}
    if trainer is not None:
        template["spec"]["trainer"] = trainer
    if template_meta is not None:
        template["metadata"] = template_meta
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "OptimizationJob",
        "metadata": {"name": name, "namespace": "team-a", "uid": "uid-1"},
        "spec": {
            "objectives": [{"metric": "loss", "direction": "Minimize"}],
            "parameters": [uniform("learning-rate", "0", "1"), categorical("opt", "adam")],
            "trainJobTemplate": template,
        },
    }


def test_env_var_names() -> None:
    assert search.env_var_name("lr") == "KUBEFLOW_TRAINER_OPT_LR"
    assert search.env_var_name("learning-rate") == "KUBEFLOW_TRAINER_OPT_LEARNING_RATE"
    assert search.env_var_name("Batch_Size.2") == "KUBEFLOW_TRAINER_OPT_BATCH_SIZE_2"
    assert search.env_var_name("drop out/β") == "KUBEFLOW_TRAINER_OPT_DROP_OUT__"


def test_the_trial_trainjob_is_the_template_named_owned_and_labelled() -> None:
    obj = optimizationjob(template_meta={"labels": {"team": "a"}, "annotations": {"note": "x"}})
    before = copy.deepcopy(obj)
    trainjob = search.trial_trainjob(obj, 3, {"learning-rate": "0.01", "opt": "adam"})
    assert obj == before  # the OptimizationJob is not touched
    meta = trainjob["metadata"]
    assert (trainjob["apiVersion"], trainjob["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert (meta["name"], meta["namespace"]) == ("tune-trial-3", "team-a")
    assert meta["labels"] == {
        "team": "a",
        "trainer.kubeflow.org/optimizationjob-name": "tune",
        "trainer.kubeflow.org/trial-index": "3",
    }
    assert meta["annotations"] == {
        "note": "x",
        "trainer.kubeflow.org/trial-parameters": '{"learning-rate":"0.01","opt":"adam"}',
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "OptimizationJob",
            "name": "tune",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert trainjob["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert trainjob["spec"]["trainer"] == {
        "env": [
            {"name": "KUBEFLOW_TRAINER_OPT_LEARNING_RATE", "value": "0.01"},
            {"name": "KUBEFLOW_TRAINER_OPT_OPT", "value": "adam"},
        ]
    }


def test_a_template_env_var_of_the_same_name_is_replaced_in_place() -> None:
    env = [
        {"name": "A", "value": "1"},
        {"name": "KUBEFLOW_TRAINER_OPT_OPT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        {"name": "B", "value": "2"},
    ]
    trainjob = search.trial_trainjob(
        optimizationjob(trainer={"env": env}), 0, {"learning-rate": "0.5", "opt": "sgd"}
    )
    assert trainjob["spec"]["trainer"]["env"] == [
        {"name": "A", "value": "1"},
        {"name": "KUBEFLOW_TRAINER_OPT_OPT", "value": "sgd"},
        {"name": "B", "value": "2"},
        {"name": "KUBEFLOW_TRAINER_OPT_LEARNING_RATE", "value": "0.5"},
    ]


def test_placeholders_in_command_and_args_are_substituted() -> None:
    trainer = {
        "command": ["python", "train.py", "--opt=${trainer.opt}"],
        "args": [
            "--lr",
            "${trainer.learning-rate}",
            "${trainer.opt}-${trainer.opt}",
            "${trainer.unknown}",
            "$(HOME)",
        ],
        "env": [{"name": "X", "value": "${trainer.opt}"}],
    }
    spec = search.trial_trainjob(optimizationjob(trainer=trainer), 0, {"learning-rate": "0.5", "opt": "sgd"})[
        "spec"
    ]
    assert spec["trainer"]["command"] == ["python", "train.py", "--opt=sgd"]
    assert spec["trainer"]["args"] == ["--lr", "0.5", "sgd-sgd", "${trainer.unknown}", "$(HOME)"]
    assert spec["trainer"]["env"][0] == {"name": "X", "value": "${trainer.opt}"}  # env values are left alone


# --- the best trial ---


RESULTS = [
    ("t-0", {"x": "0"}, 0.5),
    ("t-1", {"x": "1"}, None),
    ("t-2", {"x": "2"}, 0.1),
    ("t-3", {"x": "3"}, float("nan")),
    ("t-4", {"x": "4"}, 0.9),
    ("t-5", {"x": "5"}, 0.1),
]


def test_best_minimizes_and_maximizes() -> None:
    assert search.best("Minimize", RESULTS) == ("t-2", {"x": "2"})  # the first of a tie
    assert search.best("Maximize", RESULTS) == ("t-4", {"x": "4"})


def test_best_passes_over_trials_without_a_value() -> None:
    assert search.best("Minimize", [("t-0", {}, None), ("t-1", {"x": "1"}, 3.0)]) == ("t-1", {"x": "1"})
    assert search.best("Maximize", [("t-0", {}, None), ("t-1", {}, float("nan"))]) is None
    assert search.best("Minimize", []) is None
    with pytest.raises(ValueError):
        search.best("minimize", RESULTS)


def test_a_stepped_int_loguniform_space_draws_each_of_its_distinct_points_alike() -> None:
    from collections import Counter

    parameters = [
        {"name": "n", "searchSpace": {"logUniform": {"min": "1", "max": "10", "step": "1.1", "type": "Int"}}}
    ]
    drawn = Counter(search.random_assignment(parameters, 7, i)["n"] for i in range(5000))
    assert set(drawn) == {str(k) for k in range(1, 11)}, "the rounded powers of 1.1 reach every integer"
    assert max(drawn.values()) < 1.5 * min(drawn.values()), f"each point alike, not 1 most: {drawn}"
