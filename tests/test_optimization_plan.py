"""``plan``: a whole search driven as a controller would drive it, trials finishing with an
objective computed from their values, and the rules checked at every step: how many trials run,
how many in all, failures, restarts, TrainJobs that are not ours, and a status that changes only
when the world does (trainer/optimization/plan.py, docs/optimization.md)."""

from __future__ import annotations

import copy
import json
import math

import pytest
from optimization_helpers import (
    FAIL,
    NOW,
    Search,
    assignment,
    categorical,
    condition,
    finish,
    index,
    log_uniform,
    optimizationjob,
    uniform,
)

from trainer.admission.admit import check_schema
from trainer.optimization import search
from trainer.optimization.plan import MAX_FAILURE_MESSAGE, plan

LATER = "2026-01-02T00:00:00Z"


# --- the searches ---


def test_grid_finds_the_exact_argmax_and_ends_when_it_runs_out() -> None:
    obj = optimizationjob(
        categorical("opt", "adam", "sgd", "lion"),
        uniform("dropout", "0", "1", step="0.25"),
        log_uniform("lr", "0.0001", "0.1", step="10"),
        searchAlgorithm={"grid": {}},
        objectives=[{"metric": "acc", "direction": "Maximize"}],
        numTrials=100,
        parallelTrials=7,
    )

    def accuracy(_: int, values: dict[str, str]) -> float:
        bonus = {"adam": 0.0, "sgd": 1.0, "lion": 0.5}[values["opt"]]
        return bonus - (float(values["dropout"]) - 0.75) ** 2 - (math.log10(float(values["lr"])) + 2) ** 2

    run = Search(obj)
    last = run.run(accuracy)
    assert len(run.world) == 3 * 5 * 4, "the grid's 60 combinations, not numTrials' 100"
    assert [assignment(t) for t in run.trials()] == search.grid(obj["spec"]["parameters"])
    assert last.create == [] and last.finished
    assert last.status["result"] == {
        "trainJobName": "tune-trial-34",
        "parameters": [
            {"name": "opt", "value": "sgd"},
            {"name": "dropout", "value": "0.75"},
            {"name": "lr", "value": "0.01"},
        ],
    }
    assert last.status["trials"] == {"created": 60, "running": 0, "succeeded": 60, "failed": 0}
    succeeded = condition(last.status, "Succeeded")
    assert succeeded is not None and succeeded["status"] == "True"
    assert succeeded["reason"] == "TrialsFinished"
    assert "best: tune-trial-34 (acc=1.0)" in succeeded["message"]
    assert "60 of 60 trials finished" in succeeded["message"]


def test_a_grid_larger_than_num_trials_runs_num_trials() -> None:
    obj = optimizationjob(
        uniform("x", "0", "99", type="Int", step="1"), searchAlgorithm={"grid": {}}, numTrials=5
    )
    run = Search(obj)
    run.run(lambda i, values: float(values["x"]))
    assert [assignment(t)["x"] for t in run.trials()] == ["0", "1", "2", "3", "4"]
    assert run.obj["status"]["result"]["trainJobName"] == "tune-trial-0", "Minimize is the default"


def test_random_reproduces_its_trials_from_its_seed_and_reports_the_best() -> None:
    parameters = [log_uniform("lr", "1e-5", "1e-1"), categorical("bs", "16", "32", "64")]

    def loss(_: int, values: dict[str, str]) -> float:
        return abs(math.log10(float(values["lr"])) + 3) + {"16": 0.3, "32": 0.0, "64": 0.1}[values["bs"]]

    runs = []
    for _ in range(2):
        run = Search(optimizationjob(*parameters, searchAlgorithm={"random": {"seed": 7}}, numTrials=12))
        run.run(loss)
        runs.append(run)
    drawn = [assignment(t) for t in runs[0].trials()]
    assert drawn == [assignment(t) for t in runs[1].trials()]
    assert drawn == [search.random_assignment(parameters, 7, i) for i in range(12)]
    best = min(range(12), key=lambda i: loss(i, drawn[i]))
    assert runs[0].obj["status"]["result"] == {
        "trainJobName": f"tune-trial-{best}",
        "parameters": [
            {"name": "lr", "value": drawn[best]["lr"]},
            {"name": "bs", "value": drawn[best]["bs"]},
        ],
    }
    other = Search(optimizationjob(*parameters, searchAlgorithm={"random": {"seed": 8}}, numTrials=12))
    other.run(loss)
    assert [assignment(t) for t in other.trials()] != drawn


def test_a_random_search_without_a_seed_draws_from_its_uid() -> None:
    def first_values(uid: str) -> dict[str, str]:
        return assignment(plan(optimizationjob(uid=uid), [], NOW).create[0])

    assert first_values("uid-a") == first_values("uid-a") != first_values("uid-b")


# --- how many trials, and when ---


