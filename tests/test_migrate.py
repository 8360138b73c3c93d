"""`trainer migrate` for PyTorchJob (kubeflow.org/v1): conversion, refusals, the round trip
through `trainer render`, and --from-cluster against the stand-in API server (read only).

The manifests are our own, in the shape of the training-operator repository's examples
(named at each test); v1's env semantics are written down in docs/migration.md.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainer.cli import main

COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def container(**extra: Any) -> dict[str, Any]:
    return {
        "name": "pytorch",
        "image": "registry.example/mnist:1.0",
        "command": ["python3", "/opt/mnist/train.py", "--epochs=1"],
        "env": [{"name": "LR", "value": "0.01"}],
        "resources": {"limits": {"cpu": "2", "memory": "2Gi"}},
        **extra,
    }


def pytorchjob(
    name: str = "mnist", workers: int = 1, nproc: str | None = None, **spec: Any
) -> dict[str, Any]:
    """In the shape of training-operator examples/pytorch/simple.yaml: a Master and Workers."""
    replica = {
        "replicas": 1,
        "restartPolicy": "OnFailure",
        "template": {"spec": {"containers": [container()]}},
    }
    worker = copy.deepcopy(replica)
    worker["replicas"] = workers
    body: dict[str, Any] = {"pytorchReplicaSpecs": {"Master": replica, "Worker": worker}, **spec}
    if nproc is not None:
        body["nprocPerNode"] = nproc
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "team-a", "labels": {"app": "mnist"}},
        "spec": body,
    }


def run(
    argv: list[str], stdin: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def migrate(
    jobs: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    *flags: str,
) -> tuple[int, list[dict[str, Any]], str]:
    code, out, err = run(["migrate", "-f", "-", *flags], yaml.safe_dump_all(jobs), capsys, monkeypatch)
    return code, [d for d in yaml.safe_load_all(out) if d], err


def render(
    objects: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, Any]]:
    code, out, err = run(["render", "-f", "-"], yaml.safe_dump_all(objects), capsys, monkeypatch)
    assert code == 0, err
    return [d for d in yaml.safe_load_all(out) if d]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []}


def test_simple_round_trip_runs_the_same_pods(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/pytorch/simple.yaml: 1 Master + 1 Worker, no nprocPerNode."""
    job = pytorchjob(workers=3, nproc="4")
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    [trainjob] = out
    assert trainjob["kind"] == "TrainJob"
    assert trainjob["metadata"] == {"name": "mnist", "namespace": "team-a", "labels": {"app": "mnist"}}
    assert trainjob["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert "Warning: PyTorchJob team-a/mnist: spec.pytorchReplicaSpecs.Master.restartPolicy" in err

    [jobset] = [o for o in render(out, capsys, monkeypatch) if o["kind"] == "JobSet"]
    [node] = jobset["spec"]["replicatedJobs"]
    job_spec = node["template"]["spec"]
    assert node["replicas"] * job_spec["parallelism"] == 4  # Master + 3 Workers
    [pod] = job_spec["template"]["spec"]["containers"]
    assert pod["image"] == "registry.example/mnist:1.0"
    assert pod["command"] == ["python3", "/opt/mnist/train.py", "--epochs=1"]
    assert pod["resources"] == {"limits": {"cpu": "2", "memory": "2Gi"}}
    env = env_of(pod)
    # The user's env, and what v1's controller set, with v1's meaning.
    assert env["LR"] == "0.01"
    assert env["PYTHONUNBUFFERED"] == "0"
    assert env["MASTER_ADDR"] == "mnist-node-0-0.mnist"  # the rank 0 pod, as the Master was
    assert env["MASTER_PORT"] == "23456"
    assert env["WORLD_SIZE"] == "16"  # replicas x nprocPerNode, as v1 computed it
    assert env["RANK"] == {"fieldRef": {"fieldPath": COMPLETION_INDEX}}  # Master 0, Worker i -> i + 1
    assert env["PET_NODE_RANK"] == {"fieldRef": {"fieldPath": COMPLETION_INDEX}}
    assert env["PET_NNODES"] == "4"
    assert env["PET_NPROC_PER_NODE"] == "4"
    assert env["PET_MASTER_ADDR"] == "mnist-node-0-0.mnist"
    assert "PET_MASTER_PORT" in env


def test_named_port_is_the_master_port(capsys: Any, monkeypatch: Any) -> None:
    job = pytorchjob()
    for rtype in ("Master", "Worker"):
        spec = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]
        spec["containers"] = [container(ports=[{"name": "pytorchjob-port", "containerPort": 12345}])]
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    assert {"name": "MASTER_PORT", "value": "12345"} in out[0]["spec"]["trainer"]["env"]


