"""Render time of one large MPI TrainJob with coscheduling, in process (not a test).

    .venv/bin/python bench/render_mpi.py [--nodes 10000] [--runs 200] [--name NAME]

Times :func:`trainer.runtime.render.render` alone: the TrainJob is admitted once beforehand,
and every run starts from the same facts (the runtime only), so each run builds everything a
first reconcile builds: the JobSet, the SSH key Secret, the hostfile ConfigMap, the PodGroup and
the runtime snapshot (the SSH key derived from a seed, as ``trainer render`` does; the operator's
random key costs the same). The TrainJob name is printed because it sets the hostfile's size (it
appears twice in every line). Target: a median of at most 50 ms.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
from typing import Any

from trainer.admission.admit import admit
from trainer.apimachinery.errors import AdmissionError
from trainer.offline.cluster import render_seed, trainjob_uid
from trainer.runtime import framework as fw
from trainer.runtime.info import Facts
from trainer.runtime.render import render

Obj = dict[str, Any]
TARGET_MS = 50.0
NOW = "1970-01-01T00:00:00Z"


def runtime() -> Obj:
    def job(name: str, ancestor: str | None, command: list[str]) -> Obj:
        template: Obj = {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "node",
                                "image": "mpioperator/openmpi:0.6.0",
                                "command": command,
                                "resources": {
                                    "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}
                                },
                            }
                        ]
                    }
                }
            }
        }
        if ancestor:
            template["metadata"] = {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": ancestor}}
        return {"name": name, "template": template}

    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "mpi-bench"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "mpi": {"numProcPerNode": 1, "mpiImplementation": "OpenMPI"}},
            "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 120}},
            "template": {
                "spec": {
                    "network": {"publishNotReadyAddresses": True},
                    "replicatedJobs": [
                        job("launcher", None, ["mpirun", "python3", "train.py"]),
                        job("node", "trainer", ["/usr/sbin/sshd", "-De"]),
                    ],
                }
            },
        },
    }


def trainjob(name: str, nodes: int) -> Obj:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runtimeRef": {"name": "mpi-bench"}, "trainer": {"numNodes": nodes}},
    }


def _facts() -> Facts:
    """What the cluster holds before the first reconcile: the runtime, no children yet."""
    facts = Facts()
    facts.put(runtime())
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--name", default="mpi-bench-job")
    parser.add_argument("--profile", action="store_true", help="print the top of a cProfile of one run")
    args = parser.parse_args(argv)

    framework = fw.default()
    try:
        admitted, _ = admit(trainjob(args.name, args.nodes), None, _facts(), framework, NOW)
    except AdmissionError as exc:
        print(f"the TrainJob is refused at admission: {exc}")
        return 2
    admitted["metadata"]["uid"] = trainjob_uid("default", args.name)
    seed = render_seed(admitted["metadata"]["uid"])

    def once() -> float:
        run_facts = _facts()
        obj = copy.deepcopy(admitted)
        start = time.perf_counter()
        outcome = render(obj, run_facts, framework, NOW, seed=seed)
        elapsed = time.perf_counter() - start
        assert outcome.error is None, outcome.error
        return elapsed

    once()  # imports (cryptography, yaml) and caches are not what is measured
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        once()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    times_ms = sorted(once() * 1000 for _ in range(args.runs))
    median = statistics.median(times_ms)
    p99 = times_ms[min(len(times_ms) - 1, round(0.99 * (len(times_ms) - 1)))]

    outcome = render(copy.deepcopy(admitted), _facts(), framework, NOW, seed=seed)
    hostfile = next(o for o in outcome.objects if o["metadata"]["name"].endswith("-mpi-hostfile"))["data"][
        "hostfile"
    ]
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        f"TrainJob {args.name!r} (name length {len(args.name)}), {args.nodes} nodes + 1 launcher, "
        f"hostfile {len(hostfile)} bytes"
    )
    print(
        f"reconcile over {args.runs} runs: median {median:.1f} ms, p99 {p99:.1f} ms (target {TARGET_MS:.0f} ms)"
    )
    if median > TARGET_MS:
        print(
            f"MISSED the target by {median - TARGET_MS:.1f} ms ({median / TARGET_MS:.2f}x); run with --profile"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