@pytest.mark.parametrize("newest_first", [False, True], ids=["oldest-first", "newest-first"])
@pytest.mark.parametrize(("num", "parallel"), [(10, 3), (7, 7), (5, 1)])
def test_never_more_than_parallel_trials_unfinished_and_num_trials_in_all(
    num: int, parallel: int, newest_first: bool
) -> None:
    run = Search(optimizationjob(numTrials=num, parallelTrials=parallel))
    run.run(lambda i, values: float(i), newest_first=newest_first)
    assert run.most_unfinished == parallel
    assert sorted(index(t) for t in run.trials()) == list(range(num))
    created = [index(t) for p in run.plans for t in p.create]
    assert created == list(range(num)), "each index once, in order"
    assert all(len(p.create) <= parallel for p in run.plans)
    assert run.obj["status"]["trials"] == {"created": num, "running": 0, "succeeded": num, "failed": 0}


def test_the_first_wave_and_the_running_message() -> None:
    obj = optimizationjob(numTrials=10, parallelTrials=4)
    first = plan(obj, [], NOW)
    assert [t["metadata"]["name"] for t in first.create] == [f"tune-trial-{i}" for i in range(4)]
    # The status counts what exists: the trials it asks for are counted once they are seen.
    assert first.status["trials"] == {"created": 0, "running": 0, "succeeded": 0, "failed": 0}
    assert first.status["conditions"] == [
        {
            "type": "Created",
            "status": "True",
            "reason": "Created",
            "message": "OptimizationJob is created",
            "lastTransitionTime": NOW,
        },
        {
            "type": "Running",
            "status": "True",
            "reason": "TrialsRunning",
            "message": "0 of 10 trials finished",
            "lastTransitionTime": NOW,
        },
    ]
    run = Search(obj)
    run.step()
    finish(run.world["tune-trial-1"], 0.5)
    finish(run.world["tune-trial-2"], FAIL)
    second = run.step(LATER)
    assert [t["metadata"]["name"] for t in second.create] == ["tune-trial-4", "tune-trial-5"]
    running = condition(second.status, "Running")
    assert running is not None
    assert running["message"] == "2 of 10 trials finished, 1 failed, 2 running"
    assert running["lastTransitionTime"] == NOW, "still True: its time is kept"
    assert second.status["trials"] == {"created": 4, "running": 2, "succeeded": 1, "failed": 1}
    assert second.status["result"]["trainJobName"] == "tune-trial-1", "the best so far"


# --- failures ---


def test_more_failures_than_the_bound_fail_the_search_and_leave_running_trials_to_finish() -> None:
    run = Search(optimizationjob(numTrials=10, parallelTrials=3, maxFailedTrials=1))
    run.step()
    finish(run.world["tune-trial-0"], FAIL, message="exit code 1")
    run.step()
    assert condition(run.obj["status"], "Failed") is None, "one failure is within the bound"
    finish(run.world["tune-trial-3"], FAIL, message="OOMKilled")
    ended = run.step(LATER)
    assert ended.create == [] and ended.finished
    failed = condition(ended.status, "Failed")
    assert failed is not None
    assert (failed["status"], failed["reason"], failed["lastTransitionTime"]) == (
        "True",
        "TooManyFailedTrials",
        LATER,
    )
    assert failed["message"] == (
        "2 trials failed, more than maxFailedTrials (1): "
        "tune-trial-0 (BackoffLimitExceeded), tune-trial-3 (BackoffLimitExceeded)"
    )
    running = condition(ended.status, "Running")
    assert running is not None and running["status"] == "False"
    assert running["message"] == "the search has ended; 2 trials still running are left to finish"
    assert [(f.trial, f.message) for f in ended.failures] == [
        ("tune-trial-0", "exit code 1"),
        ("tune-trial-3", "OOMKilled"),
    ]
    # The trials left running finish: they count, and one of them is the result; nothing is made.
    finish(run.world["tune-trial-1"], 0.4)
    finish(run.world["tune-trial-2"], 0.2)
    after = run.step(LATER)
    assert after.create == []
    assert after.status["trials"] == {"created": 4, "running": 0, "succeeded": 2, "failed": 2}
    assert after.status["result"]["trainJobName"] == "tune-trial-2"
    assert condition(after.status, "Failed") == failed
    assert condition(after.status, "Succeeded") is None


def test_a_bound_of_zero_fails_the_search_at_its_first_failure() -> None:
    run = Search(optimizationjob(numTrials=5, maxFailedTrials=0))
    last = run.run(lambda i, values: FAIL if i == 1 else float(i))
    assert len(run.world) == 2
    failed = condition(last.status, "Failed")
    assert failed is not None
    assert (
        failed["message"]
        == "1 trial failed, more than maxFailedTrials (0): tune-trial-1 (BackoffLimitExceeded)"
    )
    assert last.status["result"]["trainJobName"] == "tune-trial-0", "the best of the trials that ran"
    assert (condition(last.status, "Running") or {})["message"] == "the search has ended"


