"""`trainer migrate` throughput: v1 jobs converted per second, and a cluster's worth end to end
(a benchmark, not a test).

    .venv/bin/python bench/migrate_throughput.py [--jobs 1000]

Per shape (a PyTorchJob on the bundled runtime, one that needs a TrainingRuntime of its own, an
MPIJob v2beta1, a TFJob with a Chief), the in-process conversion of one job, repeated; then
``trainer migrate -f`` on a file of ``--jobs`` jobs of every shape in a fresh interpreter (the
wall time a platform team waits for a cluster of that many v1 jobs), and the same output through
``trainer render`` (what proves it). Target: 1,000 v1 jobs migrate in at most 5 s end to end.

Upstream has no migration tool, so there is nothing to print beside these.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from benchlib import ROOT, Report, Target, machine, percentile

from trainer.migrate.cmd import convert
from trainer.migrate.common import Options

Obj = dict[str, Any]
TARGET_S = 5.0
TRAINER = str(Path(sys.executable).with_name("trainer"))


def _replica(count: int, restart: str, container: Obj, **pod: Any) -> Obj:
    return {
        "replicas": count,
        "restartPolicy": restart,
        "template": {"spec": {"containers": [container], **pod}},
    }


def _job(api: str, kind: str, name: str, spec: Obj) -> Obj:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": "bench"}, "spec": spec}


def torch_bundled(name: str) -> Obj:
    container = {"name": "pytorch", "image": "registry.example/mnist:1", "command": ["python3", "mnist.py"]}
    return _job(
        "kubeflow.org/v1",
        "PyTorchJob",
        name,
        {
            "pytorchReplicaSpecs": {
                "Master": _replica(1, "OnFailure", container),
                "Worker": _replica(3, "OnFailure", container),
            }
        },
    )


def torch_generated(name: str) -> Obj:
    job = torch_bundled(name)
    for rspec in job["spec"]["pytorchReplicaSpecs"].values():
        rspec["restartPolicy"] = "Never"
        rspec["template"]["spec"]["containers"].append({"name": "sidecar", "image": "registry.example/log:1"})
    return job


def mpi(name: str) -> Obj:
    launcher = {"name": "launcher", "image": "registry.example/pi:1", "command": ["mpirun", "-n", "8", "/pi"]}
    worker = {"name": "worker", "image": "registry.example/pi:1"}
    return _job(
        "kubeflow.org/v2beta1",
        "MPIJob",
        name,
        {
            "slotsPerWorker": 2,
            "mpiReplicaSpecs": {
                "Launcher": _replica(1, "OnFailure", launcher),
                "Worker": _replica(4, "Never", worker),
            },
        },
    )


def tf(name: str) -> Obj:
    container = {"name": "tensorflow", "image": "registry.example/tf:1", "command": ["python", "train.py"]}
    return _job(
        "kubeflow.org/v1",
        "TFJob",
        name,
        {
            "tfReplicaSpecs": {
                "Chief": _replica(1, "Never", container),
                "Worker": _replica(4, "Never", container),
            }
        },
    )


SHAPES: dict[str, Callable[[str], Obj]] = {
    "pytorch (bundled)": torch_bundled,
    "pytorch (own runtime)": torch_generated,
    "mpijob v2beta1": mpi,
    "tfjob (chief)": tf,
}


def per_job(make: Callable[[str], Obj], seconds: float) -> list[float]:
    job = make("bench-job")
    options = Options()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 20:
        copied = copy.deepcopy(job)
        start = time.perf_counter()
        convert(copied, options)
        times.append(time.perf_counter() - start)
    return times


def timed(argv: list[str], stdin: str | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False, cwd=ROOT)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:2])} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--jobs", type=int, default=1000, help="v1 jobs in the end-to-end file (default 1000)"
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="time spent per shape (default 1)")
    args = parser.parse_args(argv)

    print(machine())
    print("upstream: no migration tool (nothing to compare beside these)")
    print()
    print(f"{'shape':<24} {'runs':>6} {'p50 us':>8} {'p99 us':>8} {'per s':>8}")
    for shape, make in SHAPES.items():
        times = per_job(make, args.seconds)
        us = [t * 1e6 for t in times]
        print(
            f"{shape:<24} {len(us):>6} {percentile(us, 50):>8.0f} {percentile(us, 99):>8.0f} "
            f"{len(times) / sum(times):>8.0f}",
            flush=True,
        )
    print()
    makers = list(SHAPES.values())
    jobs = [makers[i % len(makers)](f"job-{i}") for i in range(args.jobs)]
    report = Report()
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "v1.yaml"
        source.write_text(yaml.safe_dump_all(jobs))
        migrate_s, out = timed([TRAINER, "migrate", "-f", str(source)])
        objects = [d for d in yaml.safe_load_all(out) if d]
        trainjobs = sum(1 for o in objects if o["kind"] == "TrainJob")
        runtimes = sum(1 for o in objects if o["kind"] == "TrainingRuntime")
        print(
            f"trainer migrate -f ({args.jobs} v1 jobs): {migrate_s:.2f} s, {trainjobs} TrainJobs, {runtimes} TrainingRuntimes"
        )
        render_s, rendered = timed([TRAINER, "render", "-f", "-"], out)
        jobsets = sum(1 for d in yaml.safe_load_all(rendered) if d and d["kind"] == "JobSet")
        print(f"trainer render of that output: {render_s:.2f} s, {jobsets} JobSets")
    print()
    report.add(
        Target(
            f"{args.jobs} v1 jobs through trainer migrate, end to end", round(migrate_s, 2), TARGET_S, " s"
        )
    )
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
