"""The generated views (trainer/api/views/) read an admitted object as the pydantic models do.

The render core, admission's webhook rules and the plugins read admitted objects through the
views; the models are the source of the CRDs. For every object here, each property of its view
equals the attribute of the model validated from the same object, recursively (the same JSON
key, the same default when the key is absent, nested models as views), a plain value the view
returns is the object's own (so a change made through it reaches the object), and the models'
own properties and methods (``name``, ``source()``) agree.

The reference is pydantic's own reading, ``model_validate``: it gives an absent field the same
default as ``model_construct``, which the render core's views were built with before these, and
it also says the object is one the models accept.

The objects: every bundled runtime (as ClusterTrainingRuntime and as TrainingRuntime) and example,
the fuzz tests' TrainJob on each runtime, objects that set every field the models have (a test
checks that every field was read from an object that has it), each of these with every optional
field left out in turn (admission fills the defaulted ones in), and the fuzz tests' nearly valid
variants that admission accepts. Each is what admission stored, defaults applied.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from render_helpers import ROOT
from test_fuzz import FUZZ, RUNTIMES, base_for, mutated, runtime_named

from trainer.api import constants as c
from trainer.api import viewgen, views
from trainer.apimachinery import schema_validation
from trainer.apimachinery.openapi import schemas
from trainer.offline.cluster import OfflineCluster
from trainer.runtime import framework as fw

Obj = dict[str, Any]
MODELS: dict[str, type[BaseModel]] = {model.__name__: model for model in viewgen.models()}
KINDS = (c.TRAINJOB_KIND, c.TRAINING_RUNTIME_KIND, c.CLUSTER_TRAINING_RUNTIME_KIND)


def _load(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]


EXAMPLES = [doc for path in sorted((ROOT / "examples").glob("*.yaml")) for doc in _load(path)]


def _as_training_runtime(runtime: Obj) -> Obj:
    out = copy.deepcopy(runtime)
    out["kind"] = c.TRAINING_RUNTIME_KIND
    out["metadata"]["name"] = "namespaced-" + out["metadata"]["name"]
    return out


def _with_policies(runtime: Obj, name: str, spec: Obj) -> Obj:
    out = copy.deepcopy(runtime)
    out["metadata"]["name"] = name
    out["spec"].update(spec)
    return out


def _by_name(name: str) -> Obj:
    return next(r for r in RUNTIMES if r["metadata"]["name"] == name)


TORCH = _by_name("torch-distributed")
# Runtimes that set every field of the runtime models.
EVERY_RUNTIME_FIELD = [
    _with_policies(
        _by_name("deepspeed-distributed"),
        "views-mpi",
        {
            "mlPolicy": {
                "numNodes": 2,
                "mpi": {
                    "numProcPerNode": 2,
                    "mpiImplementation": "OpenMPI",
                    "sshAuthMountPath": "/home/mpiuser/.ssh",
                    "runLauncherAsNode": True,
                },
            },
            "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 120}},
            "runPolicy": {"activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 60},
        },
    ),
    _with_policies(
        TORCH,
        "views-flux",
        {
            "mlPolicy": {"numNodes": 2, "flux": {"numProcPerNode": 4}},
            "podGroupPolicy": {"volcano": {"networkTopology": {"mode": "soft", "highestTierAllowed": 2}}},
        },
    ),
    _with_policies(
        TORCH,
        "views-torch",
        {
            "mlPolicy": {
                "numNodes": 1,
                "torch": {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["sidecar"]}]}},
            },
            "podGroupPolicy": {"workload": {"scheduleTimeoutSeconds": 300}},
        },
    ),
    _with_policies(TORCH, "views-jax", {"mlPolicy": {"jax": {}}}),
    _with_policies(TORCH, "views-xgboost", {"mlPolicy": {"xgboost": {}}}),
]
EVERY_RUNTIME_FIELD[0]["spec"]["template"]["metadata"] = {
    "labels": {"team": "a"},
    "annotations": {"note": "b"},
    "finalizers": ["example.com/keep"],
    "name": "ignored",
    "namespace": "ignored",
}


def _node_pod(runtime: Obj) -> Obj:
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod: Obj = next(job for job in jobs if job["name"] == "node")["template"]["spec"]["template"]["spec"]
    return pod


_node_pod(EVERY_RUNTIME_FIELD[2])["containers"].append({"name": "sidecar", "image": "busybox"})
# The TrainJob's runtime: initializers, and a node job with a sidecar and an init container.
PATCHABLE = copy.deepcopy(_by_name("torchtune-llama3.2-1b"))
PATCHABLE["metadata"]["name"] = "views-patchable"
_node_pod(PATCHABLE)["containers"].append({"name": "sidecar", "image": "busybox"})
_node_pod(PATCHABLE)["initContainers"] = [{"name": "prepare", "image": "busybox"}]
_META = {"labels": {"a": "b"}, "annotations": {"c": "d"}}
_CONTAINER_PATCH = {
    "env": [{"name": "A", "value": "b"}],
    "securityContext": {"runAsUser": 1000},
    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
}
# A TrainJob that sets every spec field of the TrainJob models.
EVERY_TRAINJOB_FIELD: Obj = {
    "apiVersion": c.API_VERSION,
    "kind": c.TRAINJOB_KIND,
    "metadata": {"name": "views-everything", "namespace": "default"},
    "spec": {
        "runtimeRef": {
            "name": "views-patchable",
            "kind": c.CLUSTER_TRAINING_RUNTIME_KIND,
            "apiGroup": c.GROUP,
        },
        "suspend": True,
        "managedBy": c.MANAGED_BY_TRAINER,
        "activeDeadlineSeconds": 3600,
        "ttlSecondsAfterFinished": 60,
        "initializer": {
            "dataset": {"storageUri": "hf://org/data", "env": [{"name": "A", "value": "b"}]},
            "model": {"storageUri": "hf://org/model", "secretRef": {"name": "token"}},
        },
        "trainer": {
            "image": "example.com/train:1",
            "command": ["python", "train.py"],
            "args": ["--epochs", "1"],
            "env": [{"name": "LR", "value": "0.1"}],
            "numNodes": 2,
            "numProcPerNode": 2,
            "resourcesPerNode": {"limits": {"cpu": "2", "memory": "4Gi"}},
        },
        "runtimePatches": [
            {
                "manager": "example.com/views",
                "trainingRuntimeSpec": {
                    "template": {
                        "metadata": _META,
                        "spec": {
                            "replicatedJobs": [
                                {
                                    "name": "node",
                                    "template": {
                                        "metadata": _META,
                                        "spec": {
                                            "template": {
                                                "metadata": _META,
                                                "spec": {
                                                    "affinity": {"nodeAffinity": {}},
                                                    "containers": [{"name": "sidecar", **_CONTAINER_PATCH}],
                                                    "imagePullSecrets": [{"name": "registry"}],
                                                    "initContainers": [
                                                        {"name": "prepare", **_CONTAINER_PATCH}
                                                    ],
                                                    "nodeSelector": {"pool": "gpu"},
                                                    "schedulingGates": [{"name": "example.com/wait"}],
                                                    "securityContext": {"runAsNonRoot": True},
                                                    "serviceAccountName": "trainer",
                                                    "terminationGracePeriodSeconds": 30,
                                                    "tolerations": [{"key": "k", "operator": "Exists"}],
                                                    "volumes": [{"name": "data", "emptyDir": {}}],
                                                },
                                            }
                                        },
                                    },
                                }
                            ]
                        },
                    }
                },
            }
        ],
    },
}
# A status with every field, as the operator and the training pods write it (the main resource
# ignores status, so this one is checked against the schema rather than admitted).
EVERY_STATUS_FIELD: Obj = {
    "startTime": "2026-01-01T00:00:00Z",
    "completionTime": "2026-01-01T01:00:00Z",
    "conditions": [
        {
            "type": "Complete",
            "status": "True",
            "reason": "JobSetCompleted",
            "message": "done",
            "lastTransitionTime": "2026-01-01T01:00:00Z",
            "observedGeneration": 2,
        }
    ],
    "jobsStatus": [{"name": "node", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}],
    "trainerStatus": {
        "progressPercentage": 100,
        "estimatedRemainingSeconds": 0,
        "metrics": [{"name": "loss", "value": "0.1"}],
        "lastUpdatedTime": "2026-01-01T01:00:00Z",
    },
}


def admitted(*objects: Obj) -> list[Obj]:
    """What ``trainer render`` stores of the objects it admits: runtimes, then TrainJobs (with the
    status their reconcile gave them)."""
    cluster = OfflineCluster(framework=fw.default())
    for obj in objects:
        cluster.apply(copy.deepcopy(obj))
    return [
        *cluster.facts.of_kind(c.CLUSTER_TRAINING_RUNTIME_KIND),
        *cluster.facts.of_kind(c.TRAINING_RUNTIME_KIND),
        *cluster.trainjobs.values(),
    ]


# (model, field, whether the object had the field's key): what the comparisons have covered.
Seen = set[tuple[str, str, bool]]


def assert_reads_alike(obj: Obj, seen: Seen | None = None, kind: str | None = None) -> None:
    """The view of an admitted object against the model validated from it (``kind``: when the
    object does not say)."""
    kind = kind or obj["kind"]
    assert kind in KINDS
    view, model = getattr(views, kind)(obj), MODELS[kind].model_validate(obj)
    _same_model(view, obj, model, kind, set() if seen is None else seen)


def _same_model(view: Any, raw: Obj, model: BaseModel, path: str, seen: Seen) -> None:
    cls = type(model)
    assert type(view) is getattr(views, cls.__name__), path
    public = {name for name in dir(type(view)) if not name.startswith("_")}
    assert set(cls.model_fields) <= public, path
    for name, info in cls.model_fields.items():
        key = info.alias or name
        got, want = getattr(view, name), getattr(model, name)
        where = f"{path}.{key}"
        assert getattr(view, name) is got, f"{where}: a new object on each read, unlike a model's"
        seen.add((cls.__name__, name, key in raw))
        if isinstance(want, BaseModel):
            _same_model(got, raw.get(key) or {}, want, where, seen)
        elif isinstance(want, list) and viewgen.models_in(info.annotation):
            assert isinstance(got, list) and len(got) == len(want), where
            for i, (got_item, want_item) in enumerate(zip(got, want, strict=True)):
                _same_model(got_item, raw[key][i], want_item, f"{where}[{i}]", seen)
        else:
            assert got == want, f"{where}: {got!r} != {want!r}"
            if key in raw:
                assert got is raw[key], f"{where}: not the object's own value"
    # What the models define besides their fields: copied into the views as they are.
    for name in sorted(public - set(cls.model_fields)):
        defined = hasattr(cls, name) and not hasattr(BaseModel, name)
        assert defined, f"{path}: the view has {name}, which {cls.__name__} does not define"
        got, want = getattr(view, name), getattr(model, name)
        if callable(want):
            got, want = got(), want()
        assert got == want, f"{path}.{name}: {got!r} != {want!r}"


def trainjob_on(runtime: Obj) -> Obj:
    """The fuzz tests' TrainJob (many fields set), on ``runtime``."""
    trainjob = base_for(runtime)
    name = runtime["metadata"]["name"]
    trainjob["metadata"]["name"] = "views-" + name.replace(".", "-")
    trainjob["spec"]["runtimeRef"] = {"name": name, "kind": runtime["kind"]}
    return trainjob


