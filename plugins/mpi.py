"""MPI plugin: placeholder until its implementation lands (see the issue on MPI and gang scheduling)."""

from __future__ import annotations

from trainer.api.runtime import TrainingRuntimeSpec


class MPIPlugin:
    name = "MPI"

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.ml_policy is not None and spec.ml_policy.mpi is not None


plugin = MPIPlugin()
