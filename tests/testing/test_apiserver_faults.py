"""Audit log and fault injection."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.sandbox import local_apiserver


def _cm(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": {"k": "v"}}


def test_audit_records_every_request(apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_config_map("default", _cm("a"))
    core.read_namespaced_config_map("a", "default")
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "v"}})  # no change
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "w"}})
    core.list_namespaced_config_map("default")
    with pytest.raises(client.ApiException):
        core.read_namespaced_config_map("missing", "default")
    records = apiserver.audit.select(user="admin", resource="configmaps")
    assert [(r.verb, r.status, r.mutated) for r in records] == [
        ("create", 201, True),
        ("get", 200, False),
        ("patch", 200, False),
        ("patch", 200, True),
        ("list", 200, False),
        ("get", 404, False),
    ]
    create = records[0]
    assert (create.method, create.namespace, create.name, create.group) == ("POST", "default", "a", "")
    assert create.user_agent.startswith("OpenAPI-Generator")
    assert records[2].content_type == "application/strategic-merge-patch+json"
    rules = apiserver.audit.rbac_rules("admin")
    assert {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["create", "get", "list", "patch"],
    } in rules


def test_429_and_500_before_storage(apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    apiserver.faults.add("429", verbs=["create"], budget=1, retry_after=3)
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", _cm("a"))
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "3"
    assert json.loads(err.value.body)["details"]["retryAfterSeconds"] == 3
    assert core.list_namespaced_config_map("default").items == []
    apiserver.faults.add("500", verbs=["create"], budget=1)
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", _cm("a"))
    assert err.value.status == 500
    assert core.list_namespaced_config_map("default").items == []
    core.create_namespaced_config_map("default", _cm("a"))  # budgets spent


def test_500_after_the_write(apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    apiserver.faults.add("500-after", verbs=["create"], budget=1)
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", _cm("a"))
    assert err.value.status == 500
    # The write happened: a retry sees AlreadyExists, as on a real cluster.
    assert [c.metadata.name for c in core.list_namespaced_config_map("default").items] == ["a"]
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", _cm("a"))
    assert err.value.status == 409
    record = apiserver.audit.select(verb="create", status=500)[0]
    assert record.mutated and record.fault == "500-after"


def test_409_only_where_a_real_server_returns_it(
    apiserver: LocalAPIServer, kube_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    cm = core.create_namespaced_config_map("default", _cm("a"))
    rule = apiserver.faults.add("409", budget=5)
    core.patch_namespaced_config_map(
        "a", "default", {"data": {"k": "1"}}
    )  # no precondition: never a conflict
    core.read_namespaced_config_map("a", "default")
    assert rule.fired == 0
    cm = core.read_namespaced_config_map("a", "default")
    with pytest.raises(client.ApiException) as err:
        core.replace_namespaced_config_map("a", "default", cm)
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "Conflict"
    assert rule.fired == 1


def test_faults_are_per_user_seeded_and_bounded(apiserver: LocalAPIServer, tmp_path: Any) -> None:
    from kubernetes import config

    other = config.new_client_from_config(str(apiserver.write_kubeconfig(tmp_path / "other", user="other")))
    mine = config.new_client_from_config(str(apiserver.write_kubeconfig(tmp_path / "mine", user="mine")))
    apiserver.faults.seed(42)
    apiserver.faults.add("500", users=["mine"], rate=0.5, budget=4)

    def failures(api: client.ApiClient) -> list[bool]:
        out = []
        for _ in range(20):
            try:
                client.CoreV1Api(api).list_namespaced_config_map("default")
                out.append(False)
            except client.ApiException:
                out.append(True)
        return out

    mine_failures = failures(mine)
    assert sum(mine_failures) == 4 and not any(failures(other))
    apiserver.faults.clear()
    apiserver.faults.seed(42)
    apiserver.faults.add("500", users=["mine"], rate=0.5, budget=4)
    assert failures(mine) == mine_failures  # same seed, same faults
    other.close()
    mine.close()


def test_latency(apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    apiserver.faults.add("latency", latency=0.3, budget=1)
    start = time.monotonic()
    client.CoreV1Api(kube_client).list_namespaced_config_map("default")
    assert time.monotonic() - start >= 0.3


def _watch_lines(kube_client: client.ApiClient, timeout: int) -> list[dict[str, Any]]:
    resp = kube_client.call_api(
        "/api/v1/namespaces/default/configmaps",
        "GET",
        query_params=[("watch", "true"), ("timeoutSeconds", str(timeout))],
        auth_settings=["BearerToken"],
        _preload_content=False,
    )[0]
    return [json.loads(line) for line in resp.data.decode().splitlines()]


def test_dropped_and_expired_watches(apiserver: LocalAPIServer, kube_client: client.ApiClient) -> None:
    apiserver.faults.add("drop-watch", after=0.2, budget=1)
    start = time.monotonic()
    assert _watch_lines(kube_client, 10) == []
    assert time.monotonic() - start < 3
    apiserver.faults.add("expire-watch", budget=1)
    lines = _watch_lines(kube_client, 10)
    assert lines[0]["type"] == "ERROR" and lines[0]["object"]["code"] == 410


def test_stop_is_prompt_with_open_watches(tmp_path: Any) -> None:
    import threading

    from kubernetes import config

    server = local_apiserver().start()
    api = config.new_client_from_config(str(server.write_kubeconfig(tmp_path / "kc")))
    thread = threading.Thread(target=lambda: _watch_lines(api, 600), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while server.open_watches == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.open_watches == 1
    start = time.monotonic()
    server.stop()
    thread.join(5)
    assert time.monotonic() - start < 3 and not thread.is_alive()
    api.close()
