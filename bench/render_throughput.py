"""Render throughput and latency in process, per runtime shape and size (a benchmark, not a test).

    .venv/bin/python bench/render_throughput.py [--nodes 1,100,1000,10000] [--seconds 2]

For torch (the bundled ``torch-distributed`` runtime), MPI (OpenMPI launcher + nodes, the
runtime of ``render_mpi.py`` without its PodGroup policy) and MPI with coscheduling
(``render_mpi.py``'s runtime as it is), at each node count: the TrainJob is admitted once, then
:func:`trainer.runtime.render.render` runs repeatedly from the facts a first reconcile sees
(the runtime, no children), so each run builds every child. Latency is per reconcile (p50, p99);
throughput is reconciles per second on one core. Target: a 10,000-node MPI TrainJob with
coscheduling renders in at most 50 ms (judged on p99, stricter than the median
``render_mpi.py`` reports).

Upstream publishes no render figures, so there is nothing to print beside these.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml
from benchlib import ROOT, Report, Target, machine, percentile
from render_mpi import runtime as mpi_cosched_runtime

from trainer.admission.admit import admit
from trainer.offline.cluster import render_seed, trainjob_uid
from trainer.runtime import framework as fw
from trainer.runtime.info import Facts
from trainer.runtime.render import render

Obj = dict[str, Any]
TARGET_MS = 50.0
NOW = "1970-01-01T00:00:00Z"


def torch_runtime() -> Obj:
    data: Obj = yaml.safe_load((ROOT / "runtimes" / "torch_distributed.yaml").read_text())
    return data


def mpi_runtime() -> Obj:
    runtime = mpi_cosched_runtime()
    runtime["metadata"]["name"] = "mpi-plain-bench"
    del runtime["spec"]["podGroupPolicy"]
    return runtime


SHAPES: dict[str, Callable[[], Obj]] = {
    "torch": torch_runtime,
    "mpi": mpi_runtime,
    "mpi+coscheduling": mpi_cosched_runtime,
}


def trainjob(name: str, runtime: Obj, nodes: int) -> Obj:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runtimeRef": {"name": runtime["metadata"]["name"]}, "trainer": {"numNodes": nodes}},
    }


def measure(framework: fw.Framework, runtime: Obj, nodes: int, budget: float) -> tuple[list[float], int]:
    """Reconcile times in seconds for about ``budget`` seconds (at least 20 runs), and child count."""

    def facts() -> Facts:
        fresh = Facts()
        fresh.put(copy.deepcopy(runtime))
        return fresh

    admitted, _ = admit(trainjob("bench-job", runtime, nodes), None, facts(), framework, NOW)
    admitted["metadata"]["uid"] = trainjob_uid("default", "bench-job")
    seed = render_seed(admitted["metadata"]["uid"])

    def once() -> tuple[float, int]:
        run_facts, obj = facts(), copy.deepcopy(admitted)  # outside the clock: not render's work
        start = time.perf_counter()
        outcome = render(obj, run_facts, framework, NOW, seed=seed)
        elapsed = time.perf_counter() - start
        assert outcome.error is None, outcome.error
        return elapsed, len(outcome.objects)

    once()  # first-use imports and caches are not what is measured
    times: list[float] = []
    children = 0
    deadline = time.perf_counter() + budget
    while len(times) < 20 or time.perf_counter() < deadline:
        elapsed, children = once()
        times.append(elapsed)
    return times, children


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,100,1000,10000", help="comma-separated node counts")
    parser.add_argument("--seconds", type=float, default=2.0, help="time spent per cell (default 2)")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.nodes.split(",")]

    print(machine())
    print("in-process render() of a TrainJob's first reconcile (every child built); one core")
    print("upstream: no published render figures (nothing to compare beside these)")
    print()
    print(
        f"{'runtime':<18} {'nodes':>6} {'children':>8} {'runs':>6} {'p50 ms':>8} {'p99 ms':>8} {'per s':>8}"
    )
    framework = fw.default()
    report = Report()
    results: dict[tuple[str, int], list[float]] = {}
    for shape, make in SHAPES.items():
        for nodes in sizes:
            times, children = measure(framework, make(), nodes, args.seconds)
            results[(shape, nodes)] = times
            ms = [t * 1000 for t in times]
            print(
                f"{shape:<18} {nodes:>6} {children:>8} {len(ms):>6} {percentile(ms, 50):>8.2f} "
                f"{percentile(ms, 99):>8.2f} {len(times) / sum(times):>8.0f}",
                flush=True,
            )
    print()
    big = results.get(("mpi+coscheduling", 10_000))
    if big is not None:
        ms = [t * 1000 for t in big]
        report.add(
            Target(
                "10,000-node MPI TrainJob with coscheduling, render p99",
                round(percentile(ms, 99), 2),
                TARGET_MS,
                " ms",
                f"p50 {percentile(ms, 50):.2f} ms",
            )
        )
    return report.summary() if report.targets else 0


if __name__ == "__main__":
    sys.exit(main())