# A runtime and a TrainJob on it, the bases of the nearly valid variants.
PAIRS = [
    *((r, trainjob_on(r)) for r in [*RUNTIMES, *EVERY_RUNTIME_FIELD]),
    (PATCHABLE, EVERY_TRAINJOB_FIELD),
]


def _fixed() -> Iterator[Obj]:
    runtimes = [*RUNTIMES, *map(_as_training_runtime, RUNTIMES), *EVERY_RUNTIME_FIELD, PATCHABLE]
    yield from admitted(*runtimes, *EXAMPLES, *(trainjob for _, trainjob in PAIRS))
    with_status = {**admitted(PATCHABLE, EVERY_TRAINJOB_FIELD)[-1], "status": EVERY_STATUS_FIELD}
    assert schema_validation.validate(schemas()[c.TRAINJOB_KIND], with_status) == []
    yield with_status


def test_every_admitted_object_reads_alike_through_its_view_and_its_model() -> None:
    seen: Seen = set()
    objects = list(_fixed())
    assert {o["kind"] for o in objects} == set(KINDS)
    for obj in objects:
        assert_reads_alike(obj, seen)
    every = {(name, field, True) for name, model in MODELS.items() for field in model.model_fields}
    assert every - seen == set(), "fields no object here sets: add them to the objects above"


