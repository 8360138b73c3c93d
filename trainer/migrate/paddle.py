"""PaddleJob (kubeflow.org/v1) in collective mode (Workers only): a TrainingRuntime of its own.

v2 has no PaddlePaddle plugin, so the job's runtime is generated with a plain mlPolicy (numNodes)
and carries what v1's controller put in the environment: the job id, the node count and the
rendezvous address PADDLE_MASTER (Worker 0; docs/migration.md §paddlejob). A PaddleJob with a
Master runs parameter servers, which v2 does not have: it is refused.
"""

from __future__ import annotations

from trainer.api.objects import Obj
from trainer.migrate.common import Notes, Options, Result
from trainer.migrate.errors import Refusal
from trainer.migrate.single import Context, Framework
from trainer.migrate.single import convert as convert_single


def _check(spec: Obj, notes: Notes) -> None:
    specs = spec.get("paddleReplicaSpecs")
    if isinstance(specs, dict) and specs.get("Master") is not None:
        raise Refusal(
            "spec.paddleReplicaSpecs.Master",
            "a PaddleJob with a Master runs in parameter-server mode, which Trainer v2 does not have "
            "(a collective PaddleJob, Workers only, converts)",
        )
    if spec.get("elasticPolicy") is not None:
        notes.loss(
            "spec.elasticPolicy",
            "elastic training is removed in Trainer v2; the job would run with a fixed number of nodes",
        )


def _env(ctx: Context) -> list[Obj]:
    """v1 gave Worker 0 its own pod IP as PADDLE_MASTER and the others Worker 0's name; here every
    pod names Worker 0 by its DNS name (which is Worker 0's pod IP), and POD_IP_DUMMY is kept."""
    return [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "PADDLE_JOB_ID", "value": ctx.name},
        {"name": "PADDLE_NNODES", "value": str(ctx.nodes)},
        {"name": "POD_IP_DUMMY", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "PADDLE_MASTER", "value": f"{ctx.host(0)}:{ctx.port}"},
    ]


PADDLE = Framework(
    kind="PaddleJob",
    specs="paddleReplicaSpecs",
    container="paddle",
    port_name="master",
    default_port=36543,
    order=("Master", "Worker"),
    single=(),
    runtime=None,
    policy=None,
    restart_default="OnFailure",
    reserved_env=(),
    env=_env,
    check=_check,
    port_by_name_only=True,  # v1 took 36543 unless the container named paddle had the port
)


def convert(job: Obj, options: Options) -> Result:
    return convert_single(job, options, PADDLE)
