"""A TrainJob controller under load, on the real control plane or the stand-in (a benchmark, not a test).

    .venv/bin/python bench/operator_load.py [--backend real|standin|both] [--controller ours]
        [--controller 'COMMAND {kubeconfig}'] [--trainjobs 1000] [--rate 20] [--fast-rate 100]
        [--rate-count 200] [--steady 60] [--state-count 50] [--phases burst,rate,fast,states]
        [--scale-counts 1000,3000,10000]

Backends: ``real`` is the control plane built from cluster/ (kube-apiserver, etcd, the
controller manager, the scheduler, JobSet's controller, kwok's nodes and pods), a fresh one for
each group of phases; ``standin`` is ``trainer_sandbox.LocalAPIServer`` in this process, with its
simulated JobSet controller and kubelet; ``both`` runs the same work on each, one after the other.

Controllers: ``ours`` is ``trainer run`` in a process of its own, as its own user; ``upstream``
is upstream's trainer-controller-manager v2.3.0 as ``cluster/build`` builds it (real backend
only), with the same client budget as ours in each phase, its webhooks and certificate
management off, one replica; any other value is a command run instead (``{kubeconfig}`` is replaced by the path of a kubeconfig for a
user of its own, also given as ``$KUBECONFIG``), on a fresh control plane of the same build and
the same work. Each controller runs under its own user, bound to ``cluster-admin`` (ours
included: the figures are about requests, not rights), so the audit log tells its requests apart.
Given several, the report ends with their figures side by side. docs/benchmarks.md says how to
point it at another controller binary. With two controllers on one backend, the table gives each
figure's ratio of the first to the second, and flags a phase whose load averages differ by more
than 2 (the machine is shared: such a pair is not a fair comparison).

Phases, each group on a fresh server and controller:

1. burst: ``--trainjobs`` torch TrainJobs submitted at once (their pods run until told
   otherwise, so the TrainJobs stay Running). Time until every JobSet exists, creation-to-JobSet
   latency, writes per TrainJob until its JobSet exists, requests per TrainJob; then ``--steady``
   seconds of steady state (every write counts, Events included); the controller's peak RSS and
   CPU time; etcd's database size before and after (real). Ours gets a raised client budget
   (``--qps``, ``--burst``) and ``--workers`` workers: the default budget would be measured instead.
2. rate: ``--rate-count`` torch TrainJobs at ``--rate`` per second with the default
   Configuration (QPS 50, burst 100, 4 workers): creation-to-JobSet latency.
3. fast: as rate, at ``--fast-rate`` per second, with the budget raised to fit (``--fast-qps``,
   ``--fast-burst``: at two writes per TrainJob the default budget sustains about 25/s).
4. states: suspended torch TrainJobs, running and suspended MPI ones (``deepspeed-distributed``):
   requests and writes per TrainJob, by verb and resource.
5. scale (only when named in ``--phases``): the burst's submission at each count of
   ``--scale-counts`` (1,000, 3,000 and 10,000), each on a fresh server and controller: the
   controller's CPU per TrainJob and RSS growth per 1,000 TrainJobs at each, and for ours the
   targets that both stay within 1.2x of their value at the smallest count.

Requests, writes and latencies come from the API server's audit log (on the real control plane
kube-apiserver's own, its ``requestReceivedTimestamp``): a TrainJob's create to the controller's
JobSet create. Times are wall-clock on a shared machine where the API server, its controllers and
the controller under test compete for the cores: the machine line says which.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchlib import Report, Target, machine, percentile
from trainer_sandbox.apiserver.audit import AuditRecord
from trainer_sandbox.operator_process import (
    OPERATOR_USER,
    OperatorProcess,
    _die_with_parent,
    cpu_seconds,
    proc_status,
)

Obj = dict[str, Any]
SUBMITTER = "bench-user"
OTHER_USER = "bench-controller"
TJ = "trainer.kubeflow.org/v1alpha1"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
RUN_FOREVER = [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]
SUFFIXES = ("-runtime-snapshot", "-mpi-hostfile", "-mpi-ssh-auth")
PODS_PER_NODE = 110  # the control plane's kwok nodes, as a kubelet's default

TARGET_BURST_S = 30.0
TARGET_RATE_P99_S = 1.0
TARGET_FAST_P99_S = 2.0
TARGET_RSS_MIB = 150.0
LOAD_ROW = "burst: load average (1 min)"
UPSTREAM_USER = "bench-upstream"


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
    """The TrainJob a request of the controller was about, from the names it gives its children."""
    if record.resource in ("trainjobs", "jobsets", "podgroups"):
        return record.name or None
    if record.resource in ("configmaps", "secrets"):
        for suffix in SUFFIXES:
            if record.name.endswith(suffix):
                return record.name.removesuffix(suffix)
    if record.resource == "events" and record.name:
        return record.name.rpartition(".")[0]
    return None


# --- backends ------------------------------------------------------------------------------------


class Backend(Protocol):
    name: str
    api: Any  # trainer_sandbox.backends.Cluster

    def audit(self) -> list[AuditRecord]:
        """Every request so far, in the order recorded (a list that only grows)."""

    def submit(self, objs: list[Obj], rate: float | None = None) -> None: ...

    def etcd_bytes(self) -> int | None: ...

    def stop(self) -> None: ...


class Standin:
    """``trainer_sandbox.LocalAPIServer`` in this process; records are appended as requests arrive."""

    name = "stand-in"

    def __init__(self, tmp: Path, pods: int) -> None:
        from trainer_sandbox.sandbox import local_apiserver, prepare

        self.server = local_apiserver().start()
        prepare(self.server)
        self.server.add_user(SUBMITTER)
        self.api = self.server

    def audit(self) -> list[AuditRecord]:
        return self.server.audit.records

    def submit(self, objs: list[Obj], rate: float | None = None) -> None:
        """Create the objects as the submitting user: all at once, or ``rate`` per second."""
        server = self.server
        assert server._loop is not None
        core = server.core
        rt = server._rt(TJ, "TrainJob")

        async def create(obj: Obj) -> Obj:
            ctx = server._ctx(SUBMITTER, "create", rt, "default", "")
            return await core.call(ctx, lambda: core.create(ctx, obj))

        futures: list[concurrent.futures.Future[Obj]] = []
        for delay in _schedule(len(objs), rate):
            if delay > 0:
                time.sleep(delay)
            futures.append(asyncio.run_coroutine_threadsafe(create(objs[len(futures)]), server._loop))
        for future in futures:
            future.result(120)

    def etcd_bytes(self) -> int | None:
        return None

    def stop(self) -> None:
        self.server.stop()


class Real:
    """A fresh control plane from cluster/ with kwok nodes for ``pods`` pods; kube-apiserver's audit
    log (JSON lines, one per request once answered) is read as it grows."""

    name = "real"

    def __init__(self, tmp: Path, pods: int) -> None:
        from trainer_sandbox.backends import RealCluster
        from trainer_sandbox.cluster import ControlPlane, install

        # Without the writer of kwok pods' logs: its object and file per pod are no controller's work.
        self.plane = ControlPlane.start(tmp / "control-plane", pod_logs=False)
        self.api = RealCluster(
            self.plane.kubeconfig,
            self.plane.audit_log,
            ca_dir=self.plane.pki_dir,
            kubectl=str(self.plane.kubectl),
        )
        nodes = max(install.NODE_COUNT, -(-pods // PODS_PER_NODE) + 1)
        if nodes > install.NODE_COUNT:
            admin = self.plane.client()
            install.create_all(admin, install.nodes(nodes)[install.NODE_COUNT :])
            deadline = time.monotonic() + 60
            while not install.nodes_ready(admin, nodes):
                if time.monotonic() > deadline:
                    raise SystemExit(f"{nodes} kwok nodes were not Ready within 60 s")
                time.sleep(0.5)
        self.api.grant(SUBMITTER)
        self._records: list[AuditRecord] = []
        self._offset = 0
        self._started: set[str] = set()

    def audit(self) -> list[AuditRecord]:
        from trainer_sandbox.backends import audit_record

        with self.plane.audit_log.open("rb") as log:
            log.seek(self._offset)
            chunk = log.read()
        complete = chunk.rfind(b"\n") + 1  # a line being written is read next time
        self._offset += complete
        for line in chunk[:complete].splitlines():
            event = json.loads(line)
            audit_id = str(event.get("auditID"))
            if event.get("stage") == "ResponseStarted":
                self._started.add(audit_id)
            elif audit_id in self._started:
                continue  # a watch, counted when it opened
            record = audit_record(event)
            if record is not None:
                self._records.append(record)
        return self._records

    def submit(self, objs: list[Obj], rate: float | None = None) -> None:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = []
            for delay, obj in zip(_schedule(len(objs), rate), objs, strict=True):
                if delay > 0:
                    time.sleep(delay)
                futures.append(pool.submit(self.api.create, obj, SUBMITTER))
            for future in futures:
                future.result(120)

    def etcd_bytes(self) -> int | None:
        db = self.plane.dir / "etcd" / "member" / "snap" / "db"
        return db.stat().st_size if db.exists() else None

    def stop(self) -> None:
        self.plane.stop()


BACKENDS: dict[str, Callable[[Path, int], Backend]] = {"standin": Standin, "real": Real}
BACKEND_NAMES = {"standin": Standin.name, "real": Real.name}


def _schedule(count: int, rate: float | None) -> Iterator[float]:
    """Seconds to wait before each submission: none for a burst, else one every 1/rate s."""
    start = time.monotonic()
    for i in range(count):
        yield start + i / rate - time.monotonic() if rate else 0.0


# --- controllers ---------------------------------------------------------------------------------


class Controller(Protocol):
    user: str
    settings: str

    def reconciles(self) -> float | None: ...

    def memory_kib(self, field_name: str) -> int: ...

    def cpu_seconds(self) -> float: ...

    def stop(self) -> None: ...


class Ours:
    """``trainer run`` with a Configuration of QPS, burst and workers."""

    def __init__(self, backend: Backend, tmp: Path, *, qps: float, burst: int, workers: int) -> None:
        self.user = OPERATOR_USER
        self.process = OperatorProcess(backend.api, tmp, qps=qps, burst=burst, workers=workers)
        backend.api.grant(self.user)
        self.settings = self.process.settings
        self.metrics_port = self.process.metrics_port
        try:
            self.process.start()
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from exc

    def reconciles(self) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read()
        return sum(
            float(m.group(1))
            for m in re.finditer(rb'^trainer_reconcile_total\{result="[a-z]+"\} (\S+)$', text, re.M)
        )

    def memory_kib(self, field_name: str) -> int:
        return self.process.proc_status(field_name)

    def cpu_seconds(self) -> float:
        return self.process.cpu_seconds()

    def stop(self) -> None:
        self.process.stop()


class Command:
    """Another controller: ``command`` with ``{kubeconfig}`` replaced, as a user of its own."""

    def __init__(self, backend: Backend, tmp: Path, command: str) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.user = OTHER_USER
        backend.api.add_user(self.user)
        backend.api.grant(self.user)
        kubeconfig = backend.api.write_kubeconfig(tmp / "controller.kubeconfig", user=self.user)
        argv = shlex.split(command.replace("{kubeconfig}", shlex.quote(str(kubeconfig))))
        self.settings = "its own client budget and workers (whatever its command sets)"
        self.log = tmp / "controller.log"
        seen = len(backend.audit())
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                env={**os.environ, "KUBECONFIG": str(kubeconfig)},
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        deadline = time.monotonic() + 120
        while not any(
            r.user == self.user and r.verb == "watch" and r.resource == "trainjobs"
            for r in backend.audit()[seen:]
        ):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-3000:]
                self.stop()
                raise SystemExit(f"the controller did not start watching TrainJobs:\n{tail}")
            time.sleep(0.1)

    def reconciles(self) -> None:
        return None

    def memory_kib(self, field_name: str) -> int:
        return proc_status(self.proc.pid, field_name)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Upstream:
    """Upstream's trainer-controller-manager (docs/benchmarks.md), as a user of its own."""

    def __init__(self, backend: Backend, tmp: Path, *, qps: float, burst: int) -> None:
        from trainer_sandbox.cluster import addons
        from trainer_sandbox.ports import free_port

        if not isinstance(backend, Real):
            raise SystemExit("--controller upstream runs on the real control plane only (--backend real)")
        self.user = UPSTREAM_USER
        backend.api.add_user(self.user)
        backend.api.grant(self.user)
        kubeconfig = backend.api.write_kubeconfig(tmp / "upstream.kubeconfig", user=self.user)
        self.metrics_port = free_port()
        # Its TrainJob controller runs one worker whatever groupKindConcurrency says (it is built
        # without For(), which that setting keys on), so there is no worker count to give it.
        self.settings = f"client QPS {qps:g}, burst {burst}, its one TrainJob worker"
        try:
            self.process = addons.start_upstream_trainer(
                backend.plane,
                kubeconfig,
                tmp,
                webhooks=False,
                client=(qps, burst),
                metrics_port=self.metrics_port,
            )
        except addons.AddonError as exc:
            raise SystemExit(str(exc)) from exc

    def reconciles(self) -> float:
        """Its TrainJob controller's reconciles, from controller-runtime's own counter."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read()
        return sum(
            float(m.group(1))
            for m in re.finditer(
                rb'^controller_runtime_reconcile_total\{controller="trainjob_controller",result="[a-z_]+"\} (\S+)$',
                text,
                re.M,
            )
        )

    def memory_kib(self, field_name: str) -> int:
        return proc_status(self.process.process.pid, field_name)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.process.process.pid)

    def stop(self) -> None:
        self.process.stop()


@dataclass
class Run:
    """One backend and one controller under it, for one group of phases."""

    backend: Backend
    controller: Controller
    seen: int = 0
    in_flight: list[int] = field(default_factory=list)
    created: dict[str, tuple[float, int]] = field(default_factory=dict)
    jobset: dict[str, tuple[float, int]] = field(default_factory=dict)

    def scan(self) -> None:
        """TrainJob creations and the controller's JobSet creations, read incrementally.

        On the stand-in a record is appended when its request arrives and gets its status when
        the response is sent: a create still in flight is looked at again on the next scan.
        """
        records = self.backend.audit()
        end = len(records)
        pending: list[int] = []
        for index in [*self.in_flight, *range(self.seen, end)]:
            r = records[index]
            # A JobSet may be created by server-side apply: a patch answered 201.
            if r.verb != "create" and (r.verb, r.resource) != ("patch", "jobsets"):
                continue
            if r.status == 0:
                pending.append(index)
            elif r.status >= 300:
                continue
            elif r.resource == "trainjobs" and r.user == SUBMITTER:
                self.created[r.name] = (r.time, index)
            elif r.resource == "jobsets" and r.user == self.controller.user and r.status == 201:
                self.jobset.setdefault(r.name, (r.time, index))
        self.in_flight = pending
        self.seen = end

    def latencies(self, names: list[str]) -> list[float]:
        return [
            self.jobset[n][0] - self.created[n][0] for n in names if n in self.jobset and n in self.created
        ]

    def mark(self) -> int:
        return len(self.backend.audit())

    def wait_jobsets(self, names: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self.scan()
            if all(n in self.jobset for n in names):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def wait_quiet(self, seconds: float, timeout: float = 300) -> None:
        """Until the controller has sent no request for ``seconds`` (open watches count once)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            mark = self.mark()
            time.sleep(seconds)
            if not any(r.user == self.controller.user for r in self.backend.audit()[mark:]):
                return
        print(f"  (the controller was still busy after {timeout:.0f} s)")

    def records(self, since: int, until: int | None = None) -> list[AuditRecord]:
        return [r for r in self.backend.audit()[since:until] if r.user == self.controller.user]

    def stop(self) -> None:
        self.controller.stop()
        self.backend.stop()


