"""kubectl against each backend: apply (client-side and server-side), get, delete, wait, patch,
and ``kubectl create`` of built-in kinds (protobuf bodies).

The tests take the ``cluster`` fixture (tests/backend_plugin.py): the stand-in with the CRDs and
runtimes installed, or a namespace of its own on the real control plane, where kubectl is the one
built with it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from backend_plugin import kubeconfig_for, kubectl_program
from kubectl_json import without_null_creation_timestamps
from trainer_sandbox import sandbox
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.backends import Cluster
from trainer_sandbox.sandbox import install_crds, trainer_crd_files

PODGROUP_CRD = Path(sandbox.__file__).with_name("crds") / "scheduling.x-k8s.io_podgroups.json"


class Kubectl:
    def __init__(self, program: str, kubeconfig: Path, home: Path) -> None:
        self.program = program
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.program, *args], env=self.env, input=stdin, capture_output=True, text=True, timeout=60
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def wait_running(self, selector: str) -> None:
        """``kubectl wait`` for the selected pods to run, once there are some: with none yet it
        fails at once, and controllers on a real cluster take a moment to make them."""
        assert wait_until(lambda: bool(self.json("get", "pods", "-l", selector)["items"])), selector
        self.run("wait", "--for=jsonpath={.status.phase}=Running", "pod", "-l", selector, "--timeout=30s")


@pytest.fixture
def kubectl(cluster: Cluster, tmp_path: Path) -> Kubectl:
    """kubectl as the admin, in the test's namespace (the kubeconfig's context names it)."""
    program = kubectl_program(cluster)
    if program is None:
        pytest.skip("kubectl is not installed on this machine")
    return Kubectl(program, kubeconfig_for(cluster, tmp_path), tmp_path)


def wait_until(check: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: {name}
spec:
  runtimeRef:
    name: torch-distributed
  trainer:
    numNodes: 1
    numProcPerNode: {nproc}
"""


def test_client_side_apply_crd_and_objects(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    # The CRD is installed already (on the real control plane, for every test): applying the same
    # manifest again changes nothing but kubectl's annotation, so it is safe on a shared cluster.
    kubectl.run("apply", "-f", str(PODGROUP_CRD))
    kubectl.run("wait", "--for=condition=Established", "crd/podgroups.scheduling.x-k8s.io", "--timeout=10s")
    manifest = tmp_path / "pg.yaml"
    manifest.write_text(
        "apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\nmetadata:\n  name: g\nspec:\n  minMember: 2\n"
    )
    kubectl.run("apply", "-f", str(manifest))
    # "podgroup" alone is Volcano's too (both PodGroup CRDs are installed): the group says which.
    obj = kubectl.json("get", "podgroups.scheduling.x-k8s.io", "g")
    assert obj["spec"]["minMember"] == 2
    assert "kubectl.kubernetes.io/last-applied-configuration" in obj["metadata"]["annotations"]
    # Re-applying a changed manifest patches (JSON merge patch for custom kinds).
    manifest.write_text(manifest.read_text().replace("minMember: 2", "minMember: 3"))
    out = kubectl.run("apply", "-f", str(manifest)).stdout
    assert "configured" in out
    assert kubectl.json("get", "podgroups.scheduling.x-k8s.io", "g")["spec"]["minMember"] == 3
    # Built-in kinds go through strategic merge patch.
    cm = tmp_path / "cm.yaml"
    cm.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: '1'\n  b: '2'\n")
    kubectl.run("apply", "-f", str(cm))
    cm.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: '1'\n")
    kubectl.run("apply", "-f", str(cm))
    assert kubectl.json("get", "configmap", "c")["data"] == {"a": "1"}


def test_server_side_apply_and_printer_columns(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    # Applying the installed CRDs again is idempotent: the same values, so kubectl shares their
    # ownership without a conflict.
    for f in trainer_crd_files():
        kubectl.run("apply", "--server-side", "-f", str(f))
    tj = tmp_path / "tj.yaml"
    tj.write_text(TRAINJOB.format(name="demo", nproc=2))
    kubectl.run("apply", "--server-side", "-f", str(tj))
    obj = kubectl.json("get", "trainjob", "demo", "--show-managed-fields")
    managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
    assert ("kubectl", "Apply") in managers
    table = kubectl.run("get", "trainjobs").stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "STATE",
        "PROGRESS",
        "%",
        "SECONDS",
        "LEFT",
        "RUNTIME",
        "NODES",
        "AGE",
    ]
    assert table[1].split()[:3] == ["demo", "torch-distributed", "1"]
    rows = {
        line.split()[0]: line.split()
        for line in kubectl.run("get", "clustertrainingruntimes").stdout.splitlines()[1:]
    }
    assert "torch" in rows["torch-distributed"][1:]
    # Dropping a field from the applied configuration removes it (managedFields at work)...
    labelled = TRAINJOB.format(name="demo", nproc=2).replace(
        "  name: demo\n", "  name: demo\n  labels:\n    team: a\n"
    )
    tj.write_text(labelled)
    kubectl.run("apply", "--server-side", "-f", str(tj))
    assert kubectl.json("get", "trainjob", "demo")["metadata"]["labels"] == {"team": "a"}
    tj.write_text(TRAINJOB.format(name="demo", nproc=2))
    kubectl.run("apply", "--server-side", "-f", str(tj))
    assert "labels" not in kubectl.json("get", "trainjob", "demo")["metadata"]
    # ...and a field another manager owns with another value is a conflict unless forced.
    kubectl.run("label", "trainjob", "demo", "team=b")
    tj.write_text(labelled)
    proc = kubectl.run("apply", "--server-side", "-f", str(tj), check=False)
    assert proc.returncode != 0 and "conflict" in proc.stderr.lower()
    kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(tj))
    assert kubectl.json("get", "trainjob", "demo")["metadata"]["labels"] == {"team": "a"}


