"""CoScheduling plugin: placeholder until its implementation lands (see the issue on MPI and gang scheduling)."""

from __future__ import annotations

from trainer.api.runtime import TrainingRuntimeSpec


class CoSchedulingPlugin:
    name = "CoScheduling"

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.pod_group_policy is not None and spec.pod_group_policy.coscheduling is not None


plugin = CoSchedulingPlugin()
