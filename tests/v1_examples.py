"""v1 jobs in the shape of the upstream examples (the training-operator and mpi-operator
repositories' examples, each named where it is built); our own manifests, none copied."""

from __future__ import annotations

from typing import Any


def replica(count: int, restart: str, *containers: dict[str, Any], **pod: Any) -> dict[str, Any]:
    return {
        "replicas": count,
        "restartPolicy": restart,
        "template": {"spec": {"containers": list(containers), **pod}},
    }


def v1job(kind: str, name: str, spec: dict[str, Any], api: str = "kubeflow.org/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def xgboost_container(name: str = "xgboost") -> dict[str, Any]:
    return {
        "name": name,
        "image": "registry.example/xgboost-dist-iris:1.1",
        "ports": [{"name": "xgboostjob-port", "containerPort": 9991}],
        "args": ["--job_type=Train", "--n_estimators=10", "--model_path=/tmp/xgboost-model"],
    }


def paddle_container() -> dict[str, Any]:
    return {
        "name": "paddle",
        "image": "registry.example/paddle:2.4.0-gpu",
        "command": ["python"],
        "args": ["-m", "paddle.distributed.launch", "run_check"],
        "ports": [{"name": "master", "containerPort": 37777}],
        "resources": {"limits": {"nvidia.com/gpu": 2}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }


def paddle_replica(count: int, restart: str = "OnFailure") -> dict[str, Any]:
    """training-operator examples/paddlepaddle/simple-gpu.yaml's Worker: port 37777 named master,
    2 GPUs, /dev/shm from memory."""
    return replica(
        count, restart, paddle_container(), volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    )


def tensorflow(**extra: Any) -> dict[str, Any]:
    return {
        "name": "tensorflow",
        "image": "registry.example/tf-mnist-with-summaries:1",
        "command": ["python", "/opt/tf-mnist-with-summaries/mnist.py", "--epochs=1"],
        **extra,
    }


def pi(implementation: str | None = None, **spec: Any) -> dict[str, Any]:
    """mpi-operator examples/v2beta1/pi/pi.yaml: a Launcher running mpirun as user 1000, 2 Workers
    running sshd, the key at /home/mpiuser/.ssh."""
    image = "registry.example/mpi-pi:openmpi"
    limits = {"limits": {"cpu": "1", "memory": "1Gi"}}
    launcher = {
        "name": "mpi-launcher",
        "image": image,
        "securityContext": {"runAsUser": 1000},
        "command": ["mpirun"],
        "args": ["-n", "2", "/home/mpiuser/pi"],
        "resources": limits,
    }
    worker = {
        "name": "mpi-worker",
        "image": image,
        "securityContext": {"runAsUser": 1000},
        "command": ["/usr/sbin/sshd"],
        "args": ["-De", "-f", "/home/mpiuser/.sshd_config"],
        "resources": limits,
    }
    body: dict[str, Any] = {
        "slotsPerWorker": 1,
        "runPolicy": {"cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 60, "backoffLimit": 0},
        "sshAuthMountPath": "/home/mpiuser/.ssh",
        "mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "template": {"spec": {"containers": [launcher]}}},
            "Worker": {"replicas": 2, "template": {"spec": {"containers": [worker]}}},
        },
        **spec,
    }
    if implementation:
        body["mpiImplementation"] = implementation
    return v1job("MPIJob", "pi", body, api="kubeflow.org/v2beta1")


def every_kind(namespace: str) -> list[dict[str, Any]]:
    """One job of each v1 kind (MPIJob in both versions' shapes, the CRD serving v2beta1 first)."""
    torch = {"name": "pytorch", "image": "registry.example/mnist:1", "command": ["python3", "mnist.py"]}
    jobs = [
        v1job("PyTorchJob", "torch", {"pytorchReplicaSpecs": {"Worker": replica(2, "OnFailure", torch)}}),
        v1job(
            "XGBoostJob", "xgb", {"xgbReplicaSpecs": {"Master": replica(1, "OnFailure", xgboost_container())}}
        ),
        v1job(
            "JAXJob",
            "jax",
            {"jaxReplicaSpecs": {"Worker": replica(2, "OnFailure", {"name": "jax", "image": "j:1"})}},
        ),
        v1job(
            "PaddleJob",
            "paddle",
            {"paddleReplicaSpecs": {"Worker": paddle_replica(2)}},
        ),
        v1job("TFJob", "tf", {"tfReplicaSpecs": {"Worker": replica(2, "OnFailure", tensorflow())}}),
        pi(),
    ]
    for job in jobs:
        job["metadata"]["namespace"] = namespace
        job["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
    return jobs


def horovod() -> dict[str, Any]:
    """training-operator examples/mpi/tensorflow-mnist.yaml: a Horovod Launcher (mpirun -np 2)
    and 2 Workers with no command, which v1 reached by kubectl exec."""
    image = "registry.example/horovod:0.20.0-cpu"
    launcher = {
        "name": "mpi",
        "image": image,
        "command": ["mpirun"],
        "args": [
            "-np",
            "2",
            "--allow-run-as-root",
            "-bind-to",
            "none",
            "python",
            "/examples/tensorflow2_mnist.py",
        ],
        "resources": {"limits": {"cpu": 1, "memory": "2Gi"}},
    }
    worker = {"name": "mpi", "image": image, "resources": {"limits": {"cpu": 2, "memory": "4Gi"}}}
    spec = {
        "slotsPerWorker": 1,
        "runPolicy": {"cleanPodPolicy": "Running"},
        "mpiReplicaSpecs": {"Launcher": replica(1, "Never", launcher), "Worker": replica(2, "Never", worker)},
    }
    return v1job("MPIJob", "tensorflow-mnist", spec)


def xgboost_iris(
    name: str = "xgboost-dist-iris", worker_restart: str = "ExitCode", container: str = "xgboostjob"
) -> dict[str, Any]:
    """training-operator examples/xgboost/xgboost-dist/xgboostjob_v1_iris_train.yaml: a Master
    (Never) and 2 Workers (ExitCode), port 9991 by name, and the container named xgboostjob as
    the example names it (not v1's xgboost)."""
    return v1job(
        "XGBoostJob",
        name,
        {
            "xgbReplicaSpecs": {
                "Master": replica(1, "Never", xgboost_container(container)),
                "Worker": replica(2, worker_restart, xgboost_container(container)),
            }
        },
    )
