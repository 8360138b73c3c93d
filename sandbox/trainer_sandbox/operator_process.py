"""The operator as its own process (`trainer run`), against a local API server: killable for real.

The embedded operator (``trainer_sandbox.embedded_operator``) shares the test's process and stops
politely. Chaos tests and the load benchmark need what a cluster does to a pod instead: SIGKILL at
any instant, in-flight requests cut, nothing flushed; and an RSS that is the operator's own. The
child runs as the chart's ServiceAccount user, so the audit log tells its requests apart, and it
is killed with its parent (Linux: ``PR_SET_PDEATHSIG``), so an interrupted test leaves no
operator holding a port.

The child sees only what the operator's image installs: the operator's distribution and its
requirements, transitively, without extras (:func:`operator_site`), not the packages the tests
installed beside it. That keeps its memory the image's: kopf imports the official ``kubernetes``
client (40 MiB) whenever it can, and the tests install that client. It also makes a run fail
where the image would, on an import of a package the operator does not declare.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from trainer_sandbox.apiserver.audit import AuditRecord
from trainer_sandbox.ports import free_port

OPERATOR_USER = "system:serviceaccount:kubeflow-system:kubeflow-trainer-controller-manager"
OPERATOR_DISTRIBUTION = "trainer-operator"

# `trainer run` on a site directory alone: no site-packages (-S), no current directory (-P).
_BOOT = "import site, sys; site.addsitedir(sys.argv.pop(1)); from trainer.cli import main; sys.exit(main())"
_SITE: Path | None = None


def operator_site() -> Path:
    """A site directory holding the operator's distribution and its requirements, transitively and
    without extras, as links into this environment: what ``pip install trainer-operator`` gives.

    Made once per process. Run Python on it with :func:`operator_command`.
    """
    global _SITE
    if _SITE is None:
        import site as python_site
        from importlib import metadata

        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name

        site = Path(tempfile.mkdtemp(prefix="operator-site-"))
        atexit.register(shutil.rmtree, site, True)
        todo, seen = [OPERATOR_DISTRIBUTION], set()
        while todo:
            name = canonicalize_name(todo.pop())
            if name in seen:
                continue
            seen.add(name)
            # As installed, not as a checkout in the current directory may describe itself.
            dist = next(iter(metadata.distributions(name=name, path=python_site.getsitepackages())))
            for line in dist.requires or []:
                requirement = Requirement(line)
                if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                    todo.append(requirement.name)
            for top in sorted({f.parts[0] for f in dist.files or []}):
                source = Path(str(dist.locate_file(top)))
                link = site / top
                if top.startswith("..") or top == "__pycache__" or link.exists() or not source.exists():
                    continue  # scripts (../../bin), bytecode, a directory two distributions share
                link.symlink_to(source)
        _SITE = site
    return _SITE


def operator_command(*args: str) -> list[str]:
    """``trainer ARGS...`` as a command line that sees only :func:`operator_site`."""
    return [sys.executable, "-S", "-P", "-c", _BOOT, str(operator_site()), *args]


def _spawn(command: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Popen from one thread that lives as long as this process.

    PR_SET_PDEATHSIG (``_die_with_parent``) fires when the *thread* that forked the child ends,
    not the process: a child started from a short-lived thread (the chaos test's killer restarts
    the operator from one) would be SIGKILLed as soon as that thread returned.
    """
    global _SPAWNER
    if _SPAWNER is None:
        _SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="operator-spawner")

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, **kwargs)

    return _SPAWNER.submit(spawn).result()


