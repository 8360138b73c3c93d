"""A manifest applied again is no change (docs/decisions.md §9): GitOps tools re-apply what is in
git all day, and one that finds a difference every time reports drift and fights the webhook.

The TrainJob is the README's example, whose ``cpu: 2`` is a number: the defaulting webhook keeps it
as written, so ``kubectl apply`` finds nothing to send the second time, and a server-side apply
after a client-side one takes over the fields without a conflict.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from backend_plugin import kubeconfig_for, kubectl_program
from operator_helpers import TJ
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.controller.config import Configuration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch-distributed.yaml"


@pytest.fixture
def webhook_operator(operator_kubeconfig: Path, cluster: Cluster) -> Iterator[EmbeddedOperator]:
    with EmbeddedOperator(operator_kubeconfig, Configuration(), [cluster.namespace], webhooks=True) as op:
        yield op


def test_the_example_applies_again_without_change(
    cluster: Cluster, webhook_operator: EmbeddedOperator, tmp_path: Path
) -> None:
    program = kubectl_program(cluster)
    if program is None:
        pytest.skip("kubectl is not installed on this machine")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig_for(cluster, tmp_path)), "HOME": str(tmp_path)}
    manifest = yaml.safe_load(EXAMPLE.read_text())
    assert manifest["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] == 2, "a number, as written"
    del manifest["metadata"]["namespace"]  # the test's own namespace, from the kubeconfig's context
    path = tmp_path / "trainjob.yaml"
    path.write_text(yaml.safe_dump(manifest))

    def kubectl(*args: str) -> str:
        done = subprocess.run(
            [program, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout.strip()

    assert kubectl("apply", "-f", str(path)) == "trainjob.trainer.kubeflow.org/mnist-ddp created"
    stored = cluster.get(TJ, "TrainJob", "mnist-ddp")
    assert stored["spec"]["trainer"]["resourcesPerNode"]["requests"] == {"cpu": 2, "memory": "4Gi"}
    assert kubectl("apply", "-f", str(path)) == "trainjob.trainer.kubeflow.org/mnist-ddp unchanged"
    generation = stored["metadata"]["generation"]
    # Server-side after client-side: kubectl hands the fields over; equal values conflict with nothing.
    assert kubectl("apply", "--server-side", "-f", str(path)).endswith("serverside-applied")
    assert kubectl("apply", "--server-side", "-f", str(path)).endswith("serverside-applied")
    after = json.loads(kubectl("get", "trainjob", "mnist-ddp", "-o", "json"))
    assert after["metadata"]["generation"] == generation, "no apply changed the spec"
    assert after["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] == 2


def test_a_fraction_is_stored_as_a_quantity_string_and_so_differs_on_every_apply(
    cluster: Cluster, webhook_operator: EmbeddedOperator, tmp_path: Path
) -> None:
    """The limit docs/decisions.md §9 states: no CRD schema stores 0.5 as a number, so the webhook
    writes "500m", and kubectl, comparing 0.5 with "500m", sends it again each time."""
    program = kubectl_program(cluster)
    if program is None:
        pytest.skip("kubectl is not installed on this machine")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig_for(cluster, tmp_path)), "HOME": str(tmp_path)}
    manifest = yaml.safe_load(EXAMPLE.read_text())
    del manifest["metadata"]["namespace"]
    manifest["metadata"]["name"] = "fraction"
    manifest["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] = 0.5
    path = tmp_path / "fraction.yaml"
    path.write_text(yaml.safe_dump(manifest))
    outputs = [
        subprocess.run(
            [program, "apply", "-f", str(path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        for _ in range(2)
    ]
    assert outputs == [
        "trainjob.trainer.kubeflow.org/fraction created",
        "trainjob.trainer.kubeflow.org/fraction configured",
    ]
    stored = cluster.get(TJ, "TrainJob", "fraction")
    assert stored["spec"]["trainer"]["resourcesPerNode"]["requests"]["cpu"] == "500m"