def test_without_a_bound_failures_only_count() -> None:
    run = Search(optimizationjob(numTrials=6, parallelTrials=2))
    last = run.run(lambda i, values: FAIL if i % 3 else float(i))
    assert last.status["trials"] == {"created": 6, "running": 0, "succeeded": 2, "failed": 4}
    assert condition(last.status, "Succeeded") is not None
    assert last.status["result"]["trainJobName"] == "tune-trial-0"


@pytest.mark.parametrize(
    ("reported", "said"),
    [(None, "no value"), ("nan", "'nan', not a finite number,"), ("inf", "'inf', not a finite number,")],
)
def test_a_complete_trial_without_the_metric_fails_and_is_not_retried(
    reported: str | None, said: str
) -> None:
    run = Search(optimizationjob(metric="val_loss", numTrials=3))
    last = run.run(lambda i, values: reported if i == 1 else float(i))
    assert len(run.world) == 3, "MetricMissing is final: the trial is not made again"
    assert [(f.trial, f.reason, f.message) for f in last.failures] == [
        ("tune-trial-1", "MetricMissing", f"completed, but reported {said} for metric 'val_loss'")
    ]
    assert last.status["trials"]["failed"] == 1
    assert last.status["result"]["trainJobName"] == "tune-trial-0"


def test_a_search_where_no_trial_has_the_metric_fails() -> None:
    run = Search(optimizationjob(metric="val_loss", numTrials=4, parallelTrials=2))
    last = run.run(lambda i, values: None if i % 2 else FAIL)
    failed = condition(last.status, "Failed")
    assert failed is not None and failed["reason"] == "NoTrialSucceeded"
    assert failed["message"] == (
        "no trial reported a finite value for val_loss: 4 of 4 trials finished, 4 failed: "
        "tune-trial-0 (BackoffLimitExceeded), tune-trial-1 (MetricMissing), "
        "tune-trial-2 (BackoffLimitExceeded) and 1 more"
    )
    assert "result" not in last.status


def test_many_long_failures_keep_the_status_small() -> None:
    run = Search(optimizationjob(numTrials=100, parallelTrials=10))
    for _ in range(20):
        run.step()
        for trial in run.unfinished():
            finish(trial, FAIL, message="x" * 10_000)
    last = run.step()
    assert last.finished and len(last.failures) == 100
    assert all(len(f.message) == MAX_FAILURE_MESSAGE for f in last.failures)
    assert len(json.dumps(last.status)) < 1500
    assert "and 97 more" in (condition(last.status, "Failed") or {})["message"]


# --- restarts, and what is not ours ---


def test_planning_again_from_the_same_world_creates_nothing_twice() -> None:
    run = Search(optimizationjob(numTrials=8, parallelTrials=3))
    run.step()
    finish(run.world["tune-trial-0"], 1.0)
    run.step()
    trials = list(run.world.values())
    again = plan(run.obj, trials, LATER)
    assert again.create == [], "three unfinished trials exist: nothing to make"
    # A restarted controller whose cache has not yet seen trial 3 asks for trial 3 again, by the
    # same name (AlreadyExists), never for another index.
    stale = plan(run.obj, [t for t in trials if t["metadata"]["name"] != "tune-trial-3"], LATER)
    assert [t["metadata"]["name"] for t in stale.create] == ["tune-trial-3"]
    assert assignment(stale.create[0]) == assignment(run.world["tune-trial-3"])


def test_a_trials_values_are_read_back_from_its_annotation() -> None:
    run = Search(optimizationjob(categorical("opt", "adam", "sgd"), numTrials=2, parallelTrials=2))
    run.step()
    trial = run.world["tune-trial-1"]
    values = assignment(trial)
    values["opt"] = "sgd" if values["opt"] == "adam" else "adam"
    trial["metadata"]["annotations"]["trainer.kubeflow.org/trial-parameters"] = json.dumps(values)
    finish(run.world["tune-trial-0"], 2.0)
    finish(trial, 1.0)
    last = run.step()
    assert last.status["result"] == {
        "trainJobName": "tune-trial-1",
        "parameters": [{"name": "opt", "value": values["opt"]}],
    }


