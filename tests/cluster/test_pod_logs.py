"""Pod logs on the real control plane's kwok nodes (``trainer_sandbox.cluster.podlogs``).

The API server answers ``pods/log`` by calling the pod's node's kubelet at the node's InternalIP and
kubelet port; for kwok's nodes that is kwok's server, which reads each container's log from the file
``podlogs`` keeps as kwok reports the container started, restarted and ended. These tests check that
path end to end with the kubectl built with the cluster, and that a pod logs on kwok what the same
pod logs on the stand-in. They run in the session's real control plane (the ``real`` fixture).
"""

from __future__ import annotations

import re
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import kubectl, wait_for
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from trainer_sandbox.backends import Cluster, RealCluster
from trainer_sandbox.cluster.kube import probe
from trainer_sandbox.cluster.stages import NODE_ANNOTATION, NODE_ANNOTATION_VALUE
from trainer_sandbox.sandbox import local_apiserver

pytestmark = pytest.mark.slow

Obj = dict[str, Any]
EXIT_CODE = 3


def env(**values: str) -> list[Obj]:
    return [{"name": k, "value": v} for k, v in values.items()]


def test_kwok_nodes_name_kwoks_server_as_their_kubelet(real: RealCluster) -> None:
    """Where the API server goes for a kwok node's logs (its InternalIP, with
    ``--kubelet-preferred-address-types=InternalIP``, and its ``daemonEndpoints`` port) answers as
    kwok's server, over TLS with a certificate of the cluster's CA."""
    nodes = [
        n
        for n in real.list("v1", "Node", namespace="")
        if (n["metadata"].get("annotations") or {}).get(NODE_ANNOTATION) == NODE_ANNOTATION_VALUE
    ]
    assert nodes
    endpoints = set()
    for node in nodes:
        (ip,) = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        port = node["status"].get("daemonEndpoints", {}).get("kubeletEndpoint", {}).get("Port")
        assert port, f"{node['metadata']['name']} reports no kubelet port"
        endpoints.add((ip, int(port)))
    ca = ssl.create_default_context(cafile=str(real.ca_dir / "ca.crt"))
    for ip, port in endpoints:
        assert probe(f"https://{ip}:{port}/healthz", ca) == (200, "ok"), (ip, port)


