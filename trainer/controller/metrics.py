"""Prometheus metrics of the operator.

TrainJob counters are labelled by framework (the runtime's ``trainer.kubeflow.org/framework``
label) and exist for every known framework from the start, at zero, as the v1 operator's did:
a dashboard can then tell "no failures" from "no data".
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

from trainer.controller.serving import GuardedServer, Limits

# A scraper makes one small GET at a time; prometheus_client's own server started a thread for
# every connection, without bound (controller/serving.py).
LIMITS = Limits(
    max_connections=16, head_seconds=10.0, idle_seconds=120.0, body_seconds=10.0, max_body=0, max_in_flight=4
)

FRAMEWORKS = ("torch", "deepspeed", "mlx", "jax", "xgboost", "torchtune", "flux", "unknown", "other")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reconciles = Counter("trainer_reconcile", "TrainJob reconciles.", ["result"], registry=r)
        self.reconcile_errors = Counter(
            "trainer_reconcile_errors", "Reconciles that ended in an error.", registry=r
        )
        self.reconcile_seconds = Histogram(
            "trainer_reconcile_duration_seconds", "Time one reconcile took.", registry=r
        )
        self.created = Counter(
            "trainer_trainjobs_created",
            "TrainJobs whose JobSet the operator created.",
            ["framework"],
            registry=r,
        )
        self.completed = Counter(
            "trainer_trainjobs_completed", "TrainJobs that completed.", ["framework"], registry=r
        )
        self.failed = Counter("trainer_trainjobs_failed", "TrainJobs that failed.", ["framework"], registry=r)
        self.creation_to_jobset = Histogram(
            "trainer_trainjob_creation_to_jobset_seconds",
            "From a TrainJob's creation to the creation of its JobSet.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=r,
        )
        # client-go's leader election metric, by the Lease's name: 1 on the replica that reconciles
        # (the Lease's holder, or the only replica when leader election is off), 0 on the others.
        self.leader = Gauge(
            "leader_election_master_status",
            "Whether this replica reconciles: it holds the leader election Lease (or runs without one).",
            ["name"],
            registry=r,
        )
        for framework in FRAMEWORKS:
            for counter in (self.created, self.completed, self.failed):
                counter.labels(framework=framework)
        for result in ("success", "error", "requeue"):
            self.reconciles.labels(result=result)

    def server(self, host: str, port: int) -> GuardedServer:
        """``GET /metrics`` in Prometheus' text format (or OpenMetrics, when the scraper asks)."""
        registry = self.registry

        async def metrics(request: web.Request) -> web.Response:
            encode, content_type = choose_encoder(request.headers.get("Accept", ""))
            return web.Response(body=encode(registry), headers={"Content-Type": content_type})

        app = web.Application(client_max_size=1024)
        app.router.add_get("/metrics", metrics)
        return GuardedServer(app, host, port, "metrics server", LIMITS)


def framework_of(label: str | None) -> str:
    """The ``framework`` label value: one of FRAMEWORKS, whatever a runtime author wrote (a label
    takes any value, and each new one would be a new series for as long as the process lives)."""
    if not label:
        return "unknown"
    return label if label in FRAMEWORKS else "other"
