"""The finalizer upstream's v2.0 to v2.2 left on runtimes is removed, and nothing else is touched
(controller/runtime_finalizers.py). Against a canned API server here; on both control planes
through the chart (tests/chart/test_chart_install.py), where the ClusterRole is checked exact."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from trainer.controller import runtime_finalizers as rf
from trainer.controller.cache import Cache
from trainer.controller.client import ApiError
from trainer.controller.config import Configuration
from trainer.controller.reconciler import WorkQueue
from trainer.controller.resources import CLUSTER_TRAINING_RUNTIMES, TRAINING_RUNTIMES, Resources
from trainer.controller.routing import Router

Obj = dict[str, Any]
API = "trainer.kubeflow.org/v1alpha1"


def runtime(kind: str, name: str, finalizers: list[str], namespace: str | None = None, rv: str = "7") -> Obj:
    meta: Obj = {"name": name, "resourceVersion": rv, "finalizers": finalizers}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": API, "kind": kind, "metadata": meta, "spec": {}}


def legacy(name: str) -> Obj:
    """A ClusterTrainingRuntime as upstream's v2.0 to v2.2 left it."""
    return runtime("ClusterTrainingRuntime", name, [rf.RESOURCE_IN_USE])


def over_cache(*objs: Obj) -> rf.RuntimeFinalizers:
    """Finalizer removal over a cache that holds ``objs``."""
    cache = Cache()
    for obj in objs:
        cache.observe(obj)
    return rf.RuntimeFinalizers(cache)


class Client:
    def __init__(self, fail: list[ApiError] | None = None) -> None:
        self.requests: list[tuple[str, str, Obj, str]] = []
        self.fail = fail or []

    async def request(self, method: str, path: str, body: Obj, *, content_type: str, **_: Any) -> Obj:
        self.requests.append((method, path, body, content_type))
        if self.fail:
            raise self.fail.pop(0)
        return {}


def drain(finalizers: rf.RuntimeFinalizers, client: Client) -> None:
    async def main() -> None:
        task = asyncio.create_task(finalizers.worker(client))  # type: ignore[arg-type]
        for _ in range(200):
            await asyncio.sleep(0.005)
            if not finalizers.pending:
                break
        await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(main())


def test_the_finalizer_alone_is_removed_with_the_version_it_was_seen_at() -> None:
    namespaced = runtime(
        "TrainingRuntime", "legacy", ["example.com/keep", rf.RESOURCE_IN_USE], "team", rv="42"
    )
    finalizers = over_cache(namespaced)
    finalizers.saw(namespaced)
    client = Client()
    drain(finalizers, client)
    assert client.requests == [
        (
            "PATCH",
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainingruntimes/legacy",
            {"metadata": {"resourceVersion": "42", "finalizers": ["example.com/keep"]}},
            "application/merge-patch+json",
        )
    ]
    assert finalizers.removed == 1


def test_a_cluster_runtime_loses_it_too_and_runtimes_without_it_cost_nothing() -> None:
    finalizers = over_cache(
        legacy("legacy"), runtime("ClusterTrainingRuntime", "clean", ["example.com/keep"])
    )
    finalizers.saw_all()  # a replica that starts leading looks at every runtime
    client = Client()
    drain(finalizers, client)
    assert [(path, body) for _, path, body, _ in client.requests] == [
        (
            "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/legacy",
            {"metadata": {"resourceVersion": "7", "finalizers": []}},
        )
    ]


@pytest.mark.parametrize("code", [404, 409])
def test_a_runtime_gone_or_changed_is_left_to_its_next_watch_event(code: int) -> None:
    left = legacy("legacy")
    finalizers = over_cache(left)
    finalizers.saw(left)
    client = Client(fail=[ApiError(code, {"reason": "Conflict" if code == 409 else "NotFound"})])
    drain(finalizers, client)
    assert len(client.requests) == 1 and not finalizers.pending and finalizers.removed == 0


