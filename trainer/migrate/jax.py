"""JAXJob (kubeflow.org/v1): Workers as the ``node`` Job of ``jax-distributed``.

v1 gave each Worker the coordinator (Worker 0) address and port, the process count and its
process id, the names jax.distributed.initialize is called with in v1's examples; the v2 JAX
plugin sets the JAX_* names of its own beside them (docs/migration.md).
"""

from __future__ import annotations

from trainer.api import constants as c
from trainer.api.objects import Obj
from trainer.migrate.common import Options, Result
from trainer.migrate.single import Context, Framework
from trainer.migrate.single import convert as convert_single


def _env(ctx: Context) -> list[Obj]:
    return [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "COORDINATOR_PORT", "value": str(ctx.port)},
        {"name": "COORDINATOR_ADDRESS", "value": ctx.host(0)},
        {"name": "NUM_PROCESSES", "value": str(ctx.nodes)},
        {"name": "PROCESS_ID", "valueFrom": {"fieldRef": {"fieldPath": c.JOB_COMPLETION_INDEX_FIELD}}},
    ]


JAX = Framework(
    kind="JAXJob",
    specs="jaxReplicaSpecs",
    container="jax",
    port_name="jaxjob-port",
    default_port=6666,
    order=("Worker",),
    single=(),
    runtime="jax-distributed",
    policy="jax",
    restart_default="Never",
    # What the v2 JAX plugin sets in the node container (plugins/jax.py).
    reserved_env=("JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_COORDINATOR_ADDRESS"),
    env=_env,
)


def convert(job: Obj, options: Options) -> Result:
    return convert_single(job, options, JAX)
