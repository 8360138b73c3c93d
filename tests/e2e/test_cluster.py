"""The operator against a real cluster: a TrainJob gets its JobSet and snapshot, and is cleaned up."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from trainer_sandbox.embedded_operator import EmbeddedOperator

pytestmark = pytest.mark.e2e


def test_trainjob_gets_its_children_on_a_real_cluster(e2e_kubeconfig: str) -> None:
    from kubernetes import client, config

    api = config.new_client_from_config(e2e_kubeconfig)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    namespace = f"trainer-e2e-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        with EmbeddedOperator(e2e_kubeconfig, namespaces=[namespace]):
            runtime: dict[str, Any] = {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainingRuntime",
                "metadata": {"name": "e2e-torch", "namespace": namespace},
                "spec": {
                    "mlPolicy": {"numNodes": 1, "torch": {}},
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {
                                    "name": "node",
                                    "template": {
                                        "metadata": {
                                            "labels": {
                                                "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
                                            }
                                        },
                                        "spec": {
                                            "template": {
                                                "spec": {"containers": [{"name": "node", "image": "busybox"}]}
                                            }
                                        },
                                    },
                                }
                            ]
                        }
                    },
                },
            }
            custom.create_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", namespace, "trainingruntimes", runtime
            )
            job = {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {"name": "e2e", "namespace": namespace},
                "spec": {"runtimeRef": {"name": "e2e-torch", "kind": "TrainingRuntime"}, "suspend": True},
            }
            custom.create_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", job
            )
            deadline = time.monotonic() + 60
            jobset = None
            while time.monotonic() < deadline and jobset is None:
                try:
                    jobset = custom.get_namespaced_custom_object(
                        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", "e2e"
                    )
                except client.ApiException:
                    time.sleep(1)
            assert jobset is not None and jobset["spec"]["suspend"] is True
            snapshot = core.read_namespaced_config_map("e2e-runtime-snapshot", namespace)
            assert "kind: TrainingRuntime" in snapshot.data["runtime"]
    finally:
        core.delete_namespace(namespace)
        api.close()
