"""Migrated v1 jobs run: `trainer migrate`'s TrainJobs (and TrainingRuntimes) applied to each
backend with the operator running reach Complete, and the pods the Job controller made are
the pods v1 would have run: as many per role, with v1's images, commands and args, and the env
v1 set (docs/migration.md). On the real control plane the JobSet, Job and scheduler controllers
are the real ones and kwok's nodes run the pods."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
import yaml
from operator_helpers import conditions, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator
from v1_examples import every_kind, horovod, pi, replica, tensorflow, v1job, xgboost_iris

from trainer.cli import main

RUN_FAST = {"name": "SANDBOX_RUN_SECONDS", "value": "1"}


def examples() -> dict[str, dict[str, Any]]:
    jobs = {job["metadata"]["name"]: job for job in every_kind("placeholder")}
    for job in jobs.values():
        del job["status"]  # not running: the TrainJobs start at once
    xgb = xgboost_iris("xgb", worker_restart="Never")
    tf = v1job(
        "TFJob",
        "tf-chief",
        {
            "tfReplicaSpecs": {
                "Chief": replica(1, "Never", tensorflow()),
                "Worker": replica(2, "Never", tensorflow()),
            }
        },
    )
    torch = {"name": "pytorch", "image": "registry.example/mnist:1", "command": ["python3", "mnist.py"]}
    sidecar = {"name": "metrics", "image": "registry.example/exporter:1"}
    torch_sidecar = v1job(
        "PyTorchJob",
        "torch-sidecar",
        {
            "pytorchReplicaSpecs": {
                rtype: replica(n, "OnFailure", copy.deepcopy(torch), copy.deepcopy(sidecar))
                for rtype, n in (("Master", 1), ("Worker", 2))
            }
        },
    )
    return {
        **jobs,
        "torch-sidecar": torch_sidecar,  # a runtime of its own, v1's env on the sidecar too
        "xgb": xgb,
        "tf-chief": tf,
        "tensorflow-mnist": horovod(),
        "pi-intel": renamed(pi("Intel"), "pi-intel"),
    }


def renamed(job: dict[str, Any], name: str) -> dict[str, Any]:
    job["metadata"]["name"] = name
    return job


# Per example: the pods of each replicated job v1 ran (role -> count).
EXPECTED = {
    "torch": {"node": 2},
    "torch-sidecar": {"node": 3},
    "xgb": {"node": 3},
    "jax": {"node": 2},
    "paddle": {"node": 2},
    "tf": {"node": 2},  # Workers alone: the Job succeeds when index 0 has (a Job successPolicy)
    "tf-chief": {"chief": 1, "node": 2},
    "pi": {"launcher": 1, "node": 2},
    "pi-intel": {"launcher": 1, "node": 2},
    "tensorflow-mnist": {"launcher": 1, "node": 2},
}


def migrated(
    job: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> list[dict[str, Any]]:
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump(job)))
    code = main(["migrate", "-f", "-"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.mark.parametrize("example", sorted(EXPECTED))
def test_migrated_job_runs_the_pods_v1_ran(
    example: str, cluster: Cluster, operator: EmbeddedOperator, capsys: Any, monkeypatch: Any
) -> None:
    job = copy.deepcopy(examples()[example])
    job["metadata"]["namespace"] = cluster.namespace
    specs = next(v for k, v in job["spec"].items() if k.endswith("ReplicaSpecs"))
    v1_containers, v1_images = {}, set()  # each replica type's training container (the first)
    for rtype, rspec in specs.items():
        for i, container in enumerate(rspec["template"]["spec"]["containers"]):
            container.setdefault("env", []).append(RUN_FAST)
            container.pop("resources", None)  # kwok's nodes have no GPUs
            v1_images.add(container["image"])
            if i == 0:
                v1_containers[rtype] = copy.deepcopy(container)
    for obj in migrated(job, capsys, monkeypatch):
        cluster.create(obj)
    name = job["metadata"]["name"]
    seen: dict[str, dict[str, Any]] = {}  # every pod of the JobSet, also those gone at the end

    def complete() -> bool:
        for pod in cluster.list("v1", "Pod"):
            if pod["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name:
                seen[pod["metadata"]["uid"]] = pod
        return conditions(cluster, name).get("Complete", ("",))[0] == "True"

    wait_for(complete, timeout=120, what=f"the migrated {job['kind']} Complete ({conditions(cluster, name)})")
    pods = list(seen.values())
    roles: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        roles.setdefault(pod["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"], []).append(pod)
    assert {role: len(each) for role, each in roles.items()} == EXPECTED[example]
    images = {c["image"] for p in pods for c in p["spec"]["containers"]}
    assert images == v1_images
    for role, each in roles.items():
        for pod in each:
            node = next(c for c in pod["spec"]["containers"] if c["name"] == "node")
            env = {e["name"] for e in node.get("env") or []}
            assert "SANDBOX_RUN_SECONDS" in env  # the v1 container's own env
            if job["kind"] == "MPIJob":
                v1 = v1_containers["Launcher" if role == "launcher" else "Worker"]
                command = v1.get("command") or (None if v1.get("args") else ["/usr/sbin/sshd", "-De"])
                if role == "launcher":
                    assert env & V1_ENV["MPIJob"], sorted(env)
            else:
                v1 = v1_containers.get("Worker") or next(iter(v1_containers.values()))
                command = v1.get("command")
                assert env & V1_ENV[job["kind"]], (job["kind"], sorted(env))
            assert (node.get("command"), node.get("args")) == (command, v1.get("args"))
            if job["kind"] in ON_EVERY_CONTAINER:
                for other in pod["spec"]["containers"]:
                    names = {e["name"] for e in other.get("env") or []}
                    assert names & V1_ENV[job["kind"]], (other["name"], sorted(names))


# The kinds whose v1 controller set its env on every container of a pod, not the training one alone.
ON_EVERY_CONTAINER = {"PyTorchJob", "XGBoostJob", "JAXJob", "PaddleJob"}

# A name of what v1's controller set for each kind, which every migrated pod's node container has.
V1_ENV = {
    "PyTorchJob": {"PYTHONUNBUFFERED", "PET_NODE_RANK"},
    "XGBoostJob": {"MASTER_ADDR", "WORKER_ADDRS"},
    "JAXJob": {"COORDINATOR_ADDRESS"},
    "PaddleJob": {"PADDLE_MASTER"},
    "TFJob": {"TF_CONFIG"},
    "MPIJob": {"OMPI_MCA_orte_default_hostfile", "I_MPI_HYDRA_HOST_FILE", "K_MPI_JOB_ROLE"},
}
