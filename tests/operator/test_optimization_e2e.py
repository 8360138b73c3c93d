"""OptimizationJobs on the API server (docs/optimization.md): the operator runs each search's
trials as TrainJobs, at most ``parallelTrials`` at once, reads each finished trial's metric from
its ``status.trainerStatus`` and reports the best; deleting the search deletes its trials.

On both backends the test writes each trial's metric into its TrainJob's
``status.trainerStatus``, as the status server does when the trial's pod reports it; on the real
control plane one search also takes the pod's own path: each trial's pod posts its metric to the
operator's status server with the token its projected volume would hold. The trial's pods run for
``SANDBOX_RUN_SECONDS`` and succeed (tests/nodes/test_training.py runs a search whose training
script reports its metric itself, on real nodes).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import requests
from operator_helpers import TJ, get_or_none, wait_for
from status_helpers import JOBSET_LABEL, audience, token_for
from trainer_sandbox.backends import Cluster, RealCluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.api import constants as c
from trainer.controller.config import Configuration
from trainer.optimization import search as search_module
from trainer.runtime import conditions as cond

Obj = dict[str, Any]
OJ = "trainer.kubeflow.org/v1alpha1"
RUN_SECONDS = "5"


def optimizationjob(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": OJ,
        "kind": "OptimizationJob",
        "metadata": {"name": name},
        "spec": {
            "objectives": [{"metric": "score", "direction": "Maximize"}],
            "trainJobTemplate": {
                "spec": {
                    "runtimeRef": {"name": "torch-distributed"},
                    "trainer": {
                        "numNodes": 1,
                        "env": [{"name": "SANDBOX_RUN_SECONDS", "value": RUN_SECONDS}],
                    },
                }
            },
            **spec,
        },
    }


def trials(cluster: Cluster, name: str) -> list[Obj]:
    return [
        tj
        for tj in cluster.list(TJ, "TrainJob", cluster.namespace)
        if (tj["metadata"].get("labels") or {}).get(c.OPTIMIZATIONJOB_NAME_LABEL) == name
    ]


def finished(trainjob: Obj) -> bool:
    conditions = (trainjob.get("status") or {}).get("conditions")
    return cond.is_true(conditions, c.COND_COMPLETE) or cond.is_true(conditions, c.COND_FAILED)


def report(cluster: Cluster, trainjob: Obj, value: float) -> bool:
    """What the status server writes when the trial's pod reports its metric."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cluster.patch(
        TJ,
        "TrainJob",
        trainjob["metadata"]["name"],
        {
            "status": {
                "trainerStatus": {
                    "metrics": [{"name": "score", "value": repr(value)}],
                    "lastUpdatedTime": now,
                }
            }
        },
        subresource="status",
    )
    return True


Reporter = Callable[[Cluster, Obj, float], bool]


def drive(
    cluster: Cluster, name: str, score: Any, timeout: float = 150, reporter: Reporter = report
) -> tuple[Obj, int]:
    """Report each trial's score (``score`` of its parameters, or None for no report) while the
    search runs, by ``reporter`` (False: not yet, try again); return the search once it has ended,
    and the most trials seen unfinished at once."""
    reported: set[str] = set()
    most = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = trials(cluster, name)
        most = max(most, sum(1 for t in found if not finished(t)))
        for trial in found:
            trial_name = trial["metadata"]["name"]
            if trial_name in reported or finished(trial):
                continue
            values = trial["metadata"]["annotations"][c.TRIAL_PARAMETERS_ANNOTATION]
            value = score(json.loads(values))
            if value is not None and not reporter(cluster, trial, value):
                continue
            reported.add(trial_name)
        search = cluster.get(OJ, "OptimizationJob", name)
        conditions = (search.get("status") or {}).get("conditions")
        if cond.is_true(conditions, "Succeeded") or cond.is_true(conditions, "Failed"):
            return search, most
        time.sleep(0.3)
    raise AssertionError(
        f"the search {name} did not end in {timeout} s: {cluster.get(OJ, 'OptimizationJob', name)}"
    )


