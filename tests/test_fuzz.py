"""Fuzzing admission and render with hypothesis: TrainJobs and runtimes, valid and nearly valid.

Each example starts from a valid object (a bundled runtime, a TrainJob that uses many fields)
and changes a few fields: values of the wrong type, out of range, empty, huge, unknown keys,
removed keys. Whatever comes in, ``trainer render`` (admission, then the render core) must
answer with admitted objects or refusals; never an exception, and every refusal names a field.
A TrainJob that is admitted must render without a reconcile that crashes, and the objects it
renders must be what their kinds need (a name, a namespace, an owner).
"""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, given, settings
from hypothesis import strategies as st

from trainer.offline.cluster import OfflineCluster
from trainer.runtime import framework as fw

Obj = dict[str, Any]
TJ = "trainer.kubeflow.org/v1alpha1"

RUNTIMES: list[Obj] = [
    doc
    for path in sorted(Path(str(resources.files("trainer.runtimes"))).glob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    if isinstance(doc, dict)
]

BASE_TRAINJOB: Obj = {
    "apiVersion": TJ,
    "kind": "TrainJob",
    "metadata": {"name": "fuzz", "namespace": "default", "labels": {"team": "a"}},
    "spec": {
        "runtimeRef": {
            "name": "fuzz-runtime",
            "kind": "ClusterTrainingRuntime",
            "apiGroup": "trainer.kubeflow.org",
        },
        "suspend": False,
        "activeDeadlineSeconds": 3600,
        "trainer": {
            "image": "example.com/train:1",
            "command": ["python", "train.py"],
            "args": ["--epochs", "1"],
            "env": [
                {"name": "LR", "value": "0.1"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "numNodes": 2,
            "resourcesPerNode": {"limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1}},
        },
        "initializer": {
            "dataset": {"storageUri": "hf://org/data", "env": [{"name": "A", "value": "b"}]},
            "model": {"storageUri": "hf://org/model"},
        },
        "runtimePatches": [
            {
                "manager": "example.com/fuzz",
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {
                                    "name": "node",
                                    "template": {
                                        "spec": {
                                            "template": {
                                                "spec": {
                                                    "nodeSelector": {"pool": "gpu"},
                                                    "tolerations": [{"key": "k", "operator": "Exists"}],
                                                }
                                            }
                                        }
                                    },
                                }
                            ]
                        }
                    }
                },
            }
        ],
    },
}

ODD_STRINGS = [
    "",
    "auto",
    "cpu",
    "gpu",
    "-1",
    "0",
    "2.5",
    "1Gi",
    "a" * 300,
    "Node",
    "node",
    "UPPER_case",
    "é",
    "a/b",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.sampled_from([0, -1, 1, 2**31, 10_000_000]),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from(ODD_STRINGS),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["name", "value", "x", "image", "kind"]), inner, max_size=3),
    ),
    max_leaves=6,
)


def same_type(value: Any) -> st.SearchStrategy[Any]:
    """Another value of the same JSON type: what passes the schema's types and tests the rules."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.one_of(st.integers(-2, 70), st.sampled_from([0, 1, 1024, 10_001, 2**31]))
    if isinstance(value, str):
        return st.one_of(st.sampled_from(ODD_STRINGS), st.text(max_size=12))
    if isinstance(value, list):
        return st.one_of(st.just([]), st.just(value + value), st.just(value[:1]))
    if isinstance(value, dict):
        return st.one_of(st.just({}), st.dictionaries(st.sampled_from(["name", "x"]), scalars, max_size=2))
    return values


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``obj`` (dict keys and list indexes)."""
    found: list[tuple[Any, ...]] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            found.append((*prefix, key))
            found.extend(paths(value, (*prefix, key)))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            found.append((*prefix, index))
            found.extend(paths(value, (*prefix, index)))
    return found