@dataclass
class Tally:
    """A controller's requests about a set of TrainJobs. ``writes`` counts every write request,
    whatever its answer; ``stored`` those of them that changed something (a subset, never added
    to the total); Events are apart from both."""

    reads: int = 0
    writes: int = 0
    stored: int = 0
    events: int = 0
    requests: Counter[str] = field(default_factory=Counter)  # by "verb resource[/subresource]"
    refused: Counter[str] = field(default_factory=Counter)  # of them, answered >= 300: "verb resource code"
    shared: int = 0  # about no TrainJob of the set (watches, lists): not in the total

    @property
    def total(self) -> int:
        return self.reads + self.writes + self.events


def per_trainjob(records: list[AuditRecord], names: set[str]) -> Tally:
    """The requests about these TrainJobs, by kind and by verb and resource, and the rest apart."""
    tally = Tally()
    for r in records:
        if owner(r) not in names:
            tally.shared += 1
            continue
        key = f"{r.verb} {r.resource}{'/' + r.subresource if r.subresource else ''}"
        tally.requests[key] += 1
        if r.status >= 300:
            tally.refused[f"{key} {r.status}"] += 1
        if r.resource == "events":
            tally.events += 1
        elif r.verb in WRITE_VERBS:
            tally.writes += 1
            if r.mutated:
                tally.stored += 1
        else:
            tally.reads += 1
    return tally


