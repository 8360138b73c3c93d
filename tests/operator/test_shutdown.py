"""SIGTERM ends the operator within the pod's grace period even when the API server is gone: a
node drain during a control-plane outage must not leave a replica hanging until SIGKILL, nor fill
its log with tracebacks (a ``trainer run`` process, as the Deployment runs it).

The operator reaches its API server through a TcpProxy; the outage is either a cut (connections
reset, new ones refused: the API server down) or silence (connections held, nothing answered: a
network partition), the harder case, where every request waits for its timeout.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from operator_helpers import trainjob, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.operator_process import OperatorProcess
from trainer_sandbox.ports import free_port
from trainer_sandbox.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(180)

# Kubernetes' default terminationGracePeriodSeconds, which the chart keeps.
GRACE_SECONDS = 30.0


@pytest.mark.parametrize("outage", ["cut", "silent"])
def test_sigterm_with_the_api_server_gone_ends_within_the_grace_period(
    cluster: Cluster, tmp_path: Path, outage: str
) -> None:
    user = f"system:serviceaccount:{cluster.namespace}:trainer-shutdown"
    cluster.grant(user)
    # Every server the operator can run is on: the webhooks (a self-signed certificate), the
    # status server, metrics and health; and leader election, whose release needs the API server.
    config = {
        "leaderElection": {
            "leaderElect": True,
            "resourceName": "shutdown",
            "resourceNamespace": cluster.namespace,
        },
        "webhook": {"enabled": True, "host": "127.0.0.1", "port": free_port()},
        "featureGates": {"TrainJobStatus": True},
        "statusServer": {"host": "127.0.0.1", "port": free_port()},
        "certManagement": {"enable": True, "webhookSecretNamespace": cluster.namespace},
    }
    process = OperatorProcess(
        cluster, tmp_path / "op", user=user, config=config, namespaces=[cluster.namespace]
    )
    kubeconfig = yaml.safe_load(process.kubeconfig.read_text())
    entry = kubeconfig["clusters"][0]["cluster"]
    with TcpProxy.to_url(entry["server"]) as proxy:
        entry["server"] = proxy.url  # TLS passes through: the certificate is for 127.0.0.1
        process.kubeconfig.write_text(yaml.safe_dump(kubeconfig))
        try:
            process.start()
            wait_for(lambda: process.leads(), timeout=30, what="the operator to lead")
            cluster.create(trainjob("before-outage", trainer={"numNodes": 1}))
            time.sleep(1.0)
            if outage == "cut":
                proxy.cut()
            else:
                proxy.pause()
            time.sleep(4.0)  # requests under way (the Lease renewals) meet the outage
            assert process.proc is not None
            began = time.monotonic()
            process.proc.send_signal(signal.SIGTERM)
            try:
                code = process.proc.wait(GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                raise AssertionError(
                    f"still running {GRACE_SECONDS:g} s after SIGTERM:\n{process.log_tail()}"
                ) from None
            took = time.monotonic() - began
        finally:
            process.stop()
    log = process.log_path.read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert took < GRACE_SECONDS / 2, f"{took:.1f} s: too close to SIGKILL"
