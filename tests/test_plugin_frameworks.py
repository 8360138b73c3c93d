"""PlainML, JAX and XGBoost plugins."""

from __future__ import annotations

import pytest
from render_helpers import container, env, only, render, replicated_job, rjob, runtime, trainjob


def test_plainml_counts_and_env_without_policy() -> None:
    rt = runtime(
        jobs=[
            replicated_job(
                "node",
                "trainer",
                [{"name": "node", "image": "i"}],
            )
        ]
    )
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 4
    jobset = only(render(rt, trainjob()), "JobSet")
    assert rjob(jobset, "node")["template"]["spec"]["parallelism"] == 4, (
        "template parallelism kept without mlPolicy"
    )
    jobset = only(
        render(rt, trainjob(trainer={"numNodes": 2, "env": [{"name": "X", "value": "1"}]})), "JobSet"
    )
    assert rjob(jobset, "node")["template"]["spec"]["completions"] == 2
    assert env(container(jobset, "node")) == {"X": "1"}


def test_plainml_numnodes_zero_gives_zero_parallelism() -> None:
    jobset = only(render(runtime(ml_policy={"numNodes": 3}), trainjob(trainer={"numNodes": 0})), "JobSet")
    assert rjob(jobset, "node")["template"]["spec"]["parallelism"] == 0


def test_jax_env_one_process_per_node() -> None:
    rt = runtime(ml_policy={"numNodes": 1, "jax": {}})
    jobset = only(
        render(rt, trainjob(trainer={"numNodes": 3, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}}})),
        "JobSet",
    )
    values = env(container(jobset, "node"))
    assert values["JAX_NUM_PROCESSES"] == "3"
    assert values["JAX_COORDINATOR_ADDRESS"] == "job-node-0-0.job:29500"
    assert values["JAX_PROCESS_ID"]["fieldRef"]["fieldPath"].endswith("job-completion-index']")
    assert container(jobset, "node")["ports"] == [{"containerPort": 29500}]


@pytest.mark.parametrize(
    ("runtime_gpus", "trainer", "workers"),
    [
        (None, {"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}}, "8"),
        (2, {"numNodes": 3}, "6"),
        (1, {"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 3}}}, "6"),
        (None, {"numNodes": 5}, "5"),
    ],
)
def test_xgboost_workers(runtime_gpus: int | None, trainer: dict[str, object], workers: str) -> None:
    node: dict[str, object] = {"name": "node", "image": "i"}
    if runtime_gpus:
        node["resources"] = {"limits": {"nvidia.com/gpu": runtime_gpus}}
    rt = runtime(ml_policy={"numNodes": 1, "xgboost": {}}, jobs=[replicated_job("node", "trainer", [node])])
    values = env(container(only(render(rt, trainjob(trainer=trainer)), "JobSet"), "node"))
    assert values["DMLC_NUM_WORKER"] == workers
    assert values["DMLC_TRACKER_URI"] == "job-node-0-0.job"
    assert values["DMLC_TRACKER_PORT"] == "29500"


def test_xgboost_reserved_env_one_error_per_entry() -> None:
    rt = runtime(ml_policy={"numNodes": 1, "xgboost": {}})
    bad = trainjob(
        trainer={
            "env": [
                {"name": "OK", "value": "1"},
                {"name": "DMLC_TASK_ID", "value": "0"},
                {"name": "DMLC_NUM_WORKER", "value": "2"},
            ]
        }
    )
    (refusal,) = render(rt, bad).refusals
    assert refusal.lines() == [
        "TrainJob default/job: spec.trainer.env[1]: Forbidden: DMLC_TASK_ID is reserved for the XGBoost runtime",
        "TrainJob default/job: spec.trainer.env[2]: Forbidden: DMLC_NUM_WORKER is reserved for the XGBoost runtime",
    ]
