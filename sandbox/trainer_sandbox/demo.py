"""`trainer demo`: the whole control plane in one process, no cluster needed.

It starts the local API server stand-in (with its simulated JobSet controller), installs the
CRDs and the default runtimes, starts the operator with its admission webhooks, and submits the
bundled example TrainJobs. Then it shows what a person wants to watch: the JobSet created, the
pods running, the TrainJob Complete, and one TrainJob the webhook refuses. ``--offline`` shows
what `trainer render` would create for the same examples instead.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from trainer.api.objects import Obj

TJ = "trainer.kubeflow.org/v1alpha1"
JS = "jobset.x-k8s.io/v1alpha2"
# The examples the live demo runs, each made quick: pods "run" for a couple of seconds.
LIVE_EXAMPLES = ("torch-distributed.yaml", "deepspeed.yaml")


class Reporter:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.start = time.monotonic()

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:5.1f}s] {message}", file=self.out, flush=True)


def _examples() -> Path:
    return Path(str(resources.files("trainer.examples")))


def _quick(obj: Obj) -> Obj:
    env = obj["spec"].setdefault("trainer", {}).setdefault("env", [])
    if not any(e.get("name") == "SANDBOX_RUN_SECONDS" for e in env):
        env.append({"name": "SANDBOX_RUN_SECONDS", "value": "2"})
    return obj


def run_live(out: TextIO = sys.stdout, timeout: float = 60) -> int:
    import logging

    from trainer.offline.manifests import read_manifests
    from trainer_sandbox.apiserver import APIError
    from trainer_sandbox.embedded_operator import EmbeddedOperator
    from trainer_sandbox.sandbox import local_apiserver, prepare

    # kopf warns that it cannot install signal handlers off the main thread: expected here.
    logging.getLogger("kopf").setLevel(logging.ERROR)
    say = Reporter(out).say
    server = local_apiserver().start()
    workdir = tempfile.TemporaryDirectory(prefix="trainer-demo-")
    try:
        say(f"local API server (a test stand-in, not a cluster) listening at {server.url}")
        installed = prepare(server)
        say(
            f"installed {len(installed['crds'])} CRDs and {len(installed['runtimes'])} ClusterTrainingRuntimes"
        )
        user = "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"
        server.add_user(user)
        kubeconfig = server.write_kubeconfig(Path(workdir.name) / "operator.kubeconfig", user=user)
        operator = EmbeddedOperator(kubeconfig, webhooks=True).start()
        say("operator running, admission webhooks registered")
        try:
            names = []
            for path in LIVE_EXAMPLES:
                for obj in read_manifests([str(_examples() / path)]):
                    obj = _quick(obj)
                    server.create(obj, user="ml-engineer")
                    trainer = obj["spec"]["trainer"]
                    names.append(obj["metadata"]["name"])
                    say(
                        f"submitted TrainJob {obj['metadata']['name']} "
                        f"(runtime {obj['spec']['runtimeRef']['name']}, {trainer.get('numNodes', 1)} nodes)"
                    )
            bad = {
                "apiVersion": TJ,
                "kind": "TrainJob",
                "metadata": {"name": "refused", "namespace": "default"},
                "spec": {
                    "runtimeRef": {"name": "torch-distributed"},
                    "trainer": {"env": [{"name": "PET_NODE_RANK", "value": "0"}]},
                },
            }
            try:
                server.create(bad, user="ml-engineer")
                say("unexpected: a TrainJob with a reserved env var was admitted")
                return 1
            except APIError as exc:
                say(f"refused TrainJob refused: {exc}")
            ok = _follow(server, names, say, timeout)
        finally:
            operator.stop()
        _table(server, out)
        return 0 if ok else 1
    finally:
        server.stop()
        workdir.cleanup()


def _follow(server: Any, names: list[str], say: Any, timeout: float) -> bool:
    """Print each change worth seeing until every TrainJob has finished."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    finished: dict[str, str] = {}
    while time.monotonic() < deadline and len(finished) < len(names):
        jobsets = {j["metadata"]["name"]: j for j in server.list(JS, "JobSet", "default")}
        pods = server.list("v1", "Pod", "default")
        for name in names:
            js = jobsets.get(name)
            if js is not None and f"js/{name}" not in seen:
                seen.add(f"js/{name}")
                jobs = ", ".join(
                    f"{rj['name']} x{rj['template']['spec'].get('parallelism', 1)}"
                    for rj in js["spec"]["replicatedJobs"]
                )
                say(f"JobSet {name} created by the operator: {jobs}")
            mine = [
                p
                for p in pods
                if p["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/jobset-name") == name
            ]
            phases = sorted({(p.get("status") or {}).get("phase", "Pending") for p in mine})
            key = f"pods/{name}/{','.join(phases)}"
            if mine and key not in seen:
                seen.add(key)
                say(f"pods of {name}: {len(mine)} ({', '.join(phases)})")
            tj = server.get(TJ, "TrainJob", name)
            for cond in (tj.get("status") or {}).get("conditions") or []:
                if (
                    cond["type"] in ("Complete", "Failed")
                    and cond["status"] == "True"
                    and name not in finished
                ):
                    finished[name] = cond["type"]
                    say(f"TrainJob {name} {cond['type']}: {cond.get('message', '')}")
        time.sleep(0.2)
    return len(finished) == len(names) and all(v == "Complete" for v in finished.values())