def test_invalid_trainjob_is_refused_with_the_rule_message(
    cluster: Cluster, kubectl: Kubectl, tmp_path: Path
) -> None:
    tj = tmp_path / "tj.yaml"
    tj.write_text(TRAINJOB.format(name="bad", nproc=0))
    for extra in ([], ["--server-side"]):
        proc = kubectl.run("apply", *extra, "-f", str(tj), check=False)
        assert proc.returncode != 0
        assert "numProcPerNode must be greater than or equal to 1" in proc.stderr
        assert 'The TrainJob "bad" is invalid' in proc.stderr or "is invalid" in proc.stderr
    # An unknown field is refused too: kubectl asks for strict validation, the server does it.
    tj.write_text(TRAINJOB.format(name="bad", nproc=1).replace("  trainer:\n", "  bogus: 1\n  trainer:\n"))
    proc = kubectl.run("apply", "-f", str(tj), check=False)
    assert proc.returncode != 0 and 'unknown field "spec.bogus"' in proc.stderr


def test_delete_with_cascade_and_wait(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    js = {
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
                            "template": {
                                "spec": {
                                    "containers": [
                                        {
                                            "name": "node",
                                            "image": "busybox",
                                            "command": ["echo", "hi"],
                                            "env": [{"name": "SANDBOX_RUN_SECONDS", "value": "0.3"}],
                                        }
                                    ]
                                }
                            },
                        }
                    },
                }
            ]
        },
    }
    path = tmp_path / "js.json"
    path.write_text(json.dumps(js))
    kubectl.run("apply", "-f", str(path))
    kubectl.run("wait", "--for=condition=Completed", "jobset/js", "--timeout=30s")
    pods = kubectl.json("get", "pods", "-l", "jobset.sigs.k8s.io/jobset-name=js")["items"]
    assert len(pods) == 2
    assert all(p["status"]["phase"] == "Succeeded" for p in pods)
    if cluster.serves_logs:
        logs = kubectl.run("logs", pods[0]["metadata"]["name"]).stdout
        assert "command: echo hi" in logs and "exited with code 0" in logs
    kubectl.run("delete", "jobset", "js", "--cascade=foreground", "--timeout=30s")
    wait_until(lambda: not kubectl.json("get", "pods")["items"])
    assert kubectl.json("get", "pods")["items"] == []
    assert kubectl.json("get", "jobs")["items"] == []


def test_patch_pod_status_wins_over_the_timer(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    js = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "held"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "node",
                    "template": {
                        "spec": {
                            "backoffLimit": 0,
                            "template": {
                                "spec": {
                                    "containers": [
                                        {
                                            "name": "node",
                                            "image": "busybox",
                                            "env": [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}],
                                        }
                                    ]
                                }
                            },
                        }
                    },
                }
            ]
        },
    }
    path = tmp_path / "js.json"
    path.write_text(json.dumps(js))
    kubectl.run("create", "-f", str(path))
    kubectl.wait_running("jobset.sigs.k8s.io/jobset-name=held")
    pod = kubectl.json("get", "pods", "-l", "jobset.sigs.k8s.io/jobset-name=held")["items"][0]["metadata"][
        "name"
    ]
    kubectl.run(
        "patch", "pod", pod, "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Failed"}}'
    )
    kubectl.run("wait", "--for=condition=Failed", "jobset/held", "--timeout=30s")
    js_obj = kubectl.json("get", "jobset", "held")
    assert js_obj["status"]["terminalState"] == "Failed"


