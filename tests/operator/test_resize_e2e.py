"""docs/decisions.md §resize on the API server: a suspended TrainJob's numNodes is changed, its
JobSet made again at the new size, and the resumed TrainJob runs that many pods; a running one
keeps its size."""

from __future__ import annotations

import pytest
from operator_helpers import TJ, get_or_none, operator_writes, trainjob, wait_for, wait_settled
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

JS = "jobset.x-k8s.io/v1alpha2"
RUN_FOREVER = [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]


def parallelism(jobset: dict | None) -> int | None:
    if jobset is None:
        return None
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"].get("parallelism")


def running_pods(cluster: Cluster, name: str) -> int:
    pods = cluster.list("v1", "Pod", cluster.namespace)
    return sum(
        1
        for pod in pods
        if (pod["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name") == name
        and (pod.get("status") or {}).get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    )


def test_a_suspended_trainjob_resized_runs_at_its_new_size(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    cluster.create(trainjob("grow", suspend=True, trainer={"numNodes": 1, "env": RUN_FOREVER}))
    first = wait_for(lambda: get_or_none(cluster, JS, "JobSet", "grow"), what="the suspended JobSet")
    assert parallelism(first) == 1
    cluster.patch(TJ, "TrainJob", "grow", {"spec": {"trainer": {"numNodes": 2}}})
    second = wait_for(
        lambda: (js := get_or_none(cluster, JS, "JobSet", "grow")) and parallelism(js) == 2 and js,
        timeout=60,
        what="the JobSet made again with 2 nodes",
    )
    assert second["metadata"]["uid"] != first["metadata"]["uid"], (
        "made again: JobSet's webhook holds its Jobs"
    )
    assert second["spec"]["suspend"] is True, "still suspended until the TrainJob is resumed"
    wait_settled(cluster, operator.idle)
    mark = cluster.audit_mark()
    cluster.patch(TJ, "TrainJob", "grow", {"spec": {"suspend": False}})
    wait_for(lambda: running_pods(cluster, "grow") == 2, timeout=90, what="two running pods")
    jobset = cluster.get(JS, "JobSet", "grow")
    assert jobset["metadata"]["uid"] == second["metadata"]["uid"], "resumed, not made again"
    deletes = [r for r in operator_writes(cluster, mark) if r.verb == "delete"]
    assert deletes == [], "a JobSet already of the right size is only resumed"


def test_a_running_trainjob_cannot_be_resized(cluster: Cluster, operator: EmbeddedOperator) -> None:
    cluster.create(trainjob("fixed", trainer={"numNodes": 1, "env": RUN_FOREVER}))
    wait_for(lambda: get_or_none(cluster, JS, "JobSet", "fixed"), what="the JobSet")
    with pytest.raises(APIError) as refused:
        cluster.patch(TJ, "TrainJob", "fixed", {"spec": {"trainer": {"numNodes": 2}}})
    assert "numNodes and resourcesPerNode can only be changed while the TrainJob is suspended" in str(
        refused.value
    )
    with pytest.raises(APIError) as refused:
        cluster.patch(TJ, "TrainJob", "fixed", {"spec": {"suspend": True, "trainer": {"image": "other"}}})
    assert "field is immutable" in str(refused.value)
    assert parallelism(cluster.get(JS, "JobSet", "fixed")) == 1
