"""The chart with the TrainJobStatus gate (docs/configuration.md, "Progress status server"): the
status port on the Deployment and the Service, the Configuration the operator reads, and the RBAC
its status server needs, rendered only with the gate on. The rules are used on the real control
plane by tests/operator/test_status_server_e2e.py, which runs the operator with exactly them."""

from __future__ import annotations

from typing import Any

import chart_harness as h
import yaml

from trainer.controller.config import Configuration

Obj = dict[str, Any]
GATE = {"manager": {"config": {"featureGates": {"TrainJobStatus": True}}}}


def operator_config(objects: list[Obj]) -> Configuration:
    (config_map,) = [o for o in h.find(objects, "ConfigMap") if "config.yaml" in (o.get("data") or {})]
    return Configuration.model_validate(yaml.safe_load(config_map["data"]["config.yaml"]))


def test_gate_off_renders_no_status_port_and_no_status_rbac() -> None:
    objects = h.render()
    assert [p["name"] for p in h.one(objects, "Service")["spec"]["ports"]] == ["webhook", "metrics"]
    container = h.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "status" not in [p["name"] for p in container["ports"]]
    assert not [o for o in objects if o["metadata"]["name"].endswith("-status-server")]
    assert operator_config(objects).feature_gates == {}


def test_gate_on_exposes_the_status_server_through_the_service() -> None:
    objects = h.render(GATE)
    service = h.one(objects, "Service")
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "status"]
    assert port == {"name": "status", "port": 10443, "protocol": "TCP", "targetPort": "status"}
    container = h.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "status", "containerPort": 10443, "protocol": "TCP"} in container["ports"]
    config = operator_config(objects)
    assert config.feature_gates == {"TrainJobStatus": True}
    server = config.status_server
    assert (server.port, server.qps, server.burst) == (10443, 5, 10)
    # The pods are given the Service of this release, in its namespace, on the status port.
    assert server.advertised_url == f"https://{service['metadata']['name']}.{h.NAMESPACE}.svc:10443"


def test_gate_on_grants_tokenreviews_pods_and_jobs_to_the_operator_only() -> None:
    objects = h.render(GATE)
    role = h.one(objects, "ClusterRole", "kubeflow-trainer-status-server")
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
    ]
    binding = h.one(objects, "ClusterRoleBinding", "kubeflow-trainer-status-server")
    service_account = h.one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": service_account, "namespace": h.NAMESPACE}
    ]


def test_port_and_url_are_values() -> None:
    values = h.merge(
        GATE,
        {
            "manager": {
                "config": {"statusServer": {"port": 8444, "advertisedURL": "https://progress.example.com"}}
            }
        },
    )
    objects = h.render(values)
    (port,) = [p for p in h.one(objects, "Service")["spec"]["ports"] if p["name"] == "status"]
    assert port["port"] == 8444
    assert operator_config(objects).status_server.advertised_url == "https://progress.example.com"
