"""XGBoostJob (kubeflow.org/v1): Master and Workers as the ``node`` Job of ``xgboost-distributed``.

v1 gave every pod the Master's address and port, the world size and its rank (Master 0, Worker
``i`` at ``i + 1``) and the Workers' addresses; the v2 XGBoost plugin adds the DMLC tracker env of
its own (docs/migration.md).
"""

from __future__ import annotations

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.migrate.common import Notes, Options, Result
from trainer.migrate.errors import Refusal
from trainer.migrate.single import Context, Framework
from trainer.migrate.single import convert as convert_single


def _env(ctx: Context) -> list[Obj]:
    """What v1's controller set on every pod. PYTHONUNBUFFERED is "1" since Training Operator
    v1.7 ("0" before, as for PyTorch)."""
    masters = ctx.counts.get("Master", 0)
    workers = ctx.counts.get("Worker", 0)
    added: list[Obj] = [
        {"name": "MASTER_PORT", "value": str(ctx.port)},
        {"name": "MASTER_ADDR", "value": ctx.host(0)},
        {"name": "WORLD_SIZE", "value": str(ctx.nodes)},
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": c.JOB_COMPLETION_INDEX_FIELD}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if workers:
        added += [
            {"name": "WORKER_PORT", "value": str(ctx.port)},
            {"name": "WORKER_ADDRS", "value": ",".join(ctx.host(masters + i) for i in range(workers))},
        ]
    return added


def _check(spec: Obj, notes: Notes) -> None:
    specs = spec.get("xgbReplicaSpecs")
    if isinstance(specs, dict) and specs.get("Master") is None:
        raise Refusal(
            "spec.xgbReplicaSpecs.Master",
            "missing: v1 took MASTER_PORT from the Master and could not start a job without one",
        )


XGBOOST = Framework(
    kind="XGBoostJob",
    specs="xgbReplicaSpecs",
    container="xgboost",
    port_name="xgboostjob-port",
    default_port=9999,
    order=("Master", "Worker"),
    single=("Master",),
    runtime="xgboost-distributed",
    policy="xgboost",
    restart_default="Never",
    # What the v2 XGBoost plugin sets in the node container (plugins/xgboost.py).
    reserved_env=("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER"),
    env=_env,
    check=_check,
)


def convert(job: Obj, options: Options) -> Result:
    return convert_single(job, options, XGBOOST)
