"""The operator under load on the local API server (a benchmark, not a test).

    .venv/bin/python bench/operator_load.py [--trainjobs 1000] [--rate 20] [--rate-count 200]
                                            [--steady 60] [--qps 1000 --burst 2000 --workers 16]

The local API server (``trainer_sandbox``, with its simulated JobSet controller, Job controller
and kubelet) runs in this process; the operator runs as ``trainer run`` in its own process, as
its own user, so the audit log tells its requests apart and its RSS is its own. Three phases,
each on a fresh server and operator:

1. burst: ``--trainjobs`` torch TrainJobs submitted at once (pods run until told otherwise, so
   the TrainJobs stay Running). Time until every JobSet exists, creation-to-JobSet latency,
   requests and writes per TrainJob; then ``--steady`` seconds of steady state (every write the
   operator makes counts, Events included); the operator's peak RSS (VmHWM). The operator gets
   a raised client budget (``--qps``, ``--burst``) and ``--workers`` reconcile workers: the
   default budget (50/100) caps any client at 50 requests/s, which this phase would measure
   instead of the operator.
2. rate: ``--rate-count`` torch TrainJobs at ``--rate`` per second with the default
   Configuration (QPS 50, burst 100, 4 workers): creation-to-JobSet latency.
3. states: suspended torch TrainJobs and running MPI ones (``deepspeed-distributed``), where
   upstream re-applies objects on every reconcile: our requests per TrainJob against upstream's
   for the same reconciles (see upstream.py for the derivation).

Latencies come from the audit log: the TrainJob's create request to the operator's JobSet create
request (a request is recorded when it arrives). Times are wall-clock on a shared 2-core machine
where the API server stand-in, its simulated controllers and the operator compete for the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import re
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import upstream
from benchlib import Report, Target, machine, percentile
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.apiserver.audit import AuditRecord
from trainer_sandbox.operator_process import OPERATOR_USER, OperatorProcess
from trainer_sandbox.sandbox import prepare

Obj = dict[str, Any]
SUBMITTER = "bench-user"
TJ = "trainer.kubeflow.org/v1alpha1"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
RUN_FOREVER = [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]
SUFFIXES = ("-runtime-snapshot", "-mpi-hostfile", "-mpi-ssh-auth")

TARGET_BURST_S = 30.0
TARGET_RATE_P99_S = 1.0
TARGET_RSS_MIB = 150.0


def trainjob(name: str, runtime: str = "torch-distributed", *, suspend: bool = False) -> Obj:
    spec: Obj = {"runtimeRef": {"name": runtime}, "trainer": {"numNodes": 1, "env": RUN_FOREVER}}
    if suspend:
        spec["suspend"] = True
    return {
        "apiVersion": TJ,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def owner(record: AuditRecord) -> str | None:
    """The TrainJob a request of the operator was about, from the names it gives its children."""
    if record.resource in ("trainjobs", "jobsets", "podgroups"):
        return record.name or None
    if record.resource in ("configmaps", "secrets"):
        for suffix in SUFFIXES:
            if record.name.endswith(suffix):
                return record.name.removesuffix(suffix)
    if record.resource == "events" and record.name:
        return record.name.rpartition(".")[0]
    return None


@dataclass
class Tracker:
    """Reads the audit log incrementally: TrainJob creations and the operator's JobSet creations."""

    server: LocalAPIServer
    seen: int = 0
    in_flight: list[int] = field(default_factory=list)
    created: dict[str, tuple[float, int]] = field(default_factory=dict)
    jobset: dict[str, tuple[float, int]] = field(default_factory=dict)

    def scan(self) -> None:
        # A record is appended when its request arrives and gets its status when the response is
        # sent: a create still in flight is looked at again on the next scan.
        records = self.server.audit.records
        end = len(records)
        pending: list[int] = []
        for index in [*self.in_flight, *range(self.seen, end)]:
            r = records[index]
            # The operator creates a JobSet by server-side apply: a patch answered 201.
            if r.verb != "create" and (r.verb, r.resource) != ("patch", "jobsets"):
                continue
            if r.status == 0:
                pending.append(index)
            elif r.status >= 300:
                continue
            elif r.resource == "trainjobs" and r.user == SUBMITTER:
                self.created[r.name] = (r.time, index)
            elif r.resource == "jobsets" and r.user == OPERATOR_USER and r.status == 201:
                self.jobset.setdefault(r.name, (r.time, index))
        self.in_flight = pending
        self.seen = end

    def latencies(self, names: list[str]) -> list[float]:
        return [self.jobset[n][0] - self.created[n][0] for n in names if n in self.jobset]


