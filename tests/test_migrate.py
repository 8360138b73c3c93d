"""`trainer migrate` for PyTorchJob (kubeflow.org/v1): conversion, refusals, the round trip
through `trainer render`, and --from-cluster against the stand-in API server (read only).

The manifests are our own, in the shape of the training-operator repository's examples
(named at each test); v1's env semantics are written down in docs/migration.md.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from migrate_helpers import COMPLETION_INDEX, env_of, jobset_of, migrate, pods, render, run, v1_crd

from trainer.cli import main


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


def test_simple_round_trip_runs_the_same_pods(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/pytorch/simple.yaml: 1 Master + 1 Worker, no nprocPerNode."""
    job = pytorchjob(workers=3, nproc="4")
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    [trainjob] = out
    assert trainjob["kind"] == "TrainJob"
    assert trainjob["metadata"] == {"name": "mnist", "namespace": "team-a", "labels": {"app": "mnist"}}
    assert trainjob["spec"]["runtimeRef"] == {"name": "torch-distributed"}  # it fits: no runtime of its own
    assert "Warning:" not in err  # OnFailure is what the bundled runtime's pods do

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
    assert env["PYTHONUNBUFFERED"] == "1"  # v1.7 and later
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
    # The refusal names the way through and its price: what v1 did with elasticPolicy that is lost.
    assert "--lossy converts it to a fixed number of nodes, the replicas given; lost: " in err
    for lost in ("minReplicas:maxReplicas", "rdzvBackend", "PET_RDZV_*", "PET_MAX_RESTARTS", "metrics"):
        assert lost in err, lost

    code, out, err = migrate([job], capsys, monkeypatch, "--lossy")
    assert code == 0
    assert [o["metadata"]["name"] for o in out] == ["elastic"]
    assert "Warning: PyTorchJob team-a/elastic: spec.elasticPolicy:" in err
    assert "(--lossy: a fixed number of nodes, the replicas given; lost: " in err


def test_elastic_nproc_per_node_is_carried_under_lossy(capsys: Any, monkeypatch: Any) -> None:
    """v1 set PET_NPROC_PER_NODE from the deprecated elasticPolicy.nProcPerNode (and did not default
    nprocPerNode then), but counted it as 1 in WORLD_SIZE: both are kept under --lossy."""
    job = pytorchjob(workers=2, elasticPolicy={"minReplicas": 1, "maxReplicas": 3, "nProcPerNode": 4})
    code, out, err = migrate([job], capsys, monkeypatch, "--lossy")
    assert code == 0, err
    assert out[0]["spec"]["trainer"]["numProcPerNode"] == 4
    assert "spec.nprocPerNode" not in err
    env = env_of(pods(jobset_of(out, capsys, monkeypatch))["node"][1]["spec"]["containers"][0])
    assert env["PET_NPROC_PER_NODE"] == "4"
    assert env["WORLD_SIZE"] == "3"  # v1: replicas x nprocPerNode as a number, else x 1


@pytest.mark.parametrize("nproc", [None, "auto"])
def test_nproc_per_node_auto_with_gpus_converts_silently(
    nproc: str | None, capsys: Any, monkeypatch: Any
) -> None:
    """v1 defaulted nprocPerNode to 'auto'; with GPUs on the node v2 sets 'auto' too, so torchrun
    starts the processes it started under v1 and there is nothing to warn about."""
    job = pytorchjob(workers=1, nproc=nproc)
    for rtype in ("Master", "Worker"):
        [main] = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"]
        main["resources"] = {"limits": {"nvidia.com/gpu": 2, "cpu": "8"}}
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    assert "Warning:" not in err
    assert "numProcPerNode" not in out[0]["spec"]["trainer"]
    env = env_of(pods(jobset_of(out, capsys, monkeypatch))["node"][1]["spec"]["containers"][0])
    assert env["PET_NPROC_PER_NODE"] == "auto"
    assert env["WORLD_SIZE"] == "2"  # v1 counted 'auto' as 1


