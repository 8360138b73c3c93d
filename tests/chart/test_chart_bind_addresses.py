"""The chart's configuration says where each server binds and that the webhook configurations are
the chart's: the operator's own defaults differ outside a cluster (loopback, and configurations it
writes itself: controller/webhook_server.py), so what a pod does never depends on them."""

from __future__ import annotations

from typing import Any

import chart_harness as h
import pytest
import yaml

from trainer.controller.config import Configuration
from trainer.controller.webhook_server import plan

# (values, the webhook host the chart writes): "" is the chart's default, every interface.
VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "default": ({}, ""),
    "status-server": ({"manager": {"config": {"featureGates": {"TrainJobStatus": True}}}}, ""),
    "cert-manager": ({"certManager": {"enabled": True}}, ""),
    "webhook-host": ({"manager": {"config": {"webhook": {"host": "10.0.0.7"}}}}, "10.0.0.7"),
}


@pytest.mark.parametrize(("values", "host"), VALUES.values(), ids=list(VALUES))
def test_every_bind_address_and_the_registration_are_the_charts_wherever_the_operator_runs(
    values: dict[str, Any], host: str
) -> None:
    text = h.one(h.render(values), "ConfigMap", "kubeflow-trainer-config")["data"]["config.yaml"]
    config = Configuration.model_validate(yaml.safe_load(text))
    webhook = config.webhook
    for in_cluster in (True, False):
        assert webhook.listen_host(in_cluster) == host
        assert config.status_server.listen_host(in_cluster) == "0.0.0.0"
        assert config.metrics.listen_address(in_cluster) == ("0.0.0.0", 8443)
        decided = plan(
            webhook,
            cert_management=config.cert_management.enable,
            in_cluster=in_cluster,
            api_server="https://127.0.0.1:6443",
            api_server_local=True,
        )
        assert not decided.register, decided
    assert webhook.manage_configuration is False
    assert webhook.host == host
    assert config.health.health_probe_bind_address == ":8081"
