"""PyTorchJob (kubeflow.org/v1): Master and Workers as the ``node`` Job of ``torch-distributed``.

The Master is completion index 0 and Worker ``i`` index ``i + 1``, which is v1's RANK. The v2
torch plugin sets the PET_* env of torchrun with v1's meaning; what v1 set besides is added
(docs/migration.md has the table).
"""

from __future__ import annotations

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.migrate.common import Notes, Options, Result
from trainer.migrate.single import Context, Framework
from trainer.migrate.single import convert as convert_single


def _trainer(spec: Obj, notes: Notes) -> Obj:
    nproc = spec.get("nprocPerNode")
    if isinstance(nproc, int) or (isinstance(nproc, str) and nproc.isdigit()):
        return {"numProcPerNode": int(nproc)}
    notes.warn(
        "spec.nprocPerNode",
        f"{nproc if nproc is not None else 'auto (the default)'!r} is not carried: v2 sets "
        "PET_NPROC_PER_NODE from the GPUs ('auto') or else the CPUs of resourcesPerNode",
    )
    return {}


def _check(spec: Obj, notes: Notes) -> None:
    if spec.get("elasticPolicy") is not None:
        notes.loss(
            "spec.elasticPolicy",
            "elastic training is removed in Trainer v2; the job would run with a fixed number of nodes",
        )


def _env(ctx: Context) -> list[Obj]:
    """v1 set MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK only when the job had a Master;
    PYTHONUNBUFFERED is "1" since Training Operator v1.7 ("0" before, which was a bug)."""
    added: list[Obj] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if ctx.counts.get("Master"):
        nproc = ctx.trainer.get("numProcPerNode", 1)
        added += [
            {"name": "MASTER_ADDR", "value": ctx.host(0)},
            {"name": "MASTER_PORT", "value": str(ctx.port)},
            {"name": "WORLD_SIZE", "value": str(ctx.nodes * nproc)},
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