def requests_line(tally: Tally, n: int) -> str:
    """Requests per TrainJob by verb and resource, most first; then those answered with an error
    (a conflict is a request spent for nothing)."""
    line = ", ".join(f"{key} {count / n:.2f}" for key, count in tally.requests.most_common())
    if tally.refused:
        line += "; answered >= 300: " + ", ".join(
            f"{key} {count / n:.2f}" for key, count in tally.refused.most_common()
        )
    return line


def writes_until_jobset(run: Run, names: list[str], since: int) -> list[int]:
    """For each TrainJob: the controller's non-Event writes about it up to its JobSet's creation."""
    records = run.backend.audit()
    end = max(run.jobset[n][1] for n in names) + 1
    limit = {n: run.jobset[n][1] for n in names}
    counts = dict.fromkeys(names, 0)
    for index in range(since, end):
        r = records[index]
        name = owner(r) if r.user == run.controller.user else None
        if name in counts and index <= limit[name] and r.verb in WRITE_VERBS and r.resource != "events":
            counts[name] += 1
    return list(counts.values())


def status_write_spread(records: list[AuditRecord], names: set[str]) -> str:
    """How many status writes each TrainJob got (a distribution), and the seconds between a
    TrainJob's consecutive ones (quartiles): what batching progress could fold, and could not."""
    times: dict[str, list[float]] = {}
    for r in records:
        if r.subresource == "status" and r.verb in WRITE_VERBS and owner(r) in names:
            times.setdefault(r.name, []).append(r.time)
    counts = Counter(len(t) for t in times.values())
    gaps = sorted(b - a for t in times.values() for a, b in itertools.pairwise(t))
    quartiles = (
        ", gaps between them p25 {:.2f} s, p50 {:.2f} s, p75 {:.2f} s".format(
            *(percentile(gaps, q) for q in (25, 50, 75))
        )
        if gaps
        else ""
    )
    return f"{dict(sorted(counts.items()))}{quartiles}"