def _table(server: Any, out: TextIO) -> None:
    print("\nNAME            STATE      RUNTIME                 NODES", file=out)
    for tj in server.list(TJ, "TrainJob", "default"):
        state = ",".join(
            c["type"] for c in (tj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
        )
        nodes = (tj["spec"].get("trainer") or {}).get("numNodes", "")
        print(
            f"{tj['metadata']['name']:<15} {state:<10} {tj['spec']['runtimeRef']['name']:<23} {nodes}",
            file=out,
        )


def _summary(obj: Obj) -> str:
    kind = obj["kind"]
    name = obj["metadata"]["name"]
    if kind == "JobSet":
        jobs = ", ".join(
            f"{rj['name']} x{rj['template']['spec'].get('parallelism', 1)}"
            for rj in obj["spec"].get("replicatedJobs", [])
        )
        return f"JobSet {name}: {jobs} (suspend={obj['spec'].get('suspend')})"
    if kind == "ConfigMap":
        return f"ConfigMap {name}: keys {', '.join(sorted(obj.get('data', {})))}"
    if kind == "Secret":
        keys = ", ".join(sorted(obj.get("data", {})))
        return f"Secret {name}: {obj.get('type', 'Opaque')}, keys {keys} (redacted)"
    if kind == "PodGroup":
        return f"PodGroup {name}: minMember {obj['spec'].get('minMember')}"
    return f"{kind} {name}"


def run_offline(out: TextIO = sys.stdout) -> int:
    from trainer.offline.cluster import OfflineCluster
    from trainer.offline.manifests import read_manifests
    from trainer.runtime import framework

    cluster = OfflineCluster(framework=framework.default())
    cluster.load_default_runtimes()
    for obj in read_manifests([str(_examples())]):
        cluster.apply(obj)
    for refusal in cluster.refusals:
        for line in refusal.lines():
            print(f"refused: {line}", file=out)
    for obj in cluster.output():
        if obj["kind"] == "TrainJob":
            ref = obj["spec"]["runtimeRef"]["name"]
            print(f"\nTrainJob {obj['metadata']['name']} (runtime {ref}) would create:", file=out)
            continue
        print(f"  - {_summary(obj)}", file=out)
    return 1 if cluster.refusals else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainer demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--offline", action="store_true", help="only show what would be created (trainer render)"
    )
    parser.add_argument(
        "--timeout", type=float, default=60, help="seconds to wait for the TrainJobs to finish"
    )
    args = parser.parse_args(argv)
    if args.offline:
        return run_offline()
    return run_live(timeout=args.timeout)
