"""docs/decisions.md §resize: numNodes and resourcesPerNode change while a TrainJob is suspended,
and reach its JobSet, which is made again since JobSet's webhook holds its Jobs' shape."""

from __future__ import annotations

import copy
from typing import Any

from render_helpers import container, env, only, render, rjob, runtime, trainjob
from trainer.plugins.jobset import jobset_update_allowed

from trainer.runtime import framework
from trainer.runtime import render as core
from trainer.runtime.info import Facts

TORCH = {"numNodes": 1, "torch": {}}
SUSPENDED_ONE = trainjob(suspend=True, trainer={"numNodes": 1})


def _facts(cluster: Any, stored: dict[str, Any]) -> Facts:
    """What the operator's cache holds for a rendered TrainJob: its runtime, its ConfigMaps (the
    snapshot), and ``stored``, its JobSet as the API server keeps it."""
    facts = Facts()
    for obj in [*cluster.facts.of_kind("ClusterTrainingRuntime"), *cluster.output()]:
        if obj["kind"] in ("ClusterTrainingRuntime", "ConfigMap"):
            facts.put(obj)
    facts.put(stored)
    return facts


def test_numnodes_changed_while_suspended_reaches_the_jobset_and_the_resumed_job_runs_with_it() -> None:
    rt = runtime(ml_policy=TORCH)
    resized = trainjob(suspend=True, trainer={"numNodes": 3})
    resumed = trainjob(suspend=False, trainer={"numNodes": 3})
    cluster = render(rt, SUSPENDED_ONE, resized)
    assert not cluster.refusals
    jobset = only(cluster, "JobSet")
    node = rjob(jobset, "node")["template"]["spec"]
    assert (node["parallelism"], node["completions"]) == (3, 3)
    assert env(container(jobset, "node"))["PET_NNODES"] == "3"
    cluster.apply(copy.deepcopy(resumed))
    jobset = only(cluster, "JobSet")
    assert jobset["spec"]["suspend"] is False
    assert rjob(jobset, "node")["template"]["spec"]["parallelism"] == 3


def test_resources_changed_while_suspended_replace_the_old_ones_whole() -> None:
    rt = runtime(ml_policy=TORCH)
    before = trainjob(
        suspend=True, trainer={"resourcesPerNode": {"limits": {"cpu": "2"}, "requests": {"cpu": "1"}}}
    )
    after = trainjob(suspend=True, trainer={"resourcesPerNode": {"requests": {"cpu": "1"}}})
    cluster = render(rt, before, after)
    assert not cluster.refusals
    assert container(only(cluster, "JobSet"), "node")["resources"] == {"requests": {"cpu": "1"}}, (
        "the limit taken away is gone, though what is left is contained in what was there"
    )


def test_a_running_trainjob_keeps_its_size_and_every_other_trainer_field_stays_fixed() -> None:
    rt = runtime(ml_policy=TORCH)
    running = trainjob(trainer={"numNodes": 1})
    (refusal,) = render(rt, running, trainjob(trainer={"numNodes": 2})).refusals
    line = refusal.lines()[0]
    assert "spec.trainer" in line
    assert "numNodes and resourcesPerNode can only be changed while the TrainJob is suspended" in line
    (refusal,) = render(
        rt, SUSPENDED_ONE, trainjob(suspend=True, trainer={"numNodes": 1, "image": "x"})
    ).refusals
    assert "spec.trainer: Invalid value" in refusal.lines()[0] and "field is immutable" in refusal.lines()[0]
    # Resizing in the update that resumes it is the one update Kueue makes on admission.
    assert not render(rt, SUSPENDED_ONE, trainjob(suspend=False, trainer={"numNodes": 2})).refusals


def test_a_resize_is_refused_while_the_jobset_still_has_active_jobs() -> None:
    rt = runtime(ml_policy=TORCH)
    running = trainjob(trainer={"numNodes": 1})
    suspending = trainjob(suspend=True, trainer={"numNodes": 2})
    jobset = copy.deepcopy(only(render(rt, running), "JobSet"))
    jobset["status"] = {
        "replicatedJobsStatus": [
            {"name": "node", "active": 1, "ready": 1, "succeeded": 0, "failed": 0, "suspended": 0}
        ]
    }
    (refusal,) = render(rt, running, jobset, suspending).refusals
    assert "spec.trainer.numNodes: Forbidden" in refusal.lines()[0]
    assert "ReplicatedJob node is still active" in refusal.lines()[0]
    jobset["status"]["replicatedJobsStatus"][0].update(active=0, ready=0, suspended=1)
    assert not render(rt, running, jobset, suspending).refusals, "once no Job is active it may change"