def latency_line(label: str, seconds: list[float]) -> str:
    if not seconds:
        return f"  {label}: no JobSet at all"
    ms = [s * 1000 for s in seconds]
    return (
        f"  {label}: p50 {percentile(ms, 50):.0f} ms, p99 {percentile(ms, 99):.0f} ms, "
        f"max {max(ms):.0f} ms (n={len(ms)})"
    )


# --- phases --------------------------------------------------------------------------------------


@dataclass
class Figures:
    """What one controller on one backend measured, by row of the side-by-side table."""

    label: str
    rows: dict[str, str] = field(default_factory=dict)


class Bench:
    def __init__(self, args: argparse.Namespace, report: Report, tmp: Path) -> None:
        self.args = args
        self.report = report
        self.tmp = tmp
        self.groups = 0

    def start(
        self, backend_name: str, controller: str, *, pods: int, qps: float, burst: int, workers: int
    ) -> Run:
        self.groups += 1
        where = self.tmp / f"{self.groups:02d}"
        backend = BACKENDS[backend_name](where, pods)
        try:
            made: Controller
            if controller == "ours":
                made = Ours(backend, where / "operator", qps=qps, burst=burst, workers=workers)
            elif controller == "upstream":
                made = Upstream(backend, where / "upstream", qps=qps, burst=burst)
            else:
                made = Command(backend, where / "controller", controller)
        except BaseException:
            backend.stop()
            raise
        run = Run(backend, made)
        run.wait_quiet(1.0)
        return run

    def target(self, run: Run, controller: str, target: Target) -> None:
        self.judge(run.backend.name, controller, target)

    def judge(self, backend: str, controller: str, target: Target) -> None:
        """Targets are ours: another controller's figures are printed, not judged."""
        target.name = f"[{backend}] {target.name}"
        if controller == "ours":
            self.report.add(target)
        else:
            print(f"  (not a target for another controller) {target.line()}")

    def burst(self, backend_name: str, controller: str, figures: Figures) -> None:
        args, n = self.args, self.args.trainjobs
        run = self.start(
            backend_name, controller, pods=n, qps=args.qps, burst=args.burst, workers=args.workers
        )
        try:
            self._burst(run, controller, figures)
        finally:
            run.stop()
            del run
            gc.collect()  # the stand-in's 600,000 objects, before the next server starts

    def _burst(self, run: Run, controller: str, figures: Figures) -> None:
        args, n = self.args, self.args.trainjobs
        print(f"\n== burst: {n} torch TrainJobs submitted at once ({run.controller.settings})")
        names = [f"burst-{i:05d}" for i in range(n)]
        etcd_before = run.backend.etcd_bytes()
        # Idle: started, synced and quiet, before any TrainJob (what a cluster without work costs).
        idle = run.controller.memory_kib("VmRSS") / 1024
        mark = run.mark()
        reconciles0, cpu0 = run.controller.reconciles(), run.controller.cpu_seconds()
        start = time.time()
        run.backend.submit([trainjob(name) for name in names])
        print(f"  submitted in {time.time() - start:.2f} s")
        done = run.wait_jobsets(names, timeout=600)
        if not done:
            print(f"  only {len(run.jobset)} of {n} JobSets after 600 s")
        first = min(run.created[n][0] for n in names if n in run.created)
        last = max((run.jobset[n][0] for n in names if n in run.jobset), default=first)
        elapsed = last - first if done else float("inf")
        print(f"  every JobSet exists {elapsed:.1f} s after the first submission")
        figures.rows["burst: every JobSet exists"] = f"{elapsed:.1f} s"
        self.target(
            run,
            controller,
            Target(f"{n} TrainJobs at once: every JobSet exists", round(elapsed, 1), TARGET_BURST_S, " s"),
        )
        latencies = run.latencies(names)
        print(latency_line("creation to JobSet", latencies))
        figures.rows["burst: creation to JobSet p99"] = f"{percentile(latencies, 99):.2f} s"
        made = [name for name in names if name in run.jobset]
        if made:
            counts = writes_until_jobset(run, made, mark)
            self.writes_target(run, controller, figures, "burst", counts)

        run.wait_quiet(3.0)
        records = run.records(mark)
        tally = per_trainjob(records, set(names))
        cpu = run.controller.cpu_seconds() - cpu0
        status_writes = sum(1 for r in records if r.subresource == "status" and r.verb in WRITE_VERBS) / n
        line = (
            f"{tally.total / n:.2f} requests = {tally.reads / n:.2f} reads + "
            f"{tally.writes / n:.2f} writes ({status_writes:.2f} of them status) + "
            f"{tally.events / n:.2f} Events"
        )
        reconciles1 = run.controller.reconciles()
        per_reconcile = ""
        if reconciles0 is not None and reconciles1 is not None:
            per_reconcile = f"{(reconciles1 - reconciles0) / n:.2f} reconciles, "
        load = os.getloadavg()[0]
        print(
            f"  from creation to quiet, per TrainJob: {per_reconcile}{line}; {tally.shared} requests shared by "
            f"all (watches, lists); controller CPU {cpu * 1000 / n:.1f} ms; load average (1 min) {load:.2f}"
        )
        print(f"  by request, per TrainJob: {requests_line(tally, n)}")
        print(f"  status writes per TrainJob: {status_write_spread(records, set(names))}")
        figures.rows["burst: requests per TrainJob"] = f"{tally.total / n:.2f}"
        figures.rows["burst: writes per TrainJob"] = f"{tally.writes / n:.2f}"
        figures.rows["burst: Events per TrainJob"] = f"{tally.events / n:.2f}"
        figures.rows["burst: controller CPU per TrainJob"] = f"{cpu * 1000 / n:.1f} ms"
        figures.rows[LOAD_ROW] = f"{load:.2f}"

        print(f"\n== steady state: {args.steady:.0f} s with {n} Running TrainJobs, one replica")
        mark = run.mark()
        idle_cpu0 = run.controller.cpu_seconds()
        time.sleep(args.steady)
        idle_cpu = (run.controller.cpu_seconds() - idle_cpu0) / args.steady
        steady = run.records(mark)
        writes = [r for r in steady if r.verb in WRITE_VERBS]
        print(
            f"  controller requests: {len(steady)} ({dict(Counter(r.verb for r in steady))}), "
            f"writes {len(writes)} {dict(Counter((r.verb, r.resource) for r in writes))}; "
            f"controller CPU {idle_cpu * 1000:.1f} ms a second"
        )
        figures.rows["steady: controller CPU a second"] = f"{idle_cpu * 1000:.1f} ms"
        figures.rows[f"steady: writes in {args.steady:g} s"] = str(len(writes))
        self.target(run, controller, Target(f"writes in {args.steady:.0f} s of steady state", len(writes), 0))

        peak, now = run.controller.memory_kib("VmHWM") / 1024, run.controller.memory_kib("VmRSS") / 1024
        growth = (peak - idle) / n * 1000
        print(
            f"\n== controller memory with {n} TrainJobs: idle RSS {idle:.1f} MiB, peak {peak:.1f} MiB, "
            f"now {now:.1f} MiB; RSS growth per 1,000 TrainJobs {growth:.1f} MiB"
        )
        figures.rows["idle RSS"] = f"{idle:.1f} MiB"
        figures.rows["peak RSS"] = f"{peak:.1f} MiB"
        figures.rows["RSS growth per 1,000 TrainJobs"] = f"{growth:.1f} MiB"
        self.target(
            run, controller, Target(f"peak RSS with {n} TrainJobs", round(peak, 1), TARGET_RSS_MIB, " MiB")
        )
        etcd_after = run.backend.etcd_bytes()
        if etcd_before is not None and etcd_after is not None:
            print(
                f"  etcd database: {etcd_before / 2**20:.1f} MiB before, {etcd_after / 2**20:.1f} MiB after"
            )
            figures.rows["etcd database after the burst"] = f"{etcd_after / 2**20:.1f} MiB"

    def scale(self, backend_name: str, controller: str, figures: Figures) -> None:
        """The burst's submission at each of ``--scale-counts``, each on a fresh server and
        controller: what a TrainJob costs must not grow with how many there are."""
        args = self.args
        counts = sorted({int(x) for x in args.scale_counts.split(",") if x.strip()})
        print(f"\n== scale: {', '.join(f'{n:,}' for n in counts)} torch TrainJobs submitted at once")
        cpu_at: dict[int, float] = {}
        growth_at: dict[int, float] = {}
        for n in counts:
            run = self.start(
                backend_name, controller, pods=n, qps=args.qps, burst=args.burst, workers=args.workers
            )
            try:
                idle = run.controller.memory_kib("VmRSS") / 1024
                cpu0 = run.controller.cpu_seconds()
                names = [f"scale-{i:05d}" for i in range(n)]
                started = time.monotonic()
                run.backend.submit([trainjob(name) for name in names])
                done = run.wait_jobsets(names, timeout=max(600.0, n * 0.2))
                every = time.monotonic() - started
                run.wait_quiet(3.0, timeout=max(300.0, n * 0.12))
                cpu = (run.controller.cpu_seconds() - cpu0) * 1000 / n
                peak = run.controller.memory_kib("VmHWM") / 1024
                growth = (peak - idle) / n * 1000
                cpu_at[n], growth_at[n] = cpu, growth
                made = "every JobSet" if done else f"only {len(run.jobset):,} JobSets"
                # Unfinished work would flatter CPU per TrainJob: a count short of JobSets fails.
                self.judge(
                    BACKEND_NAMES[backend_name],
                    controller,
                    Target(
                        f"scale: TrainJobs without a JobSet at {n:,}",
                        n - sum(x in run.jobset for x in names),
                        0,
                    ),
                )
                print(
                    f"  {n:>6,} TrainJobs: {made} after {every:.0f} s; controller CPU per TrainJob "
                    f"{cpu:.1f} ms; idle RSS {idle:.1f} MiB, peak {peak:.1f} MiB; RSS growth per "
                    f"1,000 TrainJobs {growth:.1f} MiB; load average (1 min) {os.getloadavg()[0]:.2f}"
                )
                figures.rows[f"scale: CPU per TrainJob at {n:,}"] = f"{cpu:.1f} ms"
                figures.rows[f"scale: RSS growth per 1,000 TrainJobs at {n:,}"] = f"{growth:.1f} MiB"
            finally:
                run.stop()
                del run
                gc.collect()
        if len(counts) < 2:
            return
        low, high = counts[0], counts[-1]
        for what, at, unit in (
            ("CPU per TrainJob", cpu_at, " ms"),
            ("RSS growth per 1,000 TrainJobs", growth_at, " MiB"),
        ):
            target = Target(
                f"scale: {what} at {high:,} within 1.2x its value at {low:,} ({at[low]:.1f}{unit})",
                round(at[high], 2),
                round(1.2 * at[low], 2),
                unit,
            )
            self.judge(BACKEND_NAMES[backend_name], controller, target)

    def writes_target(
        self, run: Run, controller: str, figures: Figures, phase: str, counts: list[int]
    ) -> None:
        spread = Counter(counts)
        print(
            f"  writes until the JobSet exists: max {max(counts)}, mean {sum(counts) / len(counts):.2f} "
            f"(distribution {dict(sorted(spread.items()))})"
        )
        figures.rows[f"{phase}: writes until the JobSet, worst"] = str(max(counts))
        self.target(
            run,
            controller,
            Target(
                f"{phase}: writes per torch TrainJob until its JobSet exists (no Events), worst of {len(counts)}",
                max(counts),
                3,
                "",
                "2 objects + 1 status write",
            ),
        )

    def rate(self, backend_name: str, controller: str, figures: Figures, *, fast: bool) -> None:
        args = self.args
        rate, qps, burst, workers = (
            (args.fast_rate, args.fast_qps, args.fast_burst, args.fast_workers)
            if fast
            else (args.rate, 50.0, 100, 4)
        )
        label, limit = ("fast", TARGET_FAST_P99_S) if fast else ("rate", TARGET_RATE_P99_S)
        run = self.start(
            backend_name, controller, pods=args.rate_count, qps=qps, burst=burst, workers=workers
        )
        try:
            n = args.rate_count
            budget = "a budget raised to fit" if fast else "the defaults"
            print(f"\n== {label}: {n} torch TrainJobs at {rate:g}/s ({run.controller.settings}: {budget})")
            names = [f"{label}-{i:05d}" for i in range(n)]
            mark = run.mark()
            run.backend.submit([trainjob(name) for name in names], rate=rate)
            if not run.wait_jobsets(names, timeout=300):
                print(f"  only {len(run.jobset)} of {n} JobSets after 300 s")
            latencies = run.latencies(names)
            print(latency_line("creation to JobSet", latencies))
            p99 = percentile(latencies, 99) if len(latencies) == n else float("inf")
            figures.rows[f"{label}: creation to JobSet p99 at {rate:g}/s"] = f"{p99:.2f} s"
            self.target(
                run,
                controller,
                Target(
                    f"creation to JobSet p99 at {rate:g}/s",
                    round(p99, 3),
                    limit,
                    " s",
                    f"client QPS {qps:g}, burst {burst}" if controller == "ours" else "",
                ),
            )
            made = [name for name in names if name in run.jobset]
            if made:
                self.writes_target(run, controller, figures, label, writes_until_jobset(run, made, mark))
        finally:
            run.stop()

    def states(self, backend_name: str, controller: str, figures: Figures) -> None:
        args = self.args
        run = self.start(
            backend_name, controller, pods=3 * 3 * args.state_count, qps=50.0, burst=100, workers=4
        )
        try:
            print(f"\n== states: {args.state_count} TrainJobs per state, requests per TrainJob")
            print(f"  {'state':<28} {'reconciles':>10} {'requests':>9} {'writes':>7} {'events':>7}")
            groups = [
                ("torch, suspended", "torch-distributed", True),
                ("MPI (DeepSpeed), running", "deepspeed-distributed", False),
                ("MPI (DeepSpeed), suspended", "deepspeed-distributed", True),
            ]
            for label, runtime, suspend in groups:
                slug = re.sub(r"[^a-z]+", "-", label.lower()).strip("-")
                names = [f"{slug}-{i:04d}" for i in range(args.state_count)]
                mark = run.mark()
                before = run.controller.reconciles()
                run.backend.submit([trainjob(name, runtime, suspend=suspend) for name in names])
                run.wait_jobsets(names, timeout=300)
                run.wait_quiet(3.0)
                n = len(names)
                tally = per_trainjob(run.records(mark), set(names))
                after = run.controller.reconciles()
                reconciles = (
                    f"{(after - before) / n:>10.2f}"
                    if before is not None and after is not None
                    else f"{'n/a':>10}"
                )
                figures.rows[f"states: requests per TrainJob, {label}"] = f"{tally.total / n:.2f}"
                figures.rows[f"states: writes per TrainJob, {label}"] = f"{tally.writes / n:.2f}"
                print(
                    f"  {label:<28} {reconciles} {tally.total / n:>9.2f} {tally.writes / n:>7.2f} "
                    f"{tally.events / n:>7.2f}"
                )
                print(f"    by request: {requests_line(tally, n)}")
            figures.rows["states: load average (1 min)"] = f"{os.getloadavg()[0]:.2f}"
        finally:
            run.stop()


