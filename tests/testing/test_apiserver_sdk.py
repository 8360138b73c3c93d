"""The Kubeflow SDK (``kubeflow`` 0.5.x) ``TrainerClient`` against each backend, without an operator
(tests/operator/test_clients.py has the SDK with one)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from trainer_sandbox.backends import Cluster

kubeflow_trainer = pytest.importorskip(
    "kubeflow.trainer", reason="the Kubeflow SDK (kubeflow 0.5.x) is not installed"
)
from kubeflow.common.types import KubernetesBackendConfig  # noqa: E402

USER = "data-scientist"


@pytest.fixture
def sandbox(cluster: Cluster, tmp_path: Path) -> tuple[Cluster, Path]:
    """The cluster (CRDs, runtimes and the public ConfigMap installed) and a user's kubeconfig.

    A real server authorizes the user: the SDK is under test here, not a user-facing role (the
    chart ships none), so the user may do everything.
    """
    cluster.add_user(USER, ["system:authenticated"])
    cluster.grant(USER)
    return cluster, cluster.write_kubeconfig(tmp_path / "kubeconfig", user=USER)


def _client(cluster: Cluster, kubeconfig: Path) -> Any:
    return kubeflow_trainer.TrainerClient(
        backend_config=KubernetesBackendConfig(config_file=str(kubeconfig), namespace=cluster.namespace)
    )


def test_lists_runtimes(sandbox: tuple[Cluster, Path]) -> None:
    cluster, kubeconfig = sandbox
    runtimes = {r.name: r for r in _client(cluster, kubeconfig).list_runtimes()}
    assert {"torch-distributed", "deepspeed-distributed", "jax-distributed"} <= set(runtimes)
    assert runtimes["torch-distributed"].trainer.framework == "torch"
    # The SDK read the public ConfigMap for the control-plane version.
    reads = [
        r
        for r in cluster.audit_since(cluster.start_mark)
        if (r.user, r.verb, r.resource, r.name, r.status)
        == (USER, "get", "configmaps", "kubeflow-trainer-public", 200)
    ]
    assert len(reads) == 1, reads


def _stand_in_operator(cluster: Cluster, trainjob: dict[str, Any]) -> None:
    """What the operator does for a plain torch TrainJob, reduced to the JobSet the SDK looks at."""
    spec = trainjob["spec"]["trainer"]
    container = {
        "name": "node",
        "image": spec["image"],
        "command": spec.get("command") or ["torchrun"],
        "env": [{"name": "SANDBOX_RUN_SECONDS", "value": "0.2"}],
    }
    nodes = int(spec.get("numNodes", 1))
    cluster.create(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {
                "name": trainjob["metadata"]["name"],
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


def test_submits_a_trainjob_and_reads_its_steps_and_logs(sandbox: tuple[Cluster, Path]) -> None:
    cluster, kubeconfig = sandbox
    client = _client(cluster, kubeconfig)
    trainer = kubeflow_trainer.CustomTrainerContainer(image="example.com/train:1", num_nodes=2)
    name = client.train(runtime=client.get_runtime("torch-distributed"), trainer=trainer)
    trainjob = cluster.get("trainer.kubeflow.org/v1alpha1", "TrainJob", name)
    assert trainjob["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert trainjob["spec"]["trainer"]["numNodes"] == 2
    assert trainjob["metadata"]["managedFields"][0]["manager"] == "OpenAPI-Generator"
    _stand_in_operator(cluster, trainjob)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = client.get_job(name)
        if len(job.steps) == 2 and all(s.status == "Succeeded" for s in job.steps):
            break
        time.sleep(0.1)
    assert sorted(s.name for s in job.steps) == ["node-0", "node-1"]
    if cluster.serves_logs:
        # On kwok the exit is in the log a moment after the status reports it (cluster/podlogs.py).
        deadline = time.monotonic() + 10
        logs = "\n".join(client.get_job_logs(name))
        while "[sandbox] exited with code 0" not in logs and time.monotonic() < deadline:
            time.sleep(0.1)
            logs = "\n".join(client.get_job_logs(name))
        assert "[sandbox] exited with code 0" in logs, logs
        assert f"[sandbox] pod {cluster.namespace}/" in logs  # node-0's own first line
    assert [j.name for j in client.list_jobs()] == [name]
    client.delete_job(name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and cluster.list("v1", "Pod"):
        time.sleep(0.1)
    assert cluster.list("v1", "Pod") == []  # garbage collected through the JobSet
