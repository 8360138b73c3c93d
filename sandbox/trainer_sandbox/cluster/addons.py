"""Controllers of other projects, run beside a cluster of ours as test dependencies: Kueue, and
upstream's own trainer-controller-manager (docs/drop-in.md).

``cluster/build`` builds both from the versions ``cluster/go.mod`` pins; here they run as ``up``
runs JobSet: out of cluster, as a user of the test's choosing (its kubeconfig), certificate
management off, the webhooks served on loopback with a certificate from the cluster's CA and
registered by URL, leader election and metrics off. Their CRDs and webhook manifests are read from
the same modules in the Go module cache, so they match the binaries and nothing of theirs is
copied into this repository.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainer.api.objects import Obj
from trainer_sandbox.cluster import install, oci, processes, registry
from trainer_sandbox.cluster.controlplane import GO_MODULE, ControlPlane, child_env
from trainer_sandbox.cluster.kube import Kube, KubeError, probe
from trainer_sandbox.cluster.pki import webhook_serving_pair
from trainer_sandbox.ports import free_port

KUEUE_MODULE = "sigs.k8s.io/kueue"
UPSTREAM_MODULE = "github.com/kubeflow/trainer/v2"
# The image upstream's chart v2.3.0 runs (its registry, repository, and the chart's version as tag).
UPSTREAM_IMAGE = "ghcr.io/kubeflow/trainer/trainer-controller-manager:v2.3.0"
# What Kueue manages here: TrainJobs, and JobSets (a TrainJob's JobSet is its child, which Kueue
# leaves to the TrainJob's workload).
KUEUE_FRAMEWORKS = ("jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob")
# The API groups whose webhooks of Kueue's are registered: its own kinds and what it manages here.
# The rest of its manifests (batch Jobs, pods, Ray, ...) would call handlers it never sets up for
# integrations that are off, and refuse those objects.
KUEUE_WEBHOOK_GROUPS = frozenset({"kueue.x-k8s.io", "trainer.kubeflow.org", "jobset.x-k8s.io"})


class AddonError(RuntimeError):
    """An add-on controller that would not start: what it waited for, and the tail of its log."""


@dataclass
class GoController:
    """A controller-runtime manager of another project's, running out of cluster."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    admin: Kube
    webhook_configurations: list[Obj] = field(default_factory=list)

    def log_tail(self, lines: int = 40) -> str:
        return processes.tail(self.log, lines)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace: float = 20.0) -> None:
        """Unregister its webhooks (the API server would otherwise keep calling a server that is
        gone, and refuse every object they match), then SIGTERM, SIGKILL after ``grace``."""
        for config in self.webhook_configurations:
            kind = config["kind"].lower() + "s"
            with contextlib.suppress(KubeError):
                self.admin.request(
                    "DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{config['metadata']['name']}"
                )
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def module_dir(module: str) -> Path:
    """Where the module cache holds ``module`` at the version cluster/go.mod pins."""
    return install.module_dir(GO_MODULE, module)


def install_crds(admin: Kube, objs: Sequence[Obj], timeout: float = 60) -> None:
    """Create, or replace with these, the CRDs, and wait until they are served."""
    for crd in objs:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
        try:
            existing = admin.get(path)
        except KubeError as e:
            if e.status != 404:
                raise
            admin.create(crd)
            continue
        replaced = {
            **crd,
            "metadata": {**crd["metadata"], "resourceVersion": existing["metadata"]["resourceVersion"]},
        }
        admin.request("PUT", path, replaced)
    install.wait_established(admin, [c["metadata"]["name"] for c in objs], time.monotonic() + timeout)


def _start(
    plane: ControlPlane,
    name: str,
    argv: list[str],
    *,
    binary: Path,
    directory: Path,
    health_port: int,
    webhook_configurations: list[Obj],
    webhooks_active: Callable[[Kube], bool],
    env: dict[str, str],
    timeout: float,
) -> GoController:
    log = directory / f"{name}.log"
    process = processes.launch(name, argv, log, env)
    plane.track(name, process, str(binary))
    admin = plane.client()
    controller = GoController(name, process, log, admin)
    deadline = time.monotonic() + timeout
    try:
        while not _ready(health_port):
            _check(controller, deadline, "its readiness probe never passed")
            time.sleep(0.2)
        for config in webhook_configurations:
            admin.create(config)
            controller.webhook_configurations.append(config)
        # A registration takes effect a moment later (the API server's informer).
        while not webhooks_active(admin):
            _check(controller, deadline, "the API server never called its webhooks")
            time.sleep(0.2)
    except BaseException:
        controller.stop(grace=5)
        raise
    return controller


def _ready(port: int) -> bool:
    """Its controller-runtime readiness probe: for both, the webhook server is up."""
    answer = probe(f"http://127.0.0.1:{port}/readyz")
    return answer is not None and answer[0] == 200


