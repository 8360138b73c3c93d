"""Training that trains, on real nodes, through the bundled runtimes and TrainJobs a user would
write, with the operator running as ``trainer run``: torch DDP over gloo, MPI over SSH with the
generated keys and hostfile, a failing rank, a deadline, suspend and resume, and logs read with
kubectl and the Kubeflow SDK."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from node_helpers import Kubectl
from trainer_sandbox.backends import RealCluster
from trainer_sandbox.cluster import ControlPlane
from trainer_sandbox.cluster.nodenet import HOST_IP
from trainer_sandbox.operator_process import OperatorProcess
from trainer_sandbox.ports import free_port

pytestmark = pytest.mark.real_nodes

TRAIN_DDP = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    target = torch.randn(16, 1)
    model = DDP(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    for step in range(300):
        x = torch.randn(64, 16, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), x @ target)
        opt.zero_grad(); loss.backward(); opt.step()
        if step in (0, 299):
            print(f"rank={rank} world={world} node={os.environ['PET_NODE_RANK']} step={step} loss={loss.item():.6f}")
    dist.destroy_process_group()
    """
)
ALLREDUCE = textwrap.dedent(
    """
    from mpi4py import MPI
    import socket
    comm = MPI.COMM_WORLD
    total = comm.allreduce(comm.rank + 1, op=MPI.SUM)
    print(f"rank={comm.rank} size={comm.size} host={socket.gethostname()} sum={total}", flush=True)
    """
)


@pytest.fixture(scope="module")
def operator(
    nodes_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    cluster = RealCluster(
        nodes_plane.kubeconfig,
        nodes_plane.audit_log,
        ca_dir=nodes_plane.pki_dir,
        kubectl=str(nodes_plane.kubectl),
    )
    user = "system:serviceaccount:default:trainer-real-nodes"
    # The progress status server listens where pods reach the host (the fabric's address), with
    # the self-signed certificate an operator without webhooks makes for its advertised host.
    port = free_port(HOST_IP)
    config = {
        "featureGates": {"TrainJobStatus": True},
        "statusServer": {"host": HOST_IP, "port": port, "advertisedURL": f"https://{HOST_IP}:{port}"},
    }
    process = OperatorProcess(cluster, tmp_path_factory.mktemp("operator"), user=user, config=config)
    cluster.grant(user)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def trainjob(name: str, runtime: str, **trainer: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer},
    }


def script_command(script: str, run: str) -> list[str]:
    """A command that writes ``script`` to /tmp/main.py and runs ``run`` (as a user's does with
    a script baked into their image)."""
    return ["bash", "-c", f"cat > /tmp/main.py <<'PY'\n{script}PY\nexec {run}"]


def state(kubectl: Kubectl, name: str) -> tuple[str, str]:
    """The TrainJob's finished condition and its reason, or ("", "") while it runs."""
    conditions = (kubectl.get("trainjob", name).get("status") or {}).get("conditions") or []
    for c in conditions:
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return c["type"], c.get("reason", "")
    return "", ""


def finished(kubectl: Kubectl, name: str, timeout: float = 240) -> tuple[str, str]:
    result: tuple[str, str] = kubectl.wait_for(
        f"TrainJob {name} to finish", lambda: state(kubectl, name)[0] and state(kubectl, name), timeout
    )
    return result


def logs(kubectl: Kubectl, name: str, job: str = "node") -> str:
    return kubectl(
        "logs", "-l", f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name={job}",
        "--prefix", "--tail=-1", "--max-log-requests=10",
    )  # fmt: skip


