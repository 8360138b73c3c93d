"""JAX: one process per node and the coordinator address jax.distributed.initialize reads."""

from __future__ import annotations

from trainer.plugin import (
    Info,
    TrainingRuntimeSpec,
    env_field_ref,
    env_value,
    hookimpl,
    upsert_env,
    upsert_ports,
)
from trainer.plugin import constants as c


class JAXPlugin:
    name = "JAX"

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.ml_policy is not None and spec.ml_policy.jax is not None

    @hookimpl
    def trainer_enforce_ml_policy(self, info: Info) -> None:
        if info.ml_policy is None or info.ml_policy.jax is None:
            return
        trainer = info.trainjob.spec.trainer
        trainer_set = info.scale_trainer()
        if trainer_set is None:
            return
        node = trainer_set.container(c.NODE)
        if trainer is None or node is None:
            return
        upsert_env(
            node,
            [
                # GPUs per node do not matter: JAX runs one process per node.
                env_value("JAX_NUM_PROCESSES", str(trainer_set.count)),
                env_field_ref("JAX_PROCESS_ID", c.JOB_COMPLETION_INDEX_FIELD),
                env_value(
                    "JAX_COORDINATOR_ADDRESS", f"{info.name}-{c.NODE}-0-0.{info.name}:{c.CONTAINER_PORT}"
                ),
            ],
        )
        upsert_ports(node, [{"containerPort": c.CONTAINER_PORT}])


plugin = JAXPlugin()
