"""Shared helpers: build runtimes and TrainJobs as plain manifests and render them in process."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from trainer.offline.cluster import OfflineCluster
from trainer.runtime import framework

Obj = dict[str, Any]

ROOT = Path(__file__).resolve().parent.parent
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def replicated_job(
    name: str, ancestor: str | None = None, containers: list[Obj] | None = None, **extra: Any
) -> Obj:
    template: Obj = {
        "spec": {"template": {"spec": {"containers": containers or [{"name": name, "image": "img"}]}}}
    }
    if ancestor:
        template["metadata"] = {"labels": {ANCESTOR: ancestor}}
    return {"name": name, "template": template, **extra}


def runtime(
    name: str = "rt",
    *,
    kind: str = "ClusterTrainingRuntime",
    ml_policy: Obj | None = None,
    jobs: list[Obj] | None = None,
    namespace: str = "default",
    **spec_extra: Any,
) -> Obj:
    spec: Obj = {
        "template": {
            "spec": {
                "replicatedJobs": jobs
                or [replicated_job("node", "trainer", [{"name": "node", "image": "rt:img"}])]
            }
        }
    }
    if ml_policy is not None:
        spec["mlPolicy"] = ml_policy
    spec.update(spec_extra)
    meta: Obj = {"name": name}
    if kind == "TrainingRuntime":
        meta["namespace"] = namespace
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}


def trainjob(name: str = "job", runtime_name: str = "rt", *, kind: str | None = None, **spec: Any) -> Obj:
    ref: Obj = {"name": runtime_name}
    if kind:
        ref["kind"] = kind
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runtimeRef": ref, **spec},
    }


def render(
    *objects: Obj,
    defaults: bool = False,
    fw: framework.Framework | None = None,
    now: str = "1970-01-01T00:00:00Z",
) -> OfflineCluster:
    cluster = OfflineCluster(framework=fw or framework.default(), now=now)
    if defaults:
        cluster.load_default_runtimes()
    for obj in objects:
        cluster.apply(copy.deepcopy(obj))
    return cluster


def only(cluster: OfflineCluster, kind: str, name: str | None = None) -> Obj:
    found = [
        o for o in cluster.output() if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (
        f"expected one {kind}, found {len(found)}; refusals: {[r.lines() for r in cluster.refusals]}"
    )
    return found[0]


def rjob(jobset: Obj, name: str) -> Obj:
    return next(rj for rj in jobset["spec"]["replicatedJobs"] if rj["name"] == name)


def container(jobset: Obj, job: str, name: str = "node") -> Obj:
    pod = rjob(jobset, job)["template"]["spec"]["template"]["spec"]
    return next(ct for ct in pod["containers"] if ct["name"] == name)


def env(ct: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ct.get("env", [])}
