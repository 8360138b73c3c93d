"""Workload (kube-scheduler's own gang): the Workload and PodGroup of scheduling.k8s.io/v1alpha2, the
pods that join the gang, and the schedule timeout that fails a gang that never fits
(docs/scheduling.md)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from render_helpers import only, render, replicated_job, rjob, runtime, trainjob

from trainer.runtime import framework
from trainer.runtime import render as core
from trainer.runtime.info import Facts

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parent.parent
V1ALPHA2 = "scheduling.k8s.io/v1alpha2"
CREATED = "2026-01-01T00:00:00Z"


def torch_gang(policy: Obj | None = None) -> Obj:
    """A torch runtime whose trainer waits for two initializers to complete, as the bundled
    torchtune runtimes do."""
    jobs = [replicated_job(step, step) for step in ("dataset-initializer", "model-initializer")]
    node = replicated_job(
        "node",
        "trainer",
        dependsOn=[
            {"name": "dataset-initializer", "status": "Complete"},
            {"name": "model-initializer", "status": "Complete"},
        ],
    )
    rt = runtime(ml_policy={"numNodes": 2, "torch": {}}, jobs=[*jobs, node])
    rt["spec"]["podGroupPolicy"] = {"workload": policy or {}}
    return rt


def deepspeed_gang(*, launcher_waits: bool = True) -> Obj:
    rt = yaml.safe_load((ROOT / "runtimes" / "deepspeed_distributed.yaml").read_text())
    rt["metadata"]["name"] = "rt"
    rt["spec"]["podGroupPolicy"] = {"workload": {}}
    if not launcher_waits:
        del rjob(rt["spec"]["template"], "launcher")["dependsOn"]
    return rt


def pod_spec(jobset: Obj, job: str) -> Obj:
    spec: Obj = rjob(jobset, job)["template"]["spec"]["template"]["spec"]
    return spec


def test_the_trainer_nodes_are_one_gang_and_the_initializers_schedule_alone() -> None:
    cluster = render(torch_gang(), trainjob("tj", trainer={"numNodes": 3}))
    jobset = only(cluster, "JobSet")
    assert pod_spec(jobset, "node")["schedulingGroup"] == {"podGroupName": "tj"}
    for step in ("dataset-initializer", "model-initializer"):
        assert "schedulingGroup" not in pod_spec(jobset, step), "they complete before the trainer starts"
    workload = only(cluster, "Workload")
    group = only(cluster, "PodGroup")
    assert workload["apiVersion"] == group["apiVersion"] == V1ALPHA2
    assert workload["spec"] == {
        "controllerRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainJob", "name": "tj"},
        "podGroupTemplates": [{"name": "gang", "schedulingPolicy": {"gang": {"minCount": 3}}}],
    }
    assert group["spec"] == {
        "podGroupTemplateRef": {"workload": {"workloadName": "tj", "podGroupTemplateName": "gang"}},
        "schedulingPolicy": {"gang": {"minCount": 3}},
    }
    for obj in (workload, group):
        meta = obj["metadata"]
        assert meta["name"] == "tj" and meta["labels"] == {"trainer.kubeflow.org/trainjob-name": "tj"}
        (owner,) = meta["ownerReferences"]
        assert owner["kind"] == "TrainJob" and owner["controller"] is True


def test_a_launcher_that_waits_for_its_nodes_joins_the_gang_without_counting_towards_it() -> None:
    cluster = render(deepspeed_gang(), trainjob("mpi", trainer={"numNodes": 4}))
    jobset = only(cluster, "JobSet")
    for job in ("node", "launcher"):
        assert pod_spec(jobset, job)["schedulingGroup"] == {"podGroupName": "mpi"}
    # numNodes 4 is 3 node pods and the launcher (runLauncherAsNode), whose pod exists only once
    # the nodes are Ready: a quorum counting it would never form.
    assert only(cluster, "PodGroup")["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}


def test_a_launcher_that_starts_with_its_nodes_counts() -> None:
    cluster = render(deepspeed_gang(launcher_waits=False), trainjob("mpi", trainer={"numNodes": 4}))
    assert only(cluster, "PodGroup")["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}


def test_workload_and_another_gang_source_are_refused_together() -> None:
    rt = torch_gang()
    rt["spec"]["podGroupPolicy"]["coscheduling"] = {}
    (refusal,) = render(rt).refusals
    line = " ".join(refusal.lines())
    assert (
        "spec.podGroupPolicy" in line and "workload cannot be combined with coscheduling or volcano" in line
    )
    bad = torch_gang({"scheduleTimeoutSeconds": 0})
    (refusal,) = render(bad).refusals
    assert "spec.podGroupPolicy.workload.scheduleTimeoutSeconds" in " ".join(refusal.lines())


def test_a_pod_set_waiting_for_the_trainer_to_complete_runs_after_the_gang() -> None:
    rt = torch_gang()
    jobs = rt["spec"]["template"]["spec"]["replicatedJobs"]
    jobs.append(replicated_job("eval", dependsOn=[{"name": "node", "status": "Complete"}]))
    cluster = render(rt, trainjob("tj", trainer={"numNodes": 3}))
    jobset = only(cluster, "JobSet")
    assert pod_spec(jobset, "node")["schedulingGroup"] == {"podGroupName": "tj"}
    assert "schedulingGroup" not in pod_spec(jobset, "eval")
    assert only(cluster, "PodGroup")["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}


def test_every_replica_of_a_gang_member_counts() -> None:
    rt = torch_gang()
    jobs = rt["spec"]["template"]["spec"]["replicatedJobs"]
    # Made with the trainer: it waits for the same initializers.
    jobs.append(replicated_job("ps", replicas=3, dependsOn=copy.deepcopy(jobs[-1]["dependsOn"])))
    cluster = render(rt, trainjob("tj", trainer={"numNodes": 2}))
    assert pod_spec(only(cluster, "JobSet"), "ps")["schedulingGroup"] == {"podGroupName": "tj"}
    assert only(cluster, "PodGroup")["spec"]["schedulingPolicy"] == {"gang": {"minCount": 5}}


# --- the schedule timeout and the gang's objects, as the operator renders them from its cache ---


def _facts(cluster: Any, *stored: Obj) -> Facts:
    facts = Facts()
    for obj in [*cluster.facts.of_kind("ClusterTrainingRuntime"), *cluster.output()]:
        if obj["kind"] in ("ClusterTrainingRuntime", "ConfigMap", "JobSet", "Workload", "PodGroup"):
            facts.put(copy.deepcopy(obj))
    for obj in stored:
        facts.put(obj)
    return facts


def _started(seconds: int | None = 60, **spec: Any) -> tuple[Obj, Any]:
    policy = {} if seconds is None else {"scheduleTimeoutSeconds": seconds}
    cluster = render(torch_gang(policy), trainjob("tj", **spec), now=CREATED)
    trainjob_obj = copy.deepcopy(only(cluster, "TrainJob"))
    trainjob_obj["metadata"]["creationTimestamp"] = CREATED
    return trainjob_obj, cluster


def _pod_group(cluster: Any, condition: Obj | None, since: str = CREATED) -> Obj:
    group = copy.deepcopy(only(cluster, "PodGroup"))
    group["metadata"]["uid"] = "pg-uid"
    if condition is not None:
        group["status"] = {
            "conditions": [{"type": "PodGroupScheduled", "lastTransitionTime": since, **condition}]
        }
    return group


def _jobset(cluster: Any, *, suspend: bool) -> Obj:
    jobset = copy.deepcopy(only(cluster, "JobSet"))
    jobset["metadata"]["uid"] = "js-uid"
    jobset["spec"]["suspend"] = suspend
    return jobset


UNSCHEDULABLE = {
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/4 nodes are available: 4 Insufficient cpu.",
}
PLACED = {"status": "True", "reason": "Scheduled", "message": ""}


def test_a_gang_the_scheduler_cannot_place_in_time_fails_the_trainjob_and_its_jobset_goes() -> None:
    trainjob_obj, cluster = _started(60)
    # The scheduler found the whole gang unplaceable at 00:10 (after the initializers ran).
    facts = _facts(
        cluster, _jobset(cluster, suspend=False), _pod_group(cluster, UNSCHEDULABLE, "2026-01-01T00:00:10Z")
    )
    waiting = core.render(trainjob_obj, facts, framework.default(), "2026-01-01T00:01:05Z")
    assert waiting.requeue_after == 5.0, "looked at again when the time is up"
    assert waiting.delete == [] and not any(
        c["type"] == "Failed" for c in (waiting.status or {}).get("conditions", [])
    )
    late = core.render(trainjob_obj, facts, framework.default(), "2026-01-01T00:01:11Z")
    failed = next(c for c in late.status["conditions"] if c["type"] == "Failed")  # type: ignore[index]
    assert failed["status"] == "True" and failed["reason"] == "GangScheduleTimeout"
    assert failed["message"] == (
        "the gang of 2 pods (PodGroup tj) was not scheduled within scheduleTimeoutSeconds (60s): "
        "0/4 nodes are available: 4 Insufficient cpu."
    )
    assert late.delete == [("JobSet", "default", "tj")]
    assert not [o for o in late.objects if o["kind"] == "JobSet"]


def test_no_verdict_a_placed_gang_or_no_timeout_never_fails_and_sets_no_timer() -> None:
    day_later = "2026-01-02T00:00:00Z"
    trainjob_obj, cluster = _started(60)
    for group in (_pod_group(cluster, None), _pod_group(cluster, PLACED)):
        facts = _facts(cluster, _jobset(cluster, suspend=False), group)
        outcome = core.render(trainjob_obj, facts, framework.default(), day_later)
        assert outcome.requeue_after is None and outcome.delete == [], group.get("status")
    trainjob_obj, cluster = _started(None)
    facts = _facts(cluster, _jobset(cluster, suspend=False), _pod_group(cluster, UNSCHEDULABLE))
    outcome = core.render(trainjob_obj, facts, framework.default(), day_later)
    assert outcome.requeue_after is None and outcome.delete == [], "without a timeout a gang waits"


def test_a_resize_while_suspended_makes_the_gang_again_and_holds_the_pods_until_it_exists() -> None:
    trainjob_obj, cluster = _started(None, suspend=True, trainer={"numNodes": 2})
    workload = copy.deepcopy(only(cluster, "Workload"))
    workload["metadata"]["uid"] = "wl-uid"
    group = _pod_group(cluster, None)
    suspended = _jobset(cluster, suspend=True)
    facts = _facts(cluster, workload, group, suspended)
    same = core.render(trainjob_obj, facts, framework.default(), CREATED)
    assert same.rebuild == [] and {o["kind"] for o in same.objects} >= {"Workload", "PodGroup"}
    # Resized and resumed in one update, as Kueue admits.
    trainjob_obj["spec"].update(suspend=False, trainer={"numNodes": 3})
    resized = core.render(trainjob_obj, facts, framework.default(), CREATED)
    gang = [o for o in resized.rebuild if o["kind"] in ("Workload", "PodGroup")]
    assert sorted(o["metadata"]["uid"] for o in gang) == ["pg-uid", "wl-uid"]
    assert not [o for o in resized.objects if o["kind"] in ("Workload", "PodGroup")]
    assert not [o for o in resized.objects if o["kind"] == "JobSet" and not o["spec"]["suspend"]], (
        "no pod is made before the PodGroup it joins"
    )
    for obj in (workload, group):
        obj["metadata"]["deletionTimestamp"] = CREATED
    going = core.render(trainjob_obj, facts, framework.default(), CREATED)
    assert not [o for o in going.rebuild if o["kind"] in ("Workload", "PodGroup")], "deleted once"
    assert not [o for o in going.objects if o["kind"] == "JobSet" and not o["spec"]["suspend"]]
    assert [o["metadata"]["uid"] for o in resized.rebuild if o["kind"] == "JobSet"] == ["js-uid"]
    gone = _facts(cluster)  # the JobSet of the old size went too (docs/decisions.md §resize)
    for kind, group in (
        ("Workload", "scheduling.k8s.io"),
        ("PodGroup", "scheduling.k8s.io"),
        ("JobSet", "jobset.x-k8s.io"),
    ):
        gone.remove(kind, "default", "tj", group=group)
    resumed = core.render(trainjob_obj, gone, framework.default(), CREATED)
    made = [o for o in resumed.objects if o["kind"] in ("Workload", "PodGroup", "JobSet")]
    assert [o["kind"] for o in made] == ["Workload", "PodGroup", "JobSet"], "the group first, then its pods"
    assert made[1]["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    assert made[2]["spec"]["suspend"] is False


def test_a_gang_the_scheduler_acted_on_is_made_again_while_suspended_and_kept_while_it_runs() -> None:
    trainjob_obj, cluster = _started(60)
    placed = _pod_group(cluster, PLACED)
    running = core.render(
        trainjob_obj, _facts(cluster, _jobset(cluster, suspend=False), placed), framework.default(), CREATED
    )
    assert not [o for o in running.rebuild if o["kind"] == "PodGroup"], "the scheduler acts on it"
    assert not [o for o in running.objects if o["kind"] == "PodGroup"], "kept as it is, status and all"
    trainjob_obj["spec"]["suspend"] = True
    suspended = core.render(
        trainjob_obj, _facts(cluster, _jobset(cluster, suspend=True), placed), framework.default(), CREATED
    )
    assert [o["metadata"]["uid"] for o in suspended.rebuild if o["kind"] == "PodGroup"] == ["pg-uid"], (
        "its verdict on the last run must not stand for the next"
    )