@st.composite
def mutated(draw: st.DrawFn, base: Obj, protect: int = 2) -> Obj:
    """``base`` with up to four fields set to odd values, removed, or added where none was."""
    obj = copy.deepcopy(base)
    for _ in range(draw(st.integers(0, 4))):
        candidates = [p for p in paths(obj) if len(p) > protect or p[0] in ("spec", "metadata")]
        if not candidates:
            break
        path = draw(st.sampled_from(candidates))
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["same-type", "same-type", "set", "delete", "add"]))
        last = path[-1]
        if action == "same-type":
            parent[last] = draw(same_type(parent[last]))
        elif action == "delete":
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[
                draw(st.sampled_from(["numNodes", "numProcPerNode", "mpi", "torch", "replicas", "extra"]))
            ] = draw(values)
        else:
            parent[last] = draw(values)
    return obj


def base_for(runtime: Obj) -> Obj:
    """The base TrainJob, without initializers the runtime has no job for (those are refused)."""
    trainjob = copy.deepcopy(BASE_TRAINJOB)
    jobs = {rj["name"] for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    initializer = trainjob["spec"]["initializer"]
    for field, job in (("dataset", "dataset-initializer"), ("model", "model-initializer")):
        if job not in jobs:
            del initializer[field]
    return trainjob


def runtime_named(runtime: Obj) -> Obj:
    out = copy.deepcopy(runtime)
    out["metadata"] = {
        "name": "fuzz-runtime",
        "labels": dict((runtime.get("metadata") or {}).get("labels") or {}),
    }
    return out


def apply_all(objects: list[Obj]) -> OfflineCluster:
    cluster = OfflineCluster(framework=fw.default())
    for obj in objects:
        cluster.apply(obj)  # must not raise, whatever obj is
    return cluster


def check(cluster: OfflineCluster) -> None:
    event("refused" if cluster.refusals else "admitted")  # pytest --hypothesis-show-statistics
    for refusal in cluster.refusals:
        assert refusal.errors, f"{refusal.kind} {refusal.name}: refused without a reason"
        for error in refusal.errors:
            assert error.path, f"{refusal.kind} {refusal.name}: a refusal that names no field: {error}"
            assert "Traceback" not in str(error)
    for obj in cluster.output():
        meta = obj["metadata"]
        assert meta.get("name"), obj
        if obj["kind"] != "TrainJob":
            assert meta["ownerReferences"][0]["kind"] == "TrainJob", obj
        for condition in (obj.get("status") or {}).get("conditions") or []:
            assert "Traceback" not in condition.get("message", ""), condition


FUZZ = settings()  # the profile in conftest.py: 300 examples, or more with --hypothesis-profile


@FUZZ
@given(data=st.data(), runtime=st.sampled_from(RUNTIMES))
def test_nearly_valid_trainjobs(data: st.DataObject, runtime: Obj) -> None:
    trainjob = data.draw(mutated(base_for(runtime)))
    check(apply_all([runtime_named(runtime), trainjob]))


@FUZZ
@given(data=st.data(), runtime=st.sampled_from(RUNTIMES))
def test_nearly_valid_runtimes(data: st.DataObject, runtime: Obj) -> None:
    broken = data.draw(mutated(runtime_named(runtime), protect=3))
    check(apply_all([broken, base_for(runtime)]))


@FUZZ
@given(data=st.data(), runtime=st.sampled_from(RUNTIMES))
def test_updates_of_nearly_valid_trainjobs(data: st.DataObject, runtime: Obj) -> None:
    """The second version of a TrainJob is checked as an update (immutable fields, suspension)."""
    first = base_for(runtime)
    first["spec"]["suspend"] = data.draw(st.booleans())
    second = data.draw(mutated(first))
    check(apply_all([runtime_named(runtime), first, second]))


@FUZZ
@given(obj=values)
def test_any_json_as_a_trainjob_spec(obj: Any) -> None:
    check(apply_all([{"apiVersion": TJ, "kind": "TrainJob", "metadata": {"name": "any"}, "spec": obj}]))


@pytest.mark.parametrize("runtime", RUNTIMES, ids=lambda r: r["metadata"]["name"])
def test_the_base_trainjob_is_admitted_on_every_runtime(runtime: Obj) -> None:
    """The fuzzing starts from valid objects: otherwise it only ever tests refusals."""
    cluster = apply_all([runtime_named(runtime), base_for(runtime)])
    assert not cluster.refusals, [line for r in cluster.refusals for line in r.lines()]
    assert any(o["kind"] == "JobSet" for o in cluster.output())