def _optional_fields(raw: Obj, model: BaseModel, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every key in ``raw`` that is an optional field of its model, at any depth."""
    for name, info in type(model).model_fields.items():
        key = info.alias or name
        if key not in raw:
            continue
        if not info.is_required():
            yield (*path, key)
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _optional_fields(raw[key], value, (*path, key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _optional_fields(raw[key][i], item, (*path, key, i))


def test_a_field_left_out_reads_as_the_models_default() -> None:
    """Admission applies the CRD's defaults, so an admitted object rarely lacks a defaulted field;
    every optional field is taken out in turn here, and its view must give the model's default."""
    seen: Seen = set()
    for obj in _fixed():
        model = MODELS[obj["kind"]].model_validate(obj)
        for path in _optional_fields(obj, model):
            variant = copy.deepcopy(obj)
            parent = variant
            for step in path[:-1]:
                parent = parent[step]
            del parent[path[-1]]
            assert_reads_alike(variant, seen, obj["kind"])
    optional = {
        (name, field, False)
        for name, model in MODELS.items()
        for field, info in model.model_fields.items()
        if not info.is_required()
    }
    assert optional - seen == set()


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_admitted(path: Path) -> None:
    """The examples above are compared as admitted, so they must be."""
    objects = admitted(*RUNTIMES, *_load(path))
    assert len(objects) == len(RUNTIMES) + len(_load(path))


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: pair[0]["metadata"]["name"])
def test_the_bases_are_admitted(pair: tuple[Obj, Obj]) -> None:
    """The objects compared are what admission stored, so each base must be admitted whole."""
    assert len(admitted(*pair)) == 2


@FUZZ
@given(data=st.data(), pair=st.sampled_from(PAIRS))
def test_nearly_valid_objects_read_alike(data: st.DataObject, pair: tuple[Obj, Obj]) -> None:
    runtime, trainjob = pair
    trainjob = copy.deepcopy(trainjob)
    trainjob["spec"]["runtimeRef"] = {"name": "fuzz-runtime"}
    broken_runtime = data.draw(mutated(runtime_named(runtime), protect=3))
    for obj in admitted(broken_runtime, data.draw(mutated(trainjob))):
        assert_reads_alike(obj)


def test_a_view_holds_the_object_itself() -> None:
    """A change made through a view's plain value reaches the object (pod templates are edited so)."""
    runtime = copy.deepcopy(TORCH)
    view = views.ClusterTrainingRuntime(runtime)
    assert view.spec.template.spec is runtime["spec"]["template"]["spec"]
    view.spec.template.spec["network"] = {"subdomain": "x"}
    assert runtime["spec"]["template"]["spec"]["network"] == {"subdomain": "x"}
