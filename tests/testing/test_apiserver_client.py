"""The local API server against the official ``kubernetes`` client: CRUD, conflicts, watch, GC."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from trainer_sandbox import sandbox
from trainer_sandbox.apiserver import LocalAPIServer

_PODGROUP_CRD = Path(sandbox.__file__).with_name("crds") / "scheduling.x-k8s.io_podgroups.json"


def _cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": data}


def _status(err: client.ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body)
    return body


def _served(custom: client.CustomObjectsApi, args: tuple[str, ...]) -> bool:
    try:
        custom.list_namespaced_custom_object(*args)
    except client.ApiException:
        return False
    return True


def wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_crud_and_metadata(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    created = core.create_namespaced_config_map("default", _cm("a", {"app": "x"}, k="v"))
    meta = created.metadata
    assert meta.uid and meta.creation_timestamp and meta.resource_version
    assert meta.managed_fields[0].manager == "OpenAPI-Generator"
    got = core.read_namespaced_config_map("a", "default")
    assert got.data == {"k": "v"}
    got.data["k2"] = "v2"
    replaced = core.replace_namespaced_config_map("a", "default", got)
    assert int(replaced.metadata.resource_version) > int(meta.resource_version)
    gen = core.create_namespaced_config_map("default", {"metadata": {"generateName": "gen-"}})
    assert gen.metadata.name.startswith("gen-") and len(gen.metadata.name) == len("gen-") + 5
    items = core.list_namespaced_config_map("default").items
    assert sorted(i.metadata.name for i in items) == sorted(["a", gen.metadata.name])
    core.delete_namespaced_config_map("a", "default")
    with pytest.raises(client.ApiException) as err:
        core.read_namespaced_config_map("a", "default")
    assert err.value.status == 404
    assert _status(err.value)["reason"] == "NotFound"
    assert _status(err.value)["message"] == 'configmaps "a" not found'


def test_errors_have_real_codes(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_config_map("default", _cm("a"))
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", _cm("a"))
    assert (err.value.status, _status(err.value)["reason"]) == (409, "AlreadyExists")
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("missing-ns", _cm("a"))
    assert (err.value.status, _status(err.value)["message"]) == (404, 'namespaces "missing-ns" not found')
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", _cm("Bad_Name"))
    assert err.value.status == 422 and _status(err.value)["details"]["causes"][0]["field"] == "metadata.name"
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "t"}, "data": {"k": 1}})
    assert err.value.status == 400


def test_stale_resource_version_conflicts(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    first = core.create_namespaced_config_map("default", _cm("a", k="1"))
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "2"}})
    first.data["k"] = "3"
    with pytest.raises(client.ApiException) as err:
        core.replace_namespaced_config_map("a", "default", first)
    assert (err.value.status, _status(err.value)["reason"]) == (409, "Conflict")
    # A patch that carries a stale resourceVersion is refused too.
    stale = {"metadata": {"resourceVersion": first.metadata.resource_version}, "data": {"k": "4"}}
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_config_map("a", "default", stale)
    assert err.value.status == 409
    assert core.read_namespaced_config_map("a", "default").data == {"k": "2"}


def test_noop_write_keeps_resource_version(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    created = core.create_namespaced_config_map("default", _cm("a", k="1"))
    same = core.patch_namespaced_config_map("a", "default", {"data": {"k": "1"}})
    assert same.metadata.resource_version == created.metadata.resource_version


def test_json_patch_and_test_op(kube_client: client.ApiClient, apiserver: LocalAPIServer) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_config_map("default", _cm("a", k="1"))
    ok = [{"op": "test", "path": "/data/k", "value": "1"}, {"op": "replace", "path": "/data/k", "value": "2"}]
    assert core.patch_namespaced_config_map("a", "default", ok).data == {"k": "2"}
    bad = [{"op": "test", "path": "/data/k", "value": "1"}, {"op": "remove", "path": "/data/k"}]
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_config_map("a", "default", bad)
    assert err.value.status == 422


def test_strategic_merge_for_builtin_and_415_for_custom(
    trainer_apiserver: LocalAPIServer, kube_client: Any
) -> None:
    core = client.CoreV1Api(kube_client)
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:1"}]},
    }
    core.create_namespaced_pod("default", pod)
    patched = core.patch_namespaced_pod(
        "p", "default", {"spec": {"containers": [{"name": "b", "image": "y:2"}]}}
    )
    assert [(c.name, c.image) for c in patched.spec.containers] == [("a", "x:1"), ("b", "y:2")]
    custom = client.CustomObjectsApi(kube_client)
    tj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }
    custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", tj)
    with pytest.raises(client.ApiException) as err:
        kube_client.call_api(
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/t",
            "PATCH",
            header_params={
                "Content-Type": "application/strategic-merge-patch+json",
                "Accept": "application/json",
            },
            body={"spec": {"suspend": True}},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )
    assert err.value.status == 415


def test_label_and_field_selectors(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_config_map("default", _cm("a", {"env": "prod", "tier": "web"}))
    core.create_namespaced_config_map("default", _cm("b", {"env": "dev"}))
    core.create_namespaced_config_map("default", _cm("c", {}))

    def names(**kw: str) -> list[str]:
        return sorted(i.metadata.name for i in core.list_namespaced_config_map("default", **kw).items)

    assert names(label_selector="env=prod") == ["a"]
    assert names(label_selector="env==prod") == ["a"]
    assert names(label_selector="env!=prod") == ["b", "c"]
    assert names(label_selector="env in (prod,dev)") == ["a", "b"]
    assert names(label_selector="env notin (prod)") == ["b", "c"]
    assert names(label_selector="tier") == ["a"]
    assert names(label_selector="!env") == ["c"]
    assert names(label_selector="env,tier=web") == ["a"]
    assert names(field_selector="metadata.name=b") == ["b"]
    assert names(field_selector="metadata.name!=b") == ["a", "c"]
    with pytest.raises(client.ApiException) as err:
        names(field_selector="data.k=1")
    assert err.value.status == 400


def test_pagination(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    for i in range(5):
        core.create_namespaced_config_map("default", _cm(f"cm-{i}"))
    page = core.list_namespaced_config_map("default", limit=2)
    seen = [i.metadata.name for i in page.items]
    while page.metadata._continue:
        page = core.list_namespaced_config_map("default", limit=2, _continue=page.metadata._continue)
        seen += [i.metadata.name for i in page.items]
    assert seen == [f"cm-{i}" for i in range(5)]


def test_watch_events_and_resource_versions(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    listed = core.list_namespaced_config_map("default")
    events: list[tuple[str, str, str]] = []
    w = watch.Watch()

    def consume() -> None:
        for ev in w.stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=5,
        ):
            events.append((ev["type"], ev["object"].metadata.name, ev["object"].metadata.resource_version))
            if len(events) == 3:
                w.stop()

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.2)
    created = core.create_namespaced_config_map("default", _cm("w"))
    patched = core.patch_namespaced_config_map("w", "default", {"data": {"k": "v"}})
    core.delete_namespaced_config_map("w", "default")
    t.join(10)
    assert [(e[0], e[1]) for e in events] == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]
    # The event carries the resourceVersion the write returned (kopf waits for it).
    assert events[0][2] == created.metadata.resource_version
    assert events[1][2] == patched.metadata.resource_version


def test_watch_replays_and_expires(apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    start = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", _cm("x", {"keep": "1"}))
    core.create_namespaced_config_map("default", _cm("y"))
    replay = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=start,
            timeout_seconds=1,
            label_selector="keep",
        )
    ]
    assert replay == [("ADDED", "x")]
    apiserver.run(_compact(apiserver))
    resp = kube_client.call_api(
        "/api/v1/namespaces/default/configmaps",
        "GET",
        query_params=[("watch", "true"), ("resourceVersion", start)],
        auth_settings=["BearerToken"],
        _preload_content=False,
    )[0]
    first = json.loads(resp.data.decode().splitlines()[0])
    assert first["type"] == "ERROR"
    assert (first["object"]["code"], first["object"]["reason"]) == (410, "Expired")


async def _compact(server: LocalAPIServer) -> None:
    server.core.store.compact()


def test_watch_bookmarks(apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    apiserver.bookmark_interval = 0.2
    resp = kube_client.call_api(
        "/api/v1/namespaces/default/configmaps",
        "GET",
        query_params=[("watch", "1"), ("allowWatchBookmarks", "true"), ("timeoutSeconds", "1")],
        auth_settings=["BearerToken"],
        _preload_content=False,
    )[0]
    types = [json.loads(line)["type"] for line in resp.data.decode().splitlines()]
    assert "BOOKMARK" in types


def test_status_subresource(trainer_apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(kube_client)
    args = ("trainer.kubeflow.org", "v1alpha1", "default", "trainjobs")
    tj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    created = custom.create_namespaced_custom_object(*args, tj)
    assert "status" not in created  # the main endpoint ignores status
    cond = {
        "type": "Complete",
        "status": "True",
        "reason": "R",
        "message": "m",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    st = custom.patch_namespaced_custom_object_status(
        *args, "t", {"status": {"conditions": [cond]}, "spec": {"suspend": True}}
    )
    assert st["status"]["conditions"][0]["reason"] == "R"
    assert st["spec"].get("suspend") is not True  # /status changes only status
    assert st["metadata"]["generation"] == created["metadata"]["generation"]
    main = custom.patch_namespaced_custom_object(*args, "t", {"spec": {"suspend": True}, "status": None})
    assert main["status"]["conditions"][0]["reason"] == "R"
    assert main["metadata"]["generation"] == created["metadata"]["generation"] + 1


def test_finalizers_and_foreground_gc(apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    owner = core.create_namespaced_config_map(
        "default", {"metadata": {"name": "owner", "finalizers": ["x/hold"]}}
    )
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map("default", {"metadata": {"name": "child", "ownerReferences": [ref]}})
    grandchild_ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "child",
        "uid": core.read_namespaced_config_map("child", "default").metadata.uid,
    }
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "grandchild", "ownerReferences": [grandchild_ref]}}
    )
    core.delete_namespaced_config_map("owner", "default")
    pending = core.read_namespaced_config_map("owner", "default")
    assert pending.metadata.deletion_timestamp is not None
    apiserver.idle()
    assert core.read_namespaced_config_map("child", "default")  # owner still exists
    core.patch_namespaced_config_map("owner", "default", {"metadata": {"finalizers": None}})
    wait_for(lambda: not core.list_namespaced_config_map("default").items)


def test_orphan_and_background_cascade(apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)

    def tree(prefix: str) -> None:
        owner = core.create_namespaced_config_map("default", {"metadata": {"name": f"{prefix}-owner"}})
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": owner.metadata.name,
            "uid": owner.metadata.uid,
        }
        core.create_namespaced_config_map(
            "default", {"metadata": {"name": f"{prefix}-child", "ownerReferences": [ref]}}
        )

    tree("orphan")
    core.delete_namespaced_config_map("orphan-owner", "default", propagation_policy="Orphan")
    child = wait_for(
        lambda: (
            (c := core.read_namespaced_config_map("orphan-child", "default"))
            and not c.metadata.owner_references
            and c
        )
    )
    assert child.metadata.name == "orphan-child"
    wait_for(
        lambda: (
            not [
                i
                for i in core.list_namespaced_config_map("default").items
                if i.metadata.name == "orphan-owner"
            ]
        )
    )
    tree("bg")
    core.delete_namespaced_config_map("bg-owner", "default", propagation_policy="Background")
    wait_for(
        lambda: (
            not [
                i
                for i in core.list_namespaced_config_map("default").items
                if i.metadata.name.startswith("bg-")
            ]
        )
    )
    # GC writes are audited under the garbage collector's own user.
    assert (
        apiserver.audit.count(
            user="system:serviceaccount:kube-system:generic-garbage-collector", verb="delete"
        )
        >= 1
    )


def test_namespace_deletion_deletes_contents(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespace({"metadata": {"name": "team"}})
    core.create_namespaced_config_map("team", _cm("a"))
    core.create_namespaced_secret("team", {"metadata": {"name": "s"}, "stringData": {}})
    core.delete_namespace("team")
    wait_for(lambda: not [n for n in core.list_namespace().items if n.metadata.name == "team"])
    assert core.list_config_map_for_all_namespaces(field_selector="metadata.namespace=team").items == []


def test_dry_run_does_not_store(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    out = core.create_namespaced_config_map("default", _cm("a"), dry_run="All")
    assert out.metadata.name == "a"
    assert core.list_namespaced_config_map("default").items == []


def test_unknown_fields_follow_field_validation(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    body = {"metadata": {"name": "a"}, "data": {}, "bogus": 1}
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", body, field_validation="Strict")
    assert err.value.status == 400 and 'unknown field "bogus"' in _status(err.value)["message"]
    created = core.create_namespaced_config_map("default", body, field_validation="Ignore")
    assert created.metadata.name == "a"


def test_annotation_size_limit(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map(
            "default", {"metadata": {"name": "a", "annotations": {"a": "x" * 262145}}}
        )
    assert err.value.status == 422
    assert "metadata.annotations" in _status(err.value)["message"]


def test_crd_registration_and_cel(trainer_apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(kube_client)
    crd = ext.read_custom_resource_definition("trainjobs.trainer.kubeflow.org")
    conds = {c.type: c.status for c in crd.status.conditions}
    assert conds == {"NamesAccepted": "True", "Established": "True"}
    resources = client.CustomObjectsApi(kube_client).get_api_resources("trainer.kubeflow.org", "v1alpha1")
    names = {r.name for r in resources.resources}
    assert {"trainjobs", "trainjobs/status", "clustertrainingruntimes"} <= names
    custom = client.CustomObjectsApi(kube_client)
    bad = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "bad"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numProcPerNode": 0}},
    }
    with pytest.raises(client.ApiException) as err:
        custom.create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", bad
        )
    assert err.value.status == 422
    assert "numProcPerNode must be greater than or equal to 1" in _status(err.value)["message"]
    # CRD defaults are applied on the way in.
    bad["metadata"]["name"] = "good"
    bad["spec"]["trainer"]["numProcPerNode"] = 1
    good = custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", bad
    )
    assert good["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"


def test_crd_deletion_removes_kind_and_objects(
    trainer_apiserver: LocalAPIServer, kube_client: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(kube_client)
    pg = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g"},
        "spec": {"minMember": 1},
    }
    custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups", pg)
    client.ApiextensionsV1Api(kube_client).delete_custom_resource_definition("podgroups.scheduling.x-k8s.io")
    with pytest.raises(client.ApiException) as err:
        custom.list_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups")
    assert err.value.status == 404


def test_unauthenticated_requests_are_refused(apiserver: LocalAPIServer) -> None:
    import urllib.request

    req = urllib.request.Request(apiserver.url + "/api/v1/namespaces")
    import ssl

    ctx = ssl.create_default_context(cadata=apiserver.ca_pem.decode())
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, context=ctx)
    assert err.value.code == 401


def test_dry_run_in_delete_options_deletes_nothing(
    apiserver: LocalAPIServer, kube_client: client.ApiClient
) -> None:
    """kubectl ``delete --dry-run=server`` sends dryRun in the DeleteOptions body, not the query."""
    core = client.CoreV1Api(kube_client)
    dry = client.V1DeleteOptions(dry_run=["All"])
    core.create_namespaced_config_map("default", _cm("a", {"app": "x"}))
    core.create_namespaced_config_map("default", _cm("b", {"app": "x"}))
    core.create_namespaced_config_map("default", {"metadata": {"name": "held", "finalizers": ["x/hold"]}})
    before = apiserver.audit.count(mutated=True)
    out = json.loads(core.delete_namespaced_config_map("a", "default", body=dry, _preload_content=False).data)
    assert out["status"] == "Success" and out["details"]["name"] == "a"
    held = json.loads(
        core.delete_namespaced_config_map("held", "default", body=dry, _preload_content=False).data
    )
    assert held["metadata"]["deletionTimestamp"]  # the object as the delete would leave it
    core.delete_collection_namespaced_config_map("default", label_selector="app=x", body=dry)
    names = sorted(i.metadata.name for i in core.list_namespaced_config_map("default").items)
    assert names == ["a", "b", "held"]
    assert core.read_namespaced_config_map("held", "default").metadata.deletion_timestamp is None
    assert apiserver.audit.count(mutated=True) == before


def test_generation_only_for_kinds_that_have_it(
    trainer_apiserver: LocalAPIServer, kube_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    ns = core.create_namespace({"metadata": {"name": "team"}})
    cm = core.create_namespaced_config_map("default", _cm("a", k="1"))
    secret = core.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
    sa = core.create_namespaced_service_account("default", {"metadata": {"name": "sa"}})
    event = core.create_namespaced_event(
        "default",
        {"metadata": {"name": "e"}, "involvedObject": {"kind": "ConfigMap", "name": "a"}, "reason": "R"},
    )
    for obj in (ns, cm, secret, sa, event):
        assert obj.metadata.generation is None, obj.kind
    cm = core.patch_namespaced_config_map("a", "default", {"data": {"k": "2"}})
    assert cm.metadata.generation is None
    custom = client.CustomObjectsApi(kube_client)
    pg = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g"},
        "spec": {"minMember": 1},
    }
    args = ("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups")
    assert custom.create_namespaced_custom_object(*args, pg)["metadata"]["generation"] == 1
    patched = custom.patch_namespaced_custom_object(*args, "g", {"spec": {"minMember": 2}})
    assert patched["metadata"]["generation"] == 2
    job = trainer_apiserver.create(_job("j", restart_policy="Never", suspend=True))
    assert job["metadata"]["generation"] == 1


def _job(name: str, restart_policy: str | None = None, **spec: Any) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "busybox:1", "env": [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]}
        ]
    }
    if restart_policy is not None:
        pod_spec["restartPolicy"] = restart_policy
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"template": {"spec": pod_spec}, **spec},
    }


def test_custom_resource_update_needs_a_resource_version(kube_client: client.ApiClient) -> None:
    """Custom resources do not allow unconditional updates."""
    custom = client.CustomObjectsApi(kube_client)
    args = ("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups")
    pg = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g"},
        "spec": {"minMember": 1},
    }
    client.ApiextensionsV1Api(kube_client).create_custom_resource_definition(
        json.loads((_PODGROUP_CRD).read_text())
    )
    wait_for(lambda: _served(custom, args))
    custom.create_namespaced_custom_object(*args, pg)
    pg["spec"]["minMember"] = 2
    with pytest.raises(client.ApiException) as err:
        custom.replace_namespaced_custom_object(*args, "g", pg)
    status = _status(err.value)
    assert (err.value.status, status["reason"]) == (422, "Invalid")
    assert status["message"] == (
        'PodGroup.scheduling.x-k8s.io "g" is invalid: metadata.resourceVersion: Invalid value: 0x0:'
        " must be specified for an update"
    )
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 0x0: must be specified for an update",
            "field": "metadata.resourceVersion",
        }
    ]


def test_no_new_finalizers_on_an_object_being_deleted(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_config_map("default", {"metadata": {"name": "a", "finalizers": ["x/hold"]}})
    core.delete_namespaced_config_map("a", "default")
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_config_map(
            "a", "default", {"metadata": {"finalizers": ["x/hold", "z/more", "y/more"]}}
        )
    status = _status(err.value)
    assert (err.value.status, status["reason"]) == (422, "Invalid")
    assert status["message"] == (
        'ConfigMap.core "a" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if'
        ' the object is being deleted, found new finalizers []string{"y/more", "z/more"}'
    )
    assert status["details"]["causes"][0]["field"] == "metadata.finalizers"


def test_create_in_a_terminating_namespace_names_the_object(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespace({"metadata": {"name": "ns"}})
    core.create_namespaced_config_map("ns", {"metadata": {"name": "held", "finalizers": ["x/hold"]}})
    core.delete_namespace("ns")
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("ns", _cm("x"))
    status = _status(err.value)
    assert (err.value.status, status["reason"]) == (403, "Forbidden")
    assert status["message"] == (
        'configmaps "x" is forbidden: unable to create new content in namespace ns because it is being'
        " terminated"
    )
    assert status["details"]["name"] == "x"
    assert status["details"]["causes"][0]["reason"] == "NamespaceTerminating"


@pytest.mark.parametrize("restart_policy", [None, "Always"])
def test_job_needs_a_restart_policy(apiserver: LocalAPIServer, restart_policy: str | None) -> None:
    from trainer_sandbox.apiserver import APIError

    with pytest.raises(APIError) as err:
        apiserver.create(_job("j", restart_policy=restart_policy))
    assert (err.value.code, err.value.reason) == (422, "Invalid")
    assert err.value.message == (
        'Job.batch "j" is invalid: spec.template.spec.restartPolicy: Required value: valid values:'
        ' "OnFailure", "Never"'
    )


def test_job_mounts_only_volumes_of_its_pod(cluster: Any) -> None:
    """The real server refuses a mount of a volume the pod does not have (a JobSet's Job creation
    fails on it); the stand-in says the same."""
    from trainer_sandbox.apiserver import APIError

    job = _job("mounts", restart_policy="Never")
    job["metadata"]["namespace"] = cluster.namespace
    job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "dshm", "mountPath": "/dev/shm"}
    ]
    with pytest.raises(APIError) as err:
        cluster.create(job)
    assert (err.value.code, err.value.reason) == (422, "Invalid")
    assert 'spec.template.spec.containers[0].volumeMounts[0].name: Not found: "dshm"' in err.value.message
    job["spec"]["template"]["spec"]["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    cluster.create(job)


def test_job_gets_a_generated_selector_and_its_pods_carry_it(apiserver: LocalAPIServer) -> None:
    created = apiserver.create(_job("j", restart_policy="Never", parallelism=2, completions=2))
    uid = created["metadata"]["uid"]
    assert created["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert created["spec"]["template"]["metadata"]["labels"] == {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": "j",
        "controller-uid": uid,
        "job-name": "j",
    }
    apiserver.create(_job("j2", restart_policy="Never"))
    pods = wait_for(
        lambda: (
            found
            if len(found := [p for p in apiserver.list("v1", "Pod", "default") if p["metadata"]["name"]]) == 3
            else None
        )
    )
    mine = [p for p in pods if p["metadata"]["labels"].get("batch.kubernetes.io/controller-uid") == uid]
    assert len(mine) == 2
    for pod in mine:
        meta = pod["metadata"]
        assert meta["labels"]["job-name"] == "j" and meta["labels"]["controller-uid"] == uid
        # A NonIndexed Job's pods: <job>-<5 random characters>, no completion index.
        assert re.fullmatch(r"j-[a-z0-9]{5}", meta["name"]), meta["name"]
        assert "batch.kubernetes.io/job-completion-index" not in meta["labels"]
        assert "batch.kubernetes.io/job-completion-index" not in (meta.get("annotations") or {})
