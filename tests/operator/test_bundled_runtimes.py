"""Every bundled runtime runs a TrainJob to the end, on each backend (the real control plane runs
the real JobSet, Job and scheduler controllers, with kwok's fake nodes running the pods)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from operator_helpers import TJ, conditions, get_or_none, trainjob, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

ROOT = Path(__file__).resolve().parents[2]
RUNTIMES = sorted(
    yaml.safe_load(p.read_text())["metadata"]["name"] for p in (ROOT / "runtimes").glob("*.yaml")
)
RUN_FAST = [{"name": "SANDBOX_RUN_SECONDS", "value": "1"}]


def test_every_bundled_runtime_is_listed() -> None:
    assert "torch-distributed" in RUNTIMES and "deepspeed-distributed" in RUNTIMES
    assert len(RUNTIMES) >= 8, RUNTIMES


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_bundled_runtime_runs_to_complete(cluster: Cluster, operator: EmbeddedOperator, runtime: str) -> None:
    cluster.create(trainjob("job", runtime=runtime, trainer={"numNodes": 2, "env": RUN_FAST}))
    wait_for(
        lambda: conditions(cluster, "job").get("Complete", ("",))[0] == "True",
        timeout=90,
        what=f"a {runtime} TrainJob Complete (conditions: {conditions(cluster, 'job')})",
    )
    assert conditions(cluster, "job")["Complete"] == ("True", "AllJobsCompleted")
    assert "Failed" not in conditions(cluster, "job")


def test_failing_pod_fails_the_trainjob(cluster: Cluster, operator: EmbeddedOperator) -> None:
    env = [{"name": "SANDBOX_RUN_SECONDS", "value": "0.5"}, {"name": "SANDBOX_EXIT_CODE", "value": "3"}]
    cluster.create(trainjob("broken", trainer={"env": env}))
    wait_for(
        lambda: conditions(cluster, "broken").get("Failed", ("",))[0] == "True",
        timeout=90,
        what="the TrainJob Failed",
    )
    assert "Complete" not in conditions(cluster, "broken")


def test_suspended_trainjob_creates_no_pods_until_resumed(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    cluster.create(trainjob("held", suspend=True, trainer={"numNodes": 2, "env": RUN_FAST}))
    wait_for(lambda: get_or_none(cluster, "jobset.x-k8s.io/v1alpha2", "JobSet", "held"), what="the JobSet")
    wait_for(lambda: conditions(cluster, "held").get("Suspended") == ("True", "Suspended"), what="Suspended")
    # Given the controllers time to act on a suspended JobSet: they must create no pods.
    wait_for(lambda: cluster.list("batch/v1", "Job"), what="the JobSet's Jobs (created suspended)")
    assert all(job["spec"].get("suspend") for job in cluster.list("batch/v1", "Job"))
    assert cluster.list("v1", "Pod") == []
    cluster.patch(TJ, "TrainJob", "held", {"spec": {"suspend": False}})
    wait_for(lambda: len(cluster.list("v1", "Pod")) == 2, what="two pods once resumed")
    wait_for(
        lambda: conditions(cluster, "held").get("Complete", ("",))[0] == "True", timeout=90, what="Complete"
    )
