"""The watched resources are one table: whatever the render core builds can be written and is watched."""

from __future__ import annotations

import kopf
import pytest
from kopf._cogs.structs.references import Resource as KopfResource
from render_helpers import Obj, render, replicated_job, runtime, trainjob

from trainer.controller.config import Configuration
from trainer.controller.operator import Operator
from trainer.controller.resources import WATCHED, WRITABLE, Role, resource_of


def _children(policy: Obj, ml_policy: Obj) -> list[Obj]:
    jobs = [
        replicated_job("launcher", "launcher", [{"name": "node", "image": "img"}]),
        replicated_job("node", "trainer", [{"name": "node", "image": "img"}]),
    ]
    rt = runtime(ml_policy=ml_policy, jobs=jobs, podGroupPolicy=policy)
    cluster = render(rt, trainjob())
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    return [o for o in cluster.output() if o["kind"] != "TrainJob"]


@pytest.mark.parametrize("scheduler", ["coscheduling", "volcano"])
def test_every_child_the_render_core_builds_is_written_and_watched(scheduler: str) -> None:
    children = _children({scheduler: {}}, {"numNodes": 2, "mpi": {}})
    kinds = {o["kind"] for o in children}
    assert {"JobSet", "ConfigMap", "Secret", "PodGroup"} <= kinds, kinds
    watched = {(r.api_version, r.kind) for r in WATCHED if r.role is Role.CHILD}
    for obj in children:
        assert resource_of(obj) is WRITABLE[(obj["apiVersion"], obj["kind"])]
        assert (obj["apiVersion"], obj["kind"]) in watched


def test_watch_ids_are_unique_and_only_our_labelled_kinds_are_filtered_by_the_server() -> None:
    assert len({r.type.name for r in WATCHED}) == len(WATCHED)
    settings = kopf.OperatorSettings()
    no_webhooks = Configuration.model_validate({"webhook": {"enabled": False}})
    Operator(config=no_webhooks).configure(settings)
    for r in WATCHED:
        found = list(
            settings.watching.label_selectors.collect(
                KopfResource(group=r.type.group, version=r.type.version, plural=r.type.plural)
            )
        )
        assert found == ([r.label_selector] if r.labelled else []), r
    assert {r.kind for r in WATCHED if r.labelled} == {"ConfigMap", "Secret"}


def test_each_watched_resource_has_one_handler_and_our_kinds_have_webhooks() -> None:
    registry = Operator(config=Configuration()).registry()
    watching = {h.id for h in registry._watching.get_all_handlers()}
    assert watching == {r.type.name for r in WATCHED}
    webhooks = {h.id for h in registry._webhooks.get_all_handlers()}
    assert webhooks == {
        f"{prefix}.{kind.lower()}"
        for kind in ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")
        for prefix in ("validator", "defaulter")
    }