def test_pod_fields_go_to_a_runtime_patch(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/pytorch/mnist/v1/pytorch_job_mnist_gloo.yaml's shape, with volumes,
    a node selector, tolerations and a service account."""
    job = pytorchjob(runPolicy={"activeDeadlineSeconds": 100, "ttlSecondsAfterFinished": 30, "suspend": True})
    for rtype in ("Master", "Worker"):
        template = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]
        template["metadata"] = {"annotations": {"sidecar.istio.io/inject": "false"}}
        template["spec"].update(
            volumes=[{"name": "data", "emptyDir": {}}],
            nodeSelector={"pool": "gpu"},
            tolerations=[{"key": "gpu", "operator": "Exists"}],
            serviceAccountName="trainer-sa",
        )
        template["spec"]["containers"] = [container(volumeMounts=[{"name": "data", "mountPath": "/data"}])]
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    spec = out[0]["spec"]
    assert spec["activeDeadlineSeconds"] == 100
    assert spec["ttlSecondsAfterFinished"] == 30
    assert spec["suspend"] is True
    [patch] = spec["runtimePatches"]
    assert patch["manager"] == "trainer.kubeflow.org/migrate"
    [jobset] = [o for o in render(out, capsys, monkeypatch) if o["kind"] == "JobSet"]
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert pod["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}]
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}
    assert pod["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert pod["spec"]["serviceAccountName"] == "trainer-sa"
    assert pod["spec"]["containers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]


def test_elastic_is_refused_naming_the_field(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/pytorch/elastic/echo/echo.yaml's shape: Workers and elasticPolicy."""
    job = pytorchjob(
        name="elastic", elasticPolicy={"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 3}
    )
    good = pytorchjob(name="other")
    code, out, err = migrate([job, good], capsys, monkeypatch)
    assert code == 1
    assert [o["metadata"]["name"] for o in out] == ["other"]  # the others are still converted
    assert "error: PyTorchJob team-a/elastic: spec.elasticPolicy:" in err

    code, out, err = migrate([job], capsys, monkeypatch, "--lossy")
    assert code == 0
    assert [o["metadata"]["name"] for o in out] == ["elastic"]
    assert "Warning: PyTorchJob team-a/elastic: spec.elasticPolicy:" in err


@pytest.mark.parametrize("name", ["Mnist", "1mnist", "mnist.v1", "m" * 64])
def test_bad_name_is_refused(name: str, capsys: Any, monkeypatch: Any) -> None:
    code, out, err = migrate([pytorchjob(name=name)], capsys, monkeypatch, "--lossy")
    assert (code, out) == (1, [])
    assert "metadata.name" in err


def test_differing_templates_are_refused_unless_lossy(capsys: Any, monkeypatch: Any) -> None:
    job = pytorchjob()
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"] = "other:2"
    code, out, err = migrate([job], capsys, monkeypatch)
    assert (code, out) == (1, [])
    assert "spec.pytorchReplicaSpecs.Worker.template" in err
    code, out, err = migrate([job], capsys, monkeypatch, "--lossy")
    assert code == 0
    assert out[0]["spec"]["trainer"]["image"] == "registry.example/mnist:1.0"
    assert "Warning: PyTorchJob team-a/mnist: spec.pytorchReplicaSpecs.Worker.template" in err


def test_what_v2_cannot_set_is_refused(capsys: Any, monkeypatch: Any) -> None:
    job = pytorchjob()
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    code, _, err = migrate([job], capsys, monkeypatch)
    assert code == 1 and "spec.pytorchReplicaSpecs.Master.replicas" in err
    job = pytorchjob()
    for rtype in ("Master", "Worker"):
        job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["hostNetwork"] = True
    code, _, err = migrate([job], capsys, monkeypatch)
    assert code == 1 and "spec.pytorchReplicaSpecs.Master.template.spec.hostNetwork" in err


def test_other_kinds_are_not_supported_yet(capsys: Any, monkeypatch: Any) -> None:
    tfjob = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "tf"}, "spec": {}}
    code, out, err = migrate([tfjob], capsys, monkeypatch)
    assert (code, out) == (1, [])
    assert "kind:" in err and "not supported yet in this version" in err


def test_running_job_is_suspended(capsys: Any, monkeypatch: Any) -> None:
    job = pytorchjob()
    job["metadata"].update(uid="1234", resourceVersion="7", managedFields=[{"manager": "x"}])
    job["status"] = {
        "conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]
    }
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    assert out[0]["spec"]["suspend"] is True
    assert set(out[0]["metadata"]) == {"name", "namespace", "labels"}
    assert "status" not in out[0]
    assert "Warning: PyTorchJob team-a/mnist: status.conditions" in err
    code, out, err = migrate([job], capsys, monkeypatch, "--no-suspend-running")
    assert "suspend" not in out[0]["spec"]


