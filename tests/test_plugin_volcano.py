"""Volcano: the group-name annotation, the PodGroup (queue, priority, topology) and admission checks."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
import yaml
from reference_data import needs_reference, reference_dir
from render_helpers import only, render, replicated_job, rjob, runtime, trainjob

from trainer.offline.cluster import OfflineCluster
from trainer.runtime import framework as fw
from trainer.runtime import render as core

Obj = dict[str, Any]
NOW = "1970-01-01T00:00:00Z"
GROUP_NAME = "scheduling.k8s.io/group-name"
QUEUE = "scheduling.volcano.sh/queue-name"


def job(name: str, ancestor: str | None, cpu: str, memory: str, priority: str | None = None) -> Obj:
    rj = replicated_job(
        name,
        ancestor,
        [{"name": "node", "image": "i", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
    )
    if priority:
        rj["template"]["spec"]["template"]["spec"]["priorityClassName"] = priority
    return rj


def volcano_runtime(
    policy: Obj | None = None, *, queue: str | None = None, jobs: list[Obj] | None = None, num_nodes: int = 4
) -> Obj:
    rt = runtime(ml_policy={"numNodes": num_nodes}, jobs=jobs or [job("node", "trainer", "500m", "512Mi")])
    rt["spec"]["podGroupPolicy"] = {"volcano": {} if policy is None else policy}
    if queue is not None:
        rt["spec"]["template"]["metadata"] = {"annotations": {QUEUE: queue}}
    return rt


def priority_class(name: str) -> Obj:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": 1000,
    }


def rendered(*objects: Obj) -> OfflineCluster:
    cluster = render(*objects)
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    return cluster


def refusal_lines(*objects: Obj) -> list[str]:
    return [line for refusal in render(*objects).refusals for line in refusal.lines()]


def test_pods_get_the_group_annotation_and_no_label() -> None:
    jobs = [job("launcher", None, "300m", "1Gi"), job("node", "trainer", "500m", "512Mi")]
    jobset = only(rendered(volcano_runtime(jobs=jobs), trainjob("vc")), "JobSet")
    for name in ("launcher", "node"):
        pod_meta = rjob(jobset, name)["template"]["spec"]["template"]["metadata"]
        assert pod_meta["annotations"][GROUP_NAME] == "vc"
        assert "labels" not in pod_meta
        assert "schedulerName" not in rjob(jobset, name)["template"]["spec"]["template"]["spec"]


def test_pod_group_with_queue_priority_and_topology() -> None:
    jobs = [job("launcher", None, "300m", "1Gi", "high-priority"), job("node", "trainer", "500m", "512Mi")]
    rt = volcano_runtime(
        {"networkTopology": {"mode": "hard", "highestTierAllowed": 1}}, queue="q1", jobs=jobs
    )
    cluster = rendered(priority_class("high-priority"), rt, trainjob("vc", suspend=True))
    group = only(cluster, "PodGroup")
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {
        "minMember": 5,
        "minResources": {"cpu": "2300m", "memory": "3Gi"},
        "queue": "q1",
        "priorityClassName": "high-priority",
        "networkTopology": {"mode": "hard", "highestTierAllowed": 1},
    }
    assert group["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-name": "vc"}
    assert group["metadata"]["ownerReferences"][0]["name"] == "vc"
    assert only(cluster, "JobSet")["metadata"]["annotations"][QUEUE] == "q1"


def test_minimal_policy_sets_only_the_gang() -> None:
    group = only(rendered(volcano_runtime(), trainjob("vc")), "PodGroup")
    assert group["spec"] == {"minMember": 4, "minResources": {"cpu": "2", "memory": "2Gi"}}


def test_network_topology_defaults() -> None:
    group = only(rendered(volcano_runtime({"networkTopology": {}}), trainjob("vc")), "PodGroup")
    assert group["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}


def test_last_priority_class_wins() -> None:
    jobs = [
        job("launcher", None, "1", "1Gi", "first"),
        job("node", "trainer", "1", "1Gi", "second"),
        job("extra", None, "1", "1Gi"),
    ]
    cluster = rendered(
        priority_class("first"), priority_class("second"), volcano_runtime(jobs=jobs), trainjob("vc")
    )
    assert only(cluster, "PodGroup")["spec"]["priorityClassName"] == "second"


def test_queue_patch_wins_over_the_runtime() -> None:
    patch = {
        "manager": "example.com/queue-manager",
        "trainingRuntimeSpec": {"template": {"metadata": {"annotations": {QUEUE: "q2"}}}},
    }
    cluster = rendered(volcano_runtime(queue="q1"), trainjob("vc", runtimePatches=[patch]))
    assert only(cluster, "PodGroup")["spec"]["queue"] == "q2"
    assert only(cluster, "JobSet")["metadata"]["annotations"][QUEUE] == "q2"


def test_empty_queue_is_refused_naming_where_it_comes_from() -> None:
    (line,) = refusal_lines(volcano_runtime(queue=""), trainjob("vc"))
    assert "Volcano queue name must not be empty" in line
    assert line.startswith('TrainJob default/vc: spec.runtimeRef.name: Invalid value: "rt":')
    assert f"spec.template.metadata.annotations[{QUEUE}]" in line

    patch = {
        "manager": "example.com/q",
        "trainingRuntimeSpec": {"template": {"metadata": {"annotations": {QUEUE: ""}}}},
    }
    (line,) = refusal_lines(volcano_runtime(queue="q1"), trainjob("vc", runtimePatches=[patch]))
    assert f"spec.runtimePatches[0].trainingRuntimeSpec.template.metadata.annotations[{QUEUE}]" in line
    assert "Volcano queue name must not be empty" in line
    # A patch that sets a real queue rescues an empty runtime value.
    patch["trainingRuntimeSpec"]["template"]["metadata"]["annotations"][QUEUE] = "q3"
    rendered(volcano_runtime(queue=""), trainjob("vc", runtimePatches=[patch]))


def test_missing_priority_class_is_refused() -> None:
    jobs = [job("node", "trainer", "1", "1Gi", "non-existent")]
    (line,) = refusal_lines(volcano_runtime(jobs=jobs), trainjob("vc"))
    assert 'PriorityClass "non-existent" doesn\'t exist' in line
    assert 'priorityclasses.scheduling.k8s.io "non-existent" not found' in line
    assert "spec.template.spec.replicatedJobs[0].template.spec.template.spec.priorityClassName" in line
    rendered(priority_class("non-existent"), volcano_runtime(jobs=jobs), trainjob("vc"))


def test_system_priority_classes_need_no_object_and_stop_the_check() -> None:
    jobs = [
        job("launcher", None, "1", "1Gi", "missing-before"),
        job("node", "trainer", "1", "1Gi", "system-node-critical"),
        job("extra", None, "1", "1Gi", "missing-after"),
    ]
    lines = refusal_lines(volcano_runtime(jobs=jobs), trainjob("vc"))
    assert len(lines) == 1 and '"missing-before"' in lines[0]
    ok = [job("node", "trainer", "1", "1Gi", "system-cluster-critical")]
    assert only(rendered(volcano_runtime(jobs=ok), trainjob("vc")), "PodGroup")["spec"][
        "priorityClassName"
    ] == ("system-cluster-critical")


def test_pod_group_is_frozen_while_the_trainjob_runs() -> None:
    framework = fw.default()
    cluster = rendered(volcano_runtime(), trainjob("vc"))
    (tj,) = cluster.trainjobs.values()
    assert "PodGroup" not in [
        o["kind"] for o in core.render(copy.deepcopy(tj), cluster.facts, framework, NOW).objects
    ]
    tj = copy.deepcopy(tj)
    tj["spec"]["suspend"] = True
    assert "PodGroup" in [o["kind"] for o in core.render(tj, cluster.facts, framework, NOW).objects]


def test_both_gang_schedulers_at_once() -> None:
    rt = volcano_runtime()
    rt["spec"]["podGroupPolicy"]["coscheduling"] = {}
    cluster = rendered(copy.deepcopy(rt), trainjob("both", suspend=True))
    (tj,) = cluster.trainjobs.values()
    outcome = core.render(copy.deepcopy(tj), cluster.facts, fw.default(), NOW)
    groups = sorted(o["apiVersion"] for o in outcome.objects if o["kind"] == "PodGroup")
    assert groups == ["scheduling.volcano.sh/v1beta1", "scheduling.x-k8s.io/v1alpha1"]
    pod_meta = rjob(only(cluster, "JobSet"), "node")["template"]["spec"]["template"]["metadata"]
    assert pod_meta["labels"]["scheduling.x-k8s.io/pod-group"] == "both"
    assert pod_meta["annotations"][GROUP_NAME] == "both"


VOLCANO_CRD = "crds/volcano/scheduling.volcano.sh_podgroups.yaml"


@needs_reference(VOLCANO_CRD)
@pytest.mark.parametrize(
    "policy", [{}, {"networkTopology": {}}, {"networkTopology": {"mode": "soft", "highestTierAllowed": 2}}]
)
def test_pod_group_validates_against_the_volcano_crd(policy: Obj) -> None:
    crd = yaml.safe_load((reference_dir() / VOLCANO_CRD).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    schema = version["schema"]["openAPIV3Schema"]
    jobs = [
        job("launcher", None, "300m", "1Gi", "system-node-critical"),
        job("node", "trainer", "500m", "512Mi"),
    ]
    group = only(rendered(volcano_runtime(policy, queue="q1", jobs=jobs), trainjob("vc")), "PodGroup")
    jsonschema.validate(group, schema)
    assert set(group["spec"]) <= set(schema["properties"]["spec"]["properties"])
