"""Shared helpers for the OptimizationJob tests: OptimizationJobs as admitted (CRD defaults
applied), trial TrainJobs finishing as the training would report, and a whole search simulated
by calling ``plan`` as a controller would, with no cluster."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from trainer.admission.admit import check_schema
from trainer.optimization.plan import Plan, plan

Obj = dict[str, Any]
NOW = "2026-01-01T00:00:00Z"
UID = "5f0c7e1a-opt-uid"
FAIL = "Failed"  # an outcome: the trial's TrainJob fails
PARAMETERS_ANNOTATION = "trainer.kubeflow.org/trial-parameters"

# What a trial does, given its index and values: a metric value, FAIL, or None (it completes
# without reporting the metric).
Outcome = float | str | None


def uniform(name: str, low: str, high: str, **extra: Any) -> Obj:
    return {"name": name, "searchSpace": {"uniform": {"min": low, "max": high, **extra}}}


def log_uniform(name: str, low: str, high: str, **extra: Any) -> Obj:
    return {"name": name, "searchSpace": {"logUniform": {"min": low, "max": high, **extra}}}


def categorical(name: str, *choices: str) -> Obj:
    return {"name": name, "searchSpace": {"categorical": {"choices": list(choices)}}}


def optimizationjob(*parameters: Obj, uid: str = UID, metric: str = "loss", **spec: Any) -> Obj:
    """An OptimizationJob as the API server stores it: CRD defaults applied, with a uid."""
    obj: Obj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "OptimizationJob",
        "metadata": {"name": "tune", "namespace": "default"},
        "spec": {
            "objectives": [{"metric": metric}],
            "parameters": list(parameters) or [uniform("lr", "0.001", "0.1")],
            "trainJobTemplate": {"spec": {"runtimeRef": {"name": "torch-distributed"}}},
            **spec,
        },
    }
    admitted = check_schema(obj, None, NOW)
    admitted["metadata"]["uid"] = uid
    return admitted


def assignment(trainjob: Obj) -> dict[str, str]:
    values: dict[str, str] = json.loads(trainjob["metadata"]["annotations"][PARAMETERS_ANNOTATION])
    return values


def index(trainjob: Obj) -> int:
    return int(trainjob["metadata"]["labels"]["trainer.kubeflow.org/trial-index"])


def is_finished(trainjob: Obj) -> bool:
    return any(
        cond["type"] in ("Complete", "Failed") and cond["status"] == "True"
        for cond in (trainjob.get("status") or {}).get("conditions") or []
    )


def finish(trainjob: Obj, outcome: Outcome, metric: str = "loss", message: str = "") -> None:
    """The trial's TrainJob as it ends: Failed, or Complete with the metric (if any) reported."""
    condition = {"status": "True", "lastTransitionTime": NOW}
    if outcome == FAIL:
        trainjob["status"] = {
            "conditions": [
                {"type": "Failed", "reason": "BackoffLimitExceeded", "message": message, **condition}
            ]
        }
        return
    status: Obj = {
        "conditions": [{"type": "Complete", "reason": "JobSetCompleted", "message": "", **condition}]
    }
    metrics = [{"name": "step", "value": "100"}]
    if outcome is not None:
        metrics.append({"name": metric, "value": outcome if isinstance(outcome, str) else repr(outcome)})
    status["trainerStatus"] = {"metrics": metrics}
    trainjob["status"] = status


class Search:
    """A simulated cluster: the trial TrainJobs that exist, and the OptimizationJob as stored."""

    def __init__(self, obj: Obj) -> None:
        self.obj = obj
        self.world: dict[str, Obj] = {}
        self.plans: list[Plan] = []
        self.most_unfinished = 0

    @property
    def parallel(self) -> int:
        return int(self.obj["spec"]["parallelTrials"])

    def step(self, now: str = NOW) -> Plan:
        """One reconcile: plan, create what it says, write its status."""
        result = plan(self.obj, list(self.world.values()), now)
        for trainjob in result.create:
            name = trainjob["metadata"]["name"]
            assert name not in self.world, f"{name} created twice"
            self.world[name] = copy.deepcopy(trainjob)
        self.obj["status"] = result.status
        self.plans.append(result)
        unfinished = [t for t in self.world.values() if not is_finished(t)]
        self.most_unfinished = max(self.most_unfinished, len(unfinished))
        return result

    def unfinished(self) -> list[Obj]:
        return sorted((t for t in self.world.values() if not is_finished(t)), key=index)

    def run(
        self,
        outcome: Callable[[int, dict[str, str]], Outcome],
        *,
        newest_first: bool = False,
        max_steps: int = 1000,
    ) -> Plan:
        """Plan, then finish one unfinished trial (the oldest, or the newest), until nothing runs.
        Returns the last plan, the one that saw every trial finished."""
        for _ in range(max_steps):
            result = self.step()
            running = self.unfinished()
            if not running:
                return result
            trial = running[-1] if newest_first else running[0]
            finish(trial, outcome(index(trial), assignment(trial)), self.metric)
        raise AssertionError("the search did not end")

    @property
    def metric(self) -> str:
        return str(self.obj["spec"]["objectives"][0]["metric"])

    def trials(self) -> list[Obj]:
        return sorted(self.world.values(), key=index)


def condition(status: Obj, type_: str) -> Obj | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)
