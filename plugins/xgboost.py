"""XGBoost: the DMLC tracker env Rabit reads; one worker per GPU, or per node without GPUs."""

from __future__ import annotations

from trainer.plugin import (
    FieldError,
    Info,
    TrainingRuntimeSpec,
    ValidationContext,
    effective_resources,
    env_field_ref,
    env_value,
    forbidden,
    gpu_count,
    hookimpl,
    upsert_env,
    upsert_ports,
)
from trainer.plugin import constants as c

RESERVED_ENV = ("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER")


class XGBoostPlugin:
    name = "XGBoost"

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.ml_policy is not None and spec.ml_policy.xgboost is not None

    @hookimpl
    def trainer_enforce_ml_policy(self, info: Info) -> None:
        if info.ml_policy is None or info.ml_policy.xgboost is None:
            return
        trainer = info.trainjob.spec.trainer
        trainer_set = info.scale_trainer()
        if trainer_set is None:
            return
        node = trainer_set.container(c.NODE)
        if trainer is None or node is None:
            return
        workers_per_node = gpu_count(effective_resources(info)) or 1
        upsert_env(
            node,
            [
                env_value("DMLC_TRACKER_URI", f"{info.name}-{c.NODE}-0-0.{info.name}"),
                env_value("DMLC_TRACKER_PORT", str(c.CONTAINER_PORT)),
                env_field_ref("DMLC_TASK_ID", c.JOB_COMPLETION_INDEX_FIELD),
                env_value("DMLC_NUM_WORKER", str(trainer_set.count * workers_per_node)),
            ],
        )
        upsert_ports(node, [{"containerPort": c.CONTAINER_PORT}])

    @hookimpl
    def trainer_validate(self, ctx: ValidationContext) -> list[FieldError] | None:
        policy = ctx.runtime.spec.ml_policy
        trainer = ctx.trainjob.spec.trainer
        if policy is None or policy.xgboost is None or trainer is None:
            return None
        errors = [
            forbidden(f"spec.trainer.env[{i}]", f"{var.get('name')} is reserved for the XGBoost runtime")
            for i, var in enumerate(trainer.env or [])
            if var.get("name") in RESERVED_ENV
        ]
        return errors or None


plugin = XGBoostPlugin()
