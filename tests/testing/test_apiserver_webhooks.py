"""Admission webhooks called as kube-apiserver calls them: order, matching, failure policy, dry run."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from trainer_sandbox.apiserver import APIError, LocalAPIServer
from trainer_sandbox.apiserver.tls import serving_cert
from trainer_sandbox.ports import free_port


class WebhookServer:
    """A plain-HTTP admission webhook in its own thread; ``handler`` decides each review."""

    def __init__(self, tls: bool = False) -> None:
        self.tls = tls
        self.port = free_port()
        self.reviews: list[dict[str, Any]] = []
        self.delay = 0.0
        self.decide: dict[str, Any] = {}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.reviews.append(review)
        if self.delay:
            await asyncio.sleep(self.delay)
        req = review["request"]
        response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
        decide = self.decide.get(request.path)
        if decide is not None:
            response.update(decide(req))
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        )

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        ssl_context = serving_cert().server_context() if self.tls else None
        self._loop.run_until_complete(
            web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=ssl_context).start()
        )
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def start(self) -> WebhookServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def hooks(apiserver: LocalAPIServer) -> Iterator[WebhookServer]:
    server = WebhookServer().start()
    apiserver.register_webhook_service("webhooks", "hook-svc", 443, f"http://127.0.0.1:{server.port}")
    yield server
    server.stop()


def _rules(
    resources: list[str], operations: list[str] | None = None, group: str = ""
) -> list[dict[str, Any]]:
    return [
        {
            "apiGroups": [group],
            "apiVersions": ["*"],
            "operations": operations or ["CREATE", "UPDATE"],
            "resources": resources,
        }
    ]


def _hook(name: str, path: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": {"service": {"namespace": "webhooks", "name": "hook-svc", "port": 443, "path": path}},
        "rules": _rules(["configmaps"]),
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        **extra,
    }


def _config(kind: str, name: str, *webhooks: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": list(webhooks),
    }


def _cm(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
    }


def _add_label(req: dict[str, Any]) -> dict[str, Any]:
    patch = [{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]
    return {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(patch).encode()).decode()}


def _deny_unless_mutated(req: dict[str, Any]) -> dict[str, Any]:
    if req["object"]["metadata"].get("labels", {}).get("mutated") != "yes":
        return {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": "not mutated"}}
    if req["object"]["metadata"]["name"] == "refused":
        return {"allowed": False, "status": {"code": 422, "message": "name refused"}, "warnings": ["w1"]}
    return {"warnings": ["looked at it"]}


def test_mutating_then_validating(apiserver: LocalAPIServer, hooks: WebhookServer) -> None:
    hooks.decide = {"/mutate": _add_label, "/validate": _deny_unless_mutated}
    apiserver.create(_config("MutatingWebhookConfiguration", "m", _hook("m.example.com", "/mutate")))
    apiserver.create(_config("ValidatingWebhookConfiguration", "v", _hook("v.example.com", "/validate")))
    created = apiserver.create(_cm("ok"))
    assert created["metadata"]["labels"] == {"mutated": "yes"}
    with pytest.raises(APIError) as err:
        apiserver.create(_cm("refused"))
    assert err.value.code == 422
    assert err.value.message == 'admission webhook "v.example.com" denied the request: name refused'
    requests = [r["request"] for r in hooks.reviews]
    first = requests[0]
    assert first["operation"] == "CREATE" and first["resource"] == {
        "group": "",
        "version": "v1",
        "resource": "configmaps",
    }
    assert first["userInfo"]["username"] == "admin" and first["namespace"] == "default"
    assert first["kind"] == {"group": "", "version": "v1", "kind": "ConfigMap"}


def test_selectors_and_operations(apiserver: LocalAPIServer, hooks: WebhookServer) -> None:
    hooks.decide = {"/deny": lambda req: {"allowed": False, "status": {"message": "no"}}}
    apiserver.create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "guarded", "labels": {"guard": "on"}}}
    )
    hook = _hook(
        "deny.example.com",
        "/deny",
        namespaceSelector={"matchLabels": {"guard": "on"}},
        objectSelector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        rules=_rules(["configmaps"], ["CREATE"]),
    )
    apiserver.create(_config("ValidatingWebhookConfiguration", "v", hook))
    apiserver.create(_cm("free"))  # other namespace
    cm = _cm("skipped", skip="1")
    cm["metadata"]["namespace"] = "guarded"
    apiserver.create(cm)  # object selector does not match
    with pytest.raises(APIError) as err:
        guarded = _cm("caught")
        guarded["metadata"]["namespace"] = "guarded"
        apiserver.create(guarded)
    assert err.value.code == 400 and "denied the request: no" in err.value.message
    apiserver.patch(
        "v1", "ConfigMap", "skipped", {"data": {"a": "b"}}, namespace="guarded"
    )  # UPDATE not in rules


def test_failure_policy_and_timeout(apiserver: LocalAPIServer, hooks: WebhookServer) -> None:
    unreachable = {"url": f"http://127.0.0.1:{free_port()}/x"}
    apiserver.create(
        _config(
            "ValidatingWebhookConfiguration",
            "ignore",
            _hook("ignore.example.com", "/", clientConfig=unreachable, failurePolicy="Ignore"),
        )
    )
    apiserver.create(_cm("passes"))
    apiserver.create(
        _config(
            "ValidatingWebhookConfiguration", "fail", _hook("fail.example.com", "/", clientConfig=unreachable)
        )
    )
    with pytest.raises(APIError) as err:
        apiserver.create(_cm("fails"))
    assert err.value.code == 500 and 'failed calling webhook "fail.example.com"' in err.value.message
    apiserver.delete("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", "fail")
    hooks.delay = 2.0
    apiserver.create(
        _config(
            "ValidatingWebhookConfiguration", "slow", _hook("slow.example.com", "/slow", timeoutSeconds=1)
        )
    )
    start = time.monotonic()
    with pytest.raises(APIError) as err:
        apiserver.create(_cm("slow"))
    assert time.monotonic() - start < 1.9
    assert "context deadline exceeded" in err.value.message


def test_dry_run_and_side_effects(apiserver: LocalAPIServer, hooks: WebhookServer, kube_client: Any) -> None:
    from kubernetes import client

    apiserver.create(
        _config("ValidatingWebhookConfiguration", "se", _hook("se.example.com", "/", sideEffects="Some"))
    )
    core = client.CoreV1Api(kube_client)
    with pytest.raises(client.ApiException) as err:
        core.create_namespaced_config_map("default", {"metadata": {"name": "d"}}, dry_run="All")
    assert err.value.status == 400 and "does not support dry run" in json.loads(err.value.body)["message"]
    core.create_namespaced_config_map("default", {"metadata": {"name": "d"}})
    assert hooks.reviews[-1]["request"]["dryRun"] is False


def test_webhook_sees_defaults_and_rejects_custom_resources(
    trainer_apiserver: LocalAPIServer, hooks: WebhookServer
) -> None:
    seen: list[dict[str, Any]] = []

    def record(req: dict[str, Any]) -> dict[str, Any]:
        seen.append(req["object"])
        return {}

    hooks.decide = {"/tj": record}
    hook = _hook("tj.example.com", "/tj", rules=_rules(["trainjobs"], group="trainer.kubeflow.org"))
    trainer_apiserver.create(_config("ValidatingWebhookConfiguration", "tj", hook))
    tj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }
    trainer_apiserver.create(tj)
    assert seen[0]["spec"]["runtimeRef"]["apiGroup"] == "trainer.kubeflow.org"  # CRD default applied first
    # Schema and CEL refuse before the validating webhook is asked.
    bad = json.loads(json.dumps(tj))
    bad["metadata"]["name"] = "bad"
    bad["spec"]["trainer"] = {"numProcPerNode": 0}
    with pytest.raises(APIError):
        trainer_apiserver.create(bad)
    assert len(seen) == 1


def test_https_webhook_with_ca_bundle(apiserver: LocalAPIServer) -> None:
    server = WebhookServer(tls=True).start()
    try:
        server.decide = {
            "/deny": lambda req: {"allowed": False, "status": {"code": 403, "reason": "Forbidden"}}
        }
        apiserver.register_webhook_service(
            "system", "webhook-service", 443, f"https://127.0.0.1:{server.port}"
        )
        hook = _hook("tls.example.com", "/deny")
        hook["clientConfig"] = {
            "service": {"namespace": "system", "name": "webhook-service", "path": "/deny"},
            "caBundle": base64.b64encode(serving_cert().ca_pem).decode(),
        }
        apiserver.create(_config("ValidatingWebhookConfiguration", "tls", hook))
        with pytest.raises(APIError) as err:
            apiserver.create(_cm("x"))
        assert (err.value.code, err.value.message) == (
            403,
            'admission webhook "tls.example.com" denied the request: Forbidden',
        )
    finally:
        server.stop()