def test_nproc_per_node_auto_without_gpus_is_said(capsys: Any, monkeypatch: Any) -> None:
    """Without GPUs torchrun resolved v1's 'auto' to the machine's CPU count, v2 sets the CPUs of
    resourcesPerNode: a real difference, said with the number v2 uses."""
    code, out, err = migrate([pytorchjob()], capsys, monkeypatch)  # limits cpu "2", no GPU
    assert code == 0, err
    assert (
        "Warning: PyTorchJob team-a/mnist: spec.nprocPerNode: 'auto' (v1's default): without GPUs "
        "torchrun resolved it to the machine's CPU count; v2 sets PET_NPROC_PER_NODE to 2 instead"
    ) in err
    env = env_of(pods(jobset_of(out, capsys, monkeypatch))["node"][1]["spec"]["containers"][0])
    assert env["PET_NPROC_PER_NODE"] == "2"


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


def test_what_a_patch_cannot_carry_gets_a_runtime_of_its_own(capsys: Any, monkeypatch: Any) -> None:
    """A sidecar, an init container, hostNetwork, a priority class, an image pull policy, restart
    Never and a backoffLimit: the job gets a TrainingRuntime named after it, which carries them all."""
    job = pytorchjob(workers=2, runPolicy={"backoffLimit": 3})
    for rtype in ("Master", "Worker"):
        replica = job["spec"]["pytorchReplicaSpecs"][rtype]
        replica["restartPolicy"] = "Never"
        replica["template"]["spec"].update(
            hostNetwork=True,
            priorityClassName="high",
            initContainers=[{"name": "fetch", "image": "busybox", "command": ["true"]}],
            containers=[
                container(imagePullPolicy="Always"),
                {
                    "name": "sidecar",
                    "image": "registry.example/log-shipper:1",
                    "env": [{"name": "SHIP_TO", "value": "logs"}, {"name": "RANK", "value": "99"}],
                },
            ],
        )
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    runtime, trainjob = out
    assert (runtime["kind"], runtime["metadata"]["name"], runtime["metadata"]["namespace"]) == (
        "TrainingRuntime",
        "mnist",
        "team-a",
    )
    assert trainjob["spec"]["runtimeRef"] == {"name": "mnist", "kind": "TrainingRuntime"}
    assert trainjob["spec"]["trainer"] == {"numNodes": 3}
    [node] = jobset_of(out, capsys, monkeypatch)["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["backoffLimit"] == 3
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["priorityClassName"] == "high"
    assert pod["restartPolicy"] == "Never"
    assert [x["name"] for x in pod["initContainers"]] == ["fetch"]
    main_container, sidecar = pod["containers"]
    assert main_container["name"] == "node" and main_container["imagePullPolicy"] == "Always"
    assert main_container["command"] == ["python3", "/opt/mnist/train.py", "--epochs=1"]
    assert sidecar["image"] == "registry.example/log-shipper:1"
    env = env_of(main_container)
    assert env["PET_NNODES"] == "3" and env["MASTER_ADDR"] == "mnist-node-0-0.mnist" and env["LR"] == "0.01"
    # v1 appended its env to every container, sidecars too (its value of a name won): the sidecar
    # sees what the training container sees of it, PET_* through the runtime's envInjection.
    sidecar_env = env_of(sidecar)
    assert sidecar_env["SHIP_TO"] == "logs" and "LR" not in sidecar_env
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONUNBUFFERED", "PET_NNODES"):
        assert sidecar_env[name] == env[name], name
    assert sidecar_env["RANK"] == {"fieldRef": {"fieldPath": COMPLETION_INDEX}}
    assert [e["name"] for e in sidecar["env"]].count("RANK") == 1
    assert not pod["initContainers"][0].get("env")  # v1 set none on init containers
    assert runtime["spec"]["mlPolicy"]["torch"] == {
        "envInjection": {"targets": [{"jobName": "node", "containerNames": ["sidecar"]}]}
    }

    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    code, _, err = migrate([job], capsys, monkeypatch)
    assert code == 1 and "spec.pytorchReplicaSpecs.Master.replicas" in err


def test_a_sidecar_named_node_is_refused_and_only_eight_get_pet_env(capsys: Any, monkeypatch: Any) -> None:
    """v2 renames the training container ``node``: a sidecar of that name would be a second one.
    envInjection names at most 8 containers: the ninth sidecar gets v1's env, not PET_* (Warning)."""
    job = pytorchjob()
    for rtype in ("Master", "Worker"):
        job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"].append(
            {"name": "node", "image": "registry.example/log-shipper:1"}
        )
    code, out, err = migrate([job], capsys, monkeypatch)
    assert (code, out) == (1, [])
    assert "spec.pytorchReplicaSpecs.Master.template.spec.containers[node]: v2 renames" in err

    job = pytorchjob()
    for rtype in ("Master", "Worker"):
        job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"] += [
            {"name": f"side-{i}", "image": "registry.example/log-shipper:1"} for i in range(9)
        ]
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    assert "PET_* go to at most 8 containers beside the training one (envInjection); not to side-8" in err
    runtime, _ = out
    [target] = runtime["spec"]["mlPolicy"]["torch"]["envInjection"]["targets"]
    assert target["containerNames"] == [f"side-{i}" for i in range(8)]
    [node] = jobset_of(out, capsys, monkeypatch)["spec"]["replicatedJobs"]
    containers = {x["name"]: env_of(x) for x in node["template"]["spec"]["template"]["spec"]["containers"]}
    assert "PET_NNODES" in containers["side-7"] and "PET_NNODES" not in containers["side-8"]
    assert containers["side-8"]["RANK"] == {"fieldRef": {"fieldPath": COMPLETION_INDEX}}