def leading_number(cell: str) -> float | None:
    found = re.match(r"-?\d+(?:\.\d+)?", cell)
    return float(found.group()) if found else None


def ratio(first: str, second: str) -> str:
    """``first / second`` of two cells' leading numbers, or "-" where either has none (or is 0)."""
    a, b = leading_number(first), leading_number(second)
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}"


def side_by_side(all_figures: list[Figures]) -> None:
    """Every figure of every controller in one table; with two controllers on a backend, the
    ratio of the first's to the second's, and a flag where their load averages differ by more
    than 2 (a phase run while the machine was busier is no fair comparison)."""
    rows: list[str] = []
    for figures in all_figures:
        rows += [row for row in figures.rows if row not in rows]
    pairs: list[tuple[Figures, Figures]] = []
    for backend in BACKEND_NAMES.values():
        group = [f for f in all_figures if f.label.endswith(f"({backend})")]
        if len(group) >= 2:
            pairs.append((group[0], group[1]))
    width = max((len(r) for r in rows), default=10)
    columns = [max(len(f.label), 12) for f in all_figures]
    ratio_labels = [
        f"{a.label.split(' (')[0]}/{b.label.split(' (')[0]} ({a.label.rsplit('(', 1)[1]}" for a, b in pairs
    ]
    ratio_columns = [max(len(label), 8) for label in ratio_labels]
    print("\n== side by side")
    print(
        f"  {'':<{width}}  "
        + "  ".join(f"{f.label:>{w}}" for f, w in zip(all_figures, columns, strict=True))
        + "".join(f"  {label:>{w}}" for label, w in zip(ratio_labels, ratio_columns, strict=True))
    )
    for row in rows:
        cells = [f.rows.get(row, "-") for f in all_figures]
        ratios = [ratio(a.rows.get(row, "-"), b.rows.get(row, "-")) for a, b in pairs]
        print(
            f"  {row:<{width}}  "
            + "  ".join(f"{c:>{w}}" for c, w in zip(cells, columns, strict=True))
            + "".join(f"  {r:>{w}}" for r, w in zip(ratios, ratio_columns, strict=True))
        )
    for a, b in pairs:
        for row in rows:
            if "load average" not in row:
                continue
            la, lb = leading_number(a.rows.get(row, "-")), leading_number(b.rows.get(row, "-"))
            if la is not None and lb is not None and abs(la - lb) > 2:
                print(f"  FLAG {row}: {a.label} {la:.2f}, {b.label} {lb:.2f}: not a fair pair, run it again")


