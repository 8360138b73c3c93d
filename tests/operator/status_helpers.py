"""Helpers for tests of the progress status server (the ``TrainJobStatus`` gate) on the real
control plane: the chart's rights for it, a running pod of a TrainJob, and the token its projected
volume would hold (docs/decisions.md §status-server-auth)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from operator_helpers import wait_for
from trainer_sandbox.backends import RealCluster

Obj = dict[str, Any]
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


def audience(namespace: str, name: str) -> str:
    return f"trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def chart_cluster_roles() -> list[Obj]:
    """The chart's ClusterRoles for the operator with the TrainJobStatus gate on."""
    root = Path(__file__).resolve().parents[2]
    for folder in (root / "tests" / "chart", root / "charts" / "tools"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    import chart_harness as h

    objects = h.render({"manager": {"config": {"featureGates": {"TrainJobStatus": True}}}})
    return [o for o in h.find(objects, "ClusterRole") if o["metadata"]["name"] in ROLES]


ROLES = ("kubeflow-trainer-controller-manager", "kubeflow-trainer-status-server")


def running_pod(real: RealCluster, name: str) -> Obj:
    """A pod of the TrainJob's JobSet, once it exists (kwok marks it running)."""

    def find() -> Obj | None:
        pods = [
            p for p in real.list("v1", "Pod") if (p["metadata"].get("labels") or {}).get(JOBSET_LABEL) == name
        ]
        return pods[0] if pods else None

    pod: Obj = wait_for(find, timeout=90, interval=0.3, what=f"a pod of {name}")
    return pod


def token_for(real: RealCluster, pod: Obj, aud: str) -> str:
    """What the kubelet would put in the pod's projected volume: a token bound to the pod."""
    meta = pod["metadata"]
    account = pod["spec"].get("serviceAccountName") or "default"
    issued = real.http.request(
        "POST",
        f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [aud],
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        },
    )
    return str(issued["status"]["token"])
