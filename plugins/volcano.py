"""Volcano plugin: placeholder until its implementation lands (see the issue on MPI and gang scheduling)."""

from __future__ import annotations

from trainer.api.runtime import TrainingRuntimeSpec


class VolcanoPlugin:
    name = "Volcano"

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.pod_group_policy is not None and spec.pod_group_policy.volcano is not None


plugin = VolcanoPlugin()