_SPAWNER: concurrent.futures.ThreadPoolExecutor | None = None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _accepts(port: int) -> bool:
    """Whether something listens on the loopback port: a kubelet's ``tcpSocket`` readiness check."""
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def proc_status(pid: int, field_name: str) -> int:
    """A field of /proc/<pid>/status in kB (VmRSS, VmHWM); 0 where there is no /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server(Protocol):
    """What the child needs of a control plane: the stand-in, or the real one (``backends.Cluster``)."""

    def add_user(self, name: str, groups: Iterable[str] = ()) -> object: ...

    def write_kubeconfig(self, path: str | Path, user: str = ..., namespace: str | None = None) -> Path: ...

    def audit_mark(self) -> int: ...

    def audit_since(self, mark: int) -> list[AuditRecord]: ...


class OperatorProcess:
    """``trainer run`` on ``server`` with a Configuration of QPS, burst and workers; ports are free ones.

    ``config`` adds sections to the Configuration (``{"leaderElection": {...}}``); ``namespaces``
    are served alone (``-n``), as a test on the shared real control plane must.
    """

    def __init__(
        self,
        server: Server,
        workdir: Path,
        *,
        qps: float = 50.0,
        burst: int = 100,
        workers: int = 4,
        user: str = OPERATOR_USER,
        config: Mapping[str, Any] | None = None,
        namespaces: Sequence[str] = (),
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.server = server
        self.user = user
        self.workdir = workdir
        self.settings = f"client QPS {qps:g}, burst {burst}, {workers} reconcile workers"
        server.add_user(user, ["system:serviceaccounts"])
        self.kubeconfig = server.write_kubeconfig(workdir / "operator.kubeconfig", user=user)
        self.metrics_port = free_port()
        self.config = workdir / "config.yaml"
        self.config.write_text(
            "apiVersion: config.trainer.kubeflow.org/v1alpha1\nkind: Configuration\n"
            f"clientConnection: {{qps: {qps}, burst: {burst}}}\n"
            f"controller: {{groupKindConcurrency: {{TrainJob.trainer.kubeflow.org: {workers}}}}}\n"
            "webhook: {enabled: false}\n"
            # Plain HTTP on loopback, so leads() and the benchmarks read it without a token.
            f"metrics: {{bindAddress: '127.0.0.1:{self.metrics_port}', secureServing: false}}\n"
            f"health: {{healthProbeBindAddress: '127.0.0.1:{free_port()}'}}\n"
            + "".join(f"{key}: {json.dumps(value)}\n" for key, value in (config or {}).items())
        )
        self.namespaces = tuple(namespaces)
        webhook = (config or {}).get("webhook") or {}
        self.webhook_port: int | None = webhook.get("port") if webhook.get("enabled") else None
        self.log_path = workdir / "operator.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 60) -> OperatorProcess:
        """Start the child and wait until it watches TrainJobs (its start-up LISTs are done then)
        and, with webhooks on, until the webhook port takes connections.

        kopf opens the webhook port only after start-up and its API discovery, a few milliseconds
        to tens of them after the TrainJob watch. In a cluster, the chart's readiness probe (a TCP
        connect to that port) keeps calls away from the pod until then; this wait is that probe.
        """
        mark = self.server.audit_mark()
        log = self.log_path.open("ab")
        log.write(f"--- start {self.starts + 1} ---\n".encode())
        log.flush()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        self.proc = _spawn(
            operator_command(
                "run", "--config", str(self.config), *(a for ns in self.namespaces for a in ("-n", ns))
            ),
            env={**env, "KUBECONFIG": str(self.kubeconfig)},
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        log.close()
        self.starts += 1
        deadline = time.monotonic() + timeout
        while not self._watching_since(mark):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the operator did not start:\n{self.log_tail()}")
            time.sleep(0.05)
        while self.webhook_port is not None and not _accepts(self.webhook_port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the operator's webhook port {self.webhook_port} never opened:\n{self.log_tail()}"
                )
            time.sleep(0.01)
        return self

    def _watching_since(self, mark: int) -> bool:
        return any(
            r.user == self.user and r.verb == "watch" and r.resource == "trainjobs"
            for r in self.server.audit_since(mark)
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def leads(self) -> bool | None:
        """What its metrics say of leader election: True while it holds the Lease, False while
        it follows, None when it does not answer (killed, or not started yet)."""
        import re
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return None
        found = re.search(r'^leader_election_master_status\{name="[^"]+"\} (\S+)$', text, re.M)
        return found is not None and float(found.group(1)) == 1.0

    def kill(self) -> None:
        """SIGKILL, as the kubelet does after a pod's grace period (or the OOM killer)."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def proc_status(self, field_name: str) -> int:
        return proc_status(self.pid, field_name)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
