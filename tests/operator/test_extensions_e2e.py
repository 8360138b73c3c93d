"""A full update by a client that does not know our fields keeps them (docs/decisions.md
§extensions-survive), on both backends, through the operator's defaulting webhook.

Kueue (and any client on upstream's Go types) reads a TrainJob into upstream's struct and writes
the whole object back, without ``spec.ttlSecondsAfterFinished``, which upstream's API does not
have: without the webhook the TTL was gone and the TrainJob never cleaned up. Here the same PUT
goes out from the official Python client, the object as upstream's types would serialize it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from operator_helpers import TJ, get_or_none, trainjob, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.controller.config import Configuration

RUN_FAST = [{"name": "SANDBOX_RUN_SECONDS", "value": "1"}]
TTL = 3


@pytest.fixture
def webhook_operator(operator_kubeconfig: Path, cluster: Cluster) -> Iterator[EmbeddedOperator]:
    with EmbeddedOperator(operator_kubeconfig, Configuration(), [cluster.namespace], webhooks=True) as op:
        yield op


def upstream_typed(obj: dict[str, Any]) -> dict[str, Any]:
    """What a client built on upstream's types sends back: the object without our fields."""
    spec = {k: v for k, v in obj["spec"].items() if k != "ttlSecondsAfterFinished"}
    return {**obj, "spec": spec, "status": obj.get("status") or {}}


def test_a_full_update_without_the_ttl_keeps_it_and_the_trainjob_still_cleans_up(
    cluster: Cluster, webhook_operator: EmbeddedOperator, tmp_path: Path
) -> None:
    api = k8s.CustomObjectsApi(
        k8s_config.new_client_from_config(str(cluster.write_kubeconfig(tmp_path / "admin.kubeconfig")))
    )
    cluster.create(trainjob("queued", trainer={"env": RUN_FAST}, suspend=True, ttlSecondsAfterFinished=TTL))
    # Kueue admits it: the whole object back, unsuspended, as upstream's types hold it (read
    # again on a conflict, as its client does: the operator writes the TrainJob's status meanwhile).
    for _ in range(20):
        sent = upstream_typed(cluster.get(TJ, "TrainJob", "queued"))
        sent["spec"]["suspend"] = False
        assert "ttlSecondsAfterFinished" not in sent["spec"]
        try:
            written, _, headers = api.replace_namespaced_custom_object_with_http_info(
                "trainer.kubeflow.org", "v1alpha1", cluster.namespace, "trainjobs", "queued", sent
            )
            break
        except ApiException as exc:
            if exc.status != 409:
                raise
    else:
        raise AssertionError("the update kept conflicting")
    assert written["spec"]["suspend"] is False
    assert written["spec"]["ttlSecondsAfterFinished"] == TTL, "kept by the defaulting webhook"
    warning = headers.get("Warning", "")
    assert "spec.ttlSecondsAfterFinished: not in this update, so kept as it was" in warning, headers
    wait_for(
        lambda: get_or_none(cluster, TJ, "TrainJob", "queued") is None,
        timeout=120,
        what="the TrainJob deleted once it finished and its TTL ran out",
    )


def test_a_changed_ttl_is_taken(cluster: Cluster, webhook_operator: EmbeddedOperator) -> None:
    cluster.create(trainjob("changed", trainer={"env": RUN_FAST}, suspend=True, ttlSecondsAfterFinished=3600))
    cluster.patch(TJ, "TrainJob", "changed", {"spec": {"ttlSecondsAfterFinished": 60}})
    assert cluster.get(TJ, "TrainJob", "changed")["spec"]["ttlSecondsAfterFinished"] == 60
