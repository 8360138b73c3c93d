"""Coscheduling (scheduler-plugins): the pod-group label on every pod and the PodGroup the gang needs."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
import yaml
from reference_data import needs_reference, reference_dir
from render_helpers import only, render, replicated_job, rjob, runtime, trainjob

from trainer.runtime import framework as fw
from trainer.runtime import render as core

Obj = dict[str, Any]
NOW = "1970-01-01T00:00:00Z"
LABEL = "scheduling.x-k8s.io/pod-group"


def resources(cpu: Any, memory: str) -> Obj:
    return {"requests": {"cpu": cpu, "memory": memory}}


def ct(name: str, res: Obj | None = None) -> Obj:
    container: Obj = {"name": name, "image": "img"}
    if res is not None:
        container["resources"] = res
    return container


def gang_runtime(policy: Obj | None = None, *, with_initializers: bool = True, ml: Obj | None = None) -> Obj:
    jobs = []
    if with_initializers:
        for step in ("dataset-initializer", "model-initializer"):
            job = replicated_job(step, step, [ct(step, resources("1", "4Gi"))])
            job["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
                {"name": "initializer", "mountPath": "/workspace"}
            ]
            jobs.append(job)
    node = replicated_job("node", "trainer", [ct("node", resources("1", "4Gi"))])
    node["template"]["spec"]["template"]["spec"]["schedulerName"] = "scheduler-plugins-scheduler"
    jobs.append(node)
    rt = runtime(ml_policy=ml or {"numNodes": 100}, jobs=jobs)
    rt["spec"]["podGroupPolicy"] = {"coscheduling": {} if policy is None else policy}
    return rt


def pod_group(*objects: Obj) -> Obj:
    cluster = render(*objects)
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    return only(cluster, "PodGroup")


def test_every_pod_of_every_job_carries_the_label_and_the_scheduler_is_untouched() -> None:
    cluster = render(gang_runtime(), trainjob("gang"))
    jobset = only(cluster, "JobSet")
    for job in ("dataset-initializer", "model-initializer", "node"):
        pod_meta = rjob(jobset, job)["template"]["spec"]["template"]["metadata"]
        assert pod_meta["labels"][LABEL] == "gang"
        assert "annotations" not in pod_meta
    pods = {rj["name"]: rj["template"]["spec"]["template"]["spec"] for rj in jobset["spec"]["replicatedJobs"]}
    assert pods["node"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert "schedulerName" not in pods["dataset-initializer"]


def test_pod_group_counts_every_pod_and_sums_their_requests() -> None:
    group = pod_group(gang_runtime({"scheduleTimeoutSeconds": 100}), trainjob("gang"))
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" and group["kind"] == "PodGroup"
    assert group["spec"] == {
        "minMember": 102,
        "minResources": {"cpu": "102", "memory": "408Gi"},
        "scheduleTimeoutSeconds": 100,
    }
    meta = group["metadata"]
    assert meta["name"] == "gang" and meta["namespace"] == "default"
    assert meta["labels"] == {"trainer.kubeflow.org/trainjob-name": "gang"}
    (owner,) = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": "gang",
        "uid": owner["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert owner["uid"]


def test_trainjob_node_count_and_resources_are_final_before_counting() -> None:
    tj = trainjob("gang", trainer={"numNodes": 100, "resourcesPerNode": resources("2", "8Gi")})
    group = pod_group(gang_runtime({"scheduleTimeoutSeconds": 300}, ml={"numNodes": 1}), tj)
    assert group["spec"] == {
        "minMember": 102,
        "minResources": {"cpu": "202", "memory": "808Gi"},
        "scheduleTimeoutSeconds": 300,
    }


def test_quantities_are_canonical_strings_and_sdk_numbers_are_accepted() -> None:
    jobs = [
        replicated_job(
            "dataset-initializer",
            "dataset-initializer",
            [ct("dataset-initializer", resources("250m", "512Mi"))],
        ),
        replicated_job("node", "trainer", [ct("node", resources("500m", "1Gi"))]),
    ]
    jobs[0]["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "initializer", "mountPath": "/workspace"}
    ]
    rt = runtime(ml_policy={"numNodes": 2}, jobs=jobs)
    rt["spec"]["podGroupPolicy"] = {"coscheduling": {}}
    group = pod_group(rt, trainjob("q"))
    assert group["spec"]["minResources"] == {"cpu": "1250m", "memory": "2560Mi"}
    # The SDK sends cpu: 2.0; the PodGroup still carries the canonical "2" per pod.
    tj = trainjob(
        "sdk", trainer={"numNodes": 3, "resourcesPerNode": {"requests": {"cpu": 2.0, "memory": "1Gi"}}}
    )
    group = pod_group(rt, tj)
    assert group["spec"]["minResources"] == {"cpu": "6250m", "memory": "3584Mi"}
    assert group["spec"]["minMember"] == 4


def test_defaults_and_pods_without_requests() -> None:
    rt = gang_runtime(with_initializers=False)
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ] = [ct("node")]
    group = pod_group(rt, trainjob("bare", trainer={"numNodes": 4}))
    assert group["spec"] == {"minMember": 4, "minResources": {}, "scheduleTimeoutSeconds": 60}
    zero = gang_runtime({"scheduleTimeoutSeconds": 0}, with_initializers=False)
    assert pod_group(zero, trainjob("zero"))["spec"]["scheduleTimeoutSeconds"] == 0


def test_sidecars_and_init_containers_count_as_the_scheduler_counts_them() -> None:
    rt = gang_runtime(with_initializers=False, ml={"numNodes": 2})
    pod = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["initContainers"] = [
        {"name": "sidecar", "image": "s", "restartPolicy": "Always", "resources": resources("250m", "256Mi")},
        {"name": "fetch", "image": "f", "resources": resources("2", "1Gi")},
    ]
    group = pod_group(rt, trainjob("side"))
    # Per pod: max(1 + 0.25, 2 + 0.25) cpu = 2250m, max(4Gi + 256Mi, 1Gi + 256Mi) = 4352Mi; x2 pods.
    assert group["spec"]["minResources"] == {"cpu": "4500m", "memory": "8704Mi"}


def test_mpi_launcher_is_a_member_too() -> None:
    jobs = [
        replicated_job("launcher", None, [ct("node", resources("1", "1Gi"))]),
        replicated_job("node", "trainer", [ct("node", resources("4", "16Gi"))]),
    ]
    rt = runtime(ml_policy={"numNodes": 1, "mpi": {}}, jobs=jobs)
    rt["spec"]["podGroupPolicy"] = {"coscheduling": {}}
    group = pod_group(rt, trainjob("mpi", trainer={"numNodes": 8}))
    assert group["spec"]["minMember"] == 9
    assert group["spec"]["minResources"] == {"cpu": "33", "memory": "129Gi"}


def admitted(*objects: Obj) -> tuple[Any, Obj]:
    cluster = render(*objects)
    assert not cluster.refusals
    (tj,) = cluster.trainjobs.values()
    return cluster, tj


def test_pod_group_is_frozen_while_the_trainjob_runs() -> None:
    framework = fw.default()
    cluster, tj = admitted(gang_runtime(), trainjob("gang"))
    assert cluster.facts.get("PodGroup", "default", "gang") is not None
    running = core.render(copy.deepcopy(tj), cluster.facts, framework, NOW)
    assert "PodGroup" not in [o["kind"] for o in running.objects]
    suspended = copy.deepcopy(tj)
    suspended["spec"]["suspend"] = True
    assert "PodGroup" in [o["kind"] for o in core.render(suspended, cluster.facts, framework, NOW).objects]


def test_a_volcano_pod_group_of_the_same_name_does_not_freeze_it() -> None:
    framework = fw.default()
    cluster, tj = admitted(gang_runtime(), trainjob("gang"))
    # Only Volcano's PodGroup of that name exists: ours is still missing and must be built.
    cluster.facts.remove("PodGroup", "default", "gang", group="scheduling.x-k8s.io")
    cluster.facts.put(
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "gang", "namespace": "default"},
            "spec": {},
        }
    )
    outcome = core.render(copy.deepcopy(tj), cluster.facts, framework, NOW)
    (group,) = [o for o in outcome.objects if o["kind"] == "PodGroup"]
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"


def test_no_policy_no_label_no_pod_group() -> None:
    rt = gang_runtime()
    del rt["spec"]["podGroupPolicy"]
    cluster = render(rt, trainjob("plain"))
    assert not [o for o in cluster.output() if o["kind"] == "PodGroup"]
    pod_meta = rjob(only(cluster, "JobSet"), "node")["template"]["spec"]["template"].get("metadata") or {}
    assert LABEL not in (pod_meta.get("labels") or {})


SCHEDULER_PLUGINS_CRD = "crds/scheduler-plugins/scheduling.x-k8s.io_podgroups.yaml"


@needs_reference(SCHEDULER_PLUGINS_CRD)
@pytest.mark.parametrize("tj", [trainjob("gang"), trainjob("one", trainer={"numNodes": 1})])
def test_pod_group_validates_against_the_scheduler_plugins_crd(tj: Obj) -> None:
    crd = yaml.safe_load((reference_dir() / SCHEDULER_PLUGINS_CRD).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    schema = version["schema"]["openAPIV3Schema"]
    group = pod_group(gang_runtime(), tj)
    jsonschema.validate(group, schema)
    assert set(group["spec"]) <= set(schema["properties"]["spec"]["properties"])
