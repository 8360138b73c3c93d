"""``trainer sandbox``: the local API server with everything a TrainJob needs, for demos and manual tests.

It installs the trainer, JobSet and PodGroup CRDs, the default ClusterTrainingRuntimes and the
``kubeflow-trainer-public`` ConfigMap the Kubeflow SDK reads, writes a kubeconfig, and serves until
interrupted. The simulated JobSet controller runs pods as documented in ``sandbox/trainer_sandbox/README.md``.

``local_apiserver`` is where the server and the simulated controllers meet: the API server package
does not know the controllers, and the controllers see only a narrow view of the server
(``trainer_sandbox.controllers.common.APIServer``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from trainer import UPSTREAM_VERSION
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.controllers import JobSetSimulator

_HERE = Path(__file__).resolve().parent
SYSTEM_NAMESPACE = "kubeflow-system"
PUBLIC_CONFIGMAP = "kubeflow-trainer-public"
TRAINER_VERSION = UPSTREAM_VERSION  # what the chart's kubeflow-trainer-public ConfigMap says

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def local_apiserver(**options: Any) -> LocalAPIServer:
    """A ``LocalAPIServer`` (``options`` are its own) with the JobSet simulator: the JobSet
    controller, the Job controller and the kubelet run with the server, from start to stop."""
    return LocalAPIServer(controllers=JobSetSimulator, **options)


def _load_docs(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".json":
        return [json.loads(path.read_text())]
    return [d for d in yaml.load_all(path.read_text(), Loader=_Loader) if isinstance(d, dict)]


def trainer_crd_files() -> list[Path]:
    """The project's trainer CRDs, packaged as ``trainer.crds``."""
    base = _package_dir("trainer.crds")
    return sorted(base.glob("trainer.kubeflow.org_*.yaml")) if base is not None else []


def runtime_files() -> list[Path]:
    """The default ClusterTrainingRuntimes, packaged as ``trainer.runtimes``."""
    base = _package_dir("trainer.runtimes")
    return sorted(base.glob("*.yaml")) if base is not None else []


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
