"""PlainML: the trainer node count and env for runtimes without a framework that manages them."""

from __future__ import annotations

from trainer.plugin import Info, TrainingRuntimeSpec, hookimpl, upsert_env
from trainer.plugin import constants as c

# Frameworks whose own plugin sets counts and env; PlainML stays out of their way.
_MANAGED = ("torch", "mpi", "jax")


def _acts(spec: TrainingRuntimeSpec) -> bool:
    return spec.ml_policy is None or spec.ml_policy.source() not in _MANAGED


class PlainMLPlugin:
    name = "PlainML"

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return _acts(spec)

    @hookimpl
    def trainer_enforce_ml_policy(self, info: Info) -> None:
        if not _acts(info.runtime.spec):
            return
        trainer = info.trainjob.spec.trainer
        trainer_set = info.scale_trainer()
        if trainer is None or trainer_set is None:
            return
        node = trainer_set.container(c.NODE)
        if node is not None and trainer.env:
            upsert_env(node, trainer.env)


plugin = PlainMLPlugin()