def _check(controller: GoController, deadline: float, what: str) -> None:
    """Raise, with its log's tail, if it exited or ``deadline`` passed while waiting for ``what``."""
    if not controller.alive:
        raise AddonError(
            f"{controller.name} exited ({controller.process.returncode}):\n{controller.log_tail()}"
        )
    if time.monotonic() > deadline:
        raise AddonError(f"{controller.name}: {what}:\n{controller.log_tail()}")


def _write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# -- Kueue -------------------------------------------------------------------------------------


def kueue_webhooks(module: Path, port: int, ca_pem: bytes) -> list[Obj]:
    """Kueue's webhook configurations, only the hooks for KUEUE_WEBHOOK_GROUPS, called by URL."""
    configs = []
    for config in install.documents(module / "config" / "components" / "webhook" / "manifests.yaml"):
        hooks = [
            h
            for h in config.get("webhooks") or []
            if all(set(r.get("apiGroups") or []) <= KUEUE_WEBHOOK_GROUPS for r in h.get("rules") or [])
        ]
        if hooks:
            configs.append({**config, "webhooks": hooks})
    return install.webhooks_by_url(configs, "kueue-", port, ca_pem)


def start_kueue(
    plane: ControlPlane,
    kubeconfig: Path,
    directory: Path,
    *,
    frameworks: Iterable[str] = KUEUE_FRAMEWORKS,
    timeout: float = 120,
) -> GoController:
    """Kueue with its CRDs installed, managing ``frameworks``; returns once the API server calls
    its webhooks (a dry-run TrainJob with a queue name comes back suspended)."""
    # With its certificate management off, Kueue reads its metrics server's certificate from a
    # fixed path, /etc/kueue/metrics/certs, even with metrics off. It gets one in a mount namespace
    # of its own, on a tmpfs over /etc there (a static binary that reads nothing else of /etc):
    # nothing is written to the host's /etc.
    if os.geteuid() != 0:
        raise AddonError(
            "Kueue is run in a mount namespace of its own (for /etc/kueue/metrics/certs): that needs root"
        )
    module = module_dir(KUEUE_MODULE)
    admin = plane.client()
    install_crds(admin, install.crds_in(module / "config" / "components" / "crd" / "bases"))
    directory.mkdir(parents=True, exist_ok=True)
    cert_dir = directory / "kueue-webhook"
    webhook_serving_pair(plane.pki_dir, "kueue-webhook", cert_dir)
    webhook_port, health_port = free_port(), free_port()
    config = _write(
        directory / "kueue-config.yaml",
        {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": "0"},
            "integrations": {"frameworks": list(frameworks)},
        },
    )
    metrics_certs = directory / "kueue-metrics"
    webhook_serving_pair(plane.pki_dir, "kueue-metrics", metrics_certs)
    script = (
        "set -e; mount -t tmpfs -o size=1m,mode=0755 kueue-etc /etc; "
        'mkdir -p /etc/kueue/metrics/certs; cp "$1"/tls.crt "$1"/tls.key /etc/kueue/metrics/certs/; '
        'shift; exec "$@"'
    )
    argv = [
        "unshare", "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", script, "kueue-in-its-namespace", str(metrics_certs),
        str(plane.bin_dir / "kueue"),
        f"--config={config}",
        # Its on-demand visibility API is an aggregated API server of its own, not needed here.
        "--feature-gates=VisibilityOnDemand=false",
        "--zap-log-level=2",
    ]  # fmt: skip
    return _start(
        plane,
        "kueue",
        argv,
        binary=plane.bin_dir / "kueue",  # unshare and sh exec it
        directory=directory,
        health_port=health_port,
        webhook_configurations=kueue_webhooks(module, webhook_port, plane.ca_cert.read_bytes()),
        webhooks_active=_kueue_webhooks_active,
        env=child_env(KUBECONFIG=str(kubeconfig)),
        timeout=timeout,
    )


def _kueue_webhooks_active(admin: Kube) -> bool:
    probe_job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "kueue-probe",
            "namespace": "default",
            "labels": {"kueue.x-k8s.io/queue-name": "probe"},
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }
    try:
        made = admin.create(probe_job, dry_run=True)
    except KubeError:
        return False
    return bool((made.get("spec") or {}).get("suspend"))


# -- upstream's trainer-controller-manager -----------------------------------------------------


def upstream_crds(module: Path) -> list[Obj]:
    return install.crds_in(module / "manifests" / "base" / "crds")


def upstream_runtimes(
    module: Path, names: Iterable[str] = ("torch_distributed", "deepspeed_distributed")
) -> list[Obj]:
    """Upstream's ClusterTrainingRuntimes from its manifests (torch, and MPI through DeepSpeed's)."""
    base = module / "manifests" / "base" / "runtimes"
    return [d for n in names for d in install.documents(base / f"{n}.yaml")]