class Cluster:
    """A local API server here, the operator as ``trainer run`` in a child process."""

    def __init__(self, tmp: Path, *, qps: float, burst: int, workers: int) -> None:
        self.server = LocalAPIServer().start()
        prepare(self.server)
        self.server.add_user(SUBMITTER)
        self.operator = OperatorProcess(self.server, tmp, qps=qps, burst=burst, workers=workers)
        self.settings = self.operator.settings
        self.metrics_port = self.operator.metrics_port
        try:
            self.operator.start()
        except RuntimeError as exc:
            self.server.stop()
            raise SystemExit(str(exc)) from exc
        self.tracker = Tracker(self.server)
        self.wait_quiet(1.0)

    def stop(self) -> None:
        self.operator.stop()
        self.server.stop()

    # --- the operator process ---

    def status(self, field_name: str) -> int:
        return self.operator.proc_status(field_name)

    def cpu_seconds(self) -> float:
        return self.operator.cpu_seconds()

    def reconciles(self) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read()
        return sum(
            float(m.group(1))
            for m in re.finditer(rb'^trainer_reconcile_total\{result="[a-z]+"\} (\S+)$', text, re.M)
        )

    # --- the API server side ---

    def submit(self, objs: list[Obj], rate: float | None = None) -> None:
        """Create the objects as the submitting user: all at once, or ``rate`` per second."""
        assert self.server._loop is not None
        core = self.server.core
        rt = self.server._rt(TJ, "TrainJob")

        async def create(obj: Obj) -> Obj:
            ctx = self.server._ctx(SUBMITTER, "create", rt, "default", "")
            return await core.call(ctx, lambda: core.create(ctx, obj))

        futures: list[concurrent.futures.Future[Obj]] = []
        start = time.monotonic()
        for i, obj in enumerate(objs):
            if rate:
                delay = start + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            futures.append(asyncio.run_coroutine_threadsafe(create(obj), self.server._loop))
        for future in futures:
            future.result(120)

    def wait_jobsets(self, names: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self.tracker.scan()
            if all(n in self.tracker.jobset for n in names):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def wait_quiet(self, seconds: float, timeout: float = 300) -> None:
        """Until the operator has sent no request for ``seconds`` (watches stay open, so they count once)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            mark = len(self.server.audit.records)
            time.sleep(seconds)
            if not any(r.user == OPERATOR_USER for r in self.server.audit.records[mark:]):
                return
        print(f"  (the operator was still busy after {timeout:.0f} s)")

    def operator_records(self, since: int, until: int | None = None) -> list[AuditRecord]:
        return [r for r in self.server.audit.records[since:until] if r.user == OPERATOR_USER]


def per_trainjob(records: list[AuditRecord], names: set[str]) -> tuple[Counter[str], int]:
    """Request counts by kind (reads, writes, events) for these TrainJobs, and the unattributed rest."""
    counts: Counter[str] = Counter()
    shared = 0
    for r in records:
        if owner(r) not in names:
            shared += 1
            continue
        if r.resource == "events":
            counts["events"] += 1
        elif r.verb in WRITE_VERBS:
            counts["writes"] += 1
            if r.mutated:
                counts["stored"] += 1
        else:
            counts["reads"] += 1
    return counts, shared


def writes_until_jobset(cluster: Cluster, names: list[str], since: int) -> list[int]:
    """For each TrainJob: the operator's non-Event writes about it up to its JobSet's creation."""
    records = cluster.server.audit.records
    end = max(cluster.tracker.jobset[n][1] for n in names) + 1
    limit = {n: cluster.tracker.jobset[n][1] for n in names}
    counts = dict.fromkeys(names, 0)
    for index in range(since, end):
        r = records[index]
        name = owner(r) if r.user == OPERATOR_USER else None
        if name in counts and index <= limit[name] and r.verb in WRITE_VERBS and r.resource != "events":
            counts[name] += 1
    return list(counts.values())


def show_latency(label: str, seconds: list[float]) -> None:
    ms = [s * 1000 for s in seconds]
    print(
        f"  {label}: p50 {percentile(ms, 50):.0f} ms, p99 {percentile(ms, 99):.0f} ms, "
        f"max {max(ms):.0f} ms (n={len(ms)})"
    )


def show_writes(label: str, counts: list[int], objects: int, upstream_writes: float) -> Target:
    spread = Counter(counts)
    print(
        f"  {label}: max {max(counts)}, mean {sum(counts) / len(counts):.2f} "
        f"(distribution {dict(sorted(spread.items()))}); upstream {upstream_writes:g} applies"
    )
    return Target(
        f"writes per torch TrainJob until its JobSet exists (no Events), worst of {len(counts)}",
        max(counts),
        objects + 1,
        "",
        f"{objects} objects + 1 status write",
    )


def phase_burst(args: argparse.Namespace, report: Report, cluster: Cluster) -> None:
    n = args.trainjobs
    print(f"\n== burst: {n} torch TrainJobs submitted at once ({cluster.settings})")
    names = [f"burst-{i:05d}" for i in range(n)]
    mark = len(cluster.server.audit.records)
    reconciles0, cpu0 = cluster.reconciles(), cluster.cpu_seconds()
    start = time.time()
    cluster.submit([trainjob(name) for name in names])
    print(f"  submitted in {time.time() - start:.2f} s")
    done = cluster.wait_jobsets(names, timeout=600)
    tracker = cluster.tracker
    first = min(tracker.created[n][0] for n in names)
    last = max(tracker.jobset[n][0] for n in names if n in tracker.jobset)
    if not done:
        print(f"  only {len(tracker.jobset)} of {n} JobSets after 600 s")
    elapsed = last - first if done else float("inf")
    print(f"  every JobSet exists {elapsed:.1f} s after the first submission")
    floor_ours = upstream.budget_floor(2, n)  # snapshot and JobSet (Events have a budget of their own)
    floor_up = upstream.budget_floor(upstream.until_jobset(upstream.TORCH), n)
    print(
        f"  upstream: no published figure; its client budget alone needs >= {floor_up:.0f} s for "
        f"{n} x {upstream.until_jobset(upstream.TORCH):g} applies (ours at that budget: >= "
        f"{floor_ours:.0f} s for its 2 creates each)"
    )
    report.add(Target(f"{n} TrainJobs at once: every JobSet exists", round(elapsed, 1), TARGET_BURST_S, " s"))
    show_latency("creation to JobSet", tracker.latencies(names))
    counts = writes_until_jobset(cluster, names, mark)
    report.add(
        show_writes("writes until the JobSet exists", counts, 2, upstream.until_jobset(upstream.TORCH))
    )

    cluster.wait_quiet(3.0)
    records = cluster.operator_records(mark)
    by_kind, shared = per_trainjob(records, set(names))
    reconciles = (cluster.reconciles() - reconciles0) / n
    cpu = cluster.cpu_seconds() - cpu0
    status_writes = sum(1 for r in records if r.subresource == "status" and r.verb == "patch") / n
    up = upstream.lifecycle(
        upstream.TORCH, suspended=False, reconciles=reconciles, status_writes=status_writes
    )
    print(
        f"  from creation to quiet, per TrainJob: {reconciles:.2f} reconciles, "
        f"{sum(by_kind.values()) / n:.2f} requests = {by_kind['reads'] / n:.2f} reads + "
        f"{by_kind['writes'] / n:.2f} writes ({status_writes:.2f} of them status) + "
        f"{by_kind['events'] / n:.2f} Events; {shared} requests shared by all (watches, lists); "
        f"operator CPU {cpu * 1000 / n:.1f} ms"
    )
    print(
        f"  upstream for the same reconciles: {up.total:.2f} requests = {up.reads:.2f} reads (cached "
        f"upstream) + {up.writes:.2f} writes + 0 Events"
    )

    print(f"\n== steady state: {args.steady:.0f} s with {n} Running TrainJobs, one operator replica")
    mark = len(cluster.server.audit.records)
    time.sleep(args.steady)
    steady = cluster.operator_records(mark)
    writes = [r for r in steady if r.verb in WRITE_VERBS]
    print(
        f"  operator requests: {len(steady)} ({dict(Counter(r.verb for r in steady))}), "
        f"writes {len(writes)} {dict(Counter((r.verb, r.resource) for r in writes))}"
    )
    print(
        "  upstream: 0 too while nothing changes (no watch event, no reconcile; controller-runtime "
        "resyncs every 10 h), then one status PATCH per change plus, per reconcile, JobSet + PodGroup "
        "applies while suspended and the hostfile apply for MPI"
    )
    report.add(Target(f"writes in {args.steady:.0f} s of steady state", len(writes), 0))

    peak, now = cluster.status("VmHWM") / 1024, cluster.status("VmRSS") / 1024
    print(f"\n== operator memory with {n} TrainJobs: peak RSS {peak:.1f} MiB, now {now:.1f} MiB")
    print("  upstream: no published figure")
    report.add(Target(f"operator peak RSS with {n} TrainJobs", round(peak, 1), TARGET_RSS_MIB, " MiB"))


def phase_rate(args: argparse.Namespace, report: Report, cluster: Cluster) -> None:
    n = args.rate_count
    print(f"\n== rate: {n} torch TrainJobs at {args.rate:g}/s ({cluster.settings}: the defaults)")
    names = [f"rate-{i:05d}" for i in range(n)]
    mark = len(cluster.server.audit.records)
    cluster.submit([trainjob(name) for name in names], rate=args.rate)
    if not cluster.wait_jobsets(names, timeout=300):
        print(f"  only {len(cluster.tracker.jobset)} of {n} JobSets after 300 s")
    last_submission = time.monotonic()
    latencies = cluster.tracker.latencies(names)
    show_latency("creation to JobSet", latencies)
    cluster.wait_quiet(1.0)
    print(
        f"  the operator was quiet (every status written) {time.monotonic() - last_submission - 1.0:.1f} s "
        "after the last JobSet: status writes yield the budget to children's and catch up"
    )
    print(
        f"  upstream: no published figure; at {args.rate:g}/s its {upstream.until_jobset(upstream.TORCH):g} "
        f"applies per TrainJob need {args.rate * upstream.until_jobset(upstream.TORCH):g} requests/s of its "
        f"{upstream.QPS:g} QPS"
    )
    report.add(
        Target(
            f"creation to JobSet p99 at {args.rate:g}/s",
            round(percentile(latencies, 99), 3),
            TARGET_RATE_P99_S,
            " s",
        )
    )
    counts = writes_until_jobset(cluster, [n for n in names if n in cluster.tracker.jobset], mark)
    report.add(
        show_writes("writes until the JobSet exists", counts, 2, upstream.until_jobset(upstream.TORCH))
    )


def phase_states(args: argparse.Namespace, cluster: Cluster) -> None:
    """Suspended torch and running MPI TrainJobs: ours against upstream for the same reconciles."""
    print(
        f"\n== states: {args.state_count} TrainJobs per state, ours against upstream for the same reconciles"
    )
    print(
        f"  {'state':<24} {'reconciles':>10} {'ours: req':>10} {'writes':>7} {'events':>7}   {'upstream: req':>13} {'writes':>7}"
    )
    groups = [
        ("torch, suspended", "torch-distributed", True, upstream.TORCH),
        ("MPI (DeepSpeed), running", "deepspeed-distributed", False, upstream.MPI),
        ("MPI (DeepSpeed), suspended", "deepspeed-distributed", True, upstream.MPI),
    ]
    for label, runtime, suspend, shape in groups:
        slug = re.sub(r"[^a-z]+", "-", label.lower()).strip("-")
        names = [f"{slug}-{i:04d}" for i in range(args.state_count)]
        mark = len(cluster.server.audit.records)
        before = cluster.reconciles()
        cluster.submit([trainjob(name, runtime, suspend=suspend) for name in names])
        cluster.wait_jobsets(names, timeout=300)
        cluster.wait_quiet(3.0)
        n = len(names)
        records = cluster.operator_records(mark)
        by_kind, _ = per_trainjob(records, set(names))
        reconciles = (cluster.reconciles() - before) / n
        status_writes = sum(1 for r in records if r.subresource == "status" and r.verb == "patch") / n
        up = upstream.lifecycle(shape, suspended=suspend, reconciles=reconciles, status_writes=status_writes)
        ours = sum(by_kind.values()) / n
        print(
            f"  {label:<24} {reconciles:>10.2f} {ours:>10.2f} {by_kind['writes'] / n:>7.2f} "
            f"{by_kind['events'] / n:>7.2f}   {up.total:>13.2f} {up.writes:>7.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainjobs", type=int, default=1000, help="TrainJobs submitted at once")
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of steady state")
    parser.add_argument("--rate", type=float, default=20.0, help="TrainJobs per second in the rate phase")
    parser.add_argument("--rate-count", type=int, default=200, help="TrainJobs in the rate phase")
    parser.add_argument("--state-count", type=int, default=50, help="TrainJobs per state in the states phase")
    parser.add_argument("--qps", type=float, default=1000.0, help="client QPS in the burst phase")
    parser.add_argument("--burst", type=int, default=2000, help="client burst in the burst phase")
    parser.add_argument("--workers", type=int, default=16, help="reconcile workers in the burst phase")
    parser.add_argument("--phases", default="burst,rate,states", help="comma-separated phases to run")
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))

    print(machine())
    print("operator: `trainer run` in its own process; API server: trainer_sandbox.LocalAPIServer here")
    print(upstream.DERIVATION)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="trainer-bench-") as tmp:
        if "burst" in phases:
            cluster = Cluster(Path(tmp) / "burst", qps=args.qps, burst=args.burst, workers=args.workers)
            try:
                phase_burst(args, report, cluster)
            finally:
                cluster.stop()
            # The API server stand-in runs in this process: collect the burst's server now, so
            # that a collection of its 600,000 objects does not pause the next phase's server.
            del cluster
            gc.collect()
        if phases & {"rate", "states"}:
            # The defaults of Configuration: what a cluster gets without tuning.
            cluster = Cluster(Path(tmp) / "default", qps=50, burst=100, workers=4)
            try:
                if "rate" in phases:
                    phase_rate(args, report, cluster)
                if "states" in phases:
                    phase_states(args, cluster)
            finally:
                cluster.stop()
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
