"""Pods on real nodes: containers run by runc, on two nodes joined by a network of ours, with
cluster DNS, Services through kube-proxy, the API server reachable from pods, logs through the
kubelet, and JobSets run to completion by the real JobSet controller."""

from __future__ import annotations

import json

import pytest
from node_helpers import Kubectl
from trainer_sandbox.cluster.nodepool import BUSYBOX_IMAGE
from trainer_sandbox.cluster.realnode import KWOK_TAINT, REAL_NODE_LABEL

pytestmark = pytest.mark.real_nodes


def pod(name: str, command: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                }
            ],
            **spec,
        },
    }


def test_the_cluster_has_two_real_nodes_and_tainted_kwok_nodes(kubectl: Kubectl) -> None:
    nodes = json.loads(kubectl("get", "nodes", "-o", "json"))["items"]
    real = [n for n in nodes if n["metadata"]["labels"].get(REAL_NODE_LABEL) == "true"]
    kwok = [n for n in nodes if n["metadata"]["labels"].get("type") == "kwok"]
    assert sorted(n["metadata"]["name"] for n in real) == ["real-0", "real-1"]
    for node in real:
        info = node["status"]["nodeInfo"]
        assert info["containerRuntimeVersion"].startswith("containerd://2."), info
        assert info["kubeletVersion"] == "v1.36.3", info
        assert not node["spec"].get("taints"), node["spec"]  # the registration taint was lifted
    assert kwok and all(KWOK_TAINT in (n["spec"].get("taints") or []) for n in kwok)


def test_pods_reach_each_other_across_nodes_by_name_and_through_services(kubectl: Kubectl) -> None:
    ns = kubectl.namespace
    server = pod(
        "server",
        "mkdir /www && echo hello-from-$(hostname) > /www/index.html && httpd -f -p 80 -h /www",
        hostname="server",
        subdomain="web",
        nodeName="real-1",
    )
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"clusterIP": None, "selector": {"app": "server"}, "ports": [{"port": 80}]},
    }
    virtual = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "webvip"},
        "spec": {"selector": {"app": "server"}, "ports": [{"port": 8080, "targetPort": 80}]},
    }
    kubectl.apply(headless, virtual, server)
    kubectl.wait_for("the server pod to run", lambda: kubectl.pod_phase("server") == "Running")
    script = (
        f"until wget -qO- http://server.web.{ns}.svc.cluster.local/; do sleep 0.5; done; "
        "until wget -qO- http://webvip:8080/; do sleep 0.5; done; "
        "echo | nc -w 5 kubernetes.default.svc 443 && echo api-server-reachable"
    )
    kubectl.apply(pod("client", script, nodeName="real-0"))
    phase = kubectl.wait_for(
        "the client pod to finish",
        lambda: kubectl.pod_phase("client") in ("Succeeded", "Failed") and kubectl.pod_phase("client"),
    )
    log = kubectl("logs", "client")
    assert phase == "Succeeded", log
    # Once by the pod's DNS name (cross-node, headless Service), once through the ClusterIP.
    assert log.count("hello-from-server") == 2, log
    assert "api-server-reachable" in log, log
    server_ip = kubectl.get("pod", "server")["status"]["podIP"]
    client_ip = kubectl.get("pod", "client")["status"]["podIP"]
    assert server_ip.startswith("10.245.1.") and client_ip.startswith("10.245.0."), (server_ip, client_ip)


def test_pods_land_on_kwok_nodes_only_when_they_tolerate_the_taint(kubectl: Kubectl) -> None:
    toleration = {
        "key": KWOK_TAINT["key"],
        "operator": "Equal",
        "value": KWOK_TAINT["value"],
        "effect": "NoSchedule",
    }
    kubectl.apply(
        pod("anywhere", "echo ran"),
        pod("fake", "echo ran", tolerations=[toleration], nodeSelector={"type": "kwok"}),
    )
    kubectl.wait_for(
        "both pods to finish",
        lambda: kubectl.pod_phase("anywhere") == "Succeeded" == kubectl.pod_phase("fake"),
    )
    assert kubectl.get("pod", "anywhere")["spec"]["nodeName"].startswith("real-")
    assert kubectl.get("pod", "fake")["spec"]["nodeName"].startswith("kwok-node-")
    assert kubectl("logs", "anywhere").strip() == "ran"


def test_a_jobset_of_real_pods_completes(kubectl: Kubectl) -> None:
    ns = kubectl.namespace
    command = (
        # Each pod finds the other by the name JobSet gives it, as torch and MPI workers do.
        f"for i in 0 1; do until nslookup js-node-0-$i.js.{ns}.svc.cluster.local >/dev/null; do sleep 0.5; done; done; "
        "echo peers-found $(hostname)"
    )
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {"spec": pod("worker", command)["spec"]},
                        }
                    },
                }
            ]
        },
    }
    kubectl.apply(jobset)

    def terminal() -> str:
        conditions = (kubectl.get("jobset", "js").get("status") or {}).get("conditions") or []
        return next(
            (c["type"] for c in conditions if c["status"] == "True" and c["type"] in ("Completed", "Failed")),
            "",
        )

    state = kubectl.wait_for("the JobSet to finish", terminal, timeout=180)
    logs = kubectl("logs", "-l", "jobset.sigs.k8s.io/jobset-name=js", "--prefix")
    assert state == "Completed", logs
    assert logs.count("peers-found js-node-0-") == 2, logs