def _job(namespace: str) -> Obj:
    """A Job whose one pod fails with ``EXIT_CODE``; its command holds a script of two lines."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "fails", "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "node",
                            "image": "busybox:1",
                            "command": ["sh", "-c", "echo one\necho 'two'"],
                            "args": ["an arg", "x"],
                            "env": env(SANDBOX_RUN_SECONDS="0.2", SANDBOX_EXIT_CODE=str(EXIT_CODE)),
                        }
                    ],
                }
            },
        },
    }


def _failed_pod(cluster: Cluster, namespace: str) -> Obj | None:
    job = cluster.get("batch/v1", "Job", "fails", namespace=namespace)
    conditions = (job.get("status") or {}).get("conditions") or []
    if not any(c["type"] == "Failed" and c["status"] == "True" for c in conditions):
        return None
    pods = [
        p
        for p in cluster.list("v1", "Pod", namespace=namespace)
        if (p["metadata"].get("labels") or {}).get("job-name") == "fails"
    ]
    return next((p for p in pods if p["status"].get("phase") == "Failed"), None)


def test_a_job_logs_the_same_lines_on_the_stand_in_and_on_kwok(real: RealCluster, tmp_path: Path) -> None:
    """The same Job, read through the API server's ``pods/log`` on both: the stand-in's simulated
    kubelet and kwok with ``podlogs`` tell the same story, ending with the exit code the pod's status
    reports (the one its env asked for)."""
    standin = local_apiserver().start()
    try:
        standin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": real.namespace}})
        backends: dict[str, Cluster] = {"standin": standin, "real": real}
        for cluster in backends.values():
            cluster.create(_job(real.namespace))
        logs = {}
        for name, cluster in backends.items():
            pod = wait_for(
                what=f"the failed pod on the {name} backend",
                check=lambda c=cluster: _failed_pod(c, real.namespace),
            )
            (status,) = pod["status"]["containerStatuses"]
            assert status["state"]["terminated"]["exitCode"] == EXIT_CODE
            kubeconfig = cluster.write_kubeconfig(tmp_path / f"{name}.kubeconfig")
            api = k8s.CoreV1Api(k8s_config.new_client_from_config(str(kubeconfig)))
            pod_name = pod["metadata"]["name"]

            def ended(api: Any = api, pod_name: str = pod_name) -> str | None:
                text = str(api.read_namespaced_pod_log(pod_name, real.namespace, container="node"))
                return text if text.rstrip("\n").endswith(f"exited with code {EXIT_CODE}") else None

            # kwok reports the exit before podlogs has written it; a real runtime writes it first.
            text = wait_for(what=f"the exit in the {name} pod's log", check=ended, timeout=10)
            assert "echo one\necho" in text and "an arg" in text
            logs[name] = text.replace(pod_name, "<pod>")
    finally:
        standin.stop()
    assert logs["real"] == logs["standin"]


def test_kubectl_logs_of_a_kwok_pod_follow_its_status(real: RealCluster) -> None:
    """A bare pod (only kwok runs those) whose containers fail and restart in place until a client
    sets its phase: each container's log has a line per restart kwok reported, with the exit code,
    then the takeover; ``--tail`` and an init container's (empty) log work too."""
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "restarts", "namespace": real.namespace},
        "spec": {
            "restartPolicy": "OnFailure",
            "initContainers": [{"name": "init", "image": "busybox:1"}],
            "containers": [
                {"name": "side", "image": "busybox:1", "command": ["sleep", "1d"]},
                {
                    "name": "node",
                    "image": "busybox:1",
                    "env": env(SANDBOX_RUN_SECONDS="0.2", SANDBOX_EXIT_CODE=str(EXIT_CODE)),
                },
            ],
        },
    }
    real.create(pod)

    def restarted_twice() -> bool:
        statuses = real.get("v1", "Pod", "restarts")["status"].get("containerStatuses") or []
        return bool(statuses) and all(int(s.get("restartCount") or 0) >= 2 for s in statuses)

    wait_for(what="two restarts", check=restarted_twice)
    real.patch("v1", "Pod", "restarts", {"status": {"phase": "Failed"}}, subresource="status")
    # The client owns the pod now: kwok's next restart is refused, and the status stays as it is.
    time.sleep(0.5)
    statuses = {s["name"]: s for s in real.get("v1", "Pod", "restarts")["status"]["containerStatuses"]}

    def taken_over(container: str) -> list[str] | None:
        out = kubectl(real, "logs", "restarts", "-c", container)
        return out.splitlines() if out.endswith("failed by a client status update\n") else None

    for name, spec in (("side", pod["spec"]["containers"][0]), ("node", pod["spec"]["containers"][1])):
        status = statuses[name]
        lines = wait_for(
            what=f"the takeover in {name}'s log", check=lambda name=name: taken_over(name), timeout=10
        )
        assert lines[0] == f"[sandbox] pod {real.namespace}/restarts container {name} image {spec['image']}"
        if spec.get("command"):
            assert lines[1] == "[sandbox] command: " + " ".join(spec["command"])
        restarts = [
            m for line in lines if (m := re.fullmatch(r".* exited with code (\d+); restarting .*", line))
        ]
        assert len(restarts) == status["restartCount"] >= 2
        assert {int(m.group(1)) for m in restarts} == {status["lastState"]["terminated"]["exitCode"]}
        assert kubectl(real, "logs", "restarts", "-c", name, "--tail=1").splitlines() == lines[-1:]
    assert kubectl(real, "logs", "restarts", "-c", "init") == ""


def test_a_deleted_pods_log_goes_with_it(real: RealCluster) -> None:
    """Each pod's ``Logs`` object (what tells kwok where its log is) is owned by the pod, so the
    garbage collector removes it with the pod; nothing piles up over a session."""
    real.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "brief", "namespace": real.namespace},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "node", "image": "busybox:1", "env": env(SANDBOX_RUN_SECONDS="-1")}],
            },
        }
    )
    wait_for(
        what="the pod to run",
        check=lambda: real.get("v1", "Pod", "brief")["status"].get("phase") == "Running",
    )
    assert "container node image busybox:1" in kubectl(real, "logs", "brief")
    (logs,) = real.list("kwok.x-k8s.io/v1alpha1", "Logs")
    uid = real.get("v1", "Pod", "brief")["metadata"]["uid"]
    assert [o["uid"] for o in logs["metadata"]["ownerReferences"]] == [uid]
    real.delete("v1", "Pod", "brief")
    wait_for(
        what="the Logs object to go",
        check=lambda: not real.list("kwok.x-k8s.io/v1alpha1", "Logs"),
        timeout=30,
    )