def test_the_render_core_asks_for_a_suspended_jobset_of_the_old_size_to_be_rebuilt() -> None:
    rt = runtime(ml_policy=TORCH)
    cluster = render(rt, SUSPENDED_ONE)
    stored = copy.deepcopy(only(cluster, "JobSet"))
    stored["metadata"]["uid"] = "js-uid"
    stored["spec"]["replicatedJobs"][0]["template"]["spec"]["completionMode"] = "Indexed"  # a server default
    trainjob_obj = copy.deepcopy(only(cluster, "TrainJob"))
    facts = _facts(cluster, stored)
    same = core.render(trainjob_obj, facts, framework.default(), "2026-01-01T00:00:00Z")
    assert same.rebuild == [] and not same.error, "the stored JobSet, defaults and all, takes what is built"
    trainjob_obj["spec"]["trainer"]["numNodes"] = 2
    resized = core.render(trainjob_obj, facts, framework.default(), "2026-01-01T00:00:00Z")
    assert [o["metadata"]["uid"] for o in resized.rebuild] == ["js-uid"]
    assert not [o for o in resized.objects if o["kind"] == "JobSet"], "nothing is written to the old one"
    stored["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    going = core.render(trainjob_obj, facts, framework.default(), "2026-01-01T00:00:01Z")
    assert going.rebuild == [] and not [o for o in going.objects if o["kind"] == "JobSet"], (
        "while it goes, neither deleted again nor written"
    )


def test_jobset_update_allowed_follows_the_jobset_webhook() -> None:
    rt = runtime(ml_policy=TORCH)
    jobset = only(render(rt, SUSPENDED_ONE), "JobSet")
    scheduling = copy.deepcopy(jobset)
    pod = rjob(scheduling, "node")["template"]["spec"]["template"]
    pod["spec"]["nodeSelector"] = {"pool": "b"}
    pod["spec"]["tolerations"] = [{"key": "k", "operator": "Exists"}]
    pod.setdefault("metadata", {})["labels"] = {"kueue.x-k8s.io/podset": "node"}
    assert jobset_update_allowed(jobset, scheduling), "what Kueue changes on a suspended JobSet"
    wider = copy.deepcopy(jobset)
    rjob(wider, "node")["template"]["spec"]["parallelism"] = 2
    assert not jobset_update_allowed(jobset, wider)
    image = copy.deepcopy(jobset)
    container(image, "node")["image"] = "other"
    assert not jobset_update_allowed(jobset, image)


def test_a_running_jobset_that_cannot_take_the_change_is_suspended_as_it_is_first() -> None:
    rt = runtime(ml_policy=TORCH)
    cluster = render(rt, trainjob(trainer={"numNodes": 1}))
    stored = copy.deepcopy(only(cluster, "JobSet"))
    stored["metadata"]["uid"] = "js-uid"
    trainjob_obj = copy.deepcopy(only(cluster, "TrainJob"))
    facts = _facts(cluster, stored)
    # Suspended and resized in one update: the JobSet still runs the old size.
    trainjob_obj["spec"].update(suspend=True, trainer={"numNodes": 2})
    outcome = core.render(trainjob_obj, facts, framework.default(), "2026-01-01T00:00:00Z")
    assert outcome.rebuild == [], "a running JobSet is not deleted"
    (jobset,) = [o for o in outcome.objects if o["kind"] == "JobSet"]
    assert jobset["spec"]["suspend"] is True
    assert jobset["spec"]["replicatedJobs"] == stored["spec"]["replicatedJobs"], "its Jobs as they are"
    stored["spec"]["suspend"] = True
    suspended = core.render(trainjob_obj, facts, framework.default(), "2026-01-01T00:00:01Z")
    assert [o["metadata"]["uid"] for o in suspended.rebuild] == ["js-uid"], "once suspended, made again"
