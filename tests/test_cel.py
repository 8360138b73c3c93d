"""Tests for the CEL evaluator that checks CRD ``x-kubernetes-validations`` rules.

Three kinds of evidence: the real CRD rules against objects Kubernetes accepts and refuses, a
differential run against cel-python for general CEL, and explicit cases where Kubernetes' cel-go
semantics differ from cel-python's (those cannot be checked differentially, so each says why).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainer.api import optimization as opt
from trainer.api import runtime as runtime_api
from trainer.api.trainjob import TRAINER_RULES
from trainer.apimachinery import cel
from trainer.apimachinery.cel import CELError, CELEvalError, CELSyntaxError

REPO = Path(__file__).resolve().parent.parent


def run(expr: str, **activation: Any) -> Any:
    return cel.compile(expr).evaluate(activation)


# ---------------------------------------------------------------------------------------------
# The rules in the CRDs we serve
# ---------------------------------------------------------------------------------------------

IMMUTABLE = "self == oldSelf"
AT_LEAST_ONE = "self >= 1"
URL_OR_EMPTY = "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')"
NAME_LENGTH = "size(self.metadata.name) <= 63"
NAME_FORMAT = "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"
MANAGED_BY = "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']"
HAS_UPDATED = "has(self.lastUpdatedTime)"
ONE_RUNTIME = (
    "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)]"
    ".filter(x, x).size() <= 1"
)
NOT_NODE = "!self.exists(c, c == 'node')"
STARTUP_VS_DEPENDS = (
    "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' "
    "&& self.replicatedJobs.exists(x, has(x.dependsOn)))"
)
NO_NAMESPACE = "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)"
EXACTLY_ONE_PLUGIN = "(has(self.tpp) ? 1 : 0) + (has(self.cloud) ? 1 : 0) + (has(self.ngts) ? 1 : 0) == 1"
AT_MOST_ONE_PLUGIN = "(has(self.tpp) ? 1 : 0) + (has(self.cloud) ? 1 : 0) + (has(self.ngts) ? 1 : 0) <= 1"

# docs/decisions.md §resize: spec.trainer's fields fixed, but numNodes and resourcesPerNode while suspended.
TRAINER_FIXED, TRAINER_RESIZE = (rule.rule for rule in TRAINER_RULES)

# docs/optimization.md: the OptimizationJob's rules, upstream's and ours.
OPT_RULES = {
    rule.rule
    for rule in (
        opt.MIN_BELOW_MAX,
        opt.MIN_POSITIVE,
        opt.UNIFORM_STEP_POSITIVE,
        opt.UNIFORM_INT_STEP_WHOLE,
        opt.LOG_STEP_ABOVE_ONE,
        opt.ONE_SPACE,
        opt.ONE_ALGORITHM,
        opt.TEMPLATE_METADATA,
        opt.PARALLEL_WITHIN_TRIALS,
        opt.MAX_FAILED_WITHIN_TRIALS,
        opt.GRID_ENUMERABLE,
    )
}

# docs/scheduling.md: the workload gang is not combined with upstream's two sources.
ONE_GANG = runtime_api.ONE_GANG.rule

TRAINER_CRD_RULES = {
    *OPT_RULES,
    ONE_GANG,
    TRAINER_FIXED,
    TRAINER_RESIZE,
    IMMUTABLE,
    AT_LEAST_ONE,
    URL_OR_EMPTY,
    NAME_LENGTH,
    NAME_FORMAT,
    MANAGED_BY,
    HAS_UPDATED,
    ONE_RUNTIME,
    NOT_NODE,
    STARTUP_VS_DEPENDS,
    NO_NAMESPACE,
}


def _spec(trainer: dict[str, Any] | None, suspend: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"runtimeRef": {"name": "torch"}, "suspend": suspend}
    if trainer is not None:
        spec["trainer"] = trainer
    return spec


def _grid(*spaces: dict[str, Any], algorithm: str = "grid") -> dict[str, Any]:
    return {
        "searchAlgorithm": {algorithm: {}},
        "parameters": [{"name": f"p{i}", "searchSpace": space} for i, space in enumerate(spaces)],
    }


CATEGORICAL = {"categorical": {"choices": ["a"]}}
STEPPED = {"uniform": {"min": "0", "max": "1", "step": "0.5"}}
UNSTEPPED = {"logUniform": {"min": "1", "max": "10"}}

CRD_CASES: list[tuple[str, dict[str, Any], bool]] = [
    (ONE_GANG, {"self": {"workload": {}}}, True),
    (ONE_GANG, {"self": {"coscheduling": {}, "volcano": {}}}, True),  # upstream's own: left alone
    (ONE_GANG, {"self": {"workload": {}, "coscheduling": {}}}, False),
    (ONE_GANG, {"self": {"workload": {}, "volcano": {}}}, False),
    (opt.MIN_BELOW_MAX.rule, {"self": {"min": "0.1", "max": "1e0"}}, True),
    (opt.MIN_BELOW_MAX.rule, {"self": {"min": "1", "max": "1"}}, False),
    (opt.MIN_BELOW_MAX.rule, {"self": {"min": "2", "max": "-1"}}, False),
    (opt.MIN_POSITIVE.rule, {"self": {"min": "0.001"}}, True),
    (opt.MIN_POSITIVE.rule, {"self": {"min": "0"}}, False),
    (opt.MIN_POSITIVE.rule, {"self": {"min": "-1e-3"}}, False),
    (opt.UNIFORM_STEP_POSITIVE.rule, {"self": {}}, True),
    (opt.UNIFORM_STEP_POSITIVE.rule, {"self": {"step": "0.25"}}, True),
    (opt.UNIFORM_STEP_POSITIVE.rule, {"self": {"step": "0"}}, False),
    (opt.UNIFORM_INT_STEP_WHOLE.rule, {"self": {"type": "Int", "step": "2"}}, True),
    (opt.UNIFORM_INT_STEP_WHOLE.rule, {"self": {"type": "Float", "step": "0.5"}}, True),
    (opt.UNIFORM_INT_STEP_WHOLE.rule, {"self": {"type": "Int"}}, True),
    (opt.UNIFORM_INT_STEP_WHOLE.rule, {"self": {"type": "Int", "step": "0.5"}}, False),
    (opt.LOG_STEP_ABOVE_ONE.rule, {"self": {"step": "10"}}, True),
    (opt.LOG_STEP_ABOVE_ONE.rule, {"self": {"step": "1"}}, False),
    (opt.ONE_SPACE.rule, {"self": CATEGORICAL}, True),
    (opt.ONE_SPACE.rule, {"self": {}}, False),
    (opt.ONE_SPACE.rule, {"self": {**CATEGORICAL, **UNSTEPPED}}, False),
    (opt.ONE_ALGORITHM.rule, {"self": {"tpe": {"seed": 1}}}, True),
    (opt.ONE_ALGORITHM.rule, {"self": {}}, False),
    (opt.ONE_ALGORITHM.rule, {"self": {"random": {}, "grid": {}}}, False),
    (opt.TEMPLATE_METADATA.rule, {"self": {"labels": {"a": "b"}}}, True),
    (opt.TEMPLATE_METADATA.rule, {"self": {"name": "x"}}, False),
    (opt.TEMPLATE_METADATA.rule, {"self": {"namespace": "x"}}, False),
    (opt.PARALLEL_WITHIN_TRIALS.rule, {"self": {"numTrials": 4, "parallelTrials": 4}}, True),
    (opt.PARALLEL_WITHIN_TRIALS.rule, {"self": {"numTrials": 4, "parallelTrials": 5}}, False),
    (opt.GRID_ENUMERABLE.rule, {"self": _grid(CATEGORICAL, STEPPED)}, True),
    (opt.GRID_ENUMERABLE.rule, {"self": _grid(UNSTEPPED, algorithm="random")}, True),
    (opt.GRID_ENUMERABLE.rule, {"self": _grid(CATEGORICAL, UNSTEPPED)}, False),
    (TRAINER_FIXED, {"self": _spec({"image": "a"}), "oldSelf": _spec({"image": "a"})}, True),
    (TRAINER_FIXED, {"self": _spec({"image": "b"}), "oldSelf": _spec({"image": "a"})}, False),
    (TRAINER_FIXED, {"self": _spec({"image": "a"}), "oldSelf": _spec(None)}, False),
    (TRAINER_FIXED, {"self": _spec({}), "oldSelf": _spec(None)}, True),
    (TRAINER_FIXED, {"self": _spec({"env": []}), "oldSelf": _spec({})}, False),
    (TRAINER_FIXED, {"self": _spec({"numNodes": 4}), "oldSelf": _spec({"numNodes": 2})}, True),
    (TRAINER_RESIZE, {"self": _spec({"numNodes": 4}), "oldSelf": _spec({"numNodes": 2})}, False),
    (TRAINER_RESIZE, {"self": _spec({"numNodes": 4}, True), "oldSelf": _spec({"numNodes": 2}, True)}, True),
    (TRAINER_RESIZE, {"self": _spec({"numNodes": 4}), "oldSelf": _spec({"numNodes": 2}, True)}, True),
    (TRAINER_RESIZE, {"self": _spec({"numNodes": 4}, True), "oldSelf": _spec({"numNodes": 2})}, True),
    (TRAINER_RESIZE, {"self": _spec({"numNodes": 2}), "oldSelf": _spec(None)}, False),
    (
        TRAINER_RESIZE,
        {
            "self": _spec({"resourcesPerNode": {"limits": {"cpu": "2"}}}),
            "oldSelf": _spec({"resourcesPerNode": {}}),
        },
        False,
    ),
    (TRAINER_RESIZE, {"self": _spec({"image": "b"}), "oldSelf": _spec({"image": "a"})}, True),
    (
        IMMUTABLE,
        {"self": {"a": [1, {"b": "c"}], "d": None}, "oldSelf": {"d": None, "a": [1, {"b": "c"}]}},
        True,
    ),
    (IMMUTABLE, {"self": {"a": [1, 2]}, "oldSelf": {"a": [2, 1]}}, False),
    (IMMUTABLE, {"self": {"a": 1}, "oldSelf": {"a": 1, "b": 2}}, False),
    (IMMUTABLE, {"self": {"a": {"b": "x"}}, "oldSelf": {"a": {"b": "y"}}}, False),
    (IMMUTABLE, {"self": "default", "oldSelf": "default"}, True),
    (IMMUTABLE, {"self": True, "oldSelf": 1}, False),
    (AT_LEAST_ONE, {"self": 1}, True),
    (AT_LEAST_ONE, {"self": 8}, True),
    (AT_LEAST_ONE, {"self": 0}, False),
    (AT_LEAST_ONE, {"self": -3}, False),
    (URL_OR_EMPTY, {"self": ""}, True),
    (URL_OR_EMPTY, {"self": "https://github.com/kubeflow/trainer"}, True),
    (URL_OR_EMPTY, {"self": "git+ssh://host/repo"}, True),
    (URL_OR_EMPTY, {"self": "github.com/kubeflow/trainer"}, False),
    (URL_OR_EMPTY, {"self": "1http://host"}, False),
    (URL_OR_EMPTY, {"self": "https://"}, False),
    (NAME_LENGTH, {"self": {"metadata": {"name": "a" * 63}}}, True),
    (NAME_LENGTH, {"self": {"metadata": {"name": "a" * 64}}}, False),
    # size() counts code points, not UTF-8 bytes.
    (NAME_LENGTH, {"self": {"metadata": {"name": "é" * 63}}}, True),
    (NAME_FORMAT, {"self": {"metadata": {"name": "pytorch-mnist"}}}, True),
    (NAME_FORMAT, {"self": {"metadata": {"name": "a"}}}, True),
    (NAME_FORMAT, {"self": {"metadata": {"name": "a1-b2"}}}, True),
    (NAME_FORMAT, {"self": {"metadata": {"name": "job-"}}}, False),
    (NAME_FORMAT, {"self": {"metadata": {"name": "1job"}}}, False),
    (NAME_FORMAT, {"self": {"metadata": {"name": "My-Job"}}}, False),
    (NAME_FORMAT, {"self": {"metadata": {"name": "job.name"}}}, False),
    # RE2's '$' is end of text; Python's would also match before a final newline.
    (NAME_FORMAT, {"self": {"metadata": {"name": "job\n"}}}, False),
    (MANAGED_BY, {"self": "trainer.kubeflow.org/trainjob-controller"}, True),
    (MANAGED_BY, {"self": "kueue.x-k8s.io/multikueue"}, True),
    (MANAGED_BY, {"self": "kueue.x-k8s.io/multikueue2"}, False),
    (MANAGED_BY, {"self": ""}, False),
    (HAS_UPDATED, {"self": {"lastUpdatedTime": "2024-01-01T00:00:00Z"}}, True),
    (HAS_UPDATED, {"self": {"other": 1}}, False),
    (ONE_RUNTIME, {"self": {}}, True),
    (ONE_RUNTIME, {"self": {"torch": {"numProcPerNode": 2}}}, True),
    (ONE_RUNTIME, {"self": {"flux": {}, "podGroupPolicy": {}}}, True),
    (ONE_RUNTIME, {"self": {"torch": {}, "mpi": {}}}, False),
    (ONE_RUNTIME, {"self": {"jax": {}, "xgboost": {}, "flux": {}}}, False),
    (NOT_NODE, {"self": ["launcher", "worker"]}, True),
    (NOT_NODE, {"self": []}, True),
    (NOT_NODE, {"self": ["launcher", "node"]}, False),
    (STARTUP_VS_DEPENDS, {"self": {"replicatedJobs": [{"name": "a", "dependsOn": []}]}}, True),
    (
        STARTUP_VS_DEPENDS,
        {"self": {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [{"name": "a"}]}},
        True,
    ),
    (
        STARTUP_VS_DEPENDS,
        {
            "self": {
                "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
                "replicatedJobs": [{"name": "a"}, {"name": "b", "dependsOn": [{"name": "a"}]}],
            }
        },
        True,
    ),
    (
        STARTUP_VS_DEPENDS,
        {
            "self": {
                "startupPolicy": {"startupPolicyOrder": "InOrder"},
                "replicatedJobs": [{"name": "a"}, {"name": "b", "dependsOn": [{"name": "a"}]}],
            }
        },
        False,
    ),
    (NO_NAMESPACE, {"self": {"templates": [{"metadata": {"name": "a"}}]}}, True),
    (NO_NAMESPACE, {"self": {"templates": [{"metadata": {"namespace": ""}}]}}, True),
    (NO_NAMESPACE, {"self": {"templates": []}}, True),
    (
        NO_NAMESPACE,
        {"self": {"templates": [{"metadata": {}}, {"metadata": {"namespace": "kube-system"}}]}},
        False,
    ),
    (EXACTLY_ONE_PLUGIN, {"self": {"tpp": {}}}, True),
    (EXACTLY_ONE_PLUGIN, {"self": {"ngts": {}, "other": 1}}, True),
    (EXACTLY_ONE_PLUGIN, {"self": {}}, False),
    (EXACTLY_ONE_PLUGIN, {"self": {"tpp": {}, "cloud": {}}}, False),
    (AT_MOST_ONE_PLUGIN, {"self": {}}, True),
    (AT_MOST_ONE_PLUGIN, {"self": {"cloud": {}}}, True),
    (AT_MOST_ONE_PLUGIN, {"self": {"tpp": {}, "cloud": {}, "ngts": {}}}, False),
]


@pytest.mark.parametrize(("rule", "activation", "expected"), CRD_CASES)
def test_crd_rule(rule: str, activation: dict[str, Any], expected: bool) -> None:
    assert cel.compile(rule).evaluate(activation) is expected


@pytest.mark.parametrize(
    ("rule", "activation"),
    [
        # Kubernetes reports these as rule evaluation errors; the caller turns them into field errors.
        (NAME_FORMAT, {"self": {"metadata": {}}}),
        (NAME_LENGTH, {"self": {"metadata": {"generateName": "x-"}}}),
        # A template without metadata: has() needs t.metadata to exist, so both sides of || fail.
        (NO_NAMESPACE, {"self": {"templates": [{"spec": {}}]}}),
        (AT_LEAST_ONE, {"self": "3"}),
        (NOT_NODE, {"self": "node"}),
    ],
)
def test_crd_rule_errors_on_malformed_object(rule: str, activation: dict[str, Any]) -> None:
    with pytest.raises(CELEvalError):
        cel.compile(rule).evaluate(activation)


def _rules_in(document: Any) -> list[str]:
    rules: list[str] = []
    if isinstance(document, dict):
        for key, value in document.items():
            if key == "x-kubernetes-validations":
                rules.extend(item["rule"] for item in value)
            else:
                rules.extend(_rules_in(value))
    elif isinstance(document, list):
        for item in document:
            rules.extend(_rules_in(item))
    return rules


def test_every_rule_in_our_crds_compiles_and_is_tested_here() -> None:
    rules: set[str] = set()
    for path in sorted((REPO / "crds").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            rules.update(_rules_in(document))
    assert rules, "no x-kubernetes-validations rules found in crds/*.yaml"
    for rule in rules:
        cel.compile(rule)
    # A rule added to the CRDs should get pass/fail cases in CRD_CASES above.
    assert rules == TRAINER_CRD_RULES


@pytest.mark.parametrize(
    ("rule", "uses_old_self"),
    [
        (IMMUTABLE, True),
        (NAME_FORMAT, False),
        ("self.all(x, x in oldSelf)", True),
        ("oldSelf.spec.replicas <= self.spec.replicas", True),
        # Here oldSelf is only the macro's own variable, so the rule is not a transition rule.
        ("self.all(oldSelf, oldSelf > 0)", False),
        ("has(oldSelf.a) || true", True),
    ],
)
def test_uses_old_self(rule: str, uses_old_self: bool) -> None:
    assert cel.compile(rule).uses_old_self is uses_old_self


def test_compile_is_cached_and_keeps_source() -> None:
    program = cel.compile("self.a + 1")
    assert cel.compile("self.a + 1") is program
    assert program.source == "self.a + 1"
    assert program.evaluate({"self": {"a": 1}}) == 2
    assert program.evaluate({"self": {"a": 41}}) == 42


# ---------------------------------------------------------------------------------------------
# Differential test against cel-python
# ---------------------------------------------------------------------------------------------

ACTIVATION: dict[str, Any] = {
    "self": {
        "a": 1,
        "b": {"c": "x"},
        "l": [3, 1, 2],
        "s": "Hello",
        "n": None,
        "f": 2.5,
        "t": True,
        "e": [],
    },
    "oldSelf": {"a": 1},
}

DIFFERENTIAL = [
    # arithmetic and precedence
    "1 + 2 * 3",
    "(1 + 2) * 3",
    "10 - 4 - 3",
    "2 * 3 % 4",
    "2 * (3 + 4) - 10 / 5",
    "-2 * -3",
    "--5",
    "-(-9223372036854775807)",
    "-9223372036854775808",
    "7 / 2",
    "-7 / 2",
    "7 % 3",
    "-7 % 3",
    "7 % -3",
    "1.5 + 2.25",
    "3.0 * 2.0",
    "1.0 / 4.0",
    "1.0 / 0.0 > 1e308",
    "1e308 * 10.0",
    "0x1F + 1",
    ".5 + .25",
    "self.f * 2.0",
    # numeric errors
    "1 / 0",
    "1 % 0",
    "9223372036854775807 + 1",
    "-9223372036854775808 - 1",
    "9223372036854775807 * 2",
    "-9223372036854775808 / -1",
    "1 + 1.0",
    "'a' + 1",
    "1.5 % 1.0",
    # comparison, equality, membership
    "1 < 2",
    "2 <= 2",
    "'abc' < 'abd'",
    "'b' > 'abc'",
    "false < true",
    "[1] < [2]",
    "'a' < 1",
    "null == null",
    "1 != 2",
    "[1, [2, 3]] == [1, [2, 3]]",
    "{'a': 1, 'b': 2} == {'b': 2, 'a': 1}",
    "[1, 2] == [2, 1]",
    "1 in [1, 2]",
    "3 in [1, 2]",
    "'a' in {'a': 1}",
    "'z' in {'a': 1}",
    "1 < 2 == true",
    "1 + 2 < 4 == true",
    # logic, including CEL's commutative error absorption
    "!!true",
    "!(1 < 2)",
    "false || true && false",
    "true || false && false",
    "true || 1 / 0 == 1",
    "1 / 0 == 1 || true",
    "false && 1 / 0 == 1",
    "1 / 0 == 1 && false",
    "true && 1 / 0 == 1",
    "1 / 0 == 1 || false",
    "1 > 2 ? 'x' : 'y'",
    "true ? 1 : 1 / 0",
    "1 ? 2 : 3",
    # field access, indexing, has()
    "self.b.c == 'x'",
    "self.missing",
    "self.b.missing",
    "self.a.b",
    "self.l[0]",
    "self.l[3]",
    "self.n == null",
    "has(self.a)",
    "has(self.zzz)",
    "has(self.b.c)",
    "has(self.b.d)",
    "{'k': 'v'}['z']",
    "[[1, 2], [3, 4]][1][0]",
    "{'a': {'b': {'c': 1}}}.a.b.c",
    "{'a': 1, 'a': 2}",
    # macros
    "self.l.all(x, x > 0)",
    "self.l.all(x, x > 1)",
    "self.l.exists(x, x == 2)",
    "self.l.exists_one(x, x > 2)",
    "self.l.exists_one(x, x > 1)",
    "self.l.filter(x, x > 1)",
    "self.l.map(x, x * 10)",
    "self.e.all(x, false)",
    "self.e.exists(x, true)",
    "[0, 1].exists(x, 10 / x > 1)",
    "[1, 0].all(x, 10 / x > 1)",
    "[1, 0].exists_one(x, 10 / x > 1)",
    "{'a': 1, 'b': 2}.exists(k, k == 'b')",
    "{'a': 1, 'b': 2}.filter(k, k == 'b')",
    "[1, 2, 3].filter(x, x % 2 == 1).map(x, x + 1)",
    "[1, 2].all(x, [3, 4].exists(y, y > x))",
    "[true, false, true].filter(x, x).size()",
    # sizes, strings and regular expressions (cel-python uses real RE2 here)
    "size(self.l) + self.l.size() + self.s.size() + size(self.b)",
    "size('héllo')",
    "size(1)",
    "'a' + 'b'",
    "[1, 2] + [3]",
    "'hello world'.startsWith('hello')",
    "'hello'.endsWith('lo')",
    "'hello'.contains('ell')",
    "self.s.startsWith(1)",
    "'abc123'.matches('^[a-z]+[0-9]+$')",
    "matches('abc', 'c$')",
    "'abc\\n'.matches('^abc$')",
    "'\u0663'.matches('^\\\\d$')",
    "'a]b'.matches('[]]')",
    "'x$'.matches('[$]$')",
    "'a'.matches('[')",
    # literals
    "'a\\tb'",
    '"double \\"quoted\\""',
    "'\\x41\\u00e9\\101'",
    "r'\\d+'",
    '"""triple "quoted" text"""',
    "'unicode: \\U0001F600'.size()",
    # conversions
    "int(3.9)",
    "int(-3.9)",
    "int('-42')",
    "int('4x')",
    "int(1e19)",
    "int('9223372036854775808')",
    "double(3)",
    "double('2.5')",
    "double('abc')",
    "string(-7)",
    "string(1.5)",
    "uint(-1)",
    "bool('false')",
    "bool('maybe')",
    "dyn(5) + 1",
]


@pytest.fixture(scope="module")
def celpy_evaluate() -> Any:
    celpy = pytest.importorskip("celpy")
    environment = celpy.Environment()

    def to_python(value: Any) -> Any:
        types = celpy.celtypes
        if isinstance(value, types.BoolType):
            return bool(value)
        if isinstance(value, (types.IntType, types.UintType)):
            return int(value)
        if isinstance(value, types.DoubleType):
            return float(value)
        if isinstance(value, types.StringType):
            return str(value)
        if isinstance(value, list):
            return [to_python(item) for item in value]
        if isinstance(value, dict):
            return {to_python(key): to_python(item) for key, item in value.items()}
        return value

    def evaluate(expr: str, activation: dict[str, Any]) -> tuple[str, Any]:
        try:
            program = environment.program(environment.compile(expr))
            result = program.evaluate({name: celpy.json_to_cel(value) for name, value in activation.items()})
        except Exception as exc:  # cel-python raises several types; all mean "error"
            return "error", repr(exc)
        if isinstance(result, Exception):
            return "error", repr(result)
        return "value", to_python(result)

    return evaluate


@pytest.mark.parametrize("expr", DIFFERENTIAL)
def test_agrees_with_cel_python(expr: str, celpy_evaluate: Any) -> None:
    kind, expected = celpy_evaluate(expr, ACTIVATION)
    if kind == "error":
        with pytest.raises(CELEvalError):
            cel.compile(expr).evaluate(ACTIVATION)
        return
    actual = cel.compile(expr).evaluate(ACTIVATION)
    # repr() also compares types: 1 vs 1.0 vs True must not pass as equal.
    assert repr(actual) == repr(expected)


def test_differential_corpus_covers_both_outcomes(celpy_evaluate: Any) -> None:
    outcomes = [celpy_evaluate(expr, ACTIVATION)[0] for expr in DIFFERENTIAL]
    assert len(DIFFERENTIAL) >= 80
    assert outcomes.count("error") >= 20
    assert outcomes.count("value") >= 60


# ---------------------------------------------------------------------------------------------
# Where Kubernetes' CEL (cel-go) and cel-python differ: we follow Kubernetes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # Heterogeneous equality (cel-go since v0.10, so every Kubernetes with CRD rules):
        # numbers compare by value across int and double; cel-python raises "no such overload".
        ("1 == 1.0", True),
        ("2 != 2.0", False),
        ("[1, 2] == [1.0, 2.0]", True),
        ("{'a': 1} == {'a': 1.0}", True),
        ("1 in [1.0]", True),
        # Values of different kinds are unequal rather than an error.
        ("'x' == 1", False),
        ("null == 0", False),
        ("[1, 'a'] == [1, 2]", False),
        ("1 in ['1']", False),
        # Python's True == 1 must not leak into CEL, where bool is not a number.
        ("true == 1", False),
        ("[true] == [1]", False),
        ("1 in [true]", False),
        ("{'a': true} == {'a': 1}", False),
        # Kubernetes enables cross-type numeric comparisons; cel-python refuses them.
        ("1 < 1.5", True),
        ("2.0 >= 2", True),
        ("9007199254740993 > 9007199254740992.0", True),
        # IEEE 754 as in Go: NaN is unequal to itself, and the sign survives division by zero.
        # (cel-python answers true and +inf respectively.)
        ("0.0 / 0.0 == 0.0 / 0.0", False),
        ("-1.0 / 0.0 < 0.0", True),
        # string() of a bool/double: cel-go prints Go's "true" and "%g"; cel-python prints Python's.
        ("string(true)", "true"),
        ("string(1e6)", "1e+06"),
        ("string(123456.0)", "123456"),
        ("string(0.1 + 0.2)", "0.30000000000000004"),
        ("string(0.00001)", "1e-05"),
        ("string(-2.5e-3)", "-0.0025"),
        # The 3-argument map() macro, which cel-python cannot parse.
        ("[1, 2, 3].map(x, x > 1, x * 2)", [4, 6]),
        # cel-go accepts an integral double as a list index.
        ("[1, 2][1.0]", 2),
    ],
)
def test_kubernetes_semantics_where_cel_python_differs(expr: str, expected: Any) -> None:
    assert repr(run(expr)) == repr(expected)


@pytest.mark.parametrize(
    "expr",
    [
        # cel-python wraps negative indices Python-style; CEL has no negative indexing.
        "[1, 2, 3][-1]",
        # cel-python answers false; in CEL has() on a non-message, non-map operand is an error.
        "has({'a': 1}.a.b)",
        # cel-python returns 'x'; CEL's && is defined on bools only.
        "true && 'x'",
        # cel-go reports overflow for MinInt64 % -1 (as for MinInt64 / -1); cel-python returns 0.
        "-9223372036854775808 % -1",
        # cel-go refuses float64(MinInt64) itself; cel-python converts it.
        "int(-9223372036854775808.0)",
        # Go's strconv.ParseInt takes no spaces; cel-python's int() strips them.
        "int(' 3')",
        # Go's strconv.ParseBool accepts 1/t/TRUE/... but not 'yes'.
        "bool('yes')",
    ],
)
def test_errors_where_cel_python_is_lenient(expr: str) -> None:
    with pytest.raises(CELEvalError):
        run(expr)


# ---------------------------------------------------------------------------------------------
# Semantics cel-python cannot check: Kubernetes' string and list libraries, numbers, errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("'MiXed-Ünï'.lowerAscii()", "mixed-Ünï"),
        ("'MiXed-ünï'.upperAscii()", "MIXED-üNï"),
        ("' \\t\\n\\u00a0 padded \\u3000'.trim()", "padded"),
        ("'a,b,,c'.split(',')", ["a", "b", "", "c"]),
        ("'a,b,c'.split(',', 2)", ["a", "b,c"]),
        ("'a,b,c'.split(',', 0)", []),
        ("'a,b,c'.split(',', -1)", ["a", "b", "c"]),
        ("'abc'.split('')", ["a", "b", "c"]),
        ("'abc'.split('', 2)", ["a", "bc"]),
        ("''.split(',')", [""]),
        ("['a', 'b', 'c'].join()", "abc"),
        ("['a', 'b', 'c'].join('-')", "a-b-c"),
        ("[].join(',')", ""),
        ("'hello'.indexOf('l')", 2),
        ("'hello'.indexOf('z')", -1),
        ("'hello'.indexOf('')", 0),
        ("'hello'.indexOf('l', 3)", 3),
        ("'héllo wörld'.indexOf('ö')", 7),
        ("'hello'.lastIndexOf('l')", 3),
        ("'hello'.lastIndexOf('')", 5),
        ("'hello'.lastIndexOf('l', 2)", 2),
        ("'hello'.lastIndexOf('l', 1)", -1),
        ("'hello hello'.lastIndexOf('hello', 10)", 6),
        ("[1, 2, 3, 2].indexOf(2)", 1),
        ("[1, 2, 3, 2].lastIndexOf(2)", 3),
        ("['a'].indexOf('b')", -1),
        ("'aaa'.replace('a', 'b')", "bbb"),
        ("'aaa'.replace('a', 'b', 2)", "bba"),
        ("'aaa'.replace('a', 'b', 0)", "aaa"),
        ("'aaa'.replace('a', 'b', -1)", "bbb"),
        ("'tacocat'.substring(4)", "cat"),
        ("'tacocat'.substring(0, 4)", "taco"),
        ("'héllo'.substring(1, 2)", "é"),
        ("'abc'.substring(3)", ""),
        ("'abc'.charAt(1)", "b"),
        ("'abc'.charAt(3)", ""),
        ("[1, 2, 2, 3].isSorted()", True),
        ("[1, 3, 2].isSorted()", False),
        ("['a', 'b'].isSorted()", True),
        ("[].isSorted()", True),
        ("[1, 2, 3].sum()", 6),
        ("[1.5, 2.5].sum()", 4.0),
        ("[].sum()", 0),
        ("[3, 1, 2].min()", 1),
        ("[3, 1, 2].max()", 3),
        ("['b', 'a'].min()", "a"),
        ("[1, 2.5].max()", 2.5),
        ("uint(5) + 1u", 6),
        ("0xFFu", 255),
        # RE2's \z is Python's \Z; a '$' in a character class stays a literal '$'.
        ("'ab'.matches('b\\\\z') && !'ab\\n'.matches('b\\\\z')", True),
        ("'a$b'.matches('^a[$]b$') && 'ab\\n'.matches('(?m)^ab$')", True),
        ("'''two\nlines'''", "two\nlines"),
        ("r'''raw \\n'''", "raw \\n"),
        ("'\\a\\b\\f\\n\\r\\t\\v\\\\\\?\\'\\\"\\`'", "\a\b\f\n\r\t\v\\?'\"`"),
        ("'\\U0001F600'", "\U0001f600"),
        ("int('+5')", 5),
        ("double('1e3')", 1000.0),
        ("double('-Inf') < 0.0", True),
        ("bool('T') && !bool('0')", True),
        ("[1, 2,]", [1, 2]),
        ("{'a': 1,}", {"a": 1}),
        ("{}", {}),
        ("{1: 'one', 'two': 2}[1]", "one"),
        ("{1: 'one'}[1.0]", "one"),
        ("// a comment\n self.x // another\n + 1", 2),
        (".self.x", 1),
        ("-9223372036854775807 - 1", -9223372036854775808),
        ("-5 / 2 * 2 + -5 % 2", -5),
        ("-(5 / 2)", -2),
    ],
)
def test_kubernetes_library_and_literals(expr: str, expected: Any) -> None:
    assert repr(run(expr, self={"x": 1})) == repr(expected)


@pytest.mark.parametrize(
    "expr",
    [
        "'hello'.indexOf('l', 5)",
        "'hello'.indexOf('l', -1)",
        "'hello'.lastIndexOf('l', 5)",
        "'abc'.substring(4)",
        "'abc'.substring(2, 1)",
        "'abc'.substring(-1)",
        "'abc'.charAt(4)",
        "[1, 'a'].join()",
        "[1, 'a'].isSorted()",
        "[1, 2.5].sum()",
        "['a'].sum()",
        "[].min()",
        "[].max()",
        "[[1], [2]].max()",
        # bool is not a number, even though Python's bool is an int subclass.
        "true + 1",
        "-true",
        "[true, false].sum()",
        "int(true)",
        "self.t * 2",
        "[1, 2][true]",
        # int64 overflow in every int operation
        "-(-9223372036854775807 - 1)",
        "[9223372036854775807, 1].sum()",
        "uint(18446744073709551616.0)",
        "int(1.0 / 0.0)",
        "int(0.0 / 0.0)",
        # cel-go refuses to order NaN rather than answering false.
        "0.0 / 0.0 < 1.0",
        "1 >= 0.0 / 0.0",
        "[1.0, 0.0 / 0.0].isSorted()",
        # maps and keys
        "{[1]: 2}",
        "{1.5: 2}",
        "{1: 'a', 1.0: 'b'}",
        "{'a': 1}[[1]]",
        "{true: 'a'}[1]",
        "{1: 'a'}[true]",
        "{'a': 1}.all(k, k > 1)",
        "null.a",
        "'abc'[0]",
        "'abc'.a",
        "undeclared + 1",
        "5.exists(x, true)",
        "[1, 2].filter(x, x)",
        "[1, 2].exists_one(x, 1)",
        "!1",
        "'a'.matches('(?P<n>a)(?P=n')",
    ],
)
def test_runtime_errors(expr: str) -> None:
    with pytest.raises(CELEvalError):
        run(expr, self={"t": True})


def test_missing_key_error_names_the_key() -> None:
    with pytest.raises(CELEvalError, match="no such key: replicas"):
        run("self.spec.replicas > 0", self={"spec": {}})
    with pytest.raises(CELEvalError, match="no such key: gpu"):
        run("self.limits['gpu'] > 0", self={"limits": {"cpu": 1}})
    with pytest.raises(CELEvalError, match="undeclared reference to 'oldSelf'"):
        run("self == oldSelf", self=1)


def test_has_on_missing_intermediate_field_is_an_error() -> None:
    with pytest.raises(CELEvalError, match="no such key: metadata"):
        run("has(self.metadata.namespace)", self={})
    assert run("has(self.metadata) && has(self.metadata.namespace)", self={}) is False
    assert run("has(self.metadata.namespace)", self={"metadata": {"namespace": ""}}) is True


@pytest.mark.parametrize("deciding_first", [True, False])
def test_logical_operators_absorb_errors_in_either_order(deciding_first: bool) -> None:
    failing = "self.missing == 1"
    for operator, deciding in (("&&", "false"), ("||", "true")):
        operands = (deciding, failing) if deciding_first else (failing, deciding)
        assert run(f"{operands[0]} {operator} {operands[1]}", self={}) is (deciding == "true")
    # A non-bool operand is an error that a deciding operand also absorbs.
    assert run("'x' || true") is True
    assert run("false && 1") is False


def test_quantifiers_let_a_deciding_element_win_over_errors() -> None:
    objects = [{"a": 1}, {}, {"a": 5}]
    assert run("self.exists(o, o.a > 3)", self=objects) is True
    assert run("self.all(o, o.a < 3)", self=objects) is False
    with pytest.raises(CELEvalError, match="no such key: a"):
        run("self.all(o, o.a < 10)", self=objects)
    with pytest.raises(CELEvalError, match="no such key: a"):
        run("self.exists(o, o.a > 10)", self=objects)
    # exists_one counts every element, so an error anywhere is an error.
    with pytest.raises(CELEvalError):
        run("self.exists_one(o, o.a > 3)", self=objects)


def test_macro_variable_shadows_and_nests() -> None:
    assert run("self.map(self, self * 2)", self=[1, 2]) == [2, 4]
    assert run("self.all(x, self.exists(y, y == x))", self=[1, 2]) is True
    assert run("[[1, 2], [3]].map(x, x.map(y, y + 1))") == [[2, 3], [4]]
    assert run("{'b': 1, 'a': 2}.map(k, k)") == ["b", "a"]


def test_int_division_truncates_toward_zero_and_modulo_keeps_dividend_sign() -> None:
    for a in (-9223372036854775807, -7, -6, -1, 0, 1, 6, 7, 9223372036854775807):
        for b in (-3, -1, 2, 3, 9223372036854775807):
            quotient = run(f"{a} / {b}")
            remainder = run(f"{a} % {b}")
            assert quotient == int(Fraction(a, b))  # int() of a Fraction truncates toward zero
            assert quotient * b + remainder == a
            assert remainder == 0 or (remainder < 0) == (a < 0)


def test_returned_values_are_plain_json_types() -> None:
    result = run("{'n': [1, 2.5, 'x', true, null, {'k': self}]}", self=[])
    assert json.loads(json.dumps(result)) == result
    assert isinstance(run("self.map(x, x)", self=[1])[0], int)
    assert math.isinf(run("1.0 / 0.0"))


def test_deep_nesting_fails_as_cel_errors_not_recursion_errors() -> None:
    with pytest.raises(CELSyntaxError, match="nests too deeply"):
        cel.compile("(" * 2000 + "1" + ")" * 2000)
    nested: Any = 1
    for _ in range(5000):
        nested = [nested]
    with pytest.raises(CELEvalError, match="nests too deeply"):
        run("self == oldSelf", self=nested, oldSelf=nested)


# ---------------------------------------------------------------------------------------------
# Compile errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("1 +", "unexpected end of expression"),
        ("(1 + 2", "expected ')'"),
        ("[1, 2", "expected ','"),
        ("{'a' 1}", "expected ':'"),
        ("1 ? 2", "expected ':'"),
        ("self.", "expected a field or method name"),
        ("1 2", "unexpected 2"),
        ("a # b", "unexpected character '#'"),
        ("!-1", "unexpected '-'"),
        ("'unterminated", "unterminated string literal"),
        ("'line\nbreak'", "newline in a single-quoted string"),
        ("'\\q'", "invalid escape sequence \\q"),
        ("'\\x4'", "invalid \\x escape"),
        ("'\\ud800'", "not a valid code point"),
        ("b'bytes'", "bytes literals are not supported"),
        ("9223372036854775808", "out of range"),
        ("-9223372036854775809", "out of range"),
        ("18446744073709551616u", "out of range"),
        ("in + 1", "reserved word 'in'"),
        ("while", "reserved word 'while'"),
        # unknown functions and macros, named in the message
        ("frobnicate(self)", "undeclared reference to function 'frobnicate'"),
        ("self.name.isEmpty()", "undeclared reference to function 'isEmpty'"),
        ("self.all(x)", "undeclared reference to function 'all'"),
        ("all(self, x, x > 0)", "undeclared reference to function 'all'"),
        ("timestamp('2024-01-01T00:00:00Z')", "undeclared reference to function 'timestamp'"),
        ("type(self) == int", "undeclared reference to function 'type'"),
        ("self.x.quantity()", "undeclared reference to function 'quantity'"),
        # known functions called the wrong way or with the wrong arity
        ("size(self, 2)", "no overload of 'size' takes 2"),
        ("'a'.startsWith()", "no overload of method 'startsWith' takes 0"),
        ("startsWith('ab', 'a')", "call it as a method, x.startsWith(...)"),
        ("'5'.int()", "call it as a function, int(...)"),
        # macros given something other than what they need
        ("has(self)", "has() needs a single field selection"),
        ("has(self['a'])", "has() needs a single field selection"),
        ("has(self.a, self.b)", "has() needs a single field selection"),
        ("self.exists(1, true)", "exists() needs a variable name"),
        ("self.map(x.y, 1)", "map() needs a variable name"),
    ],
)
def test_syntax_errors_name_the_problem(expr: str, message: str) -> None:
    with pytest.raises(CELSyntaxError) as caught:
        cel.compile(expr)
    assert message in str(caught.value)
    assert isinstance(caught.value, CELError)
    assert not isinstance(caught.value, CELEvalError)


# ---------------------------------------------------------------------------------------------
# Import cost: `trainer render` imports this on every start
# ---------------------------------------------------------------------------------------------

_IMPORT_PROBE = """
import json, sys
before = set(sys.modules)
import trainer.apimachinery.cel
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_import_uses_only_the_standard_library() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE], capture_output=True, text=True, check=True, cwd=REPO
    )
    loaded = json.loads(result.stdout)
    assert "trainer.apimachinery.cel" in loaded
    foreign = [
        name
        for name in loaded
        if name.split(".")[0] not in sys.stdlib_module_names and not name.startswith("trainer")
    ]
    assert foreign == []
    assert not any(name.split(".")[0] in ("celpy", "lark", "re2") for name in loaded)