def upstream_webhooks(module: Path, port: int, ca_pem: bytes) -> list[Obj]:
    """Upstream's webhook configurations (defaulting and validating), called by URL."""
    configs = install.documents(module / "manifests" / "base" / "webhook" / "manifests.yaml")
    return install.webhooks_by_url(configs, "upstream-trainer-", port, ca_pem)


def start_upstream_trainer(
    plane: ControlPlane,
    kubeconfig: Path,
    directory: Path,
    *,
    webhooks: bool = True,
    client: tuple[float, int] | None = None,
    metrics_port: int | None = None,
    feature_gates: str = "",
    timeout: float = 120,
) -> GoController:
    """Upstream's controller. With ``webhooks``, returns once the API server calls them (a dry-run
    TrainJob that sets a reserved env is refused); without, they are served but not registered,
    and it returns once it is ready. ``client`` is its client budget (QPS, burst; its own default
    is 50 and 100); ``metrics_port`` serves its metrics over plain HTTP on loopback."""
    module = module_dir(UPSTREAM_MODULE)
    directory.mkdir(parents=True, exist_ok=True)
    # controller-runtime's webhook server reads $TMPDIR/k8s-webhook-server/serving-certs when
    # upstream's certificate management is off (its Configuration has no certDir).
    tmp = directory / "tmp"
    webhook_serving_pair(
        plane.pki_dir, "upstream-trainer-webhook", tmp / "k8s-webhook-server" / "serving-certs"
    )
    webhook_port, health_port = free_port(), free_port()
    settings: dict[str, Any] = {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "webhook": {"host": "127.0.0.1", "port": webhook_port},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": (
            {"bindAddress": f"127.0.0.1:{metrics_port}", "secureServing": False}
            if metrics_port
            else {"bindAddress": "0"}
        ),
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
    }
    if client is not None:
        settings["clientConnection"] = {"qps": client[0], "burst": client[1]}
    config = _write(directory / "upstream-trainer-config.yaml", settings)
    argv = [str(plane.bin_dir / "trainer-controller-manager"), f"--config={config}", "--zap-log-level=2"]
    if feature_gates:
        argv.append(f"--feature-gates={feature_gates}")
    return _start(
        plane,
        "upstream-trainer",
        argv,
        binary=plane.bin_dir / "trainer-controller-manager",
        directory=directory,
        health_port=health_port,
        webhook_configurations=(
            upstream_webhooks(module, webhook_port, plane.ca_cert.read_bytes()) if webhooks else []
        ),
        webhooks_active=_upstream_webhooks_active if webhooks else (lambda _admin: True),
        env=child_env(KUBECONFIG=str(kubeconfig), TMPDIR=str(tmp)),
        timeout=timeout,
    )


def _upstream_webhooks_active(admin: Kube) -> bool:
    probe_job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "upstream-probe", "namespace": "default"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"env": [{"name": "PET_NODE_RANK", "value": "0"}]},
        },
    }
    try:
        admin.create(probe_job, dry_run=True)
    except KubeError as e:
        return "validator.trainjob.trainer.kubeflow.org" in e.message
    return False


def upstream_image(bin_dir: Path) -> oci.Blobs:
    """Upstream's controller image as its Dockerfile makes it: the static binary as ``/manager``,
    run as the distroless base's non-root user. The base adds nothing this binary reads."""
    binary = oci.File("manager", source=bin_dir / "trainer-controller-manager")
    image = oci.Image(UPSTREAM_IMAGE, entrypoint=["/manager"], user="65532:65532")
    return oci.image_blobs(image, [oci.file_layer([binary])])


def push_to_nodes(plane: ControlPlane, image: str, blobs: oci.Blobs) -> int:
    """Push an image into the registry a cluster with real nodes pulls from (docker.io, ghcr.io
    and nvcr.io are mirrored to it), through its loopback writer; the count of blobs uploaded."""
    config = yaml.safe_load((plane.dir / "registry-push.yaml").read_text())
    return registry.Client(config["http"]["addr"]).push(image, blobs)


def upstream_chart(directory: Path) -> Path:
    """Upstream's chart, copied from its module into ``directory``, without its dependencies.

    Helm refuses a chart whose dependencies are missing from ``charts/`` whatever their
    conditions; upstream's are JobSet and LWS charts from OCI registries this machine cannot
    reach, and both are off once ``jobset.install`` is false (the cluster runs JobSet already).
    """
    source = module_dir(UPSTREAM_MODULE) / "charts" / "kubeflow-trainer"
    target = directory / "kubeflow-trainer"
    shutil.copytree(source, target)
    for path in [target, *target.rglob("*")]:  # the module cache is read-only
        path.chmod(path.stat().st_mode | 0o200)
    chart = yaml.safe_load((target / "Chart.yaml").read_text())
    chart.pop("dependencies", None)
    (target / "Chart.yaml").write_text(yaml.safe_dump(chart, sort_keys=False))
    return target
