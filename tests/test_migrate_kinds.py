"""`trainer migrate` for XGBoostJob, JAXJob, PaddleJob, TFJob and MPIJob (v1 and v2beta1): the round
trip through `trainer render` runs the pods v1 ran, with v1's env (docs/migration.md).

The manifests are our own, in the shape of the upstream examples named at each test or in
tests/v1_examples.py (the training-operator and mpi-operator repositories); none is copied.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from migrate_helpers import COMPLETION_INDEX, env_of, jobset_of, migrate, pods, render
from v1_examples import (
    every_kind,
    horovod,
    paddle_container,
    paddle_replica,
    pi,
    replica,
    tensorflow,
    v1job,
    xgboost_container,
    xgboost_iris,
)

INDEX = {"fieldRef": {"fieldPath": COMPLETION_INDEX}}


# --- XGBoostJob ---


def test_xgboost_iris_master_and_workers(capsys: Any, monkeypatch: Any) -> None:
    """xgboostjob_v1_iris_train.yaml's shape (tests/v1_examples.py): Never and ExitCode mixed, the
    container named xgboostjob."""
    code, out, err = migrate([xgboost_iris()], capsys, monkeypatch)
    assert code == 0, err
    assert "'ExitCode' for all" in err  # Never and ExitCode: the nearest one policy, said
    # The one container, named as the example names it, is the training container.
    assert "spec.xgbReplicaSpecs.Master.template.spec.containers[xgboostjob]: is not named 'xgboost'" in err
    runtime, trainjob = out
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 3, "xgboost": {}}
    assert trainjob["spec"]["trainer"]["numNodes"] == 3
    [(count, pod)] = pods(jobset_of(out, capsys, monkeypatch)).values()
    assert count == 3
    [node] = pod["spec"]["containers"]
    assert node["image"] == "registry.example/xgboost-dist-iris:1.1"
    assert node["args"] == xgboost_container()["args"]
    env = env_of(node)
    name = "xgboost-dist-iris"
    assert env["MASTER_ADDR"] == f"{name}-node-0-0.{name}" and env["MASTER_PORT"] == "9991"
    assert (
        env["WORLD_SIZE"] == "3" and env["RANK"] == INDEX and env["PYTHONUNBUFFERED"] == "1"
    )  # v1.7 and later, as v1.9.4 sets it
    assert env["WORKER_PORT"] == "9991"
    assert env["WORKER_ADDRS"] == f"{name}-node-0-1.{name},{name}-node-0-2.{name}"
    # The v2 plugin's own tracker env, beside v1's.
    assert env["DMLC_NUM_WORKER"] == "3" and env["DMLC_TASK_ID"] == INDEX


def test_xgboost_same_policy_fits_the_bundled_runtime(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/xgboost/smoke-dist/xgboostjob_v1_rabit_test.yaml: Never
    everywhere, no args; but OnFailure here, which is the bundled runtime's."""
    spec = {
        "xgbReplicaSpecs": {r: replica(1, "OnFailure", xgboost_container()) for r in ("Master", "Worker")}
    }
    code, out, err = migrate([v1job("XGBoostJob", "rabit", spec)], capsys, monkeypatch)
    assert code == 0, err
    [trainjob] = out
    assert trainjob["spec"]["runtimeRef"] == {"name": "xgboost-distributed"}
    env = env_of(pods(jobset_of(out, capsys, monkeypatch))["node"][1]["spec"]["containers"][0])
    assert env["WORLD_SIZE"] == "2" and env["WORKER_ADDRS"] == "rabit-node-0-1.rabit"
    del spec["xgbReplicaSpecs"]["Master"]
    code, out, err = migrate([v1job("XGBoostJob", "rabit", spec)], capsys, monkeypatch)
    assert code == 1 and "spec.xgbReplicaSpecs.Master: missing" in err
    # Two containers and neither is v1's xgboost: which one trains is not known.
    pair = [xgboost_container("a"), xgboost_container("b")]
    two = {"xgbReplicaSpecs": {"Master": {"template": {"spec": {"containers": pair}}}}}
    code, out, err = migrate([v1job("XGBoostJob", "two", two)], capsys, monkeypatch)
    assert code == 1 and "containers: no container named 'xgboost'" in err