def test_json_output_is_one_list(capsys: Any, monkeypatch: Any) -> None:
    """A v1 List in, one v1 List out."""
    listed = {"apiVersion": "v1", "kind": "List", "items": [pytorchjob(name="a"), pytorchjob(name="b")]}
    code, out, err = run(["migrate", "-f", "-", "-o", "json"], json.dumps(listed), capsys, monkeypatch)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["kind"] == "List"
    assert [i["metadata"]["name"] for i in doc["items"]] == ["a", "b"]


def test_usage_and_syntax_errors_exit_2(capsys: Any, monkeypatch: Any, tmp_path: Path) -> None:
    assert run(["migrate", "-f", "-"], "a: [", capsys, monkeypatch)[0] == 2
    assert run(["migrate", "-f", str(tmp_path / "missing.yaml")], "", capsys, monkeypatch)[0] == 2
    assert run(["migrate", "-f", "-", "-A"], "", capsys, monkeypatch)[0] == 2
    with pytest.raises(SystemExit) as exc:
        main(["migrate"])
    assert exc.value.code == 2


PYTORCHJOB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {
        "group": "kubeflow.org",
        "names": {
            "kind": "PyTorchJob",
            "listKind": "PyTorchJobList",
            "plural": "pytorchjobs",
            "singular": "pytorchjob",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


def test_from_cluster_reads_only(capsys: Any, monkeypatch: Any, tmp_path: Path) -> None:
    from trainer_sandbox.apiserver import LocalAPIServer

    server = LocalAPIServer().start()
    try:
        server.create(PYTORCHJOB_CRD)
        server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
        server.create(pytorchjob(name="in-cluster"))
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", user="migrator")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        server.audit.records.clear()
        code, out, err = run(["migrate", "--from-cluster", "-A"], "", capsys, monkeypatch)
        assert code == 0, err
        [trainjob] = [d for d in yaml.safe_load_all(out) if d]
        assert trainjob["metadata"]["name"] == "in-cluster"
        assert "uid" not in trainjob["metadata"] and "resourceVersion" not in trainjob["metadata"]
        verbs = {r.verb for r in server.audit.records if r.user == "migrator"}
        assert verbs and verbs <= {"get", "list", "watch"}, verbs
        code, out, err = run(["migrate", "--from-cluster", "-n", "elsewhere"], "", capsys, monkeypatch)
        assert (code, out) == (0, "")
    finally:
        server.stop()


def test_from_cluster_on_each_backend(cluster: Any, capsys: Any, monkeypatch: Any, tmp_path: Path) -> None:
    """The v1 CRD as a plain CRD, a PyTorchJob in it: migrate prints its TrainJob, writes nothing."""
    import time

    install = getattr(cluster, "install", None) or cluster.create
    install(PYTORCHJOB_CRD)
    job = pytorchjob(name="from-cluster")
    job["metadata"]["namespace"] = cluster.namespace
    deadline = time.monotonic() + 60
    while True:  # a new CRD is served once it is established
        try:
            cluster.create(job)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    cluster.add_user("migrator")
    cluster.grant("migrator")
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig", user="migrator")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    mark = cluster.audit_mark()
    code, out, err = run(["migrate", "--from-cluster", "-n", cluster.namespace], "", capsys, monkeypatch)
    assert code == 0, err
    [trainjob] = [d for d in yaml.safe_load_all(out) if d]
    assert trainjob["metadata"]["name"] == "from-cluster"
    assert trainjob["metadata"]["namespace"] == cluster.namespace
    assert not {"uid", "resourceVersion", "managedFields", "creationTimestamp"} & set(trainjob["metadata"])
    verbs = {r.verb for r in cluster.audit_since(mark) if r.user == "migrator"}
    assert "list" in verbs and verbs <= {"get", "list", "watch"}, verbs


def test_workers_only_and_pull_policy(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/pytorch/cpu-demo/demo.yaml's shape: Workers only, an
    imagePullPolicy, and a PET_ variable of the user's (v1's own value won over it)."""
    job = pytorchjob(workers=2)
    del job["spec"]["pytorchReplicaSpecs"]["Master"]
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["containers"] = [
        container(
            imagePullPolicy="Always", env=[{"name": "PET_NNODES", "value": "9"}, {"name": "A", "value": "1"}]
        )
    ]
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    assert "imagePullPolicy" in err and "env[PET_NNODES]" in err
    assert out[0]["spec"]["trainer"]["numNodes"] == 2
    [jobset] = [o for o in render(out, capsys, monkeypatch) if o["kind"] == "JobSet"]
    env = env_of(jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0])
    assert env["PET_NNODES"] == "2" and env["A"] == "1" and env["PYTHONUNBUFFERED"] == "0"
    assert "MASTER_ADDR" not in env and "RANK" not in env  # v1 set these only with a Master