def test_a_deleted_trial_is_not_made_again() -> None:
    run = Search(optimizationjob(numTrials=4, parallelTrials=2))
    run.step()
    finish(run.world["tune-trial-1"], 1.0)
    run.step()
    assert run.step().create == [], "the controller has seen trial 2: status.trials.created is 3"
    assert sorted(run.world) == ["tune-trial-0", "tune-trial-1", "tune-trial-2"]
    del run.world["tune-trial-2"]  # by hand, or by a TTL
    after = run.step()
    assert [t["metadata"]["name"] for t in after.create] == ["tune-trial-3"]
    assert after.status["trials"] == {"created": 3, "running": 1, "succeeded": 1, "failed": 0}
    assert (condition(after.status, "Running") or {})["message"] == (
        "1 of 4 trials finished, 1 running, 1 deleted"
    )
    finish(run.world["tune-trial-0"], 2.0)
    finish(run.world["tune-trial-3"], 3.0)
    last = run.step()
    assert last.finished and last.create == []
    assert last.status["trials"] == {"created": 4, "running": 0, "succeeded": 3, "failed": 0}


def test_a_trainjob_of_another_owner_is_never_adopted_and_its_name_is_waited_for() -> None:
    obj = optimizationjob(numTrials=3, parallelTrials=2)
    leftover = copy.deepcopy(plan(optimizationjob(uid="an-older-uid"), [], NOW).create[0])
    finish(leftover, 0.001)  # better than anything: were it adopted, it would be the result
    stray = {
        "metadata": {"name": "tune-trial-7", "labels": {"trainer.kubeflow.org/optimizationjob-name": "tune"}}
    }
    blocked = plan(obj, [leftover, stray], NOW)
    assert blocked.create == [], "trial 0's name is taken; no other index stands in for it"
    assert blocked.status["trials"] == {"created": 0, "running": 0, "succeeded": 0, "failed": 0}
    assert "result" not in blocked.status
    running = condition(blocked.status, "Running")
    assert running is not None and running["reason"] == "TrialNameTaken"
    assert running["message"].startswith(
        "TrainJob tune-trial-0 exists and is not this OptimizationJob's trial: the trial waits for its name"
    )
    freed = plan(obj | {"status": blocked.status}, [stray], NOW)
    assert [t["metadata"]["name"] for t in freed.create] == ["tune-trial-0", "tune-trial-1"]
    assert (condition(freed.status, "Running") or {})["reason"] == "TrialsRunning"


def test_a_trainjob_not_ours_blocks_only_from_its_index_on() -> None:
    obj = optimizationjob(numTrials=5, parallelTrials=3)
    leftover = copy.deepcopy(plan(optimizationjob(uid="an-older-uid", numTrials=5), [], NOW).create[0])
    leftover["metadata"]["name"] = "tune-trial-1"
    assert [t["metadata"]["name"] for t in plan(obj, [leftover], NOW).create] == ["tune-trial-0"]


# --- the status ---


def test_the_same_input_gives_the_same_status_byte_for_byte() -> None:
    run = Search(optimizationjob(numTrials=6, parallelTrials=2))
    run.step()
    finish(run.world["tune-trial-0"], 0.5)
    finish(run.world["tune-trial-1"], FAIL)
    run.step()  # creates trials 2 and 3
    assert run.step().create == []  # sees them
    trials = list(run.world.values())
    first = plan(run.obj, trials, LATER)
    assert json.dumps(first.status) == json.dumps(run.obj["status"]), "nothing changed since the last write"
    assert json.dumps(plan(run.obj, trials, LATER).status) == json.dumps(first.status)


def test_a_finished_search_keeps_its_status_whatever_becomes_of_its_trials() -> None:
    run = Search(optimizationjob(numTrials=3, parallelTrials=3))
    last = run.run(lambda i, values: float(i))
    final = copy.deepcopy(run.obj["status"])
    assert last.finished
    for trials in (list(run.world.values()), []):  # all there; all deleted by a TTL
        again = plan(run.obj, trials, LATER)
        assert again.create == [] and again.status == final and again.finished


def test_the_status_is_valid_for_the_crd() -> None:
    run = Search(
        optimizationjob(categorical("opt", "a", "b"), numTrials=5, parallelTrials=2, maxFailedTrials=3)
    )
    run.run(lambda i, values: FAIL if i == 2 else None if i == 3 else float(i))
    obj = copy.deepcopy(run.obj)
    check_schema(obj, None, NOW)
    assert obj["status"]["trials"] == {"created": 5, "running": 0, "succeeded": 3, "failed": 2}
    assert [c["type"] for c in obj["status"]["conditions"]] == ["Created", "Running", "Succeeded"]


def test_the_condition_that_ends_a_search_comes_last_even_in_its_first_status() -> None:
    """`kubectl get` shows the last condition as the state: a search whose first status written
    already ends it (the operator was down while its trial ran) lists Running before Succeeded."""
    job = optimizationjob(numTrials=1)
    first = plan(job, [], NOW).create[0]
    finish(first, 0.5)
    job.pop("status", None)  # nothing written yet: the trial ran and finished meanwhile
    status = plan(job, [first], NOW).status
    assert [c["type"] for c in status["conditions"]] == ["Created", "Running", "Succeeded"]
    assert condition(status, "Running")["status"] == "False"