def test_exit_code_restart_policy_is_a_pod_failure_policy(capsys: Any, monkeypatch: Any) -> None:
    """v1's ExitCode: 1-127 fail the job at once, the others are retried (as restarts of the pod)."""
    job = pytorchjob()
    for rtype in ("Master", "Worker"):
        job["spec"]["pytorchReplicaSpecs"][rtype]["restartPolicy"] = "ExitCode"
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    [node] = jobset_of(out, capsys, monkeypatch)["spec"]["replicatedJobs"]
    spec = node["template"]["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    [rule] = spec["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"] == {"operator": "In", "values": list(range(1, 128))}


def test_not_a_v1_job_is_refused_naming_the_field(capsys: Any, monkeypatch: Any) -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {}}
    code, out, err = migrate([job], capsys, monkeypatch)
    assert (code, out) == (1, [])
    assert "error: Job j: kind: batch/v1 Job is not a Training Operator v1 job" in err
    job = pytorchjob()
    job["apiVersion"] = "kubeflow.org/v2beta1"
    code, out, err = migrate([job], capsys, monkeypatch)
    assert (code, out) == (1, [])
    assert "apiVersion: kubeflow.org/v2beta1 is not a version of PyTorchJob" in err


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


PYTORCHJOB_CRD = v1_crd("PyTorchJob")


def test_from_cluster_reads_only(capsys: Any, monkeypatch: Any, tmp_path: Path) -> None:
    """Only the kinds the cluster serves are read (the others are skipped), MPIJob as v1 where
    that is the version served, by LIST requests alone; a cluster with none of them says so."""
    from trainer_sandbox.sandbox import local_apiserver
    from v1_examples import horovod

    server = local_apiserver().start()
    try:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig", user="migrator")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        code, out, err = run(["migrate", "--from-cluster", "-A"], "", capsys, monkeypatch)
        assert (code, out) == (0, "")
        assert "note: the cluster serves none of the v1 kinds" in err

        server.create(PYTORCHJOB_CRD)
        server.create(v1_crd("MPIJob"))  # the Training Operator's MPIJob only
        server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
        server.create(pytorchjob(name="in-cluster"))
        mpijob = horovod()
        mpijob["metadata"]["namespace"] = "team-a"
        server.create(mpijob)
        server.audit.records.clear()
        code, out, err = run(["migrate", "--from-cluster", "-A"], "", capsys, monkeypatch)
        assert code == 0, err
        objects = [d for d in yaml.safe_load_all(out) if d]
        assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
            ("TrainJob", "in-cluster"),
            ("TrainingRuntime", "tensorflow-mnist"),
            ("TrainJob", "tensorflow-mnist"),
        ]
        assert "kubectl exec" in err  # converted as the v1 MPIJob it is
        assert "uid" not in objects[0]["metadata"] and "resourceVersion" not in objects[0]["metadata"]
        verbs = {r.verb for r in server.audit.records if r.user == "migrator"}
        assert verbs and verbs <= {"get", "list", "watch"}, verbs
        code, out, err = run(["migrate", "--from-cluster", "-n", "elsewhere"], "", capsys, monkeypatch)
        assert (code, out) == (0, "")
    finally:
        server.stop()


