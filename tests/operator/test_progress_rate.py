"""docs/decisions.md §batch: progress-only status writes keep to ``controller.progressQPS`` across
TrainJobs, on the API server, however many TrainJobs make progress at once."""

from __future__ import annotations

import itertools
from pathlib import Path

from operator_helpers import TJ, operator_writes, trainjob, wait_for
from trainer_sandbox.backends import Cluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.controller.config import Configuration

RUN_FOREVER = [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]
NAMES = [f"rate-{i}" for i in range(4)]


def ready(cluster: Cluster, name: str) -> bool:
    jobs = (cluster.get(TJ, "TrainJob", name).get("status") or {}).get("jobsStatus") or []
    return any(job.get("ready") for job in jobs)


def test_progress_writes_of_trainjobs_started_together_go_out_at_the_configured_rate(
    cluster: Cluster, operator_kubeconfig: Path
) -> None:
    # No per-TrainJob wait: only the rate spaces the writes (2 a second: half a second apart).
    config = Configuration.model_validate({"controller": {"progressBatchPeriod": "0s", "progressQPS": 2}})
    with EmbeddedOperator(operator_kubeconfig, config, namespaces=[cluster.namespace]):
        mark = cluster.audit_mark()
        for name in NAMES:
            cluster.create(trainjob(name, trainer={"env": RUN_FOREVER}))
        wait_for(
            lambda: all(ready(cluster, n) for n in NAMES), timeout=60, what="every TrainJob's Jobs ready"
        )
        writes = [r for r in operator_writes(cluster, mark) if r.subresource == "status"]
    assert {r.name for r in writes} == set(NAMES), "each TrainJob's progress reached its status"
    times = sorted(r.time for r in writes)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(times)]
    # A running torch TrainJob changes no condition: every one of these writes is progress, so
    # none may follow another by less than the rate's half second (less the audit's rounding).
    assert min(gaps) >= 0.45, f"status writes closer than 2 a second allows: gaps {gaps}"
