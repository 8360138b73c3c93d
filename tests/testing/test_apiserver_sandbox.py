"""``trainer sandbox``: starts, installs what a TrainJob needs, writes a kubeconfig, stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kubernetes import client, config

from trainer.testing import sandbox
from trainer.testing.apiserver import free_port


def test_with_operator_is_not_yet_available(capsys: object) -> None:
    assert sandbox.main(["--with-operator"]) == 2


def test_sandbox_serves_until_terminated(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "sandbox.kubeconfig"
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer.testing.sandbox",
            "--port",
            str(port),
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "Ctrl-C" in line or not line:
                break
        out = "".join(lines)
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