def test_get_watch_streams_tables(cluster: Cluster, kubectl: Kubectl) -> None:
    proc = subprocess.Popen(
        [kubectl.program, "get", "configmaps", "-w", "--request-timeout=3s"],
        env=kubectl.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "seen"}})
    time.sleep(0.5)
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    assert "seen" in out


@pytest.mark.standin_only(
    "install_crds is the stand-in's in-process installer into a blank server; the real control "
    "plane installs its CRDs at start-up (trainer_sandbox.cluster.install)"
)
def test_install_helpers_are_idempotent_per_server(apiserver: LocalAPIServer) -> None:
    names = install_crds(apiserver)
    assert "jobsets.jobset.x-k8s.io" in names and "trainjobs.trainer.kubeflow.org" in names


def test_delete_dry_run_server_deletes_nothing(cluster: Cluster, kubectl: Kubectl) -> None:
    """kubectl sends the dry run in the DeleteOptions body."""
    for name in ("a", "b"):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"app": "x"}}}
        kubectl.run("create", "-f", "-", stdin=json.dumps(cm))
    out = kubectl.run("delete", "configmap", "a", "--dry-run=server").stdout
    # kubectl 1.33 and later name the namespace in the message.
    assert re.match(r'configmap "a" deleted( from \S+ namespace)? \(server dry run\)', out), out
    kubectl.run("delete", "configmaps", "-l", "app=x", "--dry-run=server")
    # By label: a real namespace also holds kube-root-ca.crt (the stand-in publishes none).
    left = kubectl.json("get", "configmaps", "-l", "app=x")["items"]
    assert sorted(i["metadata"]["name"] for i in left) == ["a", "b"]


JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: c
        image: busybox:1
        command: [echo, {name}]
        env:
        - name: SANDBOX_RUN_SECONDS
          value: "-1"
"""


def test_logs_of_a_job_are_its_pods_logs(cluster: Cluster, kubectl: Kubectl) -> None:
    """``kubectl logs job/NAME`` finds the Job's pods by the selector the API server generated."""
    kubectl.run("create", "-f", "-", stdin=JOB.format(name="first"))
    kubectl.run("create", "-f", "-", stdin=JOB.format(name="second"))
    kubectl.wait_running("job-name=second")
    job = kubectl.json("get", "job", "second")
    selector = job["spec"]["selector"]["matchLabels"]
    pods = kubectl.json("get", "pods", "-l", ",".join(f"{k}={v}" for k, v in selector.items()))["items"]
    assert [p["metadata"]["labels"]["job-name"] for p in pods] == ["second"]
    if not cluster.serves_logs:
        return
    logs = kubectl.run("logs", "job/second").stdout
    assert "command: echo second" in logs and "command: echo first" not in logs


# `kubectl create <subcommand>`: kubectl 1.32 and later send these bodies as protobuf. Each case:
# the kind to get, the name, the arguments ("{ns}" is the test's namespace), and what the real
# server stores (dotted paths into the object); the last says whether the object, deleted and made
# again from the JSON kubectl prints in a client-side dry run, must be stored the same (a Job's
# selector holds its uid).
KUBECTL_CREATE: list[tuple[str, str, list[str], dict[str, Any], bool]] = [
    (
        "configmap",
        "c",
        ["configmap", "c", "--from-literal=a=b", "--from-file=blob={dir}/blob"],
        {"data": {"a": "b"}, "binaryData": {"blob": base64.b64encode(b"\xff\x00 blob").decode()}},
        True,
    ),
    (
        "secret",
        "s",
        ["secret", "generic", "s", "--from-literal=k=v"],
        {"data": {"k": "dg=="}, "type": "Opaque"},
        True,
    ),
    ("serviceaccount", "sa", ["serviceaccount", "sa"], {}, True),
    (
        "role",
        "r",
        ["role", "r", "--verb=get", "--resource=pods"],
        {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
        True,
    ),
    (
        "rolebinding",
        "rb",
        ["rolebinding", "rb", "--role=r", "--group=g", "--serviceaccount={ns}:sa"],
        {
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "g"},
                {"kind": "ServiceAccount", "name": "sa", "namespace": "{ns}"},
            ],
        },
        True,
    ),
    (
        "clusterrole",
        "cr-{ns}",
        ["clusterrole", "cr-{ns}", "--verb=list", "--resource=configmaps"],
        {"rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]},
        True,
    ),
    (
        "clusterrolebinding",
        "crb-{ns}",
        ["clusterrolebinding", "crb-{ns}", "--clusterrole=cr-{ns}", "--group=g"],
        {
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cr-{ns}"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "g"}],
        },
        True,
    ),
    (
        "priorityclass",
        "pc-{ns}",
        ["priorityclass", "pc-{ns}", "--value=1000", "--description=d"],
        {"value": 1000, "description": "d", "preemptionPolicy": "PreemptLowerPriority"},
        True,
    ),
    (
        "deployment",
        "d",
        ["deployment", "d", "--image=nginx:1.27", "--replicas=2"],
        {
            "spec.replicas": 2,
            "spec.selector": {"matchLabels": {"app": "d"}},
            "spec.strategy.type": "RollingUpdate",
            "spec.template.spec.containers.0.image": "nginx:1.27",
            "spec.template.spec.containers.0.resources": {},
        },
        True,
    ),
    (
        "poddisruptionbudget",
        "pdb",
        ["poddisruptionbudget", "pdb", "--selector=app=d", "--min-available=50%"],
        {"spec.minAvailable": "50%", "spec.selector": {"matchLabels": {"app": "d"}}},
        True,
    ),
    (
        "service",
        "svc",
        ["service", "clusterip", "svc", "--tcp=80:8080"],
        {
            "spec.type": "ClusterIP",
            "spec.selector": {"app": "svc"},
            "spec.ports": [{"name": "80-8080", "port": 80, "protocol": "TCP", "targetPort": 8080}],
        },
        True,
    ),
    (
        "job",
        "j",
        ["job", "j", "--image=busybox", "--", "echo", "hi"],
        {
            "spec.template.spec.containers.0.command": ["echo", "hi"],
            "spec.template.spec.restartPolicy": "Never",
        },
        False,
    ),
]


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj[int(part)] if isinstance(obj, list) else obj[part]
    return obj


