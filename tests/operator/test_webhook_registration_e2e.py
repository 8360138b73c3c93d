"""`trainer run` outside a cluster, as the README's recipe runs it: its webhooks are registered.

The operator is its own process (`trainer run --config`, a kubeconfig, no ServiceAccount), so it
can be stopped cleanly (SIGTERM) and killed (SIGKILL) for real. Its configuration names only the
webhook port: the bind address and ``webhook.manageConfiguration`` are the defaults, which
outside a cluster mean loopback and "register when the API server can call it, checked". Both
control planes run on this machine, so the API server reaches the operator's loopback.

Webhook configurations are cluster-scoped: on the real control plane the test's cleanup deletes
any it left (``RealCluster.cleanup``), so the next test's TrainJobs are not refused by a dead one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from operator_helpers import get_or_none, trainjob, wait_for
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.backends import Cluster
from trainer_sandbox.operator_process import OperatorProcess
from trainer_sandbox.ports import free_port

pytestmark = pytest.mark.timeout(240)

ADMISSION = "admissionregistration.k8s.io/v1"
KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
NAME = "trainer.kubeflow.org"
WEBHOOKS = (
    "validator.trainjob, validator.trainingruntime, validator.clustertrainingruntime, validator.optimizationjob, "
    "defaulter.trainjob, defaulter.trainingruntime, defaulter.clustertrainingruntime"
)


def run(cluster: Cluster, workdir: Path, port: int, **webhook: Any) -> OperatorProcess:
    """`trainer run` with its webhooks on ``port`` and every other webhook setting the default."""
    config = {"webhook": {"enabled": True, "port": port, **webhook}}
    return OperatorProcess(cluster, workdir, config=config, namespaces=[cluster.namespace])


def log_line(process: OperatorProcess, pattern: str, timeout: float = 60) -> str:
    """The first line of the operator's log (since its last start) that matches ``pattern``."""

    def found() -> str | None:
        text = process.log_path.read_text(errors="replace").rpartition(f"--- start {process.starts} ---")[2]
        match = re.search(f"^.*{pattern}.*$", text, re.M)
        return match.group(0) if match else None

    line: str = wait_for(found, timeout=timeout, what=f"{pattern!r} in the operator's log")
    return line


def configurations(cluster: Cluster) -> dict[str, Any]:
    return {kind: get_or_none(cluster, ADMISSION, kind, NAME) for kind in KINDS}


def urls(configuration: dict[str, Any]) -> set[str]:
    return {w["clientConfig"]["url"].rpartition("/")[0] for w in configuration["webhooks"]}


def reserved_env_job(name: str) -> dict[str, Any]:
    """What the issue describes: a TrainJob that sets PET_NNODES itself, which torch reserves."""
    return trainjob(name, trainer={"numNodes": 2, "env": [{"name": "PET_NNODES", "value": "7"}]})


def refusal(cluster: Cluster, obj: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as refused:
        cluster.create(obj)
    return refused.value


def test_the_recipe_registers_its_webhooks_and_a_clean_exit_removes_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    port = free_port()
    process = run(cluster, tmp_path / "op", port)
    try:
        process.start()
        live = log_line(process, "webhooks: live at")
        url = f"https://127.0.0.1:{port}"
        assert f"live at {url}: {WEBHOOKS} " in live, live
        assert "the API server's call checked" in live, live
        found = configurations(cluster)
        for kind, configuration in found.items():
            assert configuration is not None, kind
            assert configuration["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "trainer-run"
            assert urls(configuration) == {url}
            assert {w["failurePolicy"] for w in configuration["webhooks"]} == {"Fail"}
        # The operator's own check of the env is what refuses it, not the CRD's schema.
        refused = refusal(cluster, reserved_env_job("pet-nnodes"))
        assert (
            'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request'
            in refused.message
        )
        assert "PET_NNODES" in refused.message
        cluster.create(trainjob("plain", trainer={"numNodes": 1}))
        # The probe was a dry run: nothing of it is stored.
        assert (
            get_or_none(
                cluster, "trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", "trainer-webhook-probe"
            )
            is None
        )
    finally:
        process.stop()
    assert process.proc is not None and process.proc.returncode == 0, process.log_tail()
    assert configurations(cluster) == {kind: None for kind in KINDS}
    assert (
        "webhooks: removed ValidatingWebhookConfiguration and MutatingWebhookConfiguration"
        in process.log_tail()
    )
    # Without them nothing refuses it: the refusal above was the registration's doing.
    cluster.create(reserved_env_job("pet-nnodes-unchecked"))


def test_a_killed_run_leaves_its_configurations_and_the_next_start_replaces_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    """kill -9, then `trainer run` again: on the same port (the README's case, a new certificate
    where the API server still holds the killed run's configurations a moment), then on another."""
    first_port, second_port = free_port(), free_port()
    killed = run(cluster, tmp_path / "killed", first_port)
    other = run(cluster, tmp_path / "other", second_port)
    try:
        killed.start()
        log_line(killed, "webhooks: live at")
        killed.kill()  # SIGKILL: nothing runs at exit
        # What a kill -9 leaves (README): both configurations, calling a port nothing answers,
        # with failurePolicy Fail: every TrainJob write is refused.
        left = configurations(cluster)
        assert all(c is not None and urls(c) == {f"https://127.0.0.1:{first_port}"} for c in left.values()), (
            left
        )
        refused = refusal(cluster, trainjob("while-dead", trainer={"numNodes": 1}))
        assert refused.code == 500 and "failed calling webhook" in refused.message, refused.message

        killed.start()  # the same port, a new self-signed certificate
        replaced = log_line(killed, "webhooks: replaced the configurations")
        assert f"which called https://127.0.0.1:{first_port}" in replaced, replaced
        live = log_line(killed, f"webhooks: live at https://127.0.0.1:{first_port}:")
        assert "the API server's call checked" in live, live
        cluster.create(trainjob("after-restart", trainer={"numNodes": 1}))
        assert "PET_NNODES" in refusal(cluster, reserved_env_job("pet-nnodes")).message
        killed.kill()

        other.start()  # another port
        replaced = log_line(other, "webhooks: replaced the configurations")
        assert f"which called https://127.0.0.1:{first_port}" in replaced, replaced
        log_line(other, f"webhooks: live at https://127.0.0.1:{second_port}:")
        now = configurations(cluster)
        assert all(c is not None and urls(c) == {f"https://127.0.0.1:{second_port}"} for c in now.values()), (
            now
        )
        cluster.create(trainjob("on-another-port", trainer={"numNodes": 1}))
    finally:
        killed.kill()
        other.stop()
    assert configurations(cluster) == {kind: None for kind in KINDS}


def test_an_address_the_api_server_cannot_call_is_not_left_registered(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The API server told to call an address where nothing listens (as one in a container or a VM
    calls a loopback that is not this machine's): the probe sees it, and the configurations go.
    The host is given: left unset, the server would listen where it is advertised."""
    port = free_port()
    process = run(cluster, tmp_path / "op", port, advertiseHost="127.0.0.2", host="127.0.0.1")
    try:
        process.start()
        line = log_line(process, "not registered: the API server could not call it")
        assert f"webhooks: serving at https://127.0.0.2:{port}; " in line, line
        assert "WARNING" in line and "webhook.advertiseHost" in line, line
        assert configurations(cluster) == {kind: None for kind in KINDS}
        # Admission goes on without them, rather than refusing every write.
        cluster.create(trainjob("admitted", trainer={"numNodes": 1}))
    finally:
        process.stop()
    assert process.proc is not None and process.proc.returncode == 0, process.log_tail()
