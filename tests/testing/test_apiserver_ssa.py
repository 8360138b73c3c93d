"""Server-side apply: managedFields, removal of dropped fields, shared ownership, conflicts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from trainer_sandbox.apiserver import APIError, LocalAPIServer


def deployment(
    containers: list[dict[str, Any]], replicas: int | None = None, **labels: str
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "x"}},
        "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": containers}},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    meta: dict[str, Any] = {"name": "d", "namespace": "default"}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["manager"], m["operation"]): m["fieldsV1"] for m in obj["metadata"]["managedFields"]}


def test_apply_owns_fields_and_removes_what_it_stops_applying(apiserver: LocalAPIServer) -> None:
    a = {"name": "a", "image": "a:1"}
    b = {"name": "b", "image": "b:1"}
    first = apiserver.apply(deployment([a, b], replicas=2, team="t"), field_manager="mgr")
    fields = managers(first)[("mgr", "Apply")]
    assert fields["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"b"}']["f:image"] == {}
    assert fields["f:metadata"] == {"f:labels": {"f:team": {}}}
    second = apiserver.apply(deployment([a]), field_manager="mgr")
    assert [c["name"] for c in second["spec"]["template"]["spec"]["containers"]] == ["a"]
    assert "labels" not in second["metadata"]
    # replicas is no longer applied by anyone: removed, then defaulted again by the server.
    assert second["spec"]["replicas"] == 1


def test_fields_owned_by_another_manager_stay(apiserver: LocalAPIServer) -> None:
    a = {"name": "a", "image": "a:1"}
    apiserver.apply(deployment([a], team="t"), field_manager="one")
    apiserver.apply(deployment([a], team="t"), field_manager="two")
    out = apiserver.apply(deployment([a]), field_manager="one")
    assert out["metadata"]["labels"] == {"team": "t"}  # "two" still applies it
    assert set(managers(out)) == {("one", "Apply"), ("two", "Apply")}


def test_conflicts_and_force(apiserver: LocalAPIServer) -> None:
    a = {"name": "a", "image": "a:1"}
    apiserver.apply(deployment([a], replicas=3), field_manager="one")
    with pytest.raises(APIError) as err:
        apiserver.apply(deployment([a], replicas=5), field_manager="two", force=False)
    assert err.value.code == 409 and 'conflict with "one"' in err.value.message
    assert err.value.details and err.value.details["causes"][0]["field"] == ".spec.replicas"
    out = apiserver.apply(deployment([a], replicas=5), field_manager="two", force=True)
    assert out["spec"]["replicas"] == 5
    assert "f:replicas" not in managers(out)[("one", "Apply")]["f:spec"]
    # Same value: shared ownership, no conflict.
    apiserver.apply(deployment([a], replicas=5), field_manager="three", force=False)


def test_updates_take_ownership(apiserver: LocalAPIServer) -> None:
    a = {"name": "a", "image": "a:1"}
    apiserver.apply(deployment([a], replicas=3), field_manager="applier")
    patched = apiserver.patch("apps/v1", "Deployment", "d", {"spec": {"replicas": 4}})
    owners = managers(patched)
    assert owners[("local-apiserver-helper", "Update")]["f:spec"] == {"f:replicas": {}}
    assert "f:replicas" not in owners[("applier", "Apply")]["f:spec"]
    # The applier re-applying its old value now conflicts with the updater.
    with pytest.raises(APIError) as err:
        apiserver.apply(deployment([a], replicas=3), field_manager="applier", force=False)
    assert err.value.code == 409


def test_apply_over_http_with_status_subresource(
    trainer_apiserver: LocalAPIServer, kube_client: client.ApiClient
) -> None:
    tj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
        "status": {"jobsStatus": []},
    }

    def apply(path: str, body: dict[str, Any], manager: str) -> dict[str, Any]:
        data, _, _ = kube_client.call_api(
            path,
            "PATCH",
            query_params=[("fieldManager", manager), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
        )
        out: dict[str, Any] = json.loads(data.data)
        return out

    base = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/t"
    created = apply(base, tj, "trainer")
    assert "status" not in created  # the main endpoint ignores status, for apply too
    cond = {
        "type": "Complete",
        "status": "True",
        "reason": "R",
        "message": "m",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    body = {
        "apiVersion": tj["apiVersion"],
        "kind": "TrainJob",
        "metadata": {"name": "t"},
        "status": {"conditions": [cond]},
    }
    with_status = apply(base + "/status", body, "trainer-status")
    assert with_status["status"]["conditions"][0]["reason"] == "R"
    entries = {(m["manager"], m.get("subresource", "")) for m in with_status["metadata"]["managedFields"]}
    assert entries == {("trainer", ""), ("trainer-status", "status")}
