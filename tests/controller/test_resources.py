"""The watched resources are one table: whatever the render core builds can be written and is watched."""

from __future__ import annotations

import kopf
import pytest
from kopf._cogs.structs.references import Resource as KopfResource
from render_helpers import Obj, render, replicated_job, runtime, trainjob

from trainer.controller.client import ApiClient
from trainer.controller.config import Configuration
from trainer.controller.informer import Informer
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
    operator = Operator(config=Configuration())
    informer = Informer(ApiClient("https://127.0.0.1:1"), operator.router.scopes(), operator.router)
    for reflector in informer.reflectors:
        r = reflector.resource
        assert reflector._params() == ({"labelSelector": r.label_selector} if r.labelled else {}), r
    assert {r.kind for r in WATCHED if r.labelled} == {"ConfigMap", "Secret"}


def test_each_watched_resource_is_listed_and_watched_once_per_namespace() -> None:
    scopes = Operator(config=Configuration(), namespaces=("a", "b")).router.scopes()
    assert sorted((r.type.name, ns or "") for r, ns in scopes) == sorted(
        (r.type.name, ns) for r in WATCHED for ns in (("a", "b") if r.type.namespaced else ("",))
    )
    everywhere = Operator(config=Configuration()).router.scopes()
    assert [(r, ns) for r, ns in everywhere] == [(r, None) for r in WATCHED]


def test_kopf_watches_nothing_and_our_kinds_have_webhooks() -> None:
    """The watches are the operator's own (controller/informer.py); kopf serves the webhooks."""
    registry = Operator(config=Configuration()).registry()
    assert list(registry._watching.get_all_handlers()) == []
    settings = kopf.OperatorSettings()
    Operator(config=Configuration.model_validate({"webhook": {"enabled": False}})).configure(settings)
    for r in WATCHED:
        kopf_resource = KopfResource(group=r.type.group, version=r.type.version, plural=r.type.plural)
        assert list(settings.watching.label_selectors.collect(kopf_resource)) == []
    webhooks = {h.id for h in registry._webhooks.get_all_handlers()}
    assert webhooks == {
        f"{prefix}.{kind.lower()}"
        for kind in ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")
        for prefix in ("validator", "defaulter")
    }