def test_workers_only_and_a_pet_variable_of_the_users(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/pytorch/cpu-demo/demo.yaml's shape: Workers only, and a PET_
    variable of the user's (v1's own value won over it)."""
    job = pytorchjob(workers=2)
    del job["spec"]["pytorchReplicaSpecs"]["Master"]
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["containers"] = [
        container(env=[{"name": "PET_NNODES", "value": "9"}, {"name": "A", "value": "1"}])
    ]
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    assert "env[PET_NNODES]" in err
    assert out[0]["spec"]["trainer"]["numNodes"] == 2
    env = env_of(pods(jobset_of(out, capsys, monkeypatch))["node"][1]["spec"]["containers"][0])
    assert env["PET_NNODES"] == "2" and env["A"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert "MASTER_ADDR" not in env and "RANK" not in env  # v1 set these only with a Master


@pytest.mark.parametrize(
    ("name", "fixed"),
    [("Mnist", "mnist-"), ("1mnist", "j-1mnist-"), ("mnist.v1", "mnist-v1-"), ("m" * 70, "m" * 56 + "-")],
)
def test_fix_names_maps_each_invalid_name(name: str, fixed: str, capsys: Any, monkeypatch: Any) -> None:
    code, out, err = migrate([pytorchjob(name=name)], capsys, monkeypatch, "--fix-names")
    assert code == 0, err
    new = out[0]["metadata"]["name"]
    assert new.startswith(fixed) and len(new) <= 63 and new == new.lower()
    assert f"Warning: PyTorchJob team-a/{name}: metadata.name:" in err and repr(new) in err
    code, again, _ = migrate([pytorchjob(name=name)], capsys, monkeypatch, "--fix-names")
    assert again[0]["metadata"]["name"] == new  # the same name every time
    render(out, capsys, monkeypatch)  # and a valid TrainJob


def test_two_kinds_of_one_name_are_not_both_converted(capsys: Any, monkeypatch: Any) -> None:
    """A PyTorchJob and a TFJob named alike in one namespace would be one TrainJob: the second
    is refused, naming the first."""
    tfjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "mnist", "namespace": "team-a"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {"template": {"spec": {"containers": [{"name": "tensorflow", "image": "t"}]}}}
            }
        },
    }
    code, out, err = migrate([pytorchjob(), tfjob], capsys, monkeypatch)
    assert code == 1
    assert [o["kind"] for o in out] == ["TrainJob"] and out[0]["spec"]["runtimeRef"][
        "name"
    ] == "torch-distributed"
    assert (
        "error: TFJob team-a/mnist: metadata.name: PyTorchJob team-a/mnist becomes the TrainJob 'mnist'"
        in err
    )
    tfjob["metadata"]["namespace"] = "team-b"
    code, out, err = migrate([pytorchjob(), tfjob], capsys, monkeypatch)
    assert code == 0, err


def test_a_typed_list_as_the_api_serves_it(capsys: Any, monkeypatch: Any) -> None:
    """A PyTorchJobList saved from the API: its items have no apiVersion or kind; they are the list's."""
    items = []
    for name in ("a", "b"):
        job = pytorchjob(name=name)
        del job["apiVersion"], job["kind"]
        items.append(job)
    listed = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJobList", "metadata": {}, "items": items}
    code, out, err = run(["migrate", "-f", "-"], json.dumps(listed), capsys, monkeypatch)
    assert code == 0, err
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out) if d] == ["a", "b"]