def test_a_grid_search_finds_the_best_of_a_known_objective(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    """Every combination runs, never more than parallelTrials at once, and the best is the argmax."""
    parameters = [
        {"name": "x", "searchSpace": {"uniform": {"min": "1", "max": "4", "step": "1", "type": "Int"}}},
        {"name": "kind", "searchSpace": {"categorical": {"choices": ["a", "b"]}}},
    ]
    cluster.create(
        optimizationjob(
            "grid", searchAlgorithm={"grid": {}}, parameters=parameters, numTrials=20, parallelTrials=3
        )
    )

    def score(values: dict[str, str]) -> float:
        return -((int(values["x"]) - 3) ** 2) + (0.5 if values["kind"] == "b" else 0.0)

    search, most = drive(cluster, "grid", score)
    assert most <= 3, f"{most} trials ran at once"
    status = search["status"]
    assert cond.is_true(status["conditions"], "Succeeded"), status
    assert status["trials"] == {"created": 8, "running": 0, "succeeded": 8, "failed": 0}, "the grid's size"
    best = status["result"]
    assert best["parameters"] == [{"name": "x", "value": "3"}, {"name": "kind", "value": "b"}]
    winner = cluster.get(TJ, "TrainJob", best["trainJobName"])
    assert winner["spec"]["trainer"]["env"][-2:] == [
        {"name": "KUBEFLOW_TRAINER_OPT_X", "value": "3"},
        {"name": "KUBEFLOW_TRAINER_OPT_KIND", "value": "b"},
    ], "the values reach the training code as env vars"
    assert len(trials(cluster, "grid")) == 8, "no trial twice"

    cluster.delete(OJ, "OptimizationJob", "grid")
    wait_for(lambda: not trials(cluster, "grid"), timeout=60, what="the trials deleted with their search")


def test_a_trial_without_its_metric_fails_and_the_bound_ends_the_search(
    cluster: Cluster, operator: EmbeddedOperator
) -> None:
    """A trial that completes without the objective's metric is a failed trial, never run again;
    one more failure than maxFailedTrials fails the search, and no trial is made after it."""
    parameters = [{"name": "lr", "searchSpace": {"logUniform": {"min": "0.001", "max": "0.1"}}}]
    cluster.create(
        optimizationjob(
            "bounded",
            searchAlgorithm={"random": {"seed": 7}},
            parameters=parameters,
            numTrials=5,
            parallelTrials=1,
            maxFailedTrials=0,
        )
    )
    search, _ = drive(cluster, "bounded", lambda values: None)
    status = search["status"]
    failed = cond.find(status["conditions"], "Failed")
    assert failed is not None and failed["status"] == "True", status
    assert failed["reason"] == "TooManyFailedTrials"
    assert "bounded-trial-0 (MetricMissing)" in failed["message"]
    assert status["trials"] == {"created": 1, "running": 0, "succeeded": 0, "failed": 1}
    assert "result" not in status
    time.sleep(2)
    assert [t["metadata"]["name"] for t in trials(cluster, "bounded")] == ["bounded-trial-0"], "none after"
    told = [
        e
        for e in cluster.list("v1", "Event", cluster.namespace)
        if e["involvedObject"].get("kind") == "OptimizationJob" and e["reason"] == "TrialFailed"
    ]
    assert len(told) == 1 and "MetricMissing" in told[0]["message"], told
    assert get_or_none(cluster, TJ, "TrainJob", "bounded-trial-1") is None


def smooth(values: dict[str, str]) -> float:
    """A smooth objective with its maximum, 0, at x = 0.3, y = 0.7."""
    return -((float(values["x"]) - 0.3) ** 2) - (float(values["y"]) - 0.7) ** 2


UNIT_SQUARE = [
    {"name": "x", "searchSpace": {"uniform": {"min": "0", "max": "1"}}},
    {"name": "y", "searchSpace": {"uniform": {"min": "0", "max": "1"}}},
]


@pytest.mark.parametrize(
    ("algorithm", "num", "parallel"), [("random", 6, 3), ("tpe", 12, 2)], ids=["random", "tpe"]
)
def test_a_seeded_search_reports_the_best_of_its_trials(
    cluster: Cluster, operator: EmbeddedOperator, algorithm: str, num: int, parallel: int
) -> None:
    """Random and TPE each run numTrials trials, parallelTrials at most at once, and report the
    best of them; its values are on the trial. TPE draws at random until ten trials have a value:
    two at a time, its twelfth trial is made once ten have finished, from optuna's model."""
    name = f"seeded-{algorithm}"
    cluster.create(
        optimizationjob(
            name,
            searchAlgorithm={algorithm: {"seed": 11}},
            parameters=UNIT_SQUARE,
            numTrials=num,
            parallelTrials=parallel,
        )
    )
    search, most = drive(cluster, name, smooth)
    assert most <= parallel, f"{most} trials ran at once"
    status = search["status"]
    assert status["trials"] == {"created": num, "running": 0, "succeeded": num, "failed": 0}
    scores = {
        t["metadata"]["name"]: smooth(json.loads(t["metadata"]["annotations"][c.TRIAL_PARAMETERS_ANNOTATION]))
        for t in trials(cluster, name)
    }
    assert len(scores) == num
    assert status["result"]["trainJobName"] == max(scores, key=lambda trial: scores[trial])
    winner = cluster.get(TJ, "TrainJob", status["result"]["trainJobName"])
    given = json.loads(winner["metadata"]["annotations"][c.TRIAL_PARAMETERS_ANNOTATION])
    assert status["result"]["parameters"] == [
        {"name": "x", "value": given["x"]},
        {"name": "y", "value": given["y"]},
    ]
    if algorithm == "tpe":
        made = {t["metadata"]["name"]: t for t in trials(cluster, name)}
        last = json.loads(
            made[f"{name}-trial-{num - 1}"]["metadata"]["annotations"][c.TRIAL_PARAMETERS_ANNOTATION]
        )
        assert last != search_module.random_assignment(UNIT_SQUARE, 11, num - 1), "proposed by TPE, not drawn"


def test_a_restart_mid_search_loses_and_duplicates_no_trial(
    cluster: Cluster, operator_kubeconfig: Path
) -> None:
    """The operator stops with a wave running and another starts: every trial index is made once,
    the first wave's TrainJobs are the same objects, and the search ends with all of them."""
    cluster.create(
        optimizationjob(
            "restarted",
            searchAlgorithm={"random": {"seed": 3}},
            parameters=UNIT_SQUARE,
            numTrials=4,
            parallelTrials=2,
        )
    )
    config = Configuration()
    with EmbeddedOperator(operator_kubeconfig, config, namespaces=[cluster.namespace]):
        wave = wait_for(
            lambda: (found := trials(cluster, "restarted")) and len(found) == 2 and found,
            timeout=60,
            what="the first wave",
        )
        for trial in wave:  # reported now: the first wave may finish while no operator runs
            report(
                cluster,
                trial,
                smooth(json.loads(trial["metadata"]["annotations"][c.TRIAL_PARAMETERS_ANNOTATION])),
            )
    first = {t["metadata"]["name"]: t["metadata"]["uid"] for t in trials(cluster, "restarted")}
    with EmbeddedOperator(operator_kubeconfig, config, namespaces=[cluster.namespace]):
        search, most = drive(cluster, "restarted", smooth)
    assert most <= 2
    assert search["status"]["trials"] == {"created": 4, "running": 0, "succeeded": 4, "failed": 0}
    after = {t["metadata"]["name"]: t["metadata"]["uid"] for t in trials(cluster, "restarted")}
    assert sorted(after) == [f"restarted-trial-{i}" for i in range(4)]
    assert {k: after[k] for k in first} == first, "the first wave's trials were kept, not made again"


def through_the_status_server(tmp_path: Path) -> Reporter:
    """How a trial's pod reports its metric: the token its projected volume would hold (bound to
    the pod, the trial's audience), POSTed to the URL in its env with the CA it mounts. Not yet
    (False) while the trial has no running pod."""

    def post(cluster: Cluster, trainjob: Obj, value: float) -> bool:
        real = cast(RealCluster, cluster)
        name = trainjob["metadata"]["name"]
        pod = next(
            (
                p
                for p in real.list("v1", "Pod")
                if (p["metadata"].get("labels") or {}).get(JOBSET_LABEL) == name
                and (p.get("status") or {}).get("phase") == "Running"
            ),
            None,
        )
        tls = get_or_none(real, "v1", "ConfigMap", f"{name}-tls-config")
        if pod is None or tls is None:
            return False
        node = next(ct for ct in pod["spec"]["containers"] if ct["name"] == "node")
        url = next(e["value"] for e in node["env"] if e["name"] == "KUBEFLOW_TRAINER_SERVER_URL")
        ca = tmp_path / f"{name}-ca.crt"
        ca.write_text(tls["data"]["ca.crt"])
        token = token_for(real, pod, audience(real.namespace, name))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # required, as the SDK sends it
        body = {
            "trainerStatus": {"metrics": [{"name": "score", "value": repr(value)}], "lastUpdatedTime": now}
        }
        answer = requests.post(
            url, json=body, headers={"Authorization": f"Bearer {token}"}, verify=str(ca), timeout=10
        )
        assert answer.ok, answer.text
        return True

    return post


def test_trials_report_their_metric_through_the_status_server(
    real: RealCluster, status_operator: tuple[EmbeddedOperator, int], tmp_path: Path
) -> None:
    """The path a trial's metric takes on a cluster: each trial's pod (kwok runs it) reports to the
    operator's status server with its own token, and the search reads what the server wrote."""
    name = "served"
    search_spec = optimizationjob(
        name,
        searchAlgorithm={"random": {"seed": 5}},
        parameters=UNIT_SQUARE,
        numTrials=4,
        parallelTrials=2,
    )
    trainer = search_spec["spec"]["trainJobTemplate"]["spec"]["trainer"]
    trainer["env"] = [{"name": "SANDBOX_RUN_SECONDS", "value": "10"}]  # time to post while it runs
    real.create(search_spec)
    search, most = drive(real, name, smooth, timeout=240, reporter=through_the_status_server(tmp_path))
    assert most <= 2
    status = search["status"]
    assert status["trials"] == {"created": 4, "running": 0, "succeeded": 4, "failed": 0}
    scores = {
        t["metadata"]["name"]: smooth(json.loads(t["metadata"]["annotations"][c.TRIAL_PARAMETERS_ANNOTATION]))
        for t in trials(real, name)
    }
    assert status["result"]["trainJobName"] == max(scores, key=lambda trial: scores[trial])
    for trial in trials(real, name):
        written = trial["status"]["trainerStatus"]["metrics"]
        assert written == [{"name": "score", "value": repr(scores[trial["metadata"]["name"]])}]
