"""Helpers of the chart tests: render the chart with Helm 4 (helm-python-sdk, in process and offline),
validate what it renders, install it into the local API server, and run the operator exactly as the
rendered Deployment would: its command, arguments and environment, its ServiceAccount's identity, and
its mounted ConfigMap and Secret (written to a temporary directory that stands in for the volumes).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from trainer.testing.apiserver import LocalAPIServer

Obj = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeflow-trainer"
RELEASE = "kubeflow-trainer"
NAMESPACE = "kubeflow-system"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"


def reference_dir() -> Path | None:
    """``shared/reference`` beside the repository (CI clones it there), else the workplace's copy."""
    for candidate in (ROOT.parent / "shared" / "reference", Path("/work/shared/reference")):
        if candidate.is_dir():
            return candidate
    return None


# --- rendering ---------------------------------------------------------------------------------


def render_files(values: Obj | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        return chart.render(values=values, name=release, namespace=namespace, is_install=True)


def render(values: Obj | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE) -> list[Obj]:
    """Every object the chart renders (hooks included), in template order."""
    objects: list[Obj] = []
    for name, text in sorted(render_files(values, release=release, namespace=namespace).items()):
        if name.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def find(objects: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def hook_phase(obj: Obj) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get("helm.sh/hook")


def installed_runtimes(objects: list[Obj]) -> list[str]:
    """Names of the ClusterTrainingRuntimes an install applies (the post-install hooks)."""
    return sorted(
        o["metadata"]["name"]
        for o in find(objects, "ClusterTrainingRuntime")
        if "post-install" in (hook_phase(o) or "").split(",")
    )


def merge(base: Obj, override: Obj) -> Obj:
    out = copy.deepcopy(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_values() -> Obj:
    """Values that move the operator's three ports to free ones, so tests never collide on a machine."""
    return {
        "manager": {
            "config": {
                "webhook": {"port": free_port()},
                "metrics": {"bindAddress": f":{free_port()}"},
                "health": {"healthProbeBindAddress": f":{free_port()}"},
            }
        }
    }


# --- installing --------------------------------------------------------------------------------


def install_prerequisites(server: LocalAPIServer, *, jobset: bool = True) -> None:
    """What a cluster has before the chart: JobSet's CRD and the two PodGroup CRDs (gang schedulers)."""
    crds = ROOT / "trainer" / "testing" / "crds"
    for path in sorted(crds.glob("*.json")):
        if not jobset and path.name.startswith("jobset"):
            continue
        server.create(json.loads(path.read_text()))


@contextlib.contextmanager
def helm_config(server: LocalAPIServer, directory: Path) -> Iterator[helm.Config]:
    kubeconfig = server.write_kubeconfig(directory / "admin.kubeconfig")
    with helm.Config(kubeconfig_path=str(kubeconfig), namespace=NAMESPACE, storage_driver="memory") as cfg:
        yield cfg


def manifest_objects(release: Obj) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(release["manifest"]) if doc]


# --- the operator as its Deployment runs it ----------------------------------------------------


def service_account_user(deployment: Obj) -> str:
    spec = deployment["spec"]["template"]["spec"]
    return f"system:serviceaccount:{deployment['metadata']['namespace']}:{spec['serviceAccountName']}"


@dataclass
class OperatorProcess:
    """``trainer run`` started from a Deployment as the kubelet would start its container."""

    server: LocalAPIServer
    deployment: Obj
    workdir: Path
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.log_path = self.workdir / "operator.log"

    @property
    def pod_spec(self) -> Obj:
        spec: Obj = self.deployment["spec"]["template"]["spec"]
        return spec

    @property
    def container(self) -> Obj:
        containers = self.pod_spec["containers"]
        assert len(containers) == 1, "the operator's pod has one container"
        container: Obj = containers[0]
        return container

    @property
    def namespace(self) -> str:
        return str(self.deployment["metadata"]["namespace"])

    def port(self, name: str) -> int:
        return int(next(p["containerPort"] for p in self.container["ports"] if p["name"] == name))

    def _materialize_volumes(self) -> None:
        """Write each mounted ConfigMap and Secret (read from the API server) where the mount points."""
        volumes = {v["name"]: v for v in self.pod_spec["volumes"]}
        for mount in self.container["volumeMounts"]:
            volume = volumes[mount["name"]]
            local = self.workdir / "mounts" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            self.mounts[mount["mountPath"]] = local
            if "configMap" in volume:
                data = self.server.get("v1", "ConfigMap", volume["configMap"]["name"], self.namespace)["data"]
                for key, value in data.items():
                    (local / key).write_text(value)
            elif "secret" in volume:
                import base64

                secret = self.server.get("v1", "Secret", volume["secret"]["secretName"], self.namespace)
                for key, value in secret["data"].items():
                    (local / key).write_bytes(base64.b64decode(value))
            elif "emptyDir" not in volume:
                raise AssertionError(f"volume {mount['name']} of a kind the harness does not stand in for")
        # A path inside a mount, in an argument or a mounted file, now points at its stand-in.
        for local in self.mounts.values():
            for path in local.iterdir():
                if path.suffix in (".yaml", ".yml", ".json"):
                    path.write_text(self.translate(path.read_text()))

    def translate(self, text: str) -> str:
        """Container paths under a mount, in one pass (a stand-in path is never translated again)."""
        if not self.mounts:
            return text
        paths = "|".join(re.escape(p) for p in sorted(self.mounts, key=len, reverse=True))
        pattern = re.compile(rf"(?<![\w/.-])({paths})(?=/|$|[\s\"'])")
        return pattern.sub(lambda m: str(self.mounts[m.group(1)]), text)

    def start(self, *, register_webhooks: bool = True) -> OperatorProcess:
        self._materialize_volumes()
        user = service_account_user(self.deployment)
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{self.namespace}"]
        self.server.add_user(user, groups)
        kubeconfig = self.server.write_kubeconfig(self.workdir / "serviceaccount.kubeconfig", user=user)
        command = [self._resolve(self.container["command"][0]), *self.container["command"][1:]]
        self.argv = command + [self.translate(a) for a in self.container.get("args") or []]
        env = {"PATH": os.environ.get("PATH", ""), "KUBECONFIG": str(kubeconfig), "HOME": str(self.workdir)}
        for item in self.container.get("env") or []:
            assert "value" in item, f"env {item['name']}: only literal values are stood in for"
            env[item["name"]] = self.translate(item["value"])
        if "/tmp" in self.mounts:
            env["TMPDIR"] = str(self.mounts["/tmp"])
        self.env = env
        if register_webhooks:
            self.server.register_webhook_service(
                self.namespace, self.deployment["metadata"]["name"], 443, f"https://127.0.0.1:{self.port('webhook')}"
            )
        self.process = subprocess.Popen(
            self.argv, env=env, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=self.log_path.open("wb")
        )
        return self

    @staticmethod
    def _resolve(program: str) -> str:
        local = Path(sys.executable).parent / program
        return str(local) if local.exists() else program

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the readiness probe and the liveness probe both pass, as the kubelet would see them."""
        probes = [self.container["readinessProbe"], self.container["livenessProbe"]]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"the operator exited with {self.process.returncode}:\n{self.logs()}")
            if all(self.probe(p) for p in probes):
                return
            time.sleep(0.2)
        raise AssertionError(f"the operator was not ready within {timeout}s:\n{self.logs()}")

    def probe(self, probe: Obj) -> bool:
        action = probe.get("httpGet") or probe.get("tcpSocket")
        assert action is not None, f"probe {probe} of a kind the harness does not run"
        port = self.port(action["port"]) if isinstance(action["port"], str) else int(action["port"])
        try:
            if "httpGet" in probe:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{action['path']}", timeout=2) as response:
                    return bool(200 <= response.status < 400)
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return True
        except OSError:
            return False

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


# --- waiting -----------------------------------------------------------------------------------


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def conditions(server: LocalAPIServer, name: str, namespace: str) -> dict[str, Obj]:
    trainjob = server.get(TRAINER_API, "TrainJob", name, namespace)
    return {c["type"]: c for c in (trainjob.get("status") or {}).get("conditions") or []}


def condition_true(server: LocalAPIServer, name: str, namespace: str, type_: str) -> Obj | None:
    found = conditions(server, name, namespace).get(type_)
    return found if found is not None and found.get("status") == "True" else None
