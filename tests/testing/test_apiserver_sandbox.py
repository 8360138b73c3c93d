"""``trainer sandbox``: starts, installs what a TrainJob needs, writes a kubeconfig, stops on SIGTERM."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from trainer_sandbox.ports import free_port


def _start(kubeconfig: Path, port: int, *extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer.cli",
            "sandbox",
            "--port",
            str(port),
            "--kubeconfig",
            str(kubeconfig),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "Ctrl-C" in line or not line:
            break
    return proc, "".join(lines)


def _true_conditions_once_complete(
    custom: client.CustomObjectsApi, name: str, timeout: float = 30
) -> list[str]:
    """The TrainJob's True condition types, once Complete is one of them or ``timeout`` has passed."""
    state: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and "Complete" not in state:
        got = custom.get_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", name
        )
        state = [
            c["type"] for c in (got.get("status") or {}).get("conditions") or [] if c["status"] == "True"
        ]
        time.sleep(0.2)
    return state


def test_sandbox_with_operator_runs_a_trainjob(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "sandbox.kubeconfig"
    proc, out = _start(kubeconfig, free_port(), "--with-operator")
    try:
        assert "The operator is running in this process" in out, out
        api = config.new_client_from_config(str(kubeconfig))
        custom = client.CustomObjectsApi(api)
        job = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "sandboxed"},
            "spec": {
                "runtimeRef": {"name": "torch-distributed"},
                "trainer": {"env": [{"name": "SANDBOX_RUN_SECONDS", "value": "1"}]},
            },
        }
        custom.create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", job
        )
        assert "Complete" in _true_conditions_once_complete(custom, "sandboxed")
        api.close()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == 0


def test_sandbox_serves_until_terminated(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "sandbox.kubeconfig"
    port = free_port()
    proc, out = _start(kubeconfig, port)
    try:
        assert f"export KUBECONFIG={kubeconfig}" in out and f"https://127.0.0.1:{port}" in out
        api = config.new_client_from_config(str(kubeconfig))
        custom = client.CustomObjectsApi(api)
        runtimes = custom.list_cluster_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes"
        )
        assert "torch-distributed" in {r["metadata"]["name"] for r in runtimes["items"]}
        cm = client.CoreV1Api(api).read_namespaced_config_map("kubeflow-trainer-public", "kubeflow-system")
        assert cm.data["kubeflow_trainer_version"]
        ext = client.ApiextensionsV1Api(api)
        crds = {c.metadata.name for c in ext.list_custom_resource_definition().items}
        assert {
            "jobsets.jobset.x-k8s.io",
            "podgroups.scheduling.x-k8s.io",
            "trainjobs.trainer.kubeflow.org",
        } <= crds
        api.close()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0


GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


def _trainjob(name: str, env: list[dict[str, str]]) -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"env": env}},
    }


def test_the_printed_trainer_run_command_serves_the_sandbox(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "sandbox.kubeconfig"
    sandbox, out = _start(kubeconfig, free_port())
    operator = None
    try:
        match = re.search(r"^\s*KUBECONFIG=(\S+) trainer run (.*)$", out, re.MULTILINE)
        assert match, out
        env = {**os.environ, "KUBECONFIG": match.group(1)}
        operator = subprocess.Popen(
            [sys.executable, "-m", "trainer.cli", "run", *shlex.split(match.group(2))],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        api = config.new_client_from_config(str(kubeconfig))
        custom = client.CustomObjectsApi(api)
        refused = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the operator has registered its webhooks
            try:
                custom.create_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    "default",
                    "trainjobs",
                    _trainjob("bad", [{"name": "PET_NODE_RANK", "value": "0"}]),
                )
            except ApiException as exc:
                refused = exc
                break
            custom.delete_namespaced_custom_object(GROUP, VERSION, "default", "trainjobs", "bad")
            time.sleep(0.3)
        assert refused is not None and "invalid envs configured: [PET_NODE_RANK]" in str(refused.body)

        run_fast = [{"name": "SANDBOX_RUN_SECONDS", "value": "1"}]
        custom.create_namespaced_custom_object(
            GROUP, VERSION, "default", "trainjobs", _trainjob("ok", run_fast)
        )
        assert "Complete" in _true_conditions_once_complete(custom, "ok")
        api.close()
    finally:
        if operator is not None:
            operator.send_signal(signal.SIGTERM)
            _, err = operator.communicate(timeout=30)
            assert "Traceback" not in err, err[-3000:]
        sandbox.send_signal(signal.SIGTERM)
        assert sandbox.wait(15) == 0
