"""The chart, installed with helm into a control plane with real nodes and nothing of ours in it:
the operator runs from the image built from our Dockerfile, as the chart's Deployment says, with
its restricted security context enforced by runc; two replicas elect a leader; kube-apiserver
reaches the webhooks through the chart's Service; and a TrainJob runs to completion."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from node_helpers import Kubectl, helm
from trainer_sandbox.cluster import ControlPlane

pytestmark = pytest.mark.real_nodes
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeflow-trainer"
NAMESPACE = "kubeflow-system"
RELEASE = "trainer"


@pytest.fixture(scope="module")
def installed(bare_plane: ControlPlane) -> Iterator[ControlPlane]:
    assert not bare_plane.run_kubectl("get", "crd", "-o", "name").stdout.count("trainer.kubeflow.org")
    helm(
        bare_plane, "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--create-namespace",
        "--set", "manager.replicas=2", "--wait", "--timeout", "5m",
    )  # fmt: skip
    yield bare_plane
    helm(bare_plane, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "3m")


def operator_pods(plane: ControlPlane) -> list[dict[str, Any]]:
    out = plane.run_kubectl("-n", NAMESPACE, "get", "pods", "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if p["metadata"].get("deletionTimestamp") is None]


def test_the_operator_runs_as_the_charts_deployment_on_real_nodes(installed: ControlPlane) -> None:
    plane = installed
    pods = operator_pods(plane)
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("real-"), pod["spec"]["nodeName"]
        assert all(c["ready"] for c in pod["status"]["containerStatuses"])  # the chart's probes pass
        name = pod["metadata"]["name"]
        # The restricted security context, as runc applied it.
        uid = plane.run_kubectl("-n", NAMESPACE, "exec", name, "--", "id", "-u").stdout.strip()
        assert uid == "65532"
        write = plane.run_kubectl("-n", NAMESPACE, "exec", name, "--", "touch", "/opt/x", check=False)
        assert write.returncode != 0 and "Read-only file system" in write.stderr, write.stderr
        status = plane.run_kubectl("-n", NAMESPACE, "exec", name, "--", "cat", "/proc/1/status").stdout
        assert "NoNewPrivs:\t1" in status and "CapEff:\t0000000000000000" in status, status
    # One of them holds the Lease and reconciles.
    deadline = time.monotonic() + 60
    while True:
        leases = json.loads(plane.run_kubectl("-n", NAMESPACE, "get", "leases", "-o", "json").stdout)["items"]
        holders = [(lease["spec"] or {}).get("holderIdentity") or "" for lease in leases]
        if any(h.startswith(tuple(p["metadata"]["name"] for p in pods)) for h in holders):
            break
        assert time.monotonic() < deadline, holders
        time.sleep(1)
    logs = "".join(plane.run_kubectl("-n", NAMESPACE, "logs", p["metadata"]["name"]).stdout for p in pods)
    assert logs.strip(), "kubectl logs shows the operator's log"


def test_the_api_server_calls_the_webhooks_through_the_charts_service(installed: ControlPlane) -> None:
    bad = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "bad-env"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"env": [{"name": "PET_NODE_RANK", "value": "0"}]},
        },
    }
    refused = installed.run_kubectl("-n", "default", "apply", "-f", "-", input=json.dumps(bad), check=False)
    assert refused.returncode != 0
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request' in refused.stderr
    assert "invalid envs configured: [PET_NODE_RANK]" in refused.stderr


def test_a_trainjob_completes_under_the_charts_operator(installed: ControlPlane) -> None:
    kubectl = Kubectl(installed, "default")
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "hello"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "numNodes": 2,
                "command": [
                    "python3",
                    "-c",
                    "import os, torch; print('node', os.environ['PET_NODE_RANK'], torch.__version__)",
                ],
            },
        },
    }
    kubectl.apply(job)

    def complete() -> bool:
        conditions = (kubectl.get("trainjob", "hello").get("status") or {}).get("conditions") or []
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    kubectl.wait_for("the TrainJob to complete", complete, timeout=240)
    out = kubectl("logs", "-l", "jobset.sigs.k8s.io/jobset-name=hello", "--prefix")
    assert "node 0 2.6" in out and "node 1 2.6" in out, out