def _as_stored_by_kubectl_create(obj: dict[str, Any]) -> dict[str, Any]:
    """What two creates of the same object share: not the uid, resourceVersion and times, not the
    status or what controllers add (a Service's cluster IP, a Deployment's revision). Nor the
    ``creationTimestamp: null`` kubectl's JSON puts in a pod template's metadata: the real server
    drops it, the stand-in's JSON path keeps it (its README lists the difference)."""
    obj = without_null_creation_timestamps(obj)
    meta = obj["metadata"]
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        meta.pop(key, None)
    (meta.get("annotations") or {}).pop("deployment.kubernetes.io/revision", None)
    if not meta.get("annotations"):
        meta.pop("annotations", None)
    meta["managedFields"] = [
        {k: v for k, v in entry.items() if k != "time"}
        for entry in meta.get("managedFields", [])
        if entry["manager"] == "kubectl-create"
    ]
    obj.pop("status", None)
    if obj["kind"] == "Service":
        obj["spec"].pop("clusterIP", None)
        obj["spec"].pop("clusterIPs", None)
    return obj


def test_kubectl_create_of_builtin_kinds(cluster: Cluster, kubectl: Kubectl, tmp_path: Path) -> None:
    """Every stored kind ``kubectl create`` makes, from its protobuf body: stored as the real
    server stores it, and as the same object sent as JSON is (issue 30 item 3)."""
    ns = cluster.namespace
    (tmp_path / "blob").write_bytes(b"\xff\x00 blob")

    def fill(value: Any) -> Any:
        return json.loads(json.dumps(value).replace("{ns}", ns).replace("{dir}", str(tmp_path)))

    namespace = f"{ns}-made"
    cluster_scoped = [f"namespace/{namespace}"]
    cluster_scoped += [f"{kind}/{fill(name)}" for kind, name, *_ in KUBECTL_CREATE if "{ns}" in name]
    try:
        verbose = kubectl.run("create", "namespace", namespace, "-v=8").stderr
        assert "Content-Type: application/vnd.kubernetes.protobuf" in verbose
        made = kubectl.json("get", "namespace", namespace)
        assert made["metadata"]["labels"] == {"kubernetes.io/metadata.name": namespace}
        assert made["spec"] == {"finalizers": ["kubernetes"]}
        assert made["status"] == {"phase": "Active"}
        for kind, name, args, expected, twin in KUBECTL_CREATE:
            name, args = fill(name), fill(args)
            kubectl.run("create", *args)
            stored = kubectl.json("get", kind, name)
            for path, value in fill(expected).items():
                assert _at(stored, path) == value, (kind, path)
            if kind == "serviceaccount":
                assert set(stored) == {"apiVersion", "kind", "metadata"}
            if not twin:
                continue
            as_json = kubectl.run("create", "--dry-run=client", "-o", "json", *args).stdout
            kubectl.run("delete", kind, name)
            kubectl.run("create", "-f", "-", stdin=as_json)
            again = kubectl.json("get", kind, name)
            assert _as_stored_by_kubectl_create(again) == _as_stored_by_kubectl_create(stored), kind
    finally:
        kubectl.run("delete", "--ignore-not-found", "--wait=false", *cluster_scoped, check=False)
