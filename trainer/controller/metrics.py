"""Prometheus metrics of the operator.

TrainJob counters are labelled by framework (the runtime's ``trainer.kubeflow.org/framework``
label) and exist for every known framework from the start, at zero, as the v1 operator's did:
a dashboard can then tell "no failures" from "no data".
"""

from __future__ import annotations

import ssl

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import choose_encoder

from trainer.controller.metrics_auth import MetricsAuth, guarded
from trainer.controller.reviews import RateLimits
from trainer.controller.serving import GuardedServer, Limits

# A scraper makes one small GET at a time; prometheus_client's own server started a thread for
# every connection, without bound (controller/serving.py). More requests in flight than reviews
# under way (metrics_auth.MAX_REVIEWS), so one more than those is answered 429, never queued.
LIMITS = Limits(
    max_connections=16, head_seconds=10.0, idle_seconds=120.0, body_seconds=10.0, max_body=0, max_in_flight=12
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
        self._operations(r)

    def _operations(self, r: CollectorRegistry) -> None:
        """What an SRE's dashboards and alerts read from any controller-runtime operator, under the
        names controller-runtime and client-go give them (docs/configuration.md, "Metrics")."""
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        ProcessCollector(registry=r)
        labels = ["controller"]
        self.cr_reconciles = Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller.",
            [*labels, "result"],
            registry=r,
        )
        self.cr_errors = Counter(
            "controller_runtime_reconcile_errors_total", "Total number of reconciliation errors per controller.",
            labels, registry=r,
        )  # fmt: skip
        self.cr_time = Histogram(
            "controller_runtime_reconcile_time_seconds", "Length of time per reconciliation per controller.",
            labels, registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9,
                     1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60),
        )  # fmt: skip
        self.cr_workers = Gauge(
            "controller_runtime_max_concurrent_reconciles", "Maximum number of concurrent reconciles per controller.",
            labels, registry=r,
        )  # fmt: skip
        self.cr_active = Gauge(
            "controller_runtime_active_workers", "Number of currently used workers per controller.",
            labels, registry=r,
        )  # fmt: skip
        queue = ["controller", "name"]
        self.wq_depth = Gauge("workqueue_depth", "Current depth of workqueue", queue, registry=r)
        self.wq_adds = Counter(
            "workqueue_adds_total", "Total number of adds handled by workqueue", queue, registry=r
        )
        self.wq_retries = Counter(
            "workqueue_retries_total", "Total number of retries handled by workqueue", queue, registry=r
        )
        buckets = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1, 10, 100, 1000)  # client-go's
        self.wq_queue_seconds = Histogram(
            "workqueue_queue_duration_seconds", "How long in seconds an item stays in workqueue before being requested",
            queue, registry=r, buckets=buckets,
        )  # fmt: skip
        self.wq_work_seconds = Histogram(
            "workqueue_work_duration_seconds", "How long in seconds processing an item from workqueue takes.",
            queue, registry=r, buckets=buckets,
        )  # fmt: skip
        self.rest_requests = Counter(
            "rest_client_requests_total", "Number of HTTP requests, partitioned by status code, method, and host.",
            ["code", "method", "host"], registry=r,
        )  # fmt: skip
        self.rest_seconds = Histogram(
            "rest_client_request_duration_seconds", "Request latency in seconds. Broken down by verb, and host.",
            ["verb", "host"], registry=r,
            buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0),
        )  # fmt: skip

    def api_request(self, method: str, host: str, code: int | None, seconds: float) -> None:
        """One request of the operator's API clients (``ApiClient.observer``); ``code`` None when
        no answer came (client-go counts those as ``<error>``)."""
        self.rest_requests.labels(
            code=str(code) if code is not None else "<error>", method=method, host=host
        ).inc()
        self.rest_seconds.labels(verb=method, host=host).observe(seconds)

    def server(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        auth: MetricsAuth | None = None,
        client_limits: RateLimits | None = None,
    ) -> GuardedServer:
        """``GET /metrics`` in Prometheus' text format (or OpenMetrics, when the scraper asks): over
        TLS given ``ssl_context`` (``metrics.secureServing``), to callers the API server says may
        read it given ``auth`` (``metrics.auth``; controller/metrics_auth.py)."""
        registry = self.registry

        async def metrics(request: web.Request) -> web.Response:
            encode, content_type = choose_encoder(request.headers.get("Accept", ""))
            return web.Response(body=encode(registry), headers={"Content-Type": content_type})

        app = web.Application(client_max_size=1024)
        app.router.add_get("/metrics", guarded(metrics, auth, client_limits))
        return GuardedServer(app, host, port, "metrics server", LIMITS, ssl_context)


CONTROLLER = "trainjob"  # the controller label of controller-runtime's metrics, and the queue's name


def framework_of(label: str | None) -> str:
    """The ``framework`` label value: one of FRAMEWORKS, whatever a runtime author wrote (a label
    takes any value, and each new one would be a new series for as long as the process lives)."""
    if not label:
        return "unknown"
    return label if label in FRAMEWORKS else "other"
