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
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from trainer_sandbox.apiserver import LocalAPIServer

from trainer.controller import rbac_audit

Obj = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeflow-trainer"
RELEASE = "kubeflow-trainer"
NAMESPACE = "kubeflow-system"
TRAINER_API = "trainer.kubeflow.org/v1alpha1"
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# --- rendering ---------------------------------------------------------------------------------


def render_files(
    values: Obj | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE
) -> dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        return chart.render(values=values, name=release, namespace=namespace, is_install=True)


def render(values: Obj | None = None, *, release: str = RELEASE, namespace: str = NAMESPACE) -> list[Obj]:
    """Every object the chart renders (hooks included), in template order."""
    objects: list[Obj] = []
    for name, text in sorted(render_files(values, release=release, namespace=namespace).items()):
        if name.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.load_all(text, Loader=_LOADER) if doc]
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
        out[key] = (
            merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
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
    crds = ROOT / "sandbox" / "trainer_sandbox" / "crds"
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
    return [doc for doc in yaml.load_all(release["manifest"], Loader=_LOADER) if doc]


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
                self.namespace,
                self.deployment["metadata"]["name"],
                443,
                f"https://127.0.0.1:{self.port('webhook')}",
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
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}{action['path']}", timeout=2
                ) as response:
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


# --- the workload the operator's RBAC is derived from --------------------------------------------

SCENARIO_NAMESPACE = "team-a"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
PODGROUP_APIS = {"coscheduling": "scheduling.x-k8s.io/v1alpha1", "volcano": "scheduling.volcano.sh/v1beta1"}


def trainjob(
    name: str, runtime: str, *, kind: str = "ClusterTrainingRuntime", run_seconds: int = 1, **spec: Any
) -> Obj:
    trainer: Obj = {
        "numNodes": spec.pop("numNodes", 2),
        "env": [{"name": "SANDBOX_RUN_SECONDS", "value": str(run_seconds)}],
    }
    if "resourcesPerNode" in spec:
        trainer["resourcesPerNode"] = spec.pop("resourcesPerNode")
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": SCENARIO_NAMESPACE},
        "spec": {"runtimeRef": {"name": runtime, "kind": kind}, "trainer": trainer, **spec},
    }


def gang_runtime(name: str, policy: Obj) -> Obj:
    node = {
        "name": "node",
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "node", "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"}
                        ]
                    }
                }
            },
        },
    }
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainingRuntime",
        "metadata": {"name": name, "namespace": SCENARIO_NAMESPACE},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "podGroupPolicy": policy,
            "template": {"spec": {"replicatedJobs": [node]}},
        },
    }


@dataclass
class ScenarioResult:
    """What the workload saw, and the audit log up to its end (later tests do not change it)."""

    audit: list[Any]
    created: list[Obj]
    refusal: str
    defaulted: Obj
    events: list[Obj]
    final: dict[str, dict[str, Obj]]


def _restored(
    server: LocalAPIServer, api_version: str, kind: str, name: str, path: list[str], want: Any
) -> bool:
    value: Any = server.get(api_version, kind, name, SCENARIO_NAMESPACE)
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    return bool(value == want)


