"""The command `trainer sandbox` prints for running the operator beside it works as printed: the
operator starts, registers its webhooks with a certificate it makes itself, and runs TrainJobs."""

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

from trainer.testing.apiserver import free_port

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


def _sandbox(kubeconfig: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer.cli",
            "sandbox",
            "--port",
            str(free_port()),
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "Ctrl-C" in line or not line:
            break
    return proc, "".join(lines)


def _trainjob(name: str, env: list[dict[str, str]]) -> dict[str, object]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"env": env}},
    }


def test_the_printed_trainer_run_command_serves_the_sandbox(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "sandbox.kubeconfig"
    sandbox, out = _sandbox(kubeconfig)
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
        state: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "Complete" not in state:
            got = custom.get_namespaced_custom_object(GROUP, VERSION, "default", "trainjobs", "ok")
            state = [
                c["type"] for c in (got.get("status") or {}).get("conditions") or [] if c["status"] == "True"
            ]
            time.sleep(0.2)
        assert "Complete" in state
        api.close()
    finally:
        if operator is not None:
            operator.send_signal(signal.SIGTERM)
            _, err = operator.communicate(timeout=30)
            assert "Traceback" not in err, err[-3000:]
        sandbox.send_signal(signal.SIGTERM)
        assert sandbox.wait(15) == 0
