"""``python -m trainer_sandbox.cluster up|down [--dir DIR]`` (what ``scripts/cluster`` runs)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from trainer_sandbox.cluster.controlplane import (
    AlreadyRunning,
    ControlPlane,
    StartError,
    default_dir,
    stop_directory,
)


def _echo(line: str) -> None:
    print(line, flush=True)


def up(
    directory: Path,
    bin_dir: Path | None,
    timeout: float,
    real_nodes: int = 0,
    trainer_objects: bool = True,
    gang: bool = False,
) -> int:
    try:
        cp = ControlPlane.start(
            directory,
            bin_dir=bin_dir,
            echo=_echo,
            timeout=timeout,
            real_nodes=real_nodes,
            trainer_objects=trainer_objects,
            gang=gang,
        )
    except (StartError, AlreadyRunning, RuntimeError) as e:
        print(f"cluster up failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cluster up interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    print(f"kubeconfig: {cp.kubeconfig}")
    print(f"audit log:  {cp.audit_log}")
    print(f"kubectl:    {cp.bin_dir / 'kubectl'}")
    print(f"stop with:  scripts/cluster down --dir {cp.dir}")
    return 0


def down(directory: Path, grace: float) -> int:
    t0 = time.monotonic()
    running, killed = stop_directory(directory, grace)
    if not running:
        print(f"nothing running in {directory}")
        return 0
    note = f" (SIGKILL after {grace:.0f}s: {', '.join(killed)})" if killed else ""
    print(f"stopped {', '.join(running)} in {time.monotonic() - t0:.1f}s{note}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/cluster",
        description="A real Kubernetes control plane on loopback, built from cluster/go.mod.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start a fresh control plane and return once it is healthy")
    p_up.add_argument("--dir", type=Path, default=default_dir(), help="state directory (default: .cluster)")
    p_up.add_argument(
        "--bin-dir", type=Path, help="prebuilt binaries (default: build them with cluster/build)"
    )
    p_up.add_argument("--timeout", type=float, default=120.0, help="seconds each component may take")
    p_up.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        metavar="N",
        help="add N nodes that run real containers (root; kwok's nodes are then tainted)",
    )
    p_up.add_argument(
        "--no-trainer-objects",
        action="store_true",
        help="leave out the trainer CRDs and default runtimes, for `helm install` of the chart",
    )
    p_up.add_argument(
        "--gang",
        action="store_true",
        help="turn on kube-scheduler's gang scheduling (Workload and PodGroup, scheduling.k8s.io/v1alpha2)",
    )
    p_down = sub.add_parser("down", help="stop every process `up` started in DIR")
    p_down.add_argument("--dir", type=Path, default=default_dir(), help="state directory (default: .cluster)")
    p_down.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    args = parser.parse_args(argv)
    if args.command == "up":
        return up(
            args.dir, args.bin_dir, args.timeout, args.real_nodes, not args.no_trainer_objects, args.gang
        )
    return down(args.dir, args.grace)


if __name__ == "__main__":
    sys.exit(main())
