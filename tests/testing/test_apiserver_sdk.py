"""The Kubeflow SDK (``kubeflow`` 0.5.x) ``TrainerClient`` against the sandbox."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from trainer_sandbox.apiserver import LocalAPIServer

kubeflow_trainer = pytest.importorskip(
    "kubeflow.trainer", reason="the Kubeflow SDK (kubeflow 0.5.x) is not installed"
)
from kubeflow.common.types import KubernetesBackendConfig  # noqa: E402


@pytest.fixture
def sandbox(sandbox_apiserver: LocalAPIServer, tmp_path: Path) -> tuple[LocalAPIServer, Path]:
    server = sandbox_apiserver
    return server, server.write_kubeconfig(tmp_path / "kubeconfig", user="data-scientist")


def _client(kubeconfig: Path) -> Any:
    return kubeflow_trainer.TrainerClient(
        backend_config=KubernetesBackendConfig(config_file=str(kubeconfig), namespace="default")
    )


def test_lists_runtimes(sandbox: tuple[LocalAPIServer, Path]) -> None:
    server, kubeconfig = sandbox
    runtimes = {r.name: r for r in _client(kubeconfig).list_runtimes()}
    assert {"torch-distributed", "deepspeed-distributed", "jax-distributed"} <= set(runtimes)
    assert runtimes["torch-distributed"].trainer.framework == "torch"
    # The SDK read the public ConfigMap for the control-plane version.
    assert (
        server.audit.count(
            user="data-scientist", resource="configmaps", name="kubeflow-trainer-public", status=200
        )
        == 1
    )


def _stand_in_operator(server: LocalAPIServer, trainjob: dict[str, Any]) -> None:
    """What the operator does for a plain torch TrainJob, reduced to the JobSet the SDK looks at."""
    spec = trainjob["spec"]["trainer"]
    container = {
        "name": "node",
        "image": spec["image"],
        "command": spec.get("command") or ["torchrun"],
        "env": [{"name": "SANDBOX_RUN_SECONDS", "value": "0.2"}],
    }
    nodes = int(spec.get("numNodes", 1))
    server.create(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {
                "name": trainjob["metadata"]["name"],
                "namespace": "default",
                "ownerReferences": [
                    {
                        "apiVersion": "trainer.kubeflow.org/v1alpha1",
                        "kind": "TrainJob",
                        "name": trainjob["metadata"]["name"],
                        "uid": trainjob["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {
                            "metadata": {
                                "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                            },
                            "spec": {
                                "parallelism": nodes,
                                "completions": nodes,
                                "template": {"spec": {"containers": [container]}},
                            },
                        },
                    }
                ]
            },
        }
    )


def test_submits_a_trainjob_and_reads_its_steps_and_logs(sandbox: tuple[LocalAPIServer, Path]) -> None:
    server, kubeconfig = sandbox
    client = _client(kubeconfig)
    trainer = kubeflow_trainer.CustomTrainerContainer(image="example.com/train:1", num_nodes=2)
    name = client.train(runtime=client.get_runtime("torch-distributed"), trainer=trainer)
    trainjob = server.get("trainer.kubeflow.org/v1alpha1", "TrainJob", name)
    assert trainjob["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert trainjob["spec"]["trainer"]["numNodes"] == 2
    assert trainjob["metadata"]["managedFields"][0]["manager"] == "OpenAPI-Generator"
    _stand_in_operator(server, trainjob)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        job = client.get_job(name)
        if len(job.steps) == 2 and all(s.status == "Succeeded" for s in job.steps):
            break
        time.sleep(0.1)
    assert sorted(s.name for s in job.steps) == ["node-0", "node-1"]
    logs = "\n".join(client.get_job_logs(name))
    assert "[sandbox] exited with code 0" in logs
    assert [j.name for j in client.list_jobs()] == [name]
    client.delete_job(name)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and server.list("v1", "Pod", "default"):
        time.sleep(0.1)
    assert server.list("v1", "Pod", "default") == []  # garbage collected through the JobSet
