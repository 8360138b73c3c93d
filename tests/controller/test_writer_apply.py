"""The writer's requests: server-side apply under one field manager, plain creates where a create
must never overwrite, and nothing at all when the cluster already holds what we want."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from trainer.api.objects import Obj
from trainer.controller.cache import Cache
from trainer.controller.client import ApiError, ResourceType
from trainer.controller.resources import Resources
from trainer.controller.writer import FIELD_MANAGER, StaleCache, Writer, WriteReport
from trainer.runtime import framework as fw

OWNER = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "tj", "uid": "u1"}


def _meta(name: str) -> Obj:
    return {
        "name": name,
        "namespace": "ns",
        "labels": {"trainer.kubeflow.org/trainjob-name": "tj"},
        "ownerReferences": [{**OWNER, "controller": True}],
    }


def _jobset(suspend: bool) -> Obj:
    pod = {"containers": [{"name": "node", "image": "img"}]}
    job = {"name": "node", "template": {"spec": {"template": {"spec": pod}}}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _meta("tj"),
        "spec": {"suspend": suspend, "replicatedJobs": [job]},
    }


SECRET: Obj = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": _meta("tj-mpi-ssh-auth"),
    "immutable": True,
    "data": {"ssh-privatekey": "a2V5"},
}
CONFIGMAP: Obj = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": _meta("tj-runtime-snapshot"),
    "data": {},
}
PODGROUP: Obj = {
    "apiVersion": "scheduling.x-k8s.io/v1alpha1",
    "kind": "PodGroup",
    "metadata": _meta("tj"),
    "spec": {"minMember": 2},
}


class RecordingClient:
    """Answers as an API server would, and records each request."""

    def __init__(self, refuse: ApiError | None = None, existing: list[Obj] | None = None) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.refuse = refuse
        self.existing = existing or []

    def _stored(self, obj: Obj) -> Obj:
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(len(self.calls))
        return stored

    async def create(self, rtype: ResourceType, namespace: str | None, obj: Obj, **kwargs: Any) -> Obj:
        self.calls.append(("create", obj["kind"], kwargs))
        if self.refuse is not None:
            raise self.refuse
        return self._stored(obj)

    async def apply(self, rtype: ResourceType, namespace: str | None, obj: Obj, **kwargs: Any) -> Obj:
        self.calls.append(("apply", obj["kind"], {**kwargs, "body": copy.deepcopy(obj)}))
        if self.refuse is not None:
            raise self.refuse
        return self._stored(obj)

    async def list(self, rtype: ResourceType, namespace: str | None = None, **kwargs: Any) -> Obj:
        self.calls.append(("list", rtype.plural, kwargs))
        return {"items": copy.deepcopy(self.existing)}

    async def get_metadata(self, rtype: ResourceType, namespace: str | None, name: str) -> Obj:
        self.calls.append(("get_metadata", rtype.plural, {"name": name}))
        found = [o for o in self.existing if o["metadata"]["name"] == name]
        if not found:
            raise ApiError(404, {"reason": "NotFound"})
        return {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": found[0]["metadata"],
        }


def _write(client: RecordingClient, cache: Cache, desired: list[Obj]) -> WriteReport:
    report = WriteReport()
    writer = Writer(client, cache, Resources.of(fw.default()))  # type: ignore[arg-type]
    asyncio.run(writer.apply(copy.deepcopy(desired), report))
    return report


def test_jobsets_and_podgroups_are_created_by_an_unforced_apply_configmaps_and_secrets_by_a_create() -> None:
    client = RecordingClient()
    report = _write(client, Cache(), [CONFIGMAP, SECRET, _jobset(True), PODGROUP])
    assert [(verb, kind) for verb, kind, _ in client.calls] == [
        ("create", "ConfigMap"),
        ("create", "Secret"),
        ("apply", "JobSet"),
        ("apply", "PodGroup"),
    ]
    for verb, _, kwargs in client.calls:
        assert kwargs["field_manager"] == FIELD_MANAGER == "trainer"
        if verb == "apply":
            assert kwargs["force"] is False
    assert len(report.created) == 4


def test_a_difference_is_applied_forced_with_the_whole_object_and_a_match_writes_nothing() -> None:
    cache = Cache()
    observed = _jobset(True)
    observed["metadata"]["resourceVersion"] = "7"
    pod = observed["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["nodeSelector"] = {"pool": "spot"}  # another manager's, and what servers default
    pod["restartPolicy"] = "OnFailure"
    cache.observe(observed)

    client = RecordingClient()
    assert _write(client, cache, [_jobset(True)]).patched == []
    assert client.calls == [], "compare first: what is contained is not written"

    report = _write(client, cache, [_jobset(False)])
    assert [(verb, kind) for verb, kind, _ in client.calls] == [("apply", "JobSet")]
    sent = client.calls[0][2]
    assert sent["force"] is True
    assert sent["body"] == _jobset(False), "the whole object we want, and nothing of others'"
    assert report.patched == [_jobset(False)]


def test_a_secret_is_never_rewritten() -> None:
    cache = Cache()
    cache.observe({**copy.deepcopy(SECRET), "data": {"ssh-privatekey": "b3RoZXI="}})
    client = RecordingClient()
    _write(client, cache, [SECRET])
    assert client.calls == []


@pytest.mark.parametrize(
    ("obj", "reason", "read"),
    [
        (CONFIGMAP, "AlreadyExists", "list"),
        (_jobset(True), "Conflict", "list"),
        (SECRET, "AlreadyExists", "get_metadata"),
    ],
    ids=["create", "apply", "create-only"],
)
def test_a_create_that_meets_an_object_reads_it_once(obj: Obj, reason: str, read: str) -> None:
    """A plain create's AlreadyExists and an unforced apply's conflict with another manager alike;
    a Secret, never listed, is read by name, its metadata only."""
    existing = {**copy.deepcopy(obj), "metadata": {"name": obj["metadata"]["name"], "namespace": "ns"}}
    client = RecordingClient(refuse=ApiError(409, {"reason": reason}), existing=[existing])
    cache = Cache()
    with pytest.raises(StaleCache):
        _write(client, cache, [obj])
    assert [verb for verb, _, _ in client.calls] == ["apply" if obj["kind"] == "JobSet" else "create", read]
    cached = cache.get(obj["kind"], "ns", obj["metadata"]["name"])
    assert cached is not None
    if read == "get_metadata":
        assert "data" not in cached and cached["kind"] == "Secret", "no key material in the cache"


def test_a_secret_we_create_is_cached_without_its_keys() -> None:
    cache = Cache()
    _write(RecordingClient(), cache, [SECRET])
    cached = cache.get("Secret", "ns", "tj-mpi-ssh-auth")
    assert cached is not None and "data" not in cached
    assert cached["metadata"]["ownerReferences"] == SECRET["metadata"]["ownerReferences"]


def test_an_apply_that_creates_asks_for_create_as_well_as_patch() -> None:
    """The audit log says patch; a real API server also wants create (403 without it)."""
    from trainer_sandbox import rbac_audit
    from trainer_sandbox.apiserver.audit import AuditRecord

    def record(status: int) -> AuditRecord:
        return AuditRecord(
            "op",
            "patch",
            "jobset.x-k8s.io",
            "v1alpha2",
            "jobsets",
            "",
            "ns",
            "tj",
            "PATCH",
            "/",
            status=status,
        )

    assert rbac_audit.permissions_from_audit([record(201)], "op") == {
        ("jobset.x-k8s.io", "jobsets", "patch"),
        ("jobset.x-k8s.io", "jobsets", "create"),
    }
    assert rbac_audit.permissions_from_audit([record(200)], "op") == {("jobset.x-k8s.io", "jobsets", "patch")}


class DeletingClient(RecordingClient):
    """Answers a DELETE as the API server does: the object, marked for deletion, while its
    dependents go first (Foreground); a Status once it is gone (Background, nothing to wait for)."""

    async def delete(self, rtype: ResourceType, namespace: str | None, name: str, **kwargs: Any) -> Obj:
        self.calls.append(("delete", rtype.plural, kwargs))
        if kwargs.get("propagation") == "Foreground":
            going = self._stored(self.existing[0])
            going["metadata"].update(deletionTimestamp="2026-11-27T10:00:00Z", resourceVersion="100")
            return going
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}


def test_a_jobset_deleted_in_the_foreground_stays_in_the_cache_as_going() -> None:
    """docs/decisions.md §resize: the reconcile after the delete must not build a new JobSet onto
    the old one while its Jobs are still being deleted."""
    observed = _jobset(True)
    observed["metadata"].update(uid="js-1", resourceVersion="7")
    for propagation, kept in (("Foreground", True), ("Background", False)):
        cache = Cache()
        cache.observe(copy.deepcopy(observed))
        client = DeletingClient(existing=[copy.deepcopy(observed)])
        writer = Writer(client, cache, Resources.of(fw.default()))  # type: ignore[arg-type]
        report = WriteReport()
        asyncio.run(writer.delete(copy.deepcopy(observed), report, propagation=propagation))
        assert client.calls[-1][2]["propagation"] == propagation and client.calls[-1][2]["uid"] == "js-1"
        found = cache.get("JobSet", "ns", "tj", group="jobset.x-k8s.io")
        if kept:
            assert found is not None and found["metadata"]["deletionTimestamp"]
        else:
            assert found is None
        assert report.deleted == [("JobSet", "ns", "tj")]


def test_a_create_of_a_kind_whose_api_is_absent_says_so_and_a_core_kinds_404_stays_as_it_is() -> None:
    not_found = ApiError(
        404, {"reason": "NotFound", "message": "the server could not find the requested resource"}
    )
    gang = {
        **PODGROUP,
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }
    with pytest.raises(ApiError) as raised:
        _write(RecordingClient(refuse=not_found), Cache(), [gang])
    assert raised.value.code == 404
    assert str(raised.value) == (
        "404 NotFound: the API server does not serve PodGroup (scheduling.k8s.io/v1alpha2): its API is "
        "not installed or not enabled in this cluster"
    )
    with pytest.raises(ApiError) as raised:
        _write(RecordingClient(refuse=not_found), Cache(), [CONFIGMAP])
    assert str(raised.value) == "404 NotFound: the server could not find the requested resource"
