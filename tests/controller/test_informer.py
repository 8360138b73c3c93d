"""The reflectors and the cache behave like client-go's informer (on the stand-in, whose watch
history a test can compact and whose watches it can drop)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.sandbox import local_apiserver

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.controller import informer as informer_module
from trainer.controller.cache import Cache
from trainer.controller.client import ApiClient
from trainer.controller.config import Configuration
from trainer.controller.informer import Informer, Reflector
from trainer.controller.operator import Operator, login
from trainer.controller.resources import TRAINJOBS, Resource, Resources
from trainer.runtime import framework as fw

NS = "default"


def _watched(kind: str, group: str = "") -> Resource:
    """The resource the default operator watches for a kind (the plugins declare it)."""
    return next(r for r in Resources.of(fw.default()).watched if r.kind == kind and r.type.group == group)


CONFIGMAPS = _watched("ConfigMap")
COSCHEDULING_PODGROUPS = _watched("PodGroup", "scheduling.x-k8s.io")
JOBSETS = _watched("JobSet", "jobset.x-k8s.io")


@pytest.fixture
def apiserver() -> Iterator[LocalAPIServer]:
    server = local_apiserver().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kubeconfig(apiserver: LocalAPIServer, tmp_path: Path) -> str:
    return str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))


class Recorder:
    """A sink that keeps what it was told, over a real cache."""

    def __init__(self) -> None:
        self.cache = Cache()
        self.lists: list[tuple[list[str], str]] = []
        self.events: list[tuple[str, str]] = []
        self.gone: list[str] = []

    def listed(
        self, resource: Resource, namespace: str | None, items: list[Obj], resource_version: str
    ) -> None:
        for item in items:
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", resource.kind)
        _, gone = self.cache.replace(
            resource.kind,
            resource.type.group,
            namespace,
            items,
            resource_version,
            label=resource.label,
        )
        self.lists.append((sorted(i["metadata"]["name"] for i in items), resource_version))
        self.gone.extend(o["metadata"]["name"] for o in gone)

    def changed(self, resource: Resource, type_: str, obj: Obj) -> None:
        self.events.append((type_, obj["metadata"]["name"]))
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        if type_ == "DELETED":
            self.cache.forget(resource.kind, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        else:
            self.cache.observe(obj)


def _configmap(name: str, trainjob: str = "tj") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS, "labels": {c.TRAINJOB_NAME_LABEL: trainjob}},
        "data": {"k": "v"},
    }


def _run(kubeconfig: str, test: Callable[[ApiClient], Awaitable[None]]) -> None:
    async def main() -> None:
        client = ApiClient.from_credentials(await login(kubeconfig), qps=0, burst=1)
        try:
            await asyncio.wait_for(test(client), 30)
        finally:
            await client.close()

    asyncio.run(main())


async def _until(check: Callable[[], Any], what: str, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _stop(task: asyncio.Task[None], informer: Informer) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await informer.close()


def test_the_watch_starts_from_the_lists_resource_version(apiserver: LocalAPIServer, kubeconfig: str) -> None:
    """What changed between the LIST and the watch comes as an event; what the LIST had does not."""
    apiserver.create(_configmap("before"))

    async def test(client: ApiClient) -> None:
        sink = Recorder()
        informer = Informer(client, [(CONFIGMAPS, NS)], sink)
        await informer.list_all()
        reflector = informer.reflectors[0]
        assert sink.lists == [(["before"], reflector.resource_version)]
        await asyncio.to_thread(apiserver.create, _configmap("between"))
        [task] = informer.start()
        try:
            await _until(lambda: sink.events, "the watch event")
            await asyncio.sleep(0.3)
            assert sink.events == [("ADDED", "between")]
            assert reflector.lists == 1
        finally:
            await _stop(task, informer)

    _run(kubeconfig, test)


def test_a_dropped_watch_resumes_from_its_resource_version_without_listing_again(
    apiserver: LocalAPIServer, kubeconfig: str
) -> None:
    apiserver.faults.add("drop-watch", after=0.2, budget=3, resources=["configmaps"])

    async def test(client: ApiClient) -> None:
        sink = Recorder()
        informer = Informer(client, [(CONFIGMAPS, NS)], sink)
        await informer.list_all()
        reflector = informer.reflectors[0]
        [task] = informer.start()
        try:
            await _until(lambda: reflector.watches >= 3, "three watches")
            await asyncio.to_thread(apiserver.create, _configmap("later"))
            await asyncio.to_thread(apiserver.delete, "v1", "ConfigMap", "later")
            await _until(lambda: ("DELETED", "later") in sink.events, "the deletion")
            assert sink.events == [("ADDED", "later"), ("DELETED", "later")]
            assert reflector.lists == 1, "a dropped watch resumes; it does not list again"
        finally:
            await _stop(task, informer)

    _run(kubeconfig, test)


def test_after_410_gone_a_new_list_drops_what_vanished_meanwhile(
    apiserver: LocalAPIServer, kubeconfig: str
) -> None:
    apiserver.create(_configmap("stays"))
    apiserver.create(_configmap("vanishes"))

    async def test(client: ApiClient) -> None:
        sink = Recorder()
        informer = Informer(client, [(CONFIGMAPS, NS)], sink)
        await informer.list_all()
        reflector = informer.reflectors[0]
        assert reflector.resource_version is not None
        # The link is down: no watch runs while the object is deleted and the history forgotten.
        await asyncio.to_thread(apiserver.delete, "v1", "ConfigMap", "vanishes")
        apiserver.core.store.compact()
        [task] = informer.start()
        try:
            await _until(lambda: reflector.lists == 2, "the second LIST")
            assert sink.gone == ["vanishes"]
            assert sink.events == [], "no event told of the deletion: the LIST did"
            assert sink.cache.get("ConfigMap", NS, "vanishes") is None
            assert sink.cache.get("ConfigMap", NS, "stays") is not None
            await asyncio.to_thread(apiserver.create, _configmap("after"))
            await _until(lambda: ("ADDED", "after") in sink.events, "the watch after the LIST")
        finally:
            await _stop(task, informer)

    _run(kubeconfig, test)


def test_lists_come_in_pages_from_one_snapshot(
    apiserver: LocalAPIServer, kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer_module, "LIST_PAGE", 2)
    for i in range(5):
        apiserver.create(_configmap(f"cm-{i}"))
    apiserver.create({**_configmap("unlabelled"), "metadata": {"name": "unlabelled", "namespace": NS}})

    async def test(client: ApiClient) -> None:
        sink = Recorder()
        informer = Informer(client, [(CONFIGMAPS, NS)], sink)
        await informer.list_all()
        await informer.close()
        assert sink.lists[0][0] == [f"cm-{i}" for i in range(5)], "only what carries our label"

    _run(kubeconfig, test)
    lists = [r for r in apiserver.audit.records if r.verb == "list" and r.resource == "configmaps"]
    assert len(lists) == 3


def test_an_optional_api_that_is_not_installed_lists_as_empty(
    apiserver: LocalAPIServer, kubeconfig: str
) -> None:
    async def test(client: ApiClient) -> None:
        sink = Recorder()
        stale = {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "old", "namespace": NS, "resourceVersion": "1"},
        }
        sink.cache.observe(stale)
        reflector = Reflector(client, COSCHEDULING_PODGROUPS, NS, sink, lambda: _never())
        await reflector.list()
        assert reflector.absent and reflector.lists == 1
        assert sink.cache.get("PodGroup", NS, "old") is None, "what an uninstalled API had is gone"

    _run(kubeconfig, test)


def _never() -> Any:
    raise AssertionError("no watch of an API that is not installed")


# --- the cache's side of a LIST ------------------------------------------------------------------


def _obj(
    kind: str, name: str, rv: int, *, ns: str = NS, group: str = "", labels: dict[str, str] | None = None
) -> Obj:
    meta: Obj = {"name": name, "namespace": ns, "resourceVersion": str(rv)}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": f"{group}/v1" if group else "v1", "kind": kind, "metadata": meta}


def test_replace_drops_what_the_list_lacks_and_reports_what_changed() -> None:
    cache = Cache()
    for obj in (
        _obj("JobSet", "gone", 5, group="jobset.x-k8s.io"),
        _obj("JobSet", "same", 6, group="jobset.x-k8s.io"),
    ):
        cache.observe(obj)
    cache.observe(_obj("JobSet", "newer", 30, group="jobset.x-k8s.io"))  # a write's response after the LIST
    cache.observe(_obj("JobSet", "elsewhere", 7, ns="other", group="jobset.x-k8s.io"))
    listed = [
        _obj("JobSet", "same", 6, group="jobset.x-k8s.io"),
        _obj("JobSet", "new", 8, group="jobset.x-k8s.io"),
    ]
    changed, gone = cache.replace("JobSet", "jobset.x-k8s.io", NS, listed, "20")
    assert [o["metadata"]["name"] for o in changed] == ["new"]
    assert [o["metadata"]["name"] for o in gone] == ["gone"]
    assert cache.get("JobSet", NS, "newer") is not None, "newer than the LIST: it stays"
    assert cache.get("JobSet", "other", "elsewhere") is not None, "another namespace is another scope"


def test_replace_keeps_to_its_group_and_to_what_its_selector_shows() -> None:
    cache = Cache()
    cache.observe(_obj("PodGroup", "pg", 3, group="scheduling.volcano.sh"))
    cache.observe(_obj("ConfigMap", "foreign", 3))  # read by name, without our label
    cache.observe(_obj("ConfigMap", "ours", 3, labels={c.TRAINJOB_NAME_LABEL: "tj"}))
    assert cache.replace("PodGroup", "scheduling.x-k8s.io", NS, [], "10") == ([], [])
    assert cache.get("PodGroup", NS, "pg", group="scheduling.volcano.sh") is not None
    _, gone = cache.replace("ConfigMap", "", NS, [], "10", label=c.TRAINJOB_NAME_LABEL)
    assert [o["metadata"]["name"] for o in gone] == ["ours"]
    assert cache.get("ConfigMap", NS, "foreign") is not None


def test_a_relist_queues_the_owners_of_what_vanished_or_changed() -> None:
    operator = Operator(config=Configuration())
    trainjob = {
        "apiVersion": f"{c.GROUP}/{c.VERSION}",
        "kind": c.TRAINJOB_KIND,
        "metadata": {"name": "tj", "namespace": NS, "resourceVersion": "2"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }
    operator.cache.observe(trainjob)
    owner = [
        {"apiVersion": f"{c.GROUP}/{c.VERSION}", "kind": c.TRAINJOB_KIND, "name": "tj", "controller": True}
    ]
    jobset = _obj("JobSet", "tj", 5, group="jobset.x-k8s.io")
    jobset["metadata"]["ownerReferences"] = owner
    operator.cache.observe(jobset)
    operator.router.listed(TRAINJOBS, NS, [dict(trainjob)], "20")
    assert operator.queue.idle, "an unchanged TrainJob in a new LIST is not queued"
    operator.router.listed(JOBSETS, NS, [], "20")
    assert not operator.queue.idle
    assert operator.cache.get("JobSet", NS, "tj") is None