def test_torch_ddp_trains_on_two_nodes_with_two_processes_each(
    operator: OperatorProcess, kubectl: Kubectl
) -> None:
    kubectl.apply(
        trainjob(
            "ddp",
            "torch-distributed",
            numNodes=2,
            numProcPerNode=2,
            command=script_command(TRAIN_DDP, "torchrun /tmp/main.py"),
            resourcesPerNode={"requests": {"cpu": "100m", "memory": "256Mi"}},
        )
    )
    outcome = finished(kubectl, "ddp")
    out = logs(kubectl, "ddp")
    assert outcome[0] == "Complete", (outcome, out[-3000:])
    lines = re.findall(r"rank=(\d) world=(\d) node=(\d) step=(\d+) loss=([\d.]+)", out)
    ranks = {int(r) for r, *_ in lines}
    assert ranks == {0, 1, 2, 3}, out[-3000:]
    assert {w for _, w, *_ in lines} == {"4"}, out[-3000:]  # one world size everywhere
    assert {(int(r) // 2, int(n)) for r, _, n, *_ in lines} == {(0, 0), (1, 1)}  # ranks 0-1 on node 0
    pods = json.loads(kubectl("get", "pods", "-l", "jobset.sigs.k8s.io/jobset-name=ddp", "-o", "json"))[
        "items"
    ]
    assert {p["spec"]["nodeName"] for p in pods} == {"real-0", "real-1"}
    for rank in ranks:
        first = next(float(loss) for r, _, _, s, loss in lines if int(r) == rank and s == "0")
        last = next(float(loss) for r, _, _, s, loss in lines if int(r) == rank and s == "299")
        assert last < first / 100, (rank, first, last)  # the model learned


def test_training_reports_progress_through_the_status_server(
    operator: OperatorProcess, kubectl: Kubectl
) -> None:
    report = textwrap.dedent(
        """
        import os, time
        import torch.distributed as dist
        from kubeflow.trainer import update_trainjob_status
        dist.init_process_group("gloo")
        if dist.get_rank() == 0:
            sent = update_trainjob_status(progress_percent=42, estimated_remaining_seconds=30, metrics={"loss": 0.25})
            print(f"reported={sent}", flush=True)
        time.sleep(25)
        dist.barrier()
        dist.destroy_process_group()
        """
    )
    kubectl.apply(
        trainjob(
            "progress",
            "torch-distributed",
            numNodes=2,
            command=script_command(report, "torchrun /tmp/main.py"),
        )
    )

    def shown() -> str:
        columns = kubectl("get", "trainjob", "progress", "--no-headers").split()
        return columns[1] if len(columns) > 1 and columns[1].isdigit() else ""

    assert kubectl.wait_for("the progress column", shown, timeout=150) == "42"
    status = kubectl.get("trainjob", "progress")["status"]["trainerStatus"]
    assert status["progressPercentage"] == 42 and status["estimatedRemainingSeconds"] == 30, status
    assert status["metrics"] == [{"name": "loss", "value": "0.25"}], status
    assert finished(kubectl, "progress")[0] == "Complete"
    assert "reported=True" in logs(kubectl, "progress")


def test_mpi_reaches_every_host_over_ssh_and_allreduces(operator: OperatorProcess, kubectl: Kubectl) -> None:
    kubectl.apply(
        trainjob(
            "mpi",
            "deepspeed-distributed",
            numNodes=3,
            numProcPerNode=2,
            command=["mpirun", "python3", "-c", ALLREDUCE],
        )
    )
    outcome = finished(kubectl, "mpi")
    out = logs(kubectl, "mpi", job="launcher")
    assert outcome[0] == "Complete", (outcome, out[-3000:])
    lines = re.findall(r"rank=(\d) size=(\d) host=(\S+) sum=(\d+)", out)
    assert sorted(int(r) for r, *_ in lines) == [0, 1, 2, 3, 4, 5], out
    assert {s for _, s, _, _ in lines} == {"6"} and {t for *_, t in lines} == {"21"}, out
    # The launcher runs as a node (runLauncherAsNode): three hosts, two slots each.
    hosts = [h for _, _, h, _ in lines]
    assert sorted({h.split(".")[0] for h in hosts}) == ["mpi-launcher-0-0", "mpi-node-0-0", "mpi-node-0-1"], (
        hosts
    )
    assert all(hosts.count(h) == 2 for h in hosts)


def test_a_failing_rank_fails_the_trainjob_by_the_runtimes_failure_policy(
    operator: OperatorProcess, kubectl: Kubectl
) -> None:
    runtime = json.loads(kubectl("get", "clustertrainingruntime", "torch-distributed", "-o", "json"))
    strict = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": "torch-strict"},
        "spec": runtime["spec"],
    }
    strict["spec"]["template"]["spec"]["failurePolicy"] = {"maxRestarts": 0}
    strict["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = 0
    kubectl.apply(strict)
    job = trainjob(
        "fails",
        "torch-strict",
        numNodes=2,
        command=["bash", "-c", 'echo "node $PET_NODE_RANK"; [ "$PET_NODE_RANK" != 1 ] && sleep 300; exit 1'],
    )
    job["spec"]["runtimeRef"].update(kind="TrainingRuntime", apiGroup="trainer.kubeflow.org")
    kubectl.apply(job)
    outcome = finished(kubectl, "fails", timeout=120)
    assert outcome[0] == "Failed", outcome
    # The healthy rank's container is stopped too: no pod of the TrainJob is left running.
    kubectl.wait_for(
        "the other rank's pod to stop",
        lambda: (
            "Running"
            not in kubectl(
                "get",
                "pods",
                "-l",
                "jobset.sigs.k8s.io/jobset-name=fails",
                "-o",
                "jsonpath={.items[*].status.phase}",
            )
        ),
    )


def test_active_deadline_ends_running_containers(operator: OperatorProcess, kubectl: Kubectl) -> None:
    job = trainjob("late", "torch-distributed", numNodes=2, command=["bash", "-c", "echo started; sleep 600"])
    job["spec"]["activeDeadlineSeconds"] = 45  # room for a first pull of the image
    kubectl.apply(job)
    kubectl.wait_for(
        "the pods to run",
        lambda: (
            kubectl("get", "pods", "-o", "jsonpath={.items[*].status.phase}").split()
            == ["Running", "Running"]
        ),
    )
    assert finished(kubectl, "late", timeout=90) == ("Failed", "DeadlineExceeded")
    kubectl.wait_for("the pods to be gone", lambda: kubectl("get", "pods", "-o", "name") == "", timeout=90)


def test_suspend_stops_real_pods_and_resume_starts_them_again(
    operator: OperatorProcess, kubectl: Kubectl
) -> None:
    kubectl.apply(
        trainjob("pause", "torch-distributed", numNodes=2, command=["bash", "-c", "echo up; sleep 600"])
    )

    def running_pods() -> set[str]:
        out = json.loads(kubectl("get", "pods", "-o", "json"))["items"]
        return {p["metadata"]["uid"] for p in out if p["status"].get("phase") == "Running"}

    first = kubectl.wait_for("two running pods", lambda: len(running_pods()) == 2 and running_pods())
    kubectl("patch", "trainjob", "pause", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    kubectl.wait_for("the pods to be gone", lambda: kubectl("get", "pods", "-o", "name") == "", timeout=90)
    kubectl("patch", "trainjob", "pause", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    second = kubectl.wait_for("two running pods again", lambda: len(running_pods()) == 2 and running_pods())
    assert not first & second  # new pods, started again
    assert "up" in logs(kubectl, "pause")
    kubectl("delete", "trainjob", "pause")


def test_the_sdk_trains_and_reads_the_training_log(
    operator: OperatorProcess, kubectl: Kubectl, nodes_plane: ControlPlane
) -> None:
    pytest.importorskip("kubeflow.trainer", reason="the Kubeflow SDK (kubeflow 0.5.x) is not installed")
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import CustomTrainer, TrainerClient

    def train() -> None:
        import os

        import torch.distributed as dist

        dist.init_process_group("gloo")
        print(
            f"sdk-training rank {dist.get_rank()} of {dist.get_world_size()} node {os.environ['PET_NODE_RANK']}"
        )
        dist.destroy_process_group()

    client = TrainerClient(
        backend_config=KubernetesBackendConfig(
            config_file=str(nodes_plane.kubeconfig), namespace=kubectl.namespace
        )
    )
    name = client.train(runtime="torch-distributed", trainer=CustomTrainer(func=train, num_nodes=2))
    job: Any = client.wait_for_job_status(name, timeout=240, polling_interval=2)
    assert job.status == "Complete"
    sdk_logs = "\n".join(client.get_job_logs(name))
    assert "sdk-training rank 0 of 2 node 0" in sdk_logs, sdk_logs[-2000:]
    assert "sdk-training rank 1 of 2 node 1" in logs(kubectl, name)


def test_a_search_whose_training_reports_its_metric_finds_the_best(
    operator: OperatorProcess, kubectl: Kubectl
) -> None:
    """docs/optimization.md on real nodes: each trial's script reads its value from the env var the
    operator gives it and reports its metric through the status server with the Kubeflow SDK, as
    a user's would; the search ends with the best trial, and `kubectl get` shows it."""
    train = textwrap.dedent(
        """
        import os, time
        from kubeflow.trainer import update_trainjob_status
        x = float(os.environ["KUBEFLOW_TRAINER_OPT_X"])
        sent = update_trainjob_status(metrics={"score": -((x - 0.5) ** 2)})
        print(f"x={x} reported={sent}", flush=True)
        time.sleep(2)
        """
    )
    kubectl.apply(
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "OptimizationJob",
            "metadata": {"name": "tune"},
            "spec": {
                "objectives": [{"metric": "score", "direction": "Maximize"}],
                "searchAlgorithm": {"grid": {}},
                "parameters": [
                    {"name": "x", "searchSpace": {"categorical": {"choices": ["0.1", "0.5", "0.9"]}}}
                ],
                "numTrials": 3,
                "parallelTrials": 2,
                "trainJobTemplate": {
                    "spec": {
                        "runtimeRef": {"name": "torch-distributed"},
                        "trainer": {"numNodes": 1, "command": script_command(train, "python3 /tmp/main.py")},
                    }
                },
            },
        }
    )

    def ended() -> str:
        conditions = (kubectl.get("optimizationjob", "tune").get("status") or {}).get("conditions") or []
        return next(
            (c["type"] for c in conditions if c["type"] in ("Succeeded", "Failed") and c["status"] == "True"),
            "",
        )

    assert kubectl.wait_for("the search to end", ended, timeout=300) == "Succeeded", kubectl.get(
        "optimizationjob", "tune"
    )
    status = kubectl.get("optimizationjob", "tune")["status"]
    assert status["result"]["parameters"] == [{"name": "x", "value": "0.5"}], status
    assert status["trials"] == {"created": 3, "running": 0, "succeeded": 3, "failed": 0}, status
    best = status["result"]["trainJobName"]
    assert "reported=True" in logs(kubectl, best)
    shown = kubectl("get", "optimizationjobs", "tune", "--no-headers").split()
    assert shown[0] == "tune" and shown[1] == "Succeeded" and best in shown, shown
