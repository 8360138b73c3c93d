"""``trainer sandbox``: the local API server with everything a TrainJob needs, for demos and manual tests.

It installs the trainer, JobSet and PodGroup CRDs, the default ClusterTrainingRuntimes and the
``kubeflow-trainer-public`` ConfigMap the Kubeflow SDK reads, writes a kubeconfig, and serves until
interrupted. The simulated JobSet controller runs pods as documented in ``trainer/testing/README.md``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from trainer.testing.apiserver import LocalAPIServer

_HERE = Path(__file__).resolve().parent
_PROJECT = _HERE.parent.parent
_REFERENCE = Path("/work/shared/reference")
SYSTEM_NAMESPACE = "kubeflow-system"
PUBLIC_CONFIGMAP = "kubeflow-trainer-public"
TRAINER_VERSION = "v2.1.0"

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_docs(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".json":
        return [json.loads(path.read_text())]
    return [d for d in yaml.load_all(path.read_text(), Loader=_Loader) if isinstance(d, dict)]


def trainer_crd_files() -> list[Path]:
    """The project's trainer CRDs (packaged as ``trainer.crds``), else the reference copies."""
    for base in (_package_dir("trainer.crds"), _PROJECT / "crds", _REFERENCE / "crds" / "trainer"):
        if base is not None and base.is_dir():
            found = sorted(base.glob("trainer.kubeflow.org_*.yaml"))
            if found:
                return found
    return []


def runtime_files() -> list[Path]:
    for base in (_package_dir("trainer.runtimes"), _PROJECT / "runtimes", _REFERENCE / "runtimes"):
        if base is not None and base.is_dir():
            found = sorted(p for p in base.rglob("*.yaml") if p.name != "kustomization.yaml")
            if found:
                return found
    return []


def _package_dir(name: str) -> Path | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def install_crds(server: LocalAPIServer) -> list[str]:
    """Install the trainer, JobSet and PodGroup CRDs; returns their names."""
    names = []
    for path in [*trainer_crd_files(), *sorted((_HERE / "crds").glob("*.json"))]:
        for doc in _load_docs(path):
            if doc.get("kind") == "CustomResourceDefinition":
                names.append(server.create(doc)["metadata"]["name"])
    return names


def install_runtimes(server: LocalAPIServer) -> list[str]:
    names = []
    for path in runtime_files():
        for doc in _load_docs(path):
            if doc.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime"):
                names.append(server.create(doc)["metadata"]["name"])
    return names


def install_public_configmap(server: LocalAPIServer) -> None:
    """What the Kubeflow SDK reads to report the control-plane version.

    Upstream's manifest has ``kubeflow_trainer_api_version``; the 0.5 SDK reads
    ``kubeflow_trainer_version``. Both are set.
    """
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}}
    server.create(ns)
    server.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": PUBLIC_CONFIGMAP, "namespace": SYSTEM_NAMESPACE},
            "data": {
                "kubeflow_trainer_version": TRAINER_VERSION,
                "kubeflow_trainer_api_version": TRAINER_VERSION,
            },
        }
    )


def prepare(server: LocalAPIServer) -> dict[str, list[str]]:
    crds = install_crds(server)
    runtimes = install_runtimes(server)
    install_public_configmap(server)
    return {"crds": crds, "runtimes": runtimes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trainer sandbox",
        description="Run an in-memory Kubernetes API server with the trainer CRDs and runtimes (a test and"
        " demo tool, not a cluster).",
    )
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: a free port)")
    parser.add_argument(
        "--kubeconfig",
        default="sandbox.kubeconfig",
        help="where to write the kubeconfig (default: %(default)s)",
    )
    parser.add_argument("--with-operator", action="store_true", help="also run the operator in this process")
    args = parser.parse_args(argv)
    if args.with_operator:
        print("trainer sandbox: --with-operator is not yet available", file=sys.stderr)
        return 2
    server = LocalAPIServer(port=args.port).start()
    try:
        installed = prepare(server)
        path = server.write_kubeconfig(Path(args.kubeconfig).expanduser().resolve())
        print(f"Local Kubernetes API server (a test stand-in, not a cluster) at {server.url}")
        print(f"Installed {len(installed['crds'])} CRDs and runtimes: {', '.join(installed['runtimes'])}")
        print(f"Kubeconfig: {path}")
        print(f"  export KUBECONFIG={path}")
        print("  kubectl get clustertrainingruntimes")
        print("Pods run for $SANDBOX_RUN_SECONDS (default 2) and exit with $SANDBOX_EXIT_CODE (default 0),")
        print("read from the TrainJob's spec.trainer.env. Press Ctrl-C to stop.")
        sys.stdout.flush()
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