def run_scenario(server: LocalAPIServer, operator_user: str) -> ScenarioResult:
    """Everything the operator does for TrainJobs, so its audit log holds every kind of call it makes.

    Completion (torch), MPI with its Secret and hostfile (deepspeed), both gang schedulers' PodGroups,
    suspend and resume, an exceeded deadline (the JobSet is deleted), children edited behind the
    operator's back (it writes them back), deletion, and the webhooks: a refusal and a defaulting.
    """
    ns = SCENARIO_NAMESPACE
    server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    server.create(gang_runtime("gang-coscheduling", {"coscheduling": {"scheduleTimeoutSeconds": 30}}))
    server.create(gang_runtime("gang-volcano", {"volcano": {}}))

    # A float quantity, as the Kubeflow SDK sends it: the defaulting webhook makes it a quantity string.
    defaulted = server.create(
        trainjob("torch", "torch-distributed", resourcesPerNode={"requests": {"cpu": 0.5}})
    )
    server.create(trainjob("deepspeed", "deepspeed-distributed", run_seconds=-1))
    # Gang-scheduled TrainJobs start suspended: a PodGroup is only rewritten while no pod runs.
    server.create(trainjob("coscheduled", "gang-coscheduling", kind="TrainingRuntime", suspend=True))
    server.create(trainjob("volcano", "gang-volcano", kind="TrainingRuntime", suspend=True))
    server.create(trainjob("suspended", "torch-distributed", suspend=True))
    server.create(
        trainjob("deadline", "torch-distributed", run_seconds=-1, numNodes=1, activeDeadlineSeconds=3)
    )
    refusal = ""
    try:
        server.create(trainjob("refused", "no-such-runtime"))
    except Exception as exc:  # the API server's refusal, with the webhook's words
        refusal = str(exc)

    def exists(api_version: str, kind: str, name: str) -> bool:
        return any(o["metadata"]["name"] == name for o in server.list(api_version, kind, ns))

    wait_for("the hostfile ConfigMap", lambda: exists("v1", "ConfigMap", "deepspeed-mpi-hostfile"))
    for name, api in PODGROUP_APIS.items():
        wait_for(
            f"the {name} PodGroup",
            lambda api=api, name=name: exists(
                api, "PodGroup", "coscheduled" if name == "coscheduling" else "volcano"
            ),
        )
    wait_for("the suspended TrainJob's JobSet", lambda: exists(JOBSET_API, "JobSet", "suspended"))

    # Children edited behind the operator's back are written back.
    hostfile = server.get("v1", "ConfigMap", "deepspeed-mpi-hostfile", ns)
    key = next(iter(hostfile["data"]))
    server.patch("v1", "ConfigMap", "deepspeed-mpi-hostfile", {"data": {key: "edited\n"}}, ns)
    wait_for(
        "the hostfile written back",
        lambda: _restored(
            server, "v1", "ConfigMap", "deepspeed-mpi-hostfile", ["data", key], hostfile["data"][key]
        ),
    )
    for api, name in ((PODGROUP_APIS["coscheduling"], "coscheduled"), (PODGROUP_APIS["volcano"], "volcano")):
        want = server.get(api, "PodGroup", name, ns)["spec"]["minMember"]
        server.patch(api, "PodGroup", name, {"spec": {"minMember": want + 5}}, ns)
        wait_for(
            f"PodGroup {name} written back",
            lambda api=api, name=name, want=want: _restored(
                server, api, "PodGroup", name, ["spec", "minMember"], want
            ),
        )

    # What the operator created, while it all exists (for the ownerReference permissions).
    kinds = [("v1", "ConfigMap"), ("v1", "Secret"), ("v1", "Event"), (JOBSET_API, "JobSet")]
    kinds += [(api, "PodGroup") for api in PODGROUP_APIS.values()]
    # Its creates, and its server-side applies that created (a patch answered 201), each under the
    # field manager it named, else the one its user agent makes.
    managers = {
        urllib.parse.parse_qs(urllib.parse.urlsplit(r.path).query).get(
            "fieldManager", [r.user_agent.split("/")[0]]
        )[0]
        for r in list(server.audit.records)
        if r.user == operator_user and (r.verb == "create" or (r.verb == "patch" and r.status == 201))
    }
    created = [
        o
        for api, kind in kinds
        for o in server.list(api, kind, ns)
        if any(f.get("manager") in managers for f in o["metadata"].get("managedFields") or [])
    ]

    for name in ("suspended", "coscheduled", "volcano"):
        server.patch(TRAINER_API, "TrainJob", name, {"spec": {"suspend": False}}, ns)
    for name in ("torch", "suspended", "coscheduled", "volcano"):
        wait_for(f"TrainJob {name} complete", lambda name=name: condition_true(server, name, ns, "Complete"))
    wait_for("TrainJob deadline failed", lambda: condition_true(server, "deadline", ns, "Failed"))
    wait_for("the deadline's JobSet deleted", lambda: not exists(JOBSET_API, "JobSet", "deadline"))
    server.delete(TRAINER_API, "TrainJob", "deepspeed", ns)
    wait_for("children collected", lambda: not exists(JOBSET_API, "JobSet", "deepspeed"))
    time.sleep(1)  # let the operator see the deletions, as it would in a cluster

    events = server.list("v1", "Event", ns)
    final = {
        o["metadata"]["name"]: conditions(server, o["metadata"]["name"], ns)
        for o in server.list(TRAINER_API, "TrainJob", ns)
    }
    return ScenarioResult(list(server.audit.records), created, refusal, defaulted, events, final)


# --- one installed release with its operator running ---------------------------------------------

OWNER_KINDS = {(TRAINER_API, "TrainJob"): rbac_audit.OwnerKind("trainer.kubeflow.org", "trainjobs")}


@dataclass
class Installed:
    server: LocalAPIServer
    helm: helm.Config
    release: Obj
    objects: list[Obj]
    operator: OperatorProcess
    values: Obj

    @property
    def deployment(self) -> Obj:
        return one(self.objects, "Deployment")

    @property
    def operator_user(self) -> str:
        return service_account_user(self.deployment)


@contextlib.contextmanager
def installed(
    directory: Path, values: Obj | None = None, *, start_operator: bool = True, jobset: bool = True
) -> Iterator[Installed]:
    """A local API server with JobSet's CRD, the chart installed by Helm, and the operator running as
    its Deployment says (on free ports)."""
    values = merge(port_values(), values or {})
    server = LocalAPIServer().start()
    try:
        install_prerequisites(server, jobset=jobset)
        with helm_config(server, directory) as cfg:
            release = cfg.install(str(CHART), RELEASE, values, create_namespace=True, timeout=60)
            objects = manifest_objects(release)
            operator = OperatorProcess(server, one(objects, "Deployment"), directory)
            try:
                if start_operator:
                    operator.start().wait_ready()
                yield Installed(server, cfg, release, objects, operator, values)
            finally:
                operator.stop()
    finally:
        server.stop()


def operator_permissions(result: ScenarioResult, user: str) -> set[rbac_audit.Permission]:
    """The permissions the operator used: its calls, and what its ownerReferences ask of admission."""
    return rbac_audit.permissions_from_audit(result.audit, user) | rbac_audit.owner_finalizer_permissions(
        result.created, OWNER_KINDS
    )
