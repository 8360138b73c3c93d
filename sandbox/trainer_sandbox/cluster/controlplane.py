"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok (the kubelets of four fake nodes), what their containers print (``podlogs``)
and the JobSet controller.

It exists so the operator can be tried against the real API machinery (admission, RBAC, the Job
controller, garbage collection, JobSet's own webhooks and controller) where the in-memory stand-in
only imitates them, without Docker: every binary is built from the modules pinned in ``cluster/``.

``ControlPlane.start(dir)`` brings it up and returns once every component is healthy; the processes
run in sessions of their own and are recorded in ``dir/cluster.json``, so ``stop()`` here or
``scripts/cluster down`` from anywhere can stop them. Every ``start`` is a fresh cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from trainer_sandbox.cluster import install, nodenet, nodepool, processes
from trainer_sandbox.cluster.kube import Kube, KubeError, probe, tls_context
from trainer_sandbox.cluster.nodepool import NodePool, kwok_taint
from trainer_sandbox.cluster.pki import ADMIN_USER, SERVICE_CIDR, KeyPair, Pki, make_pki, write_kubeconfig
from trainer_sandbox.cluster.processes import Record
from trainer_sandbox.cluster.stages import NODE_ANNOTATION, NODE_ANNOTATION_VALUE, write_stages
from trainer_sandbox.ports import free_ports

REPO_ROOT = Path(__file__).resolve().parents[3]
GO_MODULE = REPO_ROOT / "cluster"
STATE_FILE = "cluster.json"
# Kubernetes 1.36's own gang scheduling (Workload and PodGroup, scheduling.k8s.io/v1alpha2): alpha
# gates every component that reads or serves the API needs, and the API itself (docs/scheduling.md).
GANG_FEATURE_GATES = "GenericWorkload=true,GangScheduling=true"
GANG_API = "scheduling.k8s.io/v1alpha2=true"
# What keeps a PodGroup until its pods are gone; it runs only where the gates are on.
GANG_CONTROLLERS = ("podgroup-protection-controller",)
COMPONENT_TIMEOUT = 120.0  # seconds from launch to healthy, per component (2 busy cores start slowly)
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTROLLERS = (
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "ttl-after-finished-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    # Runtimes with volumeClaimPolicies (torchtune's) get PVCs from JobSet; the binder binds them
    # to the pool of volumes `up` creates (install.volumes), and the pods can be scheduled.
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
)
# Everything `up` writes into the directory; removed before a new cluster starts there.
_OWNED = (
    STATE_FILE,
    "etcd",
    "logs",
    "pki",
    "kwok-home",
    "audit.log",
    "kubeconfig",
    "sa.key",
    "sa.pub",
    "kwok-stages.yaml",
    "kwok-logs",
    "jobset-config.yaml",
    "audit-policy.yaml",
    "images",
    "nodes",
    "registry.yaml",
    "registry-push.yaml",
)

Echo = Callable[[str], None]


class StartError(RuntimeError):
    """A component did not come up; names it, with the end of its log."""

    def __init__(self, component: str, reason: str, log_tail: str = "") -> None:
        message = f"{component}: {reason}"
        if log_tail:
            message += f"\n--- last lines of its log ---\n{log_tail}"
        super().__init__(message)
        self.component = component


class AlreadyRunning(RuntimeError):
    pass


def default_dir() -> Path:
    return REPO_ROOT / ".cluster"


def build_binaries() -> Path:
    """Run ``cluster/build`` (warm: a second; cold: it prints its progress on our stderr) and return
    the directory of the binaries it prints."""
    script = GO_MODULE / "build"
    if not script.exists():
        raise RuntimeError(f"{script} not found: pass the directory of prebuilt binaries instead")
    out = subprocess.run([str(script)], stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"cluster/build failed (exit {out.returncode}); its output is above")
    return Path(out.stdout.strip().splitlines()[-1])


def child_env(**extra: str) -> dict[str, str]:
    """The components' environment: no KUBECONFIG of the caller's; loopback, the real nodes'
    networks and cluster names never proxied."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    local = (
        f"127.0.0.1,localhost,{nodenet.FABRIC_CIDR},{nodenet.POD_CIDRS},{SERVICE_CIDR},.svc,.cluster.local"
    )
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = ",".join(x for x in (local, env.get(key, "")) if x)
    env.update(extra)
    return env


@dataclass
class ControlPlane:
    """A running cluster and the files a client needs (``kubeconfig`` is the admin's)."""

    dir: Path
    bin_dir: Path
    server: str
    kubeconfig: Path
    audit_log: Path
    ca_cert: Path
    sa_key: Path
    sa_pub: Path
    records: list[Record] = field(default_factory=list)
    _children: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def pki_dir(self) -> Path:
        """``ca.crt`` and ``ca.key`` (to sign client certificates for more users) and the rest."""
        return self.dir / "pki"

    @property
    def kubectl(self) -> Path:
        """The kubectl built with the cluster (never the one on PATH: versions must match)."""
        return self.bin_dir / "kubectl"

    @classmethod
    def start(
        cls,
        directory: Path | str | None = None,
        *,
        bin_dir: Path | str | None = None,
        echo: Echo | None = None,
        timeout: float = COMPONENT_TIMEOUT,
        real_nodes: int = 0,
        trainer_objects: bool = True,
        pod_logs: bool = True,
        gang: bool = False,
    ) -> ControlPlane:
        """Start a fresh cluster in ``directory`` (default ``.cluster`` in the repository) and return
        once every component is healthy; ``echo`` receives one line per component as it is.
        ``real_nodes`` adds that many nodes that run containers (see ``nodepool``; needs root).
        ``trainer_objects=False`` leaves out the trainer CRDs, the default runtimes and the public
        ConfigMap, for an install of the chart (Helm adopts nothing it did not make).
        ``pod_logs=False`` leaves out the writer of kwok pods' logs (``podlogs``: one object and
        one file per pod), for benchmarks that count the API server's work per pod.
        ``gang=True`` turns on kube-scheduler's gang scheduling (``GANG_FEATURE_GATES`` in the API
        server, the controller manager and the scheduler, and the API they serve).

        On any failure everything started so far is stopped before the error propagates.
        """
        directory = Path(directory) if directory is not None else default_dir()
        directory = directory.resolve()
        binaries = Path(bin_dir) if bin_dir is not None else build_binaries()
        starter = _Starter(
            directory,
            binaries,
            echo or (lambda _line: None),
            timeout,
            real_nodes,
            trainer_objects,
            pod_logs,
            gang,
        )
        try:
            return starter.run()
        except BaseException:
            starter.abort()
            raise

    @classmethod
    def attach(cls, directory: Path | str | None = None) -> ControlPlane:
        """A handle on the cluster ``up`` left running in ``directory``."""
        directory = (Path(directory) if directory is not None else default_dir()).resolve()
        records, extra = processes.load_records(directory / STATE_FILE)
        if not records or not all(processes.is_ours(r) for r in records):
            raise RuntimeError(f"no running cluster in {directory}")
        return cls(
            dir=directory,
            bin_dir=Path(str(extra["bin_dir"])),
            server=str(extra["server"]),
            kubeconfig=directory / "kubeconfig",
            audit_log=directory / "audit.log",
            ca_cert=directory / "pki" / "ca.crt",
            sa_key=directory / "sa.key",
            sa_pub=directory / "sa.pub",
            records=records,
        )

    def track(self, name: str, process: subprocess.Popen[bytes], binary: str) -> None:
        """Count a process started beside the cluster (a controller of the tests') as one of its
        components, in the state file too: ``stop`` and ``down`` stop it with the API server's
        other clients, also after the process that started it died. ``binary`` is what it runs as
        (after any exec), as ``down`` recognises it."""
        self.records.append(Record(name=name, pid=process.pid, binary=binary))
        self._children.append(process)
        _, extra = processes.load_records(self.dir / STATE_FILE)
        processes.save_records(self.dir / STATE_FILE, self.records, extra)

    def stop(self, grace: float = 10.0) -> list[str]:
        """Stop every process (SIGTERM, SIGKILL after ``grace``); returns those that needed SIGKILL."""
        _, extra = processes.load_records(self.dir / STATE_FILE)
        killed = _stop(self.dir, self.records, extra, grace, self._children)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / STATE_FILE).unlink()
        return killed

    def run_kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl ARGS`` as the admin, output captured."""
        return subprocess.run(
            [str(self.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            env=child_env(),
        )

    def client(self) -> Kube:
        """A plain HTTPS client as the admin."""
        return Kube(self.server, tls_context(self.ca_cert, *_admin_pair(self.dir)))

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _waves(records: Sequence[Record]) -> list[list[Record]]:
    """The API server's clients first, then the API server, then etcd."""
    last = ("kube-apiserver", "etcd")
    return [[r for r in records if r.name not in last]] + [[r for r in records if r.name == n] for n in last]


def _stop(
    directory: Path,
    records: Sequence[Record],
    extra: dict[str, Any],
    grace: float,
    children: Sequence[subprocess.Popen[bytes]] = (),
) -> list[str]:
    """Stop the API server's clients, then what runs in real nodes' containers (clients too: the
    API server would wait for their watches to drain), then the API server and etcd; then remove
    the real nodes' cgroups, mounts and network."""
    waves = _waves(records)
    killed = processes.stop(waves[:1], grace, children)
    NodePool.kill_containers(directory, extra)
    killed += processes.stop(waves[1:], grace, children)
    NodePool.teardown(directory, extra)
    return killed


def _admin_pair(directory: Path) -> tuple[Path, Path]:
    return directory / "pki" / "admin.crt", directory / "pki" / "admin.key"


def stop_directory(directory: Path | str | None = None, grace: float = 10.0) -> tuple[list[str], list[str]]:
    """What ``down`` does: stop every process recorded in ``directory``. Returns the names that were
    running and those that needed SIGKILL; nothing recorded or nothing running is not an error."""
    directory = (Path(directory) if directory is not None else default_dir()).resolve()
    state = directory / STATE_FILE
    records, extra = processes.load_records(state)
    running = [r.name for r in records if processes.is_ours(r)]
    killed = _stop(directory, records, extra, grace)
    with contextlib.suppress(FileNotFoundError):
        state.unlink()
    return running, killed


class _Starter:
    """One ``up``: the order components start in, and how each is known to be healthy."""

    def __init__(
        self,
        directory: Path,
        bin_dir: Path,
        echo: Echo,
        timeout: float,
        real_nodes: int = 0,
        trainer_objects: bool = True,
        pod_logs: bool = True,
        gang: bool = False,
    ) -> None:
        self.gang = gang
        self.trainer_objects = trainer_objects
        self.pod_logs = pod_logs
        self.prepared = False
        self.dir = directory
        self.bin = bin_dir
        self.echo = echo
        self.timeout = timeout
        self.records: list[Record] = []
        self.children: list[subprocess.Popen[bytes]] = []
        self.launched: dict[str, float] = {}
        self.webhooks_registered = False
        (
            self.etcd_port,
            self.etcd_peer_port,
            self.apiserver_port,
            self.kcm_port,
            self.scheduler_port,
            self.kwok_port,
            self.webhook_port,
            self.jobset_health_port,
        ) = free_ports(8)
        self.pool = None
        if real_nodes:
            registry_port, push_port = free_ports(2)
            self.pool = NodePool(
                directory, real_nodes, bin_dir, registry_port=registry_port, push_port=push_port
            )
        # With real nodes the API server serves where nodes and pods reach it (the host's end of
        # their network); host clients reach that address as well as loopback.
        self.host = nodenet.HOST_IP if self.pool else "127.0.0.1"
        self.server = f"https://{self.host}:{self.apiserver_port}"

    # -- the sequence ------------------------------------------------------------------------
    def run(self) -> ControlPlane:
        t0 = time.monotonic()
        self._prepare_directory()
        self.prepared = True  # from here on, what is in the directory is this `up`'s own
        if self.pool:
            self._save_state()  # before the network exists, so that `down` finds it after a crash
            self.pool.prepare(self.echo)
            self._save_state()  # with the host's settings the nodes will change
        # Everything read from disk first: a missing module or file fails before anything starts.
        module = install.jobset_module_dir(GO_MODULE)
        jobset_crds = install.jobset_crds(module)
        kwok_crds = install.kwok_logs_crds(install.module_dir(GO_MODULE, install.KWOK_MODULE))
        other_crds = install.trainer_and_podgroup_crds()
        runtimes = install.runtimes()
        if not self.trainer_objects:  # the chart's to install: only the PodGroup CRDs stay
            other_crds = [c for c in other_crds if c["spec"]["group"] != "trainer.kubeflow.org"]
            runtimes = []
        pki = make_pki(
            self.dir / "pki",
            self.dir,
            node_names=self.pool.names if self.pool else (),
            apiserver_ips=(self.host,) if self.pool else (),
        )
        kubeconfigs = self._kubeconfigs(pki)
        ca_ctx = tls_context(pki.ca.cert)
        admin = Kube(self.server, tls_context(pki.ca.cert, pki.admin.cert, pki.admin.key))

        self._launch("etcd", self._etcd_argv())
        self._await(
            "etcd", lambda: _ok(probe(f"http://127.0.0.1:{self.etcd_port}/health"), '"health":"true"')
        )

        self._launch("kube-apiserver", self._apiserver_argv(pki))
        self._await("kube-apiserver", lambda: _ok(probe(f"{self.server}/readyz", admin.ctx)))

        # kwok and JobSet need their bindings and CRDs before they start (a 403 or a 404 puts an
        # informer into back-off); the rest can land while they start.
        install.create_all(admin, install.cluster_admin_bindings())
        install.create_all(admin, kwok_crds)
        self._launch("kube-controller-manager", self._controller_manager_argv(pki, kubeconfigs["kcm"]))
        self._launch("kube-scheduler", self._scheduler_argv(pki, kubeconfigs["scheduler"]))
        install.wait_established(admin, _names(kwok_crds), time.monotonic() + self.timeout)
        self._launch(
            "kwok",
            self._kwok_argv(kubeconfigs["kwok"], pki),
            env=child_env(HOME=str(self.dir / "kwok-home")),  # kwok also reads ~/.kwok/kwok.yaml
        )
        logs_ready = self.dir / "kwok-logs" / ".listed"
        if self.pod_logs:
            self._launch("kwok-logs", self._kwok_logs_argv(pki, logs_ready), binary=sys.executable)
        crds_started = time.monotonic()
        install.create_all(admin, jobset_crds)
        install.wait_established(admin, _names(jobset_crds), time.monotonic() + self.timeout)
        self._launch(
            "jobset",
            [str(self.bin / "jobset"), f"--config={self._jobset_config(pki)}", "--zap-log-level=info"],
            env=child_env(KUBECONFIG=str(kubeconfigs["jobset"])),
        )
        install.create_all(admin, other_crds)
        kwok_nodes = install.nodes()
        install.create_all(admin, kwok_taint(kwok_nodes) if self.pool else kwok_nodes)
        install.create_all(admin, install.volumes())

        self._await(
            "kube-controller-manager",
            lambda: _ok(probe(f"https://127.0.0.1:{self.kcm_port}/healthz", ca_ctx)),
        )
        self._await(
            "kube-scheduler",
            lambda: _ok(probe(f"https://127.0.0.1:{self.scheduler_port}/healthz", ca_ctx)),
        )
        self._await(
            "kwok",  # over TLS, as the API server reaches it for logs
            lambda: (
                _ok(probe(f"https://127.0.0.1:{self.kwok_port}/healthz", ca_ctx))
                and install.nodes_ready(admin)
            ),
        )
        if self.pod_logs:
            self._await("kwok-logs", logs_ready.exists)
        self._await("jobset", lambda: self._jobset_ready(admin, module, pki.ca.cert))

        deadline = time.monotonic() + self.timeout
        install.wait_established(admin, _names(other_crds), deadline)
        install.create_when_served(admin, runtimes, deadline)
        if self.trainer_objects:
            install.create_all(admin, install.public_configmap())
        self.echo(f"{'CRDs and runtimes installed':<28} {time.monotonic() - crds_started:5.1f}s")
        if self.pool:
            self.pool.start(pki, self.server, self._launch, self._await, admin, self.echo)
        self.echo(f"{'cluster up':<28} {time.monotonic() - t0:5.1f}s")
        return ControlPlane(
            dir=self.dir,
            bin_dir=self.bin,
            server=self.server,
            kubeconfig=self.dir / "kubeconfig",
            audit_log=self.dir / "audit.log",
            ca_cert=pki.ca.cert,
            sa_key=pki.sa_key,
            sa_pub=pki.sa_pub,
            records=list(self.records),
            _children=list(self.children),
        )

    def abort(self) -> None:
        """Stop what this `up` started. Nothing, when it stopped before the directory was its own
        (a cluster already running there is not this one's to stop)."""
        if not self.prepared:
            return
        _stop(self.dir, self.records, self.pool.state() if self.pool else {}, 5.0, self.children)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / STATE_FILE).unlink()

    # -- helpers -----------------------------------------------------------------------------
    def _prepare_directory(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        records, extra = processes.load_records(self.dir / STATE_FILE)
        alive = [r for r in records if processes.is_ours(r)]
        if alive:
            names = ", ".join(f"{r.name} (pid {r.pid})" for r in alive)
            raise AlreadyRunning(f"a cluster is already running in {self.dir}: {names}; stop it with `down`")
        NodePool.teardown(self.dir, extra)  # what a crashed `up` with real nodes left in this directory
        for name in _OWNED:
            path = self.dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        (self.dir / "logs").mkdir()
        (self.dir / "kwok-home").mkdir()

    def _kubeconfigs(self, pki: Pki) -> dict[str, Path]:
        write_kubeconfig(self.dir / "kubeconfig", self.server, pki.ca.cert, pki.admin, ADMIN_USER)
        pairs: dict[str, KeyPair] = {
            "kcm": pki.controller_manager,
            "scheduler": pki.scheduler,
            "kwok": pki.kwok,
            "jobset": pki.jobset,
        }
        return {
            name: write_kubeconfig(
                self.dir / "pki" / f"{name}.kubeconfig", self.server, pki.ca.cert, pair, name
            )
            for name, pair in pairs.items()
        }

    def _launch(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, binary: str | None = None
    ) -> None:
        """Start a component; ``binary`` is what it runs as when ``argv`` starts with a prefix that
        execs it (a real node's ``nsenter``), so that ``down`` recognises it."""
        proc = processes.launch(name, argv, self.dir / "logs" / f"{name}.log", env or child_env())
        self.children.append(proc)
        self.records.append(Record(name=name, pid=proc.pid, binary=binary or argv[0]))
        self.launched[name] = time.monotonic()
        self._save_state()

    def _save_state(self) -> None:
        extra: dict[str, Any] = {"bin_dir": str(self.bin), "server": self.server}
        if self.pool:
            extra.update(self.pool.state())
        processes.save_records(self.dir / STATE_FILE, self.records, extra)

    def _await(self, name: str, healthy: Callable[[], bool]) -> None:
        """Until ``healthy()``; fails naming ``name`` if its process exits or the time runs out."""
        proc = next(p for p, r in zip(self.children, self.records, strict=True) if r.name == name)
        log = self.dir / "logs" / f"{name}.log"
        started = self.launched[name]
        last_error = ""
        while True:
            code = proc.poll()
            if code is not None:
                raise StartError(name, f"exited with code {code}", processes.tail(log))
            try:
                if healthy():
                    break
            except (OSError, KubeError) as e:  # not answering yet, or answering "not yet"
                last_error = f" (last error: {e})"
            if time.monotonic() - started > self.timeout:
                reason = f"not healthy after {self.timeout:.0f}s{last_error}"
                raise StartError(name, reason, processes.tail(log))
            time.sleep(0.1)
        self.echo(f"{name:<28} {time.monotonic() - started:5.1f}s")

    def _jobset_ready(self, admin: Kube, module: Path, ca: Path) -> bool:
        """JobSet's webhook server is up; register its webhooks once, then wait until the API
        server calls them."""
        if not self.webhooks_registered:
            if not _ok(probe(f"http://127.0.0.1:{self.jobset_health_port}/readyz")):
                return False
            hooks = install.jobset_webhooks(module, self.webhook_port, ca.read_bytes())
            install.create_all(admin, hooks)
            self.webhooks_registered = True
        return install.jobset_webhooks_active(admin)

    # -- command lines -----------------------------------------------------------------------
    def _etcd_argv(self) -> list[str]:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [
            str(self.bin / "etcd"),
            "--name=trainer-cluster",
            f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=trainer-cluster={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",  # a throwaway cluster: durability costs seconds on slow disks
            "--log-level=warn",
        ]

    def _apiserver_argv(self, pki: Pki) -> list[str]:
        policy = self.dir / "audit-policy.yaml"
        policy.write_bytes(
            resources.files("trainer_sandbox.cluster").joinpath("audit-policy.yaml").read_bytes()
        )
        return [
            str(self.bin / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={self.host}",
            f"--advertise-address={self.host}",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.dir / 'pki'}",
            f"--tls-cert-file={pki.apiserver.cert}",
            f"--tls-private-key-file={pki.apiserver.key}",
            f"--client-ca-file={pki.ca.cert}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--allow-privileged=true",
            "--profiling=false",
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.dir / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # each event is written before its response is sent
            "--audit-log-maxsize=0",
            "--audit-log-maxbackup=0",
            # Node names are not in any resolver: reach kubelets (kwok's server for its nodes,
            # 127.0.0.1) by the IP they report. Their serving certificates are not checked (no
            # --kubelet-certificate-authority): a real node's kubelet makes its own, self-signed.
            "--kubelet-preferred-address-types=InternalIP",
            *(
                [
                    f"--kubelet-client-certificate={pki.kubelet_client.cert}",
                    f"--kubelet-client-key={pki.kubelet_client.key}",
                ]
                if pki.kubelet_client
                else []
            ),
            # No kube-proxy runs on this host, so a Service's ClusterIP leads nowhere from here:
            # call webhooks (and aggregated APIs) at their endpoints' pod IPs, which the host
            # routes to the nodes.
            *(["--enable-aggregator-routing=true"] if self.pool else []),
            *self._gang_argv(),
            *([f"--runtime-config={GANG_API}"] if self.gang else []),
        ]

    def _gang_argv(self) -> list[str]:
        return [f"--feature-gates={GANG_FEATURE_GATES}"] if self.gang else []

    def _controller_manager_argv(self, pki: Pki, kubeconfig: Path) -> list[str]:
        return [
            str(self.bin / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.kcm_port}",
            f"--tls-cert-file={pki.controller_manager_serving.cert}",
            f"--tls-private-key-file={pki.controller_manager_serving.key}",
            f"--controllers={','.join(self._controllers())}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca.cert}",
            *self._gang_argv(),
        ]

    def _controllers(self) -> tuple[str, ...]:
        return (
            CONTROLLERS
            + (nodepool.CONTROLLERS if self.pool else ())
            + (GANG_CONTROLLERS if self.gang else ())
        )

    def _scheduler_argv(self, pki: Pki, kubeconfig: Path) -> list[str]:
        return [
            str(self.bin / "kube-scheduler"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.scheduler_port}",
            f"--tls-cert-file={pki.scheduler_serving.cert}",
            f"--tls-private-key-file={pki.scheduler_serving.key}",
            "--leader-elect=false",
            *self._gang_argv(),
        ]

    def _kwok_argv(self, kubeconfig: Path, pki: Pki) -> list[str]:
        """kwok's server is every fake node's kubelet endpoint: its nodes report 127.0.0.1 and its
        port (stages.node_stages), and it serves their pods' logs from the files ``Logs`` objects
        name (``podlogs``), over TLS with a certificate of the cluster's CA."""
        stages = write_stages(self.dir / "kwok-stages.yaml")
        return [
            str(self.bin / "kwok"),
            f"--kubeconfig={kubeconfig}",
            f"--config={stages}",
            f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}={NODE_ANNOTATION_VALUE}",
            "--cidr=10.244.0.0/16",
            "--node-ip=127.0.0.1",
            f"--node-port={self.kwok_port}",
            "--node-lease-duration-seconds=0",
            f"--server-address=127.0.0.1:{self.kwok_port}",
            f"--tls-cert-file={pki.kwok_serving.cert}",
            f"--tls-private-key-file={pki.kwok_serving.key}",
            "--enable-crds=Logs",
        ]

    def _kwok_logs_argv(self, pki: Pki, ready: Path) -> list[str]:
        """The writer of the kwok pods' log files, as kwok's own client."""
        return [
            sys.executable,
            "-m",
            "trainer_sandbox.cluster.podlogs",
            f"--server={self.server}",
            f"--ca={pki.ca.cert}",
            f"--cert={pki.kwok.cert}",
            f"--key={pki.kwok.key}",
            f"--dir={self.dir / 'kwok-logs'}",
            f"--ready={ready}",
        ]

    def _jobset_config(self, pki: Pki) -> Path:
        """JobSet's Configuration: our certificate instead of its own rotation (which needs a
        Secret and a Service in-cluster), webhooks and probes on loopback, metrics off."""
        config: dict[str, Any] = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {
                "host": "127.0.0.1",
                "port": self.webhook_port,
                "certDir": str(pki.jobset_webhook.cert.parent),
            },
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.jobset_health_port}"},
            "metrics": {"bindAddress": "0"},
        }
        path = self.dir / "jobset-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path


def _ok(answer: tuple[int, str] | None, contains: str = "") -> bool:
    return answer is not None and answer[0] == 200 and contains in answer[1]


def _names(crds: Sequence[dict[str, Any]]) -> list[str]:
    return [str(c["metadata"]["name"]) for c in crds]


@contextlib.contextmanager
def running(directory: Path | str | None = None, **kwargs: Any) -> Iterator[ControlPlane]:
    """``with running(dir) as cp:`` starts a cluster and stops it on the way out."""
    cp = ControlPlane.start(directory, **kwargs)
    try:
        yield cp
    finally:
        cp.stop()
