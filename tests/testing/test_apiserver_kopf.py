"""kopf, the operator's framework, against the local API server: handlers run, 429s are retried."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from trainer_sandbox.apiserver import LocalAPIServer

kopf_testing = pytest.importorskip("kopf.testing")

OPERATOR = """
import kopf

@kopf.on.login()
def login(**kwargs):
    # The kubernetes client reads $KUBECONFIG once, at import; kopf's own reader reads it now.
    return kopf.login_with_kubeconfig(**kwargs)

@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_):
    settings.networking.error_backoffs = [0.1, 0.2, 0.5, 1, 1, 1]
    settings.watching.server_timeout = 30
    settings.posting.enabled = True

@kopf.on.create("configmaps", labels={"demo": "yes"})
def created(body, patch, logger, **_):
    patch.setdefault("metadata", {}).setdefault("annotations", {})["demo/handled"] = body["metadata"]["name"]
    kopf.info(body, reason="Handled", message="handled by the test operator")
"""

USER = "kopf-operator"


def _operator(tmp_path: Path) -> Path:
    path = tmp_path / "operator.py"
    path.write_text(OPERATOR)
    return path


def _run(
    apiserver: LocalAPIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str]
) -> dict[str, Any]:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kopf.kubeconfig", user=USER)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    handled: dict[str, Any] = {}
    args = ["run", "--standalone", "--all-namespaces", str(_operator(tmp_path))]
    with kopf_testing.KopfRunner(args, timeout=60) as runner:
        time.sleep(1.0)
        for name in names:
            apiserver.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": "default", "labels": {"demo": "yes"}},
                }
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(handled) < len(names):
            for name in names:
                cm = apiserver.get("v1", "ConfigMap", name)
                value = (cm["metadata"].get("annotations") or {}).get("demo/handled")
                if value:
                    handled[name] = value
            time.sleep(0.1)
        # kopf posts its k8s events in the background: give it the time to.
        while time.monotonic() < deadline and not apiserver.audit.count(user=USER, resource="events"):
            time.sleep(0.1)
    assert runner.exception is None, runner.output
    return handled


def test_kopf_runs_a_handler(
    apiserver: LocalAPIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handled = _run(apiserver, tmp_path, monkeypatch, ["one", "two"])
    assert handled == {"one": "one", "two": "two"}
    # Every request kopf made is in the audit log under its user; the test's own writes under admin.
    by_user = apiserver.audit.by_user()
    assert by_user[USER] > 0
    assert apiserver.audit.count(user=USER, verb="patch", resource="configmaps") >= 2
    assert apiserver.audit.count(user=USER, verb="watch") >= 1
    assert apiserver.audit.count(user=USER, verb="create", resource="events", status=201) >= 1
    assert by_user["admin"] == apiserver.audit.count(user="admin")
    assert sum(by_user.values()) == len(apiserver.audit.records)


def test_kopf_retries_through_429(
    apiserver: LocalAPIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver.faults.seed(7)
    rule = apiserver.faults.add("429", users=[USER], verbs=["patch"], rate=1.0, budget=3, retry_after=1)
    handled = _run(apiserver, tmp_path, monkeypatch, ["retry"])
    assert handled == {"retry": "retry"}
    assert rule.fired == 3
    refused = apiserver.audit.select(user=USER, verb="patch", status=429)
    assert len(refused) == 3 and all(r.fault == "429" for r in refused)
    assert apiserver.audit.count(user=USER, verb="patch", status=200) >= 1