@pytest.mark.parametrize(
    "failure", [ApiError(500, {"reason": "InternalError"}), TimeoutError(), RuntimeError("a bug")]
)
def test_any_failure_is_tried_again_and_the_worker_goes_on(
    monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    monkeypatch.setattr(rf, "RETRY_SECONDS", 0.01)
    first, later = legacy("legacy"), legacy("later")
    finalizers = over_cache(first, later)
    finalizers.saw(first)
    client = Client(fail=[failure])  # type: ignore[list-item]

    async def main() -> None:
        task = asyncio.create_task(finalizers.worker(client))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
        finalizers.saw(later)  # seen after the failure: the same worker takes it
        await asyncio.sleep(0.1)
        assert not task.done(), "a failure never ends the worker"
        task.cancel()

    asyncio.run(main())
    paths = [path.rsplit("/", 1)[1] for _, path, _, _ in client.requests]
    assert paths == ["legacy", "legacy", "later"] and finalizers.removed == 2


def test_a_runtime_that_keeps_failing_backs_off_and_lets_others_go_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rf, "RETRY_SECONDS", 0.05)
    stuck, fine = legacy("stuck"), legacy("fine")
    finalizers = over_cache(stuck, fine)
    finalizers.saw(stuck)
    finalizers.saw(fine)

    class Refusing(Client):
        async def request(self, method: str, path: str, body: Obj, *, content_type: str, **kw: Any) -> Obj:
            await super().request(method, path, body, content_type=content_type, **kw)
            if path.endswith("/stuck"):  # e.g. a webhook that refuses it
                raise ApiError(403, {"reason": "Forbidden"})
            return {}

    client = Refusing()

    async def main() -> None:
        task = asyncio.create_task(finalizers.worker(client))  # type: ignore[arg-type]
        await asyncio.sleep(0.3)  # attempts at 0, 0.05 and 0.15 (doubling); the fourth is due at 0.35
        task.cancel()

    asyncio.run(main())
    paths = [path.rsplit("/", 1)[1] for _, path, _, _ in client.requests]
    assert paths[:2] == ["stuck", "fine"], "the other runtime does not wait behind the failing one"
    assert paths.count("stuck") == 3 and finalizers.failures[("ClusterTrainingRuntime", None, "stuck")] == 3
    assert finalizers.removed == 1


def test_the_router_hands_over_runtimes_it_sees_and_the_operator_may_patch_them() -> None:
    cache = Cache()
    resources = Resources([])
    router = Router(cache, WorkQueue(), resources)
    router.runtime_finalizers = finalizers = rf.RuntimeFinalizers(cache)
    router.changed(TRAINING_RUNTIMES, "ADDED", runtime("TrainingRuntime", "a", [rf.RESOURCE_IN_USE], "team"))
    router.listed(
        CLUSTER_TRAINING_RUNTIMES, None, [runtime("ClusterTrainingRuntime", "b", [rf.RESOURCE_IN_USE])], "9"
    )
    router.changed(TRAINING_RUNTIMES, "ADDED", runtime("TrainingRuntime", "c", [], "team"))
    assert list(finalizers.pending) == [
        ("TrainingRuntime", "team", "a"),
        ("ClusterTrainingRuntime", None, "b"),
    ]
    granted = resources.permissions()
    assert {
        ("trainer.kubeflow.org", r, "patch") for r in ("trainingruntimes", "clustertrainingruntimes")
    } <= granted


def test_upstreams_runtime_concurrency_keys_are_read_and_unknown_ones_refused() -> None:
    controller = Configuration.model_validate(
        {
            "controller": {
                "groupKindConcurrency": {
                    "TrainJob.trainer.kubeflow.org": 5,
                    "TrainingRuntime.trainer.kubeflow.org": 1,
                    "ClusterTrainingRuntime.trainer.kubeflow.org": 3,
                }
            }
        }
    ).controller
    assert (controller.trainjob_workers, controller.runtime_workers) == (5, 3)
    with pytest.raises(ValueError, match="not a kind this operator reconciles"):
        Configuration.model_validate({"controller": {"groupKindConcurrency": {"Job.batch": 2}}})
    with pytest.raises(ValueError, match="at least 1"):
        Configuration.model_validate(
            {"controller": {"groupKindConcurrency": {"TrainJob.trainer.kubeflow.org": 0}}}
        )
