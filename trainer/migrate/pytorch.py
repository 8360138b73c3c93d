"""PyTorchJob (kubeflow.org/v1): Master and Workers as the ``node`` Job of ``torch-distributed``.

The Master is completion index 0 and Worker ``i`` index ``i + 1``, which is v1's RANK. The v2
torch plugin sets the PET_* env of torchrun with v1's meaning; what v1 set besides is added
(docs/migration.md has the table).
"""

from __future__ import annotations

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.api.quantity import cpu_count, gpu_count
from trainer.migrate.common import Notes, Options, Result
from trainer.migrate.single import Context, Framework
from trainer.migrate.single import convert as convert_single

# What --lossy makes of an elastic PyTorchJob, and what v1 did with spec.elasticPolicy that is lost.
ELASTIC_LOSSY = (
    "a fixed number of nodes, the replicas given; lost: PET_NNODES as the minReplicas:maxReplicas "
    "range, the rendezvous settings rdzvBackend, rdzvHost, rdzvPort, rdzvId, rdzvConf and standalone "
    "as PET_RDZV_* and PET_STANDALONE, maxRestarts as PET_MAX_RESTARTS, and the autoscaling by metrics"
)


def _count(value: object) -> int | None:
    """A process count as v1's string field holds one (``"4"``) or YAML gives it (``4``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _v1_nproc(spec: Obj) -> int:
    """The processes per node in v1's WORLD_SIZE: ``nprocPerNode`` when a number, else 1. v1
    counted 'auto', 'gpu', 'cpu' and the deprecated elasticPolicy.nProcPerNode as 1, so the
    TrainJob's numProcPerNode (which may come from the latter) is not what to multiply by."""
    return _count(spec.get("nprocPerNode")) or 1


def _trainer(spec: Obj, main: Obj, notes: Notes) -> Obj:
    """numProcPerNode, from what v1 put in PET_NPROC_PER_NODE.

    v1 defaulted nprocPerNode to 'auto'. v2 sets 'auto' too when the node has GPUs, so torchrun
    resolves it as it did under v1 and nothing is said; without GPUs torchrun's 'auto' counted the
    machine's CPUs while v2 counts resourcesPerNode's, a real difference, so a Warning says it."""
    nproc = spec.get("nprocPerNode")
    count = _count(nproc)
    if count is not None:
        return {"numProcPerNode": count}
    elastic = spec.get("elasticPolicy")
    deprecated = _count(elastic.get("nProcPerNode")) if isinstance(elastic, dict) else None
    if nproc is None and deprecated is not None:
        # v1 did not default nprocPerNode then and set PET_NPROC_PER_NODE from this (--lossy only:
        # an elastic job is refused without it).
        return {"numProcPerNode": deprecated}
    resources = main.get("resources")
    try:
        gpus, cpus = gpu_count(resources), str(max(1, cpu_count(resources)))
    except ValueError:  # admission names the quantity; the Warning need not
        gpus, cpus = 0, "the CPU count"
    if nproc in (None, "auto") and gpus > 0:
        return {}
    if nproc in (None, "auto"):
        said = "'auto' (v1's default)" if nproc is None else "'auto'"
        notes.warn(
            "spec.nprocPerNode",
            f"{said}: without GPUs torchrun resolved it to the machine's CPU count; v2 sets "
            f"PET_NPROC_PER_NODE to {cpus} instead, the CPUs of resourcesPerNode (at least 1); set "
            "spec.trainer.numProcPerNode for another count",
        )
    else:
        notes.warn(
            "spec.nprocPerNode",
            f"{nproc!r} is not carried: v2 sets PET_NPROC_PER_NODE to 'auto' when resourcesPerNode has "
            f"GPUs, else to {cpus}, its CPUs (at least 1)",
        )
    return {}


def _check(spec: Obj, notes: Notes) -> None:
    if spec.get("elasticPolicy") is not None:
        notes.loss("spec.elasticPolicy", "elastic training is removed in Trainer v2", ELASTIC_LOSSY)


def _env(ctx: Context) -> list[Obj]:
    """v1 set MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK only when the job had a Master;
    PYTHONUNBUFFERED is "1" since Training Operator v1.7 ("0" before, which was a bug)."""
    added: list[Obj] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if ctx.counts.get("Master"):
        added += [
            {"name": "MASTER_ADDR", "value": ctx.host(0)},
            {"name": "MASTER_PORT", "value": str(ctx.port)},
            {"name": "WORLD_SIZE", "value": str(ctx.nodes * _v1_nproc(ctx.spec))},
            {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": c.JOB_COMPLETION_INDEX_FIELD}}},
        ]
    return added


PYTORCH = Framework(
    kind="PyTorchJob",
    specs="pytorchReplicaSpecs",
    container="pytorch",
    port_name="pytorchjob-port",
    default_port=23456,
    order=("Master", "Worker"),
    single=("Master",),
    runtime="torch-distributed",
    policy="torch",
    restart_default="OnFailure",
    # What the v2 torch plugin sets in the node container (plugins/torch.py); reserved in a TrainJob.
    reserved_env=("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"),
    env=_env,
    trainer=_trainer,
    check=_check,
)


def convert(job: Obj, options: Options) -> Result:
    return convert_single(job, options, PYTORCH)
