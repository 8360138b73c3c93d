"""The operator as users meet it: kubectl (with the webhooks) and the Kubeflow SDK, unmodified."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from backend_plugin import kubectl_program
from operator_helpers import TJ, conditions, get_or_none, trainjob, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.controller.config import Configuration


@pytest.fixture
def webhook_operator(operator_kubeconfig: Path, cluster: Cluster) -> Iterator[EmbeddedOperator]:
    with EmbeddedOperator(operator_kubeconfig, Configuration(), [cluster.namespace], webhooks=True) as op:
        yield op


@pytest.fixture
def user_kubeconfig(cluster: Cluster, tmp_path: Path) -> Path:
    cluster.add_user("ml-engineer", ["system:authenticated"])
    # A real server authorizes the user: what kubectl and the SDK show is under test here, not a
    # user-facing role (the chart ships none), so the user may do what the tests ask of it.
    cluster.grant("ml-engineer")
    return cluster.write_kubeconfig(tmp_path / "user.kubeconfig", user="ml-engineer")


@pytest.fixture
def kubectl(cluster: Cluster) -> Callable[..., subprocess.CompletedProcess[str]]:
    """kubectl of the server's version (the one built with the real control plane there)."""
    program = kubectl_program(cluster)
    if program is None:
        pytest.skip("kubectl is not installed on this machine")

    def run(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [program, "--kubeconfig", str(kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


def test_lifecycle_through_kubectl(
    cluster: Cluster,
    operator: EmbeddedOperator,
    user_kubeconfig: Path,
    kubectl: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    job = trainjob("cli", trainer={"numNodes": 2, "env": [{"name": "SANDBOX_RUN_SECONDS", "value": "1"}]})
    applied = kubectl(user_kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(job))
    assert applied.returncode == 0, applied.stderr
    waited = kubectl(user_kubeconfig, "wait", "trainjob/cli", "--for=condition=Complete", "--timeout=30s")
    assert waited.returncode == 0, waited.stderr
    table = kubectl(user_kubeconfig, "get", "trainjobs")
    header, row = table.stdout.splitlines()[:2]
    # Progress % and Seconds Left stay empty: this TrainJob reports none (docs/decisions.md §10).
    assert header.split() == ["NAME", "STATE", "PROGRESS", "%", "SECONDS", "LEFT", "RUNTIME", "NODES", "AGE"]
    assert row.split()[:4] == ["cli", "Complete", "torch-distributed", "2"]
    assert (
        kubectl(user_kubeconfig, "get", "tj", "cli", "-o", "name").stdout.strip()
        == "trainjob.trainer.kubeflow.org/cli"
    )

    def reasons() -> set[str]:
        described = kubectl(
            user_kubeconfig, "get", "events", "--field-selector", "involvedObject.name=cli", "-o", "json"
        )
        return {e["reason"] for e in json.loads(described.stdout)["items"]}

    # Events are posted by a task of their own, after the status that announces them.
    wait_for(lambda: "TrainJobCompleted" in reasons(), what="the Events")
    deleted = kubectl(user_kubeconfig, "delete", "trainjob", "cli", "--cascade=foreground", "--timeout=30s")
    assert deleted.returncode == 0, deleted.stderr
    wait_for(
        lambda: get_or_none(cluster, "jobset.x-k8s.io/v1alpha2", "JobSet", "cli") is None,
        what="JobSet collected",
    )
    wait_for(
        lambda: get_or_none(cluster, "v1", "ConfigMap", "cli-runtime-snapshot") is None,
        what="snapshot collected",
    )


def test_webhook_refusals_seen_through_kubectl(
    cluster: Cluster,
    webhook_operator: EmbeddedOperator,
    user_kubeconfig: Path,
    kubectl: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    reserved = trainjob("bad-env", trainer={"env": [{"name": "PET_NODE_RANK", "value": "0"}]})
    out = kubectl(user_kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(reserved))
    assert out.returncode != 0
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request' in out.stderr
    assert "spec.trainer.env" in out.stderr and "invalid envs configured: [PET_NODE_RANK]" in out.stderr

    missing = trainjob("no-runtime", runtime="nowhere")
    out = kubectl(user_kubeconfig, "create", "-f", "-", stdin=yaml.safe_dump(missing))
    assert out.returncode != 0
    assert "specified clusterTrainingRuntime must be created before the TrainJob is created" in out.stderr

    # A schema/CEL rule is refused by the API server itself, with the rule's message.
    bad_nproc = trainjob("zero", trainer={"numProcPerNode": 0})
    out = kubectl(user_kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(bad_nproc))
    assert out.returncode != 0 and "numProcPerNode must be greater than or equal to 1" in out.stderr

    runtime = {
        "apiVersion": TJ,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "two-replicas"},
        "spec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "replicas": 2,
                            "template": {
                                "metadata": {
                                    "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                                },
                                "spec": {
                                    "template": {"spec": {"containers": [{"name": "node", "image": "x"}]}}
                                },
                            },
                        }
                    ]
                }
            }
        },
    }
    out = kubectl(user_kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(runtime))
    assert out.returncode != 0 and "always must be 1" in out.stderr

    # The runtime defaulter takes numbers where the schema takes quantity strings (docs/decisions.md §9).
    fractional = copy.deepcopy(runtime)
    fractional["metadata"]["name"] = "fractional"
    fractional_job = fractional["spec"]["template"]["spec"]["replicatedJobs"][0]
    fractional_job["replicas"] = 1
    fractional_job["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": 0.5}
    }
    out = kubectl(user_kubeconfig, "create", "-f", "-", stdin=json.dumps(fractional))
    assert out.returncode == 0, out.stderr
    stored_runtime = cluster.get(TJ, "ClusterTrainingRuntime", "fractional", namespace="")
    stored_job = stored_runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    assert stored_job["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "500m"}
    }

    # The defaulting webhook makes the SDK's numeric quantities acceptable.
    numeric = trainjob("numeric", suspend=True, trainer={"resourcesPerNode": {"requests": {"cpu": 1.5}}})
    out = kubectl(user_kubeconfig, "create", "-f", "-", stdin=json.dumps(numeric))
    assert out.returncode == 0, out.stderr
    stored = cluster.get(TJ, "TrainJob", "numeric")
    assert stored["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] == "1500m"


kubeflow_trainer = pytest.importorskip(
    "kubeflow.trainer", reason="the Kubeflow SDK (kubeflow 0.5.x) is not installed"
)


def test_kubeflow_sdk_end_to_end(
    cluster: Cluster, webhook_operator: EmbeddedOperator, user_kubeconfig: Path
) -> None:
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import CustomTrainer

    def train_mnist() -> None:
        print("training mnist")

    client = kubeflow_trainer.TrainerClient(
        backend_config=KubernetesBackendConfig(config_file=str(user_kubeconfig), namespace=cluster.namespace)
    )
    name = client.train(
        runtime="torch-distributed",
        trainer=CustomTrainer(
            func=train_mnist,
            num_nodes=2,
            resources_per_node={"cpu": 2.0},
            env={"SANDBOX_RUN_SECONDS": "1"},
        ),
    )
    job: Any = client.wait_for_job_status(name, timeout=60, polling_interval=1)
    assert job.status == "Complete"
    if cluster.serves_logs:  # the real backend's through kwok (trainer_sandbox.cluster.podlogs)
        logs = "\n".join(client.get_job_logs(name))
        assert "train_mnist" in logs, logs[:500]
    stored = cluster.get(TJ, "TrainJob", name)
    # docs/decisions.md §9: the SDK's 2.0 is a whole number, stored as the number it is.
    assert stored["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] == 2, stored["spec"]
    assert conditions(cluster, name)["Complete"][0] == "True"
    client.delete_job(name)
    wait_for(lambda: get_or_none(cluster, TJ, "TrainJob", name) is None, what="TrainJob deleted")