# --- JAXJob ---


def test_jax_cpu_demo(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/jax/cpu-demo/demo.yaml: 2 Workers, OnFailure, no ports."""
    jax = {"name": "jax", "image": "registry.example/jaxgoogle:1", "command": ["python3", "train.py"]}
    job = v1job("JAXJob", "jaxjob-simple", {"jaxReplicaSpecs": {"Worker": replica(2, "OnFailure", jax)}})
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    [trainjob] = out
    assert trainjob["spec"]["runtimeRef"] == {"name": "jax-distributed"}
    [(count, pod)] = pods(jobset_of(out, capsys, monkeypatch)).values()
    assert count == 2
    env = env_of(pod["spec"]["containers"][0])
    assert pod["spec"]["containers"][0]["command"] == ["python3", "train.py"]
    assert env["COORDINATOR_ADDRESS"] == "jaxjob-simple-node-0-0.jaxjob-simple"
    assert env["COORDINATOR_PORT"] == "6666"  # v1's default port
    assert env["NUM_PROCESSES"] == "2" and env["PROCESS_ID"] == INDEX and env["PYTHONUNBUFFERED"] == "1"
    assert env["JAX_NUM_PROCESSES"] == "2"  # and v2's own


# --- PaddleJob ---


def test_paddle_collective(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/paddlepaddle/simple-gpu.yaml: 2 Workers (collective mode),
    port 37777 named master, 2 GPUs each, /dev/shm from memory."""
    spec = {"paddleReplicaSpecs": {"Worker": paddle_replica(2)}}
    code, out, err = migrate([v1job("PaddleJob", "paddle-simple", spec)], capsys, monkeypatch)
    assert code == 0, err
    runtime, trainjob = out
    assert runtime["kind"] == "TrainingRuntime" and runtime["spec"]["mlPolicy"] == {"numNodes": 2}
    assert trainjob["spec"]["runtimeRef"] == {"name": "paddle-simple", "kind": "TrainingRuntime"}
    [(count, pod)] = pods(jobset_of(out, capsys, monkeypatch)).values()
    assert count == 2
    [node] = pod["spec"]["containers"]
    assert node["args"] == ["-m", "paddle.distributed.launch", "run_check"]
    assert node["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert pod["spec"]["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    env = env_of(node)
    assert env["PADDLE_MASTER"] == "paddle-simple-node-0-0.paddle-simple:37777"
    assert env["PADDLE_NNODES"] == "2" and env["PADDLE_JOB_ID"] == "paddle-simple"
    assert env["POD_IP_DUMMY"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_paddle_parameter_servers_are_refused(capsys: Any, monkeypatch: Any) -> None:
    spec = {"paddleReplicaSpecs": {r: paddle_replica(2, "Never") for r in ("Master", "Worker")}}
    code, out, err = migrate([v1job("PaddleJob", "ps", spec)], capsys, monkeypatch, "--lossy")
    assert (code, out) == (1, [])
    assert "spec.paddleReplicaSpecs.Master: a PaddleJob with a Master runs in parameter-server mode" in err


def test_paddle_port_only_from_the_container_named_paddle(capsys: Any, monkeypatch: Any) -> None:
    """v1 read PADDLE_MASTER's port from the container named paddle alone and took 36543 for any
    other, even one declaring a port named master."""
    main = {**paddle_container(), "name": "trainer"}
    spec = {"paddleReplicaSpecs": {"Worker": replica(2, "OnFailure", main)}}
    code, out, err = migrate([v1job("PaddleJob", "renamed", spec)], capsys, monkeypatch)
    assert code == 0, err
    env = env_of(pods(jobset_of(out, capsys, monkeypatch))["node"][1]["spec"]["containers"][0])
    assert env["PADDLE_MASTER"] == "renamed-node-0-0.renamed:36543"


# --- sidecars ---

SIDECAR = {
    "name": "metrics",
    "image": "registry.example/exporter:1",
    "env": [{"name": "PORT", "value": "9100"}],
}
JAX = {"name": "jax", "image": "registry.example/jaxgoogle:1", "command": ["python3", "train.py"]}


@pytest.mark.parametrize(
    ("kind", "specs", "replicas", "v1_env"),
    [
        (
            "XGBoostJob",
            "xgbReplicaSpecs",
            {"Master": 1, "Worker": 2},
            ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "WORKER_ADDRS", "PYTHONUNBUFFERED"),
        ),
        ("JAXJob", "jaxReplicaSpecs", {"Worker": 2}, ("COORDINATOR_ADDRESS", "NUM_PROCESSES", "PROCESS_ID")),
        (
            "PaddleJob",
            "paddleReplicaSpecs",
            {"Worker": 2},
            ("PADDLE_MASTER", "PADDLE_NNODES", "POD_IP_DUMMY"),
        ),
    ],
)
def test_a_sidecar_sees_the_env_v1_set_on_every_container(
    kind: str, specs: str, replicas: dict[str, int], v1_env: tuple[str, ...], capsys: Any, monkeypatch: Any
) -> None:
    """v1's XGBoost, JAX and Paddle controllers appended their env to every container of a pod;
    a sidecar of the migrated pod sees the same names and values as the training container."""
    main = {"XGBoostJob": xgboost_container(), "JAXJob": JAX, "PaddleJob": paddle_container()}[kind]
    spec = {specs: {rtype: replica(n, "OnFailure", main, SIDECAR) for rtype, n in replicas.items()}}
    code, out, err = migrate([v1job(kind, "side", spec)], capsys, monkeypatch)
    assert code == 0, err
    [(_, pod)] = pods(jobset_of(out, capsys, monkeypatch)).values()
    node, sidecar = pod["spec"]["containers"]
    assert (node["name"], sidecar["name"]) == ("node", "metrics")
    node_env, sidecar_env = env_of(node), env_of(sidecar)
    for name in v1_env:
        assert sidecar_env[name] == node_env[name], name
    assert sidecar_env["PORT"] == "9100"
    assert not any(name.startswith(("DMLC_", "JAX_")) for name in sidecar_env)  # v2's own: node only


def test_a_tfjob_sidecar_gets_no_tf_config(capsys: Any, monkeypatch: Any) -> None:
    """v1's TFJob controller set TF_CONFIG on the container named tensorflow alone."""
    spec = {"tfReplicaSpecs": {"Worker": replica(2, "OnFailure", tensorflow(), SIDECAR)}}
    code, out, err = migrate([v1job("TFJob", "side", spec)], capsys, monkeypatch)
    assert code == 0, err
    [(_, pod)] = pods(jobset_of(out, capsys, monkeypatch)).values()
    node, sidecar = pod["spec"]["containers"]
    assert "TF_CONFIG" in env_of(node)
    assert env_of(sidecar) == {"PORT": "9100"}


# --- TFJob ---


def test_tfjob_of_workers(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/tensorflow/simple.yaml: 2 Workers (MultiWorkerMirrored)."""
    job = v1job(
        "TFJob", "tfjob-simple", {"tfReplicaSpecs": {"Worker": replica(2, "OnFailure", tensorflow())}}
    )
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    jobset = jobset_of(out, capsys, monkeypatch)
    [(count, pod)] = pods(jobset).values()
    assert count == 2
    env = env_of(pod["spec"]["containers"][0])
    assert env["TF_TASK_INDEX"] == INDEX
    # Kubernetes puts the index in place of $(TF_TASK_INDEX) in each pod.
    config = json.loads(env["TF_CONFIG"].replace("$(TF_TASK_INDEX)", "1"))
    hosts = [f"tfjob-simple-node-0-{i}.tfjob-simple.ml.svc:2222" for i in range(2)]
    assert config == {
        "cluster": {"worker": hosts},
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }
    # Without a Chief, v1's job succeeded when Worker 0 did.
    assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["successPolicy"] == {
        "rules": [{"succeededIndexes": "0"}]
    }


def test_tfjob_with_a_chief_and_an_evaluator(capsys: Any, monkeypatch: Any) -> None:
    """A Chief, Workers and an Evaluator, each its own replicated job with its own task type."""
    spec = {
        "tfReplicaSpecs": {
            "Chief": replica(1, "Never", tensorflow(ports=[{"name": "tfjob-port", "containerPort": 3333}])),
            "Worker": replica(3, "Never", tensorflow()),
            "Evaluator": replica(1, "Never", tensorflow(image="registry.example/eval:1")),
        }
    }
    code, out, err = migrate([v1job("TFJob", "mwms", spec)], capsys, monkeypatch)
    assert code == 0, err
    jobset = jobset_of(out, capsys, monkeypatch)
    by_job = pods(jobset)
    assert {k: v[0] for k, v in by_job.items()} == {"chief": 1, "node": 3, "evaluator": 1}
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    chief = env_of(by_job["chief"][1]["spec"]["containers"][0])
    config = json.loads(chief["TF_CONFIG"].replace("$(TF_TASK_INDEX)", "0"))
    assert list(config["cluster"]) == ["chief", "evaluator", "worker"]  # v1 wrote them sorted
    assert config["cluster"]["chief"] == ["mwms-chief-0-0.mwms.ml.svc:3333"]
    assert config["cluster"]["worker"][2] == "mwms-node-0-2.mwms.ml.svc:2222"
    assert config["task"] == {"type": "chief", "index": 0}
    evaluator = by_job["evaluator"][1]["spec"]["containers"][0]
    assert evaluator["image"] == "registry.example/eval:1"
    assert '"type":"evaluator"' in env_of(evaluator)["TF_CONFIG"]


def test_tfjob_tf_config_only_in_a_container_named_tensorflow(capsys: Any, monkeypatch: Any) -> None:
    """v1 wrote TF_CONFIG into the container named tensorflow alone, and took the default port 2222
    for the cluster addresses of a replica type whose container is named otherwise."""
    worker = tensorflow(name="tf", ports=[{"name": "tfjob-port", "containerPort": 3333}])
    spec = {
        "tfReplicaSpecs": {"Chief": replica(1, "Never", tensorflow()), "Worker": replica(2, "Never", worker)}
    }
    code, out, err = migrate([v1job("TFJob", "renamed", spec)], capsys, monkeypatch)
    assert code == 0, err
    assert (
        "spec.tfReplicaSpecs.Worker.template.spec.containers[tf].env: v1 set TF_CONFIG only in a "
        "container named 'tensorflow', so this one ran without it"
    ) in err
    by_job = pods(jobset_of(out, capsys, monkeypatch))
    assert "TF_CONFIG" not in env_of(by_job["node"][1]["spec"]["containers"][0])
    chief = env_of(by_job["chief"][1]["spec"]["containers"][0])["TF_CONFIG"]
    config = json.loads(chief.replace("$(TF_TASK_INDEX)", "0"))
    assert config["cluster"]["worker"] == [f"renamed-node-0-{i}.renamed.ml.svc:2222" for i in range(2)]


def test_tfjob_a_type_without_replicas_is_an_empty_list(capsys: Any, monkeypatch: Any) -> None:
    """v1's TF_CONFIG named every replica type of the spec, one of no replicas as []."""
    spec = {
        "tfReplicaSpecs": {
            "Worker": replica(2, "Never", tensorflow()),
            "Evaluator": replica(0, "Never", tensorflow()),
        }
    }
    code, out, err = migrate([v1job("TFJob", "noeval", spec)], capsys, monkeypatch)
    assert code == 0, err
    [(_, pod)] = pods(jobset_of(out, capsys, monkeypatch)).values()
    config = json.loads(env_of(pod["spec"]["containers"][0])["TF_CONFIG"].replace("$(TF_TASK_INDEX)", "0"))
    assert config["cluster"] == {
        "evaluator": [],
        "worker": [f"noeval-node-0-{i}.noeval.ml.svc:2222" for i in range(2)],
    }


def test_tfjob_parameter_servers_are_refused(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/tensorflow/dist-mnist/tf_job_mnist.yaml: 2 PS and 4 Workers."""
    image = {"name": "tensorflow", "image": "registry.example/tf-dist-mnist-test:1.0"}
    spec = {"tfReplicaSpecs": {"PS": replica(2, "Never", image), "Worker": replica(4, "Never", image)}}
    code, out, err = migrate([v1job("TFJob", "dist-mnist", spec)], capsys, monkeypatch, "--lossy")
    assert (code, out) == (1, [])
    assert "error: TFJob ml/dist-mnist: spec.tfReplicaSpecs.PS: parameter servers" in err


# --- MPIJob ---


def rendered(out: list[dict[str, Any]], capsys: Any, monkeypatch: Any) -> dict[str, dict[str, Any]]:
    """The JobSet, the hostfile ConfigMap and the SSH Secret."""
    objects = render(out, capsys, monkeypatch)
    found = {o["kind"]: o for o in objects if o["kind"] in ("JobSet", "Secret")}
    found["ConfigMap"] = next(o for o in objects if o["metadata"]["name"].endswith("-mpi-hostfile"))
    return found


def test_mpijob_v2beta1_pi(capsys: Any, monkeypatch: Any) -> None:
    code, out, err = migrate([pi()], capsys, monkeypatch)
    assert code == 0, err
    runtime, trainjob = out
    assert runtime["spec"]["mlPolicy"]["mpi"] == {
        "numProcPerNode": 1,
        "mpiImplementation": "OpenMPI",
        "sshAuthMountPath": "/home/mpiuser/.ssh",
        "runLauncherAsNode": False,
    }
    assert trainjob["spec"]["ttlSecondsAfterFinished"] == 60
    objects = rendered(out, capsys, monkeypatch)
    jobset = objects["JobSet"]
    by_job = pods(jobset)
    assert {k: v[0] for k, v in by_job.items()} == {"launcher": 1, "node": 2}
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}
    [launcher] = by_job["launcher"][1]["spec"]["containers"]
    assert launcher["command"] == ["mpirun"] and launcher["args"] == ["-n", "2", "/home/mpiuser/pi"]
    assert launcher["securityContext"] == {"runAsUser": 1000}
    env = env_of(launcher)
    assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert env["OMPI_MCA_orte_set_default_slots"] == "1"
    assert env["K_MPI_JOB_ROLE"] == "launcher" and env["NVIDIA_VISIBLE_DEVICES"] == ""
    assert {"name": "mpi-ssh-auth", "mountPath": "/home/mpiuser/.ssh"} in launcher["volumeMounts"]
    launcher_job = next(r for r in jobset["spec"]["replicatedJobs"] if r["name"] == "launcher")
    assert launcher_job["template"]["spec"]["backoffLimit"] == 0  # v2beta1 gave it to the launcher Job
    [worker] = by_job["node"][1]["spec"]["containers"]
    assert worker["command"] == ["/usr/sbin/sshd"] and env_of(worker)["K_MPI_JOB_ROLE"] == "worker"
    assert {"name": "mpi-ssh-auth", "mountPath": "/home/mpiuser/.ssh"} in worker["volumeMounts"]
    assert objects["ConfigMap"]["data"]["hostfile"] == "pi-node-0-0.pi slots=1\npi-node-0-1.pi slots=1\n"


def test_mpijob_v2beta1_mpich_and_launcher_as_worker(capsys: Any, monkeypatch: Any) -> None:
    """mpi-operator examples/v2beta1/pi/pi-mpich.yaml (MPICH, a worker readiness probe), with the
    Launcher as a worker, 4 slots, and the Launcher made after the Workers are ready."""
    job = pi(
        "MPICH", slotsPerWorker=4, runLauncherAsWorker=True, launcherCreationPolicy="WaitForWorkersReady"
    )
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["readinessProbe"] = {"tcpSocket": {"port": 2222}, "initialDelaySeconds": 2}
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    assert (
        "spec.launcherCreationPolicy: with runLauncherAsWorker, the Launcher's hostfile line comes after"
        in err
    )
    assert out[1]["spec"]["trainer"] == {"numNodes": 3, "numProcPerNode": 4}
    objects = rendered(out, capsys, monkeypatch)
    by_job = pods(objects["JobSet"])
    assert {k: v[0] for k, v in by_job.items()} == {"node": 2, "launcher": 1}
    launcher_job = next(r for r in objects["JobSet"]["spec"]["replicatedJobs"] if r["name"] == "launcher")
    assert launcher_job["dependsOn"] == [{"name": "node", "status": "Ready"}]
    env = env_of(by_job["launcher"][1]["spec"]["containers"][0])
    assert env["HYDRA_HOST_FILE"] == "/etc/mpi/hostfile" and "NVIDIA_VISIBLE_DEVICES" not in env
    assert by_job["node"][1]["spec"]["containers"][0]["readinessProbe"]["tcpSocket"] == {"port": 2222}
    assert objects["ConfigMap"]["data"]["hostfile"].splitlines() == [
        "pi-node-0-0.pi:4",
        "pi-node-0-1.pi:4",
        "pi-launcher-0-0.pi:4",
    ]
    # Without the creation policy, the Launcher's line comes first, as in v2beta1.
    del job["spec"]["launcherCreationPolicy"]
    code, out, err = migrate([job], capsys, monkeypatch)
    hostfile = rendered(out, capsys, monkeypatch)["ConfigMap"]["data"]["hostfile"]
    assert hostfile.splitlines()[0] == "pi-launcher-0-0.pi:4"


def test_mpijob_v1_horovod(capsys: Any, monkeypatch: Any) -> None:
    """training-operator examples/mpi/tensorflow-mnist.yaml (tests/v1_examples.py): Workers
    with no command, which v1 reached by kubectl exec, get an SSH server."""
    code, out, err = migrate([horovod()], capsys, monkeypatch)
    assert code == 0, err
    assert "kubectl exec" in err and "containers[mpi].command" in err
    by_job = pods(rendered(out, capsys, monkeypatch)["JobSet"])
    assert {k: v[0] for k, v in by_job.items()} == {"launcher": 1, "node": 2}
    [node] = by_job["node"][1]["spec"]["containers"]
    assert node["command"] == ["/usr/sbin/sshd", "-De"]  # an SSH server instead of v1's sleep
    assert node["resources"] == {"limits": {"cpu": "2", "memory": "4Gi"}}
    assert {"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"} in node["volumeMounts"]
    assert by_job["launcher"][1]["spec"]["containers"][0]["args"][:2] == ["-np", "2"]


def test_mpijob_v1_kubexec_env_is_named(capsys: Any, monkeypatch: Any) -> None:
    """v1 pointed OpenMPI and Intel MPI at its kubectl exec script; the Warning names each variable."""
    code, _, err = migrate([horovod()], capsys, monkeypatch)
    assert code == 0, err
    for name in ("OMPI_MCA_plm_rsh_agent", "I_MPI_HYDRA_BOOTSTRAP=rsh", "I_MPI_HYDRA_BOOTSTRAP_EXEC"):
        assert name in err, name


@pytest.mark.parametrize(
    "launcher_gpu",
    [
        pytest.param("sidecar", id="a-launcher-sidecar-with-a-gpu"),
        pytest.param("zero", id="a-gpu-limit-of-0"),
    ],
)
def test_mpijob_v1_gpu_launcher_as_v1_decided_it(launcher_gpu: str, capsys: Any, monkeypatch: Any) -> None:
    """v1 took a Launcher for a GPU one (in the hostfile, NVIDIA_* left alone) when any of its
    containers had a limit named like a GPU, whatever the count; else it blanked NVIDIA_*."""
    job = horovod()
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    if launcher_gpu == "sidecar":
        launcher["containers"].append(
            {"name": "probe", "image": "p:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}
        )
    else:
        launcher["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 0
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    runtime, trainjob = out
    assert runtime["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] is True
    assert trainjob["spec"]["trainer"]["numNodes"] == 3
    env = env_of(pods(rendered(out, capsys, monkeypatch)["JobSet"])["launcher"][1]["spec"]["containers"][0])
    assert "NVIDIA_VISIBLE_DEVICES" not in env and "NVIDIA_DRIVER_CAPABILITIES" not in env
    # A CPU launcher: blanked, as before.
    code, out, err = migrate([horovod()], capsys, monkeypatch)
    env = env_of(pods(rendered(out, capsys, monkeypatch)["JobSet"])["launcher"][1]["spec"]["containers"][0])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "" and env["NVIDIA_DRIVER_CAPABILITIES"] == ""


@pytest.mark.parametrize(
    ("policy", "field"),
    [({"Launcher": None}, "Launcher"), ({"Chief": {}}, "Chief")],
)
def test_mpijob_shape_refusals(policy: dict[str, Any], field: str, capsys: Any, monkeypatch: Any) -> None:
    job = pi()
    specs = job["spec"]["mpiReplicaSpecs"]
    for key, value in policy.items():
        if value is None:
            del specs[key]
        else:
            specs[key] = value
    code, out, err = migrate([job], capsys, monkeypatch)
    assert (code, out) == (1, [])
    assert f"spec.mpiReplicaSpecs.{field}" in err


# --- runPolicy.schedulingPolicy ---


def test_volcano_gang_with_queue_and_priority(capsys: Any, monkeypatch: Any) -> None:
    """A gang on Volcano (the pods name it as their scheduler): its queue and priority class."""
    job = pi(
        runPolicy={"schedulingPolicy": {"minAvailable": 3, "queue": "research", "priorityClass": "high"}}
    )
    for rspec in job["spec"]["mpiReplicaSpecs"].values():
        rspec["template"]["spec"]["schedulerName"] = "volcano"
    code, out, err = migrate([job], capsys, monkeypatch)
    assert code == 0, err
    runtime = out[0]
    assert runtime["spec"]["podGroupPolicy"] == {"volcano": {}}
    objects = {o["kind"]: o for o in render([priority_class("high"), *out], capsys, monkeypatch)}
    group = objects["PodGroup"]
    assert group["spec"]["queue"] == "research" and group["spec"]["priorityClassName"] == "high"
    assert group["spec"]["minMember"] == 3


def test_coscheduling_gang_with_timeout(capsys: Any, monkeypatch: Any) -> None:
    spec = {
        "jaxReplicaSpecs": {
            "Worker": replica(2, "OnFailure", {"name": "jax", "image": "registry.example/jax:1"})
        },
        "runPolicy": {"schedulingPolicy": {"scheduleTimeoutSeconds": 120, "minAvailable": 1}},
    }
    code, out, err = migrate([v1job("JAXJob", "gang", spec)], capsys, monkeypatch)
    assert code == 0, err
    assert "minAvailable: 1 is not carried" in err
    assert out[0]["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 120}}
    objects = {o["kind"]: o for o in render(out, capsys, monkeypatch)}
    assert objects["PodGroup"]["spec"]["scheduleTimeoutSeconds"] == 120
    assert objects["PodGroup"]["spec"]["minMember"] == 2


def priority_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": 1000,
    }


# --- --from-cluster ---


def test_from_cluster_every_kind_on_each_backend(
    cluster: Any, capsys: Any, monkeypatch: Any, tmp_path: Any
) -> None:
    """The v1 CRDs as plain CRDs, one job of each kind: `--from-cluster -A` prints their
    TrainJobs (and runtimes), suspended as they still run, by LIST requests only; the output
    renders."""
    import time

    from migrate_helpers import run, v1_crd

    install = getattr(cluster, "install", None) or cluster.create
    for kind in ("PyTorchJob", "XGBoostJob", "JAXJob", "PaddleJob", "TFJob"):
        install(v1_crd(kind))
    install(v1_crd("MPIJob", ("v2beta1", "v1")))
    deadline = time.monotonic() + 60
    for job in every_kind(cluster.namespace):
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
    monkeypatch.setenv("KUBECONFIG", str(cluster.write_kubeconfig(tmp_path / "kubeconfig", user="migrator")))
    mark = cluster.audit_mark()
    code, out, err = run(["migrate", "--from-cluster", "-A"], "", capsys, monkeypatch)
    assert code == 0, err
    import yaml

    objects = [
        d for d in yaml.safe_load_all(out) if d and d["metadata"].get("namespace") == cluster.namespace
    ]
    trainjobs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "TrainJob"}
    assert set(trainjobs) == {"torch", "xgb", "jax", "paddle", "tf", "pi"}  # the MPIJob once, as v2beta1
    assert all(t["spec"]["suspend"] is True for t in trainjobs.values())
    assert all(not {"uid", "resourceVersion", "managedFields"} & set(o["metadata"]) for o in objects)
    assert "status" not in str([o.keys() for o in objects])
    runtimes = {o["metadata"]["name"] for o in objects if o["kind"] == "TrainingRuntime"}
    assert runtimes == {"paddle", "tf", "pi"}  # no bundled runtime fits these
    verbs = {r.verb for r in cluster.audit_since(mark) if r.user == "migrator"}
    assert "list" in verbs and verbs <= {"get", "list", "watch"}, verbs
    jobsets = [o for o in render(objects, capsys, monkeypatch) if o["kind"] == "JobSet"]
    assert len(jobsets) == 6
    for obj in objects:  # and the server takes them: our CRDs' schemas and rules accept each
        cluster.create(obj)


@pytest.mark.parametrize(
    ("job", "field"),
    [
        (
            v1job(
                "PaddleJob",
                "elastic",
                {"paddleReplicaSpecs": {"Worker": paddle_replica(2)}, "elasticPolicy": {}},
            ),
            "spec.elasticPolicy",
        ),
        (
            v1job(
                "TFJob",
                "dynamic",
                {
                    "tfReplicaSpecs": {"Worker": replica(2, "Never", tensorflow())},
                    "enableDynamicWorker": True,
                },
            ),
            "spec.enableDynamicWorker",
        ),
    ],
)
def test_what_v2_removed_is_refused_unless_lossy(
    job: dict[str, Any], field: str, capsys: Any, monkeypatch: Any
) -> None:
    code, out, err = migrate([job], capsys, monkeypatch)
    assert (code, out) == (1, [])
    assert f"{job['metadata']['name']}: {field}:" in err
    code, out, err = migrate([job], capsys, monkeypatch, "--lossy")
    assert code == 0, err
    assert (
        f"Warning: {job['kind']} ml/{job['metadata']['name']}: {field}:" in err
        and "(--lossy: dropped)" in err
    )
    render(out, capsys, monkeypatch)


BAD_VALUES = [None, "x", 7, -1, True, [], {}, [1], {"a": 1}, 1.5]


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Any:
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _paths(value, (*prefix, i))


@pytest.mark.parametrize(
    "kind", ["PyTorchJob", "XGBoostJob", "JAXJob", "PaddleJob", "TFJob", "MPIJob", "MPIJob v1"]
)
def test_a_wrong_type_anywhere_is_converted_or_refused_never_a_crash(kind: str) -> None:
    """Every field of an example set to each value of the wrong type: converted, or refused with
    a field and a reason; never an internal error (exit 3)."""
    from trainer.migrate.cmd import convert
    from trainer.migrate.common import Options
    from trainer.migrate.errors import Refusal

    examples = {job["kind"]: job for job in every_kind("ml")}
    job = horovod() if kind == "MPIJob v1" else examples[kind]
    refused = 0
    for path in list(_paths(job))[1:]:
        for value in BAD_VALUES:
            broken = json.loads(json.dumps(job))
            target = broken
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            for options in (Options(), Options(lossy=True, fix_names=True)):
                try:
                    convert(broken, options)
                except Refusal as exc:
                    refused += 1
                    assert exc.field and exc.reason
    assert refused  # the wrong types were seen, not all converted
