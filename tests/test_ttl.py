"""TTL, run policy and times in the pure core, admission and `trainer render` (docs/decisions.md §ttl)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from render_helpers import only, render, replicated_job, runtime, trainjob

from trainer.admission.admit import Mode, admit
from trainer.apimachinery.errors import AdmissionError
from trainer.runtime import framework
from trainer.runtime import render as core
from trainer.runtime.info import Facts

Obj = dict[str, Any]
TORCH = {"numNodes": 1, "torch": {}}
T0 = "2026-01-01T00:00:00Z"


def finished(tj: Obj, kind: str = "Complete", at: str = "2026-01-01T00:10:00Z") -> Obj:
    done = copy.deepcopy(tj)
    done["status"] = {
        "startTime": T0,
        "conditions": [
            {"type": kind, "status": "True", "reason": "R", "message": "m", "lastTransitionTime": at}
        ],
    }
    return done


def facts_of(cluster: Any, *extra: Obj) -> Facts:
    facts = Facts()
    for obj in [*(o for o in cluster.output() if o["kind"] != "TrainJob"), *extra]:
        facts.put(obj)
    return facts


def built(rt: Obj, tj: Obj) -> tuple[Obj, Facts]:
    """A TrainJob rendered against ``rt`` (its snapshot pins it) and the facts it left."""
    cluster = render(rt, tj, now=T0)
    return only(cluster, "TrainJob"), facts_of(cluster, rt)


def test_a_finished_trainjob_expires_when_its_ttl_runs_out_and_not_before() -> None:
    tj, facts = built(runtime(ml_policy=TORCH), trainjob(ttlSecondsAfterFinished=30))
    done = finished(tj)
    early = core.render(done, facts, framework.default(), "2026-01-01T00:10:20Z")
    assert not early.expired and early.requeue_after == 10
    late = core.render(done, facts, framework.default(), "2026-01-01T00:10:30Z")
    assert late.expired and late.objects == []


def test_a_failed_trainjob_expires_too_from_its_failed_condition() -> None:
    tj, facts = built(runtime(ml_policy=TORCH), trainjob(ttlSecondsAfterFinished=0))
    failed = core.render(finished(tj, "Failed"), facts, framework.default(), "2026-01-01T00:10:00Z")
    assert failed.expired
    assert "completionTime" not in (failed.status or {}), "a failed Job gets no completionTime"


def test_an_unfinished_trainjob_is_never_expired_whatever_its_ttl() -> None:
    tj, facts = built(runtime(ml_policy=TORCH), trainjob(ttlSecondsAfterFinished=0))
    later = core.render(tj, facts, framework.default(), "2030-01-01T00:00:00Z")
    assert not later.expired and later.requeue_after is None


def test_start_time_is_when_the_jobs_are_first_reported() -> None:
    """docs/decisions.md §ttl: built is not started; the JobSet's first report of its Jobs is."""
    rt = runtime(ml_policy=TORCH)
    cluster = render(rt, trainjob())
    tj = only(cluster, "TrainJob")
    assert "startTime" not in (tj.get("status") or {}), "its JobSet has not reported its Jobs yet"
    jobset = copy.deepcopy(only(cluster, "JobSet"))
    jobset["status"] = {
        "replicatedJobsStatus": [
            {"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
        ]
    }
    facts = facts_of(cluster, rt)
    facts.put(jobset)
    first = core.render(tj, facts, framework.default(), "2026-01-01T00:00:03Z")
    assert first.status is not None and first.status["startTime"] == "2026-01-01T00:00:03Z"
    tj["status"] = first.status
    later = core.render(tj, facts, framework.default(), "2026-01-01T00:09:00Z")
    assert later.status is not None and later.status["startTime"] == "2026-01-01T00:00:03Z"


def test_the_runtime_run_policy_is_a_default_the_trainjob_overrides() -> None:
    rt = runtime(ml_policy=TORCH, runPolicy={"ttlSecondsAfterFinished": 3600})
    inherited, facts = built(rt, trainjob())
    at = core.render(finished(inherited), facts, framework.default(), "2026-01-01T00:11:00Z")
    assert not at.expired and at.requeue_after == 3600 - 60
    own, facts = built(rt, trainjob(ttlSecondsAfterFinished=0))
    assert core.render(finished(own), facts, framework.default(), "2026-01-01T00:10:00Z").expired


def test_the_pinned_runtime_counts_not_a_later_edit_of_it() -> None:
    rt = runtime(ml_policy=TORCH, runPolicy={"ttlSecondsAfterFinished": 60})
    tj, facts = built(rt, trainjob())
    edited = copy.deepcopy(rt)
    edited["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = 0
    facts.put(edited)
    kept = core.render(finished(tj), facts, framework.default(), "2026-01-01T00:10:30Z")
    assert not kept.expired and kept.requeue_after == 30


def test_the_runtime_run_policy_deadline_applies() -> None:
    rt = runtime(ml_policy=TORCH, runPolicy={"activeDeadlineSeconds": 60})
    tj, facts = built(rt, trainjob())
    tj["metadata"]["creationTimestamp"] = T0
    early = core.render(tj, facts, framework.default(), "2026-01-01T00:00:20Z")
    assert early.requeue_after == 40 and not early.delete
    late = core.render(tj, facts, framework.default(), "2026-01-01T00:01:01Z")
    assert late.delete == [("JobSet", "default", "job")]
    own = copy.deepcopy(tj)
    own["spec"]["activeDeadlineSeconds"] = 3600
    assert core.render(own, facts, framework.default(), "2026-01-01T00:01:01Z").delete == []


def test_start_time_waits_for_a_resume_and_is_reset_by_one() -> None:
    rt = runtime(ml_policy=TORCH)
    tj, facts = built(rt, trainjob(suspend=True))
    assert "startTime" not in (tj.get("status") or {}), "a suspended TrainJob has not started"
    resumed = copy.deepcopy(tj)
    resumed["spec"]["suspend"] = False
    first = core.render(resumed, facts, framework.default(), "2026-01-01T00:05:00Z")
    assert first.status is not None and first.status["startTime"] == "2026-01-01T00:05:00Z"
    resumed["status"] = first.status
    steady = core.render(resumed, facts, framework.default(), "2026-01-01T00:06:00Z")
    assert steady.status is not None and steady.status["startTime"] == "2026-01-01T00:05:00Z"
    # Suspended again, then resumed: the time of the resume, as batch/v1 Job resets it.
    resumed["spec"]["suspend"] = True
    paused = core.render(resumed, facts, framework.default(), "2026-01-01T00:07:00Z")
    resumed["status"] = paused.status
    resumed["spec"]["suspend"] = False
    again = core.render(resumed, facts, framework.default(), "2026-01-01T00:08:00Z")
    assert again.status is not None and again.status["startTime"] == "2026-01-01T00:08:00Z"


def test_completion_time_is_the_complete_conditions_time() -> None:
    tj, facts = built(runtime(ml_policy=TORCH), trainjob())
    done = core.render(
        finished(tj, at="2026-01-01T00:10:00Z"), facts, framework.default(), "2026-01-02T00:00:00Z"
    )
    assert done.status is not None
    assert (done.status["startTime"], done.status["completionTime"]) == (T0, "2026-01-01T00:10:00Z")


# --- admission --------------------------------------------------------------------------------


def _admit_runtime(rt: Obj) -> list[str]:
    _, warnings = admit(rt, None, Facts(), framework.default(), now=T0)
    return warnings


def test_a_job_level_deadline_in_a_runtime_template_is_refused() -> None:
    job = replicated_job("node", "trainer", [{"name": "node", "image": "img"}])
    job["template"]["spec"]["activeDeadlineSeconds"] = 600
    with pytest.raises(AdmissionError) as refused:
        _admit_runtime(runtime(ml_policy=TORCH, jobs=[job]))
    text = str(refused.value)
    assert "spec.template.spec.replicatedJobs[0].template.spec.activeDeadlineSeconds" in text
    assert "runPolicy" in text


def test_an_update_that_leaves_the_spec_as_it_was_is_not_refused_for_it() -> None:
    """A runtime accepted before this rule (or by upstream's webhook) must stay changeable and
    deletable: removing a finalizer (controller/runtime_finalizers.py) or a label is an update
    that does not touch the spec, and is not judged by it. A spec change still is."""
    job = replicated_job("node", "trainer", [{"name": "node", "image": "img"}])
    job["template"]["spec"]["activeDeadlineSeconds"] = 600
    stored = runtime(ml_policy=TORCH, jobs=[job])
    stored["metadata"]["finalizers"] = ["trainer.kubeflow.org/resource-in-use"]
    stored["metadata"]["deletionTimestamp"] = T0
    update = copy.deepcopy(stored)
    update["metadata"]["finalizers"] = []
    # As the webhook sees them: both objects as the API server stored and defaulted them.
    admit(update, stored, Facts(), framework.default(), now=T0, mode=Mode.WEBHOOK)
    changed = copy.deepcopy(update)
    changed["spec"]["mlPolicy"]["numNodes"] = 2
    with pytest.raises(AdmissionError, match="activeDeadlineSeconds"):
        admit(changed, stored, Facts(), framework.default(), now=T0, mode=Mode.WEBHOOK)


def test_a_jobset_level_ttl_in_a_runtime_template_stays_valid_with_a_warning() -> None:
    rt = runtime(ml_policy=TORCH)
    assert _admit_runtime(rt) == []
    rt["spec"]["template"]["spec"]["ttlSecondsAfterFinished"] = 60
    (warning,) = _admit_runtime(rt)
    assert "spec.template.spec.ttlSecondsAfterFinished" in warning and "TrainJob" in warning


def test_ttl_fields_are_checked_by_the_schema() -> None:
    with pytest.raises(AdmissionError) as refused:
        _admit_runtime(runtime(ml_policy=TORCH, runPolicy={"ttlSecondsAfterFinished": -1}))
    assert "spec.runPolicy.ttlSecondsAfterFinished" in str(refused.value)
    cluster = render(runtime(ml_policy=TORCH), trainjob(ttlSecondsAfterFinished="soon"))
    assert cluster.refusals and "spec.ttlSecondsAfterFinished" in "\n".join(cluster.refusals[0].lines())


# --- trainer render ---------------------------------------------------------------------------


def test_render_shows_the_effective_ttl_and_no_start_before_the_jobs_run(tmp_path: Path) -> None:
    rt = runtime(ml_policy=TORCH, runPolicy={"ttlSecondsAfterFinished": 600})
    manifests = tmp_path / "in.yaml"
    manifests.write_text(
        yaml.safe_dump_all([rt, trainjob("inherits"), trainjob("own", ttlSecondsAfterFinished=5)])
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.cli",
            "render",
            "--no-default-runtimes",
            "-f",
            str(manifests),
            "--now",
            T0,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (
        "Note: TrainJob default/inherits: ttlSecondsAfterFinished 600 (its runtime's runPolicy)"
        in done.stderr
    )
    assert "Note: TrainJob default/own: ttlSecondsAfterFinished 5 (its own)" in done.stderr
    trainjobs = [d for d in yaml.safe_load_all(done.stdout) if d["kind"] == "TrainJob"]
    # Offline nothing reports the Jobs, so nothing has started (docs/decisions.md §ttl).
    assert [(d.get("status") or {}).get("startTime") for d in trainjobs] == [None, None]