def spread(values: list[float]) -> str:
    """``median (min to max)`` of several runs' values, or the one value of a single run."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    if len(ordered) == 1:
        return f"{median:.2f}"
    return f"{median:.2f} ({ordered[0]:.2f} to {ordered[-1]:.2f})"


def paired_summary(runs: list[list[Figures]]) -> None:
    """Each figure over several runs, as the median with min and max per controller, and the
    ratio of the first controller's to the second's on each backend, computed within each run
    (the two ran one after the other on the same machine) and then summarised the same way."""
    labels = [f.label for f in runs[0]]
    rows: list[str] = []
    for figures in (f for run in runs for f in run):
        rows += [row for row in figures.rows if row not in rows]
    pairs = []
    for backend in BACKEND_NAMES.values():
        group = [i for i, label in enumerate(labels) if label.endswith(f"({backend})")]
        if len(group) >= 2:
            pairs.append((group[0], group[1]))
    print(f"\n== over {len(runs)} paired runs: median (min to max)")
    width = max((len(r) for r in rows), default=10)
    header = [*labels, *(f"{labels[a].split(' (')[0]}/{labels[b]}" for a, b in pairs)]
    print(f"  {'':<{width}}  " + "  ".join(f"{h:>24}" for h in header))
    for row in rows:
        cells = []
        for i in range(len(labels)):
            values = [v for run in runs if (v := leading_number(run[i].rows.get(row, "-"))) is not None]
            cells.append(spread(values) if values else "-")
        for a, b in pairs:
            ratios = []
            for run in runs:
                x, y = leading_number(run[a].rows.get(row, "-")), leading_number(run[b].rows.get(row, "-"))
                if x is not None and y:
                    ratios.append(x / y)
            cells.append(spread(ratios) if ratios else "-")
        print(f"  {row:<{width}}  " + "  ".join(f"{c:>24}" for c in cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("real", "standin", "both"), default="real")
    parser.add_argument(
        "--controller",
        action="append",
        help="'ours' (default), 'upstream' (its v2.3.0 controller, real backend), or a command run "
        "instead, {kubeconfig} substituted; repeatable",
    )
    parser.add_argument("--trainjobs", type=int, default=1000, help="TrainJobs submitted at once")
    parser.add_argument("--steady", type=float, default=60.0, help="seconds of steady state")
    parser.add_argument("--rate", type=float, default=20.0, help="TrainJobs per second in the rate phase")
    parser.add_argument(
        "--fast-rate", type=float, default=100.0, help="TrainJobs per second in the fast phase"
    )
    parser.add_argument("--rate-count", type=int, default=200, help="TrainJobs in each rate phase")
    parser.add_argument("--state-count", type=int, default=50, help="TrainJobs per state in the states phase")
    parser.add_argument("--qps", type=float, default=1000.0, help="our client QPS in the burst phase")
    parser.add_argument("--burst", type=int, default=2000, help="our client burst in the burst phase")
    parser.add_argument("--workers", type=int, default=16, help="our reconcile workers in the burst phase")
    parser.add_argument("--fast-qps", type=float, default=1000.0, help="our client QPS in the fast phase")
    parser.add_argument("--fast-burst", type=int, default=2000, help="our client burst in the fast phase")
    parser.add_argument(
        "--fast-workers", type=int, default=16, help="our reconcile workers in the fast phase"
    )
    parser.add_argument(
        "--phases",
        default="burst,rate,fast,states",
        help="comma-separated phases to run: burst, rate, fast, states, and scale (not by default: "
        "it takes most of an hour)",
    )
    parser.add_argument(
        "--scale-counts",
        default="1000,3000,10000",
        help="TrainJobs submitted at once in each step of the scale phase",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="run every controller this many times, alternating, and summarise each figure and ratio "
        "as the median with min and max of the runs (a ratio within each run's pair)",
    )
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))
    backends = ("standin", "real") if args.backend == "both" else (args.backend,)
    controllers = args.controller or ["ours"]

    print(machine())
    print(f"backends: {', '.join(backends)}; controllers: {', '.join(controllers)}")
    print("each controller runs as a user of its own bound to cluster-admin (ours included)")
    report = Report()
    runs: list[list[Figures]] = []
    with tempfile.TemporaryDirectory(prefix="trainer-bench-") as tmp:
        bench = Bench(args, report, Path(tmp))
        for number in range(1, max(1, args.runs) + 1):
            all_figures: list[Figures] = []
            runs.append(all_figures)
            for backend in backends:
                for controller in controllers:
                    name = controller if controller in ("ours", "upstream") else "other"
                    label = f"{name} ({BACKEND_NAMES[backend]})"
                    print(
                        f"\n##### {label}: {controller}"
                        + (f", run {number} of {args.runs}" if args.runs > 1 else "")
                    )
                    figures = Figures(label)
                    all_figures.append(figures)
                    if "burst" in phases:
                        bench.burst(backend, controller, figures)
                    if "rate" in phases:
                        bench.rate(backend, controller, figures, fast=False)
                    if "fast" in phases:
                        bench.rate(backend, controller, figures, fast=True)
                    if "states" in phases:
                        bench.states(backend, controller, figures)
                    if "scale" in phases:
                        bench.scale(backend, controller, figures)
            if len(all_figures) > 1:
                side_by_side(all_figures)
    if len(runs) > 1:
        paired_summary(runs)
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
