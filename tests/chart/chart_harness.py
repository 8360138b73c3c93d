"""Helpers of the chart tests: render the chart with Helm 4 (helm-python-sdk, in process and offline),
validate what it renders, install it into a control plane, and run the operator exactly as the
rendered Deployment would: its command, arguments and environment, its ServiceAccount's identity, and
its mounted ConfigMap and Secret (written to a temporary directory that stands in for the volumes).

The control plane is either backend (``trainer_sandbox.backends.Cluster``):

- the stand-in, a fresh server per install: the webhooks' Service is mapped to the operator's
  loopback port (``register_webhook_service``), and the chart's certificate is served as it is;
- the real one built from ``cluster/`` (kube-apiserver with the RBAC authorizer): the operator runs
  as the chart's ServiceAccount with a token from the TokenRequest API, so every call it makes is
  authorized by the chart's ClusterRole and Roles. No pod runs it, so the Service leads nowhere: the
  harness points each webhook of the chart's configurations at the operator's loopback port by
  ``clientConfig.url`` (a JSON patch of that field: everything else, ``failurePolicy`` included,
  stays as Helm wrote it), and makes 127.0.0.1, the pod's address here, one its certificate names.
  An operator that keeps its own certificate (the chart's default) is given it as its
  ``webhook.advertiseHost`` and writes the caBundle itself; a mounted certificate (cert-manager's,
  the user's Secret) is re-issued in its Secret for that address, and the caBundle set to its CA.
  Helm installs with ``--wait`` (its hooks need the CRDs served); with no Deployment controller on
  this plane, the harness writes the Deployment's status once the operator is ready.
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
from trainer_sandbox import rbac_audit
from trainer_sandbox.apiserver import LocalAPIServer
from trainer_sandbox.apiserver.errors import APIError
from trainer_sandbox.backends import Cluster, RealCluster
from trainer_sandbox.ports import free_port
from trainer_sandbox.sandbox import local_apiserver

Obj = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kubeflow-trainer"
RELEASE = "kubeflow-trainer"
NAMESPACE = "kubeflow-system"
OPERATOR_ACCOUNT = "kubeflow-trainer-controller-manager"  # the release's ServiceAccount
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


def port_values() -> Obj:
    """Values that move the operator's three ports to free ones, so tests never collide on a machine,
    and run one replica (the chart's default is two): the harness runs the Deployment's one pod itself,
    and the stand-in serves no PodDisruptionBudget."""
    return {
        "manager": {
            "replicas": 1,
            "config": {
                "webhook": {"port": free_port()},
                "metrics": {"bindAddress": f":{free_port()}"},
                "health": {"healthProbeBindAddress": f":{free_port()}"},
            },
        }
    }


# --- installing --------------------------------------------------------------------------------


TRAINER_GROUP = "trainer.kubeflow.org"
CRD_API = "apiextensions.k8s.io/v1"
WEBHOOK_API = "admissionregistration.k8s.io/v1"
WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


def install_prerequisites(server: Cluster, *, jobset: bool = True) -> None:
    """What a cluster has before the chart: JobSet's CRD and the two PodGroup CRDs (gang schedulers).

    The real control plane has them (and JobSet's controller) from its start, and also the trainer
    CRDs, the default runtimes and the public ConfigMap its other tests use: those are the chart's to
    install, so they are removed first (Helm adopts nothing it did not make) and put back by
    :func:`restore_real_plane` after the release is gone.
    """
    if isinstance(server, RealCluster):
        assert jobset, "the real control plane's JobSet CRD stays: its controller runs"
        _remove_preinstalled(server)
        return
    crds = ROOT / "sandbox" / "trainer_sandbox" / "crds"
    for path in sorted(crds.glob("*.json")):
        if not jobset and path.name.startswith("jobset"):
            continue
        server.create(json.loads(path.read_text()))


def _trainer_crds(server: Cluster) -> list[Obj]:
    return [
        c for c in server.list(CRD_API, "CustomResourceDefinition") if c["spec"]["group"] == TRAINER_GROUP
    ]


def _remove_preinstalled(server: RealCluster) -> None:
    from trainer_sandbox.sandbox import PUBLIC_CONFIGMAP, SYSTEM_NAMESPACE

    with contextlib.suppress(APIError):
        server.delete("v1", "ConfigMap", PUBLIC_CONFIGMAP, SYSTEM_NAMESPACE)
    # Other tests run the operator as the chart's ServiceAccount (a TokenRequest needs the account,
    # so the cluster view makes it): not Helm's, so Helm would refuse to adopt it.
    with contextlib.suppress(APIError):
        account = server.get("v1", "ServiceAccount", OPERATOR_ACCOUNT, NAMESPACE)
        if (account["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") != "Helm":
            server.delete("v1", "ServiceAccount", OPERATOR_ACCOUNT, NAMESPACE)
    for crd in _trainer_crds(server):
        server.delete(CRD_API, "CustomResourceDefinition", crd["metadata"]["name"], "")
    wait_for("the trainer CRDs gone", lambda: not _trainer_crds(server), timeout=120)


def restore_real_plane(server: RealCluster) -> None:
    """What the real control plane's other tests expect: the trainer CRDs (kept by the uninstall),
    the default runtimes and the public ConfigMap, as ``trainer_sandbox.cluster`` installs them."""
    from trainer_sandbox.cluster import install

    for crd in install.trainer_and_podgroup_crds():
        if crd["spec"]["group"] == TRAINER_GROUP:
            server.install(crd)
    wait_for(
        "the trainer CRDs established",
        lambda: (
            len(
                [
                    c
                    for c in _trainer_crds(server)
                    if any(
                        k["type"] == "Established" and k["status"] == "True"
                        for k in (c.get("status") or {}).get("conditions") or []
                    )
                ]
            )
            == 4
        ),
        timeout=60,
    )
    for obj in [*install.runtimes(), *install.public_configmap()]:

        def created(obj: Obj = obj) -> bool:
            try:
                server.install(copy.deepcopy(obj))
            except APIError as exc:
                if exc.code == 404:  # a kind not served yet
                    return False
                raise
            return True

        wait_for(f"{obj['kind']} {obj['metadata']['name']} restored", created, timeout=60)


@contextlib.contextmanager
def helm_config(server: Cluster, directory: Path) -> Iterator[helm.Config]:
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

    server: Cluster
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

    @property
    def mounts_certificate(self) -> bool:
        """Whether the pod mounts its serving certificate (else the operator keeps its own)."""
        return any(m["name"] == "webhook-cert" for m in self.container["volumeMounts"])

    def start(self, *, register_webhooks: bool = True) -> OperatorProcess:
        real = register_webhooks and isinstance(self.server, RealCluster)
        ca_bundle: str | None = None
        if real and self.mounts_certificate:
            ca_bundle = reissue_for_loopback(self.server, self.deployment)
        self._materialize_volumes()
        if real and not self.mounts_certificate:
            self._advertise_loopback()
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
        if register_webhooks and isinstance(self.server, LocalAPIServer):
            self.server.register_webhook_service(
                self.namespace,
                self.deployment["metadata"]["name"],
                443,
                f"https://127.0.0.1:{self.port('webhook')}",
            )
        elif register_webhooks:
            point_webhooks_at(self.server, self.port("webhook"), ca_bundle)
        self.process = subprocess.Popen(
            self.argv, env=env, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=self.log_path.open("wb")
        )
        return self

    def _advertise_loopback(self) -> None:
        """The operator that keeps its own certificate makes it for the Service's names and its
        ``webhook.advertiseHost``: here the pod's address is 127.0.0.1, so that goes in the mounted
        configuration (the API server then trusts the CA the operator writes into the caBundle)."""
        for path in self.mounts[self._mount_of("config")].iterdir():
            if path.suffix not in (".yaml", ".yml"):
                continue
            config = yaml.safe_load(path.read_text())
            if isinstance(config, dict) and isinstance(config.get("webhook"), dict):
                config["webhook"]["advertiseHost"] = LOOPBACK
                path.write_text(yaml.safe_dump(config, sort_keys=False))

    def _mount_of(self, volume: str) -> str:
        return str(next(m["mountPath"] for m in self.container["volumeMounts"] if m["name"] == volume))

    def wait_webhooks_trusted(self, timeout: float = 60) -> None:
        """Until every webhook of the release has a caBundle and a URL (the operator that keeps its
        own certificate writes the caBundle once it leads)."""
        if not isinstance(self.server, RealCluster):
            return

        def trusted() -> bool:
            return all(
                h["clientConfig"].get("caBundle") and h["clientConfig"].get("url")
                for _, c in _webhook_configurations(self.server)
                for h in c["webhooks"]
            )

        wait_for("the webhooks' caBundle", trusted, timeout=timeout)

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


# --- the webhooks on the real control plane: the Service's address is the operator's loopback port ---

LOOPBACK = "127.0.0.1"


def webhook_secret_name(deployment: Obj, server: Cluster | None = None) -> str:
    """The Secret the operator's webhook server serves: the volume mounted where its certDir is, or,
    when the operator keeps its own certificate (nothing mounted), the Secret its configuration names."""
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    names = [v["secret"]["secretName"] for v in volumes if "secret" in v and v["name"] == "webhook-cert"]
    if not names and server is not None:
        config_map = next(v["configMap"]["name"] for v in volumes if v["name"] == "config")
        data = server.get("v1", "ConfigMap", config_map, deployment["metadata"]["namespace"])["data"]
        settings = yaml.safe_load(data["config.yaml"]).get("certManagement") or {}
        names = [settings["webhookSecretName"]] if settings.get("enable") else []
    assert len(names) == 1, f"one webhook certificate volume expected, found {names}"
    return str(names[0])


def reissue_for_loopback(server: Cluster, deployment: Obj) -> str:
    """Re-issue the webhook certificate in its Secret for the loopback address the operator has here
    (the Service's names kept), from a CA of its own; return that CA, base64, for the caBundle.

    Helm keeps the Secret's data on upgrade (``lookup``), so the caBundle Helm renders then is this
    CA too: only the clientConfig's service has to be turned into a URL again.
    """
    import base64
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    namespace = str(deployment["metadata"]["namespace"])
    service = str(deployment["metadata"]["name"])  # the Service is named as the Deployment
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chart-tests-loopback-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    dns = [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans.append(x509.IPAddress(ipaddress.ip_address(LOOPBACK)))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[2])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    pem = serialization.Encoding.PEM
    data = {
        "ca.crt": b64(ca_cert.public_bytes(pem)),
        "tls.crt": b64(cert.public_bytes(pem)),
        # The CA's key too: the operator keeps a certificate it can renew (controller/certificate_secret.py).
        "ca.key": b64(
            ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        ),
        "tls.key": b64(
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        ),
    }
    server.patch("v1", "Secret", webhook_secret_name(deployment, server), {"data": data}, namespace)
    return data["ca.crt"]


def _webhook_configurations(server: Cluster) -> list[tuple[str, Obj]]:
    return [
        (kind, obj)
        for kind in WEBHOOK_KINDS
        for obj in server.list(WEBHOOK_API, kind)
        if (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/instance") == RELEASE
    ]


def point_webhooks_at(server: Cluster, port: int, ca_bundle: str | None = None) -> None:
    """Each webhook of the release's configurations called at ``https://127.0.0.1:<port>/<path>``
    (the path the chart gave its service), and trusting ``ca_bundle`` when one is given.

    A JSON patch of those fields alone, each tested against the webhook's name: the caBundle an
    operator that keeps its own certificate writes, and everything Helm wrote (``failurePolicy``,
    rules, selectors), stay as they are.
    """
    assert isinstance(server, RealCluster)
    found = _webhook_configurations(server)
    assert found, "the release has no webhook configurations"
    for kind, live in found:
        ops: list[Obj] = []
        for i, hook in enumerate(live["webhooks"]):
            config = hook["clientConfig"]
            path = (config.get("service") or {}).get("path") or urllib.parse.urlsplit(config["url"]).path
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook["name"]})
            if "service" in config:
                ops.append({"op": "remove", "path": f"/webhooks/{i}/clientConfig/service"})
            url = f"https://{LOOPBACK}:{port}{path}"
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/url", "value": url})
            if ca_bundle is not None:
                ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca_bundle})
        server.json_patch(WEBHOOK_API, kind, live["metadata"]["name"], ops)


def restore_webhook_services(server: Cluster, objects: list[Obj]) -> None:
    """Undo :func:`point_webhooks_at`: the service (and caBundle, if any) the chart rendered in
    ``objects`` back in place of the URL, so that Helm's next apply finds what it wrote."""
    assert isinstance(server, RealCluster)
    for kind, live in _webhook_configurations(server):
        rendered = {h["name"]: h for h in one(objects, kind, live["metadata"]["name"])["webhooks"]}
        ops: list[Obj] = []
        for i, hook in enumerate(live["webhooks"]):
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook["name"]})
            if "url" in hook["clientConfig"]:
                ops.append({"op": "remove", "path": f"/webhooks/{i}/clientConfig/url"})
            config = rendered[hook["name"]]["clientConfig"]
            ops.append(
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/service", "value": config["service"]}
            )
            if "caBundle" in config:  # the chart's own (else the operator's, which stays)
                ops.append(
                    {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": config["caBundle"]}
                )
        server.json_patch(WEBHOOK_API, kind, live["metadata"]["name"], ops)


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


def conditions(server: Cluster, name: str, namespace: str) -> dict[str, Obj]:
    trainjob = server.get(TRAINER_API, "TrainJob", name, namespace)
    return {c["type"]: c for c in (trainjob.get("status") or {}).get("conditions") or []}


def condition_true(server: Cluster, name: str, namespace: str, type_: str) -> Obj | None:
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
    runtimes: dict[str, str]  # each installed ClusterTrainingRuntime: the TrainJob that ran it
    legacy_finalizers: dict[str, list[str]]  # runtimes upstream's v2.0-v2.2 left: their finalizers after
    mpi_gang: dict[str, Obj]  # the MPI TrainJob with coscheduling: its Secret, hostfile and PodGroup


def bundled_runtime_job(runtime: str) -> str:
    return "rt-" + re.sub(r"[^a-z0-9-]", "-", runtime)


def _restored(server: Cluster, api_version: str, kind: str, name: str, path: list[str], want: Any) -> bool:
    value: Any = server.get(api_version, kind, name, SCENARIO_NAMESPACE)
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    return bool(value == want)


LEGACY_FINALIZER = "trainer.kubeflow.org/resource-in-use"


def carried_over_runtimes(server: Cluster) -> dict[str, list[str]]:
    """Runtimes as upstream's v2.0 to v2.2 left them, with their finalizer (and, on one, a finalizer
    of someone else's); the finalizers each has once the operator has seen it, and then both are
    deleted, as they can be now."""
    torch = server.get(TRAINER_API, "ClusterTrainingRuntime", "torch-distributed", "")
    made = [
        {
            "apiVersion": TRAINER_API,
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "legacy-cluster", "finalizers": [LEGACY_FINALIZER]},
            "spec": copy.deepcopy(torch["spec"]),
        },
        {
            "apiVersion": TRAINER_API,
            "kind": "TrainingRuntime",
            "metadata": {
                "name": "legacy",
                "namespace": SCENARIO_NAMESPACE,
                "finalizers": ["example.com/keep", LEGACY_FINALIZER],
            },
            "spec": copy.deepcopy(torch["spec"]),
        },
    ]
    after: dict[str, list[str]] = {}
    for obj in made:
        server.create(obj)
    for obj in made:
        kind, name = obj["kind"], obj["metadata"]["name"]
        namespace = obj["metadata"].get("namespace", "")

        def removed(
            kind: str = kind, name: str = name, namespace: str = namespace
        ) -> tuple[list[str]] | None:
            finalizers = server.get(TRAINER_API, kind, name, namespace)["metadata"].get("finalizers") or []
            return None if LEGACY_FINALIZER in finalizers else (finalizers,)

        (after[name],) = wait_for(f"{kind} {name} without upstream's finalizer", removed, timeout=60)
    server.patch(
        TRAINER_API, "TrainingRuntime", "legacy", {"metadata": {"finalizers": None}}, SCENARIO_NAMESPACE
    )
    for obj in made:
        server.delete(TRAINER_API, obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
    return after


def run_scenario(server: Cluster, operator_user: str, mark: int = 0) -> ScenarioResult:
    """Everything the operator does for TrainJobs, so its audit log holds every kind of call it makes.

    Completion (torch, and a TrainJob of every installed runtime), MPI with its Secret and hostfile
    (deepspeed, and an MPI runtime with coscheduling), both gang schedulers' PodGroups, suspend and
    resume, an exceeded deadline (the JobSet is deleted), children edited behind the operator's back
    (it writes them back), deletion, and the webhooks: a refusal and a defaulting. ``mark``: where
    in the audit log the release's life began.
    """
    ns = SCENARIO_NAMESPACE
    if not any(n["metadata"]["name"] == ns for n in server.list("v1", "Namespace")):
        server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    server.create(gang_runtime("gang-coscheduling", {"coscheduling": {"scheduleTimeoutSeconds": 30}}))
    server.create(gang_runtime("gang-volcano", {"volcano": {}}))
    # MPI (its SSH Secret and hostfile) under coscheduling (a PodGroup): deepspeed's runtime, ganged.
    deepspeed = server.get(TRAINER_API, "ClusterTrainingRuntime", "deepspeed-distributed", "")
    mpi_spec = copy.deepcopy(deepspeed["spec"])
    mpi_spec["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 60}}
    server.create(
        {
            "apiVersion": TRAINER_API,
            "kind": "TrainingRuntime",
            "metadata": {"name": "mpi-gang", "namespace": ns},
            "spec": mpi_spec,
        }
    )
    server.create(trainjob("mpi-gang", "mpi-gang", kind="TrainingRuntime"))
    runtimes = {
        o["metadata"]["name"]: bundled_runtime_job(o["metadata"]["name"])
        for o in server.list(TRAINER_API, "ClusterTrainingRuntime")
    }
    for runtime, job in runtimes.items():
        server.create(trainjob(job, runtime))
    legacy = carried_over_runtimes(server)

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
    # Gone a second after it completes (docs/decisions.md §ttl): the operator deletes the TrainJob.
    server.create(trainjob("short-lived", "torch-distributed", numNodes=1, ttlSecondsAfterFinished=1))
    # A search (docs/optimization.md): the operator creates its trial, a TrainJob it owns with
    # blockOwnerDeletion, and writes the search's status.
    template = trainjob("unused", "torch-distributed", numNodes=1)
    server.create(
        {
            "apiVersion": TRAINER_API,
            "kind": "OptimizationJob",
            "metadata": {"name": "search", "namespace": ns},
            "spec": {
                "objectives": [{"metric": "loss"}],
                "parameters": [{"name": "lr", "searchSpace": {"uniform": {"min": "0.1", "max": "0.2"}}}],
                "trainJobTemplate": {"spec": template["spec"]},
            },
        }
    )
    refusal = ""
    try:
        server.create(trainjob("refused", "no-such-runtime"))
    except Exception as exc:  # the API server's refusal, with the webhook's words
        refusal = str(exc)

    def exists(api_version: str, kind: str, name: str) -> bool:
        return any(o["metadata"]["name"] == name for o in server.list(api_version, kind, ns))

    wait_for("the hostfile ConfigMap", lambda: exists("v1", "ConfigMap", "deepspeed-mpi-hostfile"))
    mpi_gang = {
        "Secret": wait_for(
            "mpi-gang's SSH Secret", lambda: _get(server, "v1", "Secret", "mpi-gang-mpi-ssh-auth")
        ),
        "ConfigMap": wait_for(
            "mpi-gang's hostfile", lambda: _get(server, "v1", "ConfigMap", "mpi-gang-mpi-hostfile")
        ),
        "PodGroup": wait_for(
            "mpi-gang's PodGroup", lambda: _get(server, PODGROUP_APIS["coscheduling"], "PodGroup", "mpi-gang")
        ),
    }
    for name, api in PODGROUP_APIS.items():
        wait_for(
            f"the {name} PodGroup",
            lambda api=api, name=name: exists(
                api, "PodGroup", "coscheduled" if name == "coscheduling" else "volcano"
            ),
        )
    wait_for("the suspended TrainJob's JobSet", lambda: exists(JOBSET_API, "JobSet", "suspended"))
    wait_for("the TrainJob Suspended", lambda: condition_true(server, "suspended", ns, "Suspended"))

    # A Secret planted under a child's name is neither mounted nor adopted (docs/decisions.md §11):
    # the TrainJob waits, naming it, and goes on once it is gone. The create meets the name (409)
    # and the operator reads that Secret's metadata by name: the `get` on Secrets it is granted,
    # never `list`.
    planted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "planted-mpi-ssh-auth", "namespace": ns},
    }
    server.create({**planted, "type": "Opaque", "data": {"key": "bm90IG91cnM="}})
    server.create(trainjob("planted", "deepspeed-distributed"))

    def refused_naming_it() -> bool:
        failed = condition_true(server, "planted", ns, "ReconcileFailed") or {}
        return "planted-mpi-ssh-auth" in str(failed.get("message", ""))

    wait_for("the planted Secret refused", refused_naming_it)
    server.delete("v1", "Secret", "planted-mpi-ssh-auth", ns)
    wait_for(
        "planted's JobSet once the name is free", lambda: exists(JOBSET_API, "JobSet", "planted"), timeout=90
    )

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

    wait_for(
        "the search's trial counted",
        lambda: (
            (
                (server.get(TRAINER_API, "OptimizationJob", "search", ns).get("status") or {}).get("trials")
                or {}
            ).get("created")
            == 1
        ),
    )

    # What the operator created, while it all exists (for the ownerReference permissions).
    kinds = [("v1", "ConfigMap"), ("v1", "Secret"), ("v1", "Event"), (JOBSET_API, "JobSet")]
    kinds.append((TRAINER_API, "TrainJob"))  # a search's trials
    kinds += [(api, "PodGroup") for api in PODGROUP_APIS.values()]
    # Its creates, and its server-side applies that created (a patch answered 201), each under the
    # field manager it named, else the one its user agent makes.
    managers = {
        urllib.parse.parse_qs(urllib.parse.urlsplit(r.path).query).get(
            "fieldManager", [r.user_agent.split("/")[0]]
        )[0]
        for r in server.audit_since(mark)
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
    for name in ("torch", "suspended", "coscheduled", "volcano", "mpi-gang", *runtimes.values()):
        wait_for(
            f"TrainJob {name} complete",
            lambda name=name: condition_true(server, name, ns, "Complete"),
            timeout=120,
        )
    wait_for(
        "TrainJob short-lived deleted after its TTL",
        lambda: not exists(TRAINER_API, "TrainJob", "short-lived"),
        timeout=120,
    )
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
    return ScenarioResult(
        server.audit_since(mark), created, refusal, defaulted, events, final, runtimes, legacy, mpi_gang
    )


def _get(server: Cluster, api_version: str, kind: str, name: str) -> Obj | None:
    try:
        return server.get(api_version, kind, name, SCENARIO_NAMESPACE)
    except APIError as exc:
        if exc.code == 404:
            return None
        raise


# --- one installed release with its operator running ---------------------------------------------

OWNER_KINDS = {
    (TRAINER_API, "TrainJob"): rbac_audit.OwnerKind("trainer.kubeflow.org", "trainjobs"),
    (TRAINER_API, "OptimizationJob"): rbac_audit.OwnerKind("trainer.kubeflow.org", "optimizationjobs"),
}


@dataclass
class Installed:
    server: Cluster
    helm: helm.Config
    release: Obj
    objects: list[Obj]
    operator: OperatorProcess
    values: Obj
    mark: int  # the audit log's position before the install: the release's calls come after it

    @property
    def deployment(self) -> Obj:
        return one(self.objects, "Deployment")

    @property
    def operator_user(self) -> str:
        return service_account_user(self.deployment)

    def upgrade(self, values: Obj) -> Obj:
        """``helm upgrade`` to ``values``; on the real control plane the webhooks are given back their
        Service for Helm, and pointed at the running operator again after it."""
        real = isinstance(self.server, RealCluster)
        if real:
            restore_webhook_services(self.server, self.objects)
        release = self.helm.upgrade(str(CHART), RELEASE, values, timeout=60)
        self.release, self.objects, self.values = release, manifest_objects(release), values
        if real:
            ca_bundle = None  # the operator that keeps its own certificate writes it again itself
            if self.operator.mounts_certificate:
                name = webhook_secret_name(self.deployment, self.server)
                ca_bundle = self.server.get("v1", "Secret", name, NAMESPACE)["data"]["ca.crt"]
            point_webhooks_at(self.server, self.operator.port("webhook"), ca_bundle)
            self.operator.wait_webhooks_trusted()
        return release


def install_and_wait(
    cfg: helm.Config, cluster: RealCluster, values: Obj, directory: Path, timeout: float = 180
) -> tuple[Obj, OperatorProcess]:
    """``helm install --wait``, as the install guide has it, with the operator started the moment
    Helm has created its Deployment, while Helm waits.

    On a real server Helm must wait: the runtimes are hooks, and a hook of a kind whose CRD the same
    install created fails when Helm applies it before the API server serves that CRD. It waits for
    the CRDs to be established and the Deployment to be available. This control plane runs no
    Deployment controller, so the harness, which runs the Deployment's one pod itself, also writes
    its status: available once that pod passes its probes and its webhooks are trusted.
    """
    import threading

    outcome: dict[str, Any] = {}

    def install() -> None:
        try:
            outcome["release"] = cfg.install(
                str(CHART), RELEASE, values, create_namespace=True, timeout=int(timeout), wait="watcher"
            )
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    deployment = one(render(values), "Deployment")
    name = deployment["metadata"]["name"]
    thread = threading.Thread(target=install, name="helm-install", daemon=True)
    thread.start()
    operator = OperatorProcess(cluster, deployment, directory)
    try:

        def created() -> bool:
            if "error" in outcome:
                raise outcome["error"]
            deployments = [d["metadata"]["name"] for d in cluster.list("apps/v1", "Deployment", NAMESPACE)]
            return name in deployments and len(_webhook_configurations(cluster)) == len(WEBHOOK_KINDS)

        wait_for("Helm to create the Deployment and the webhooks", created, timeout=timeout)
        operator.start().wait_ready()
        operator.wait_webhooks_trusted()
        live = cluster.get("apps/v1", "Deployment", name, NAMESPACE)
        replicas = int(live["spec"].get("replicas", 1))
        assert replicas == 1, "the harness runs one pod"
        counts = {k: replicas for k in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")}
        available = [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
        ]
        status = {"observedGeneration": live["metadata"]["generation"], **counts, "conditions": available}
        cluster.patch("apps/v1", "Deployment", name, {"status": status}, NAMESPACE, subresource="status")
        thread.join(timeout + 30)
        if "error" in outcome:
            raise outcome["error"]
        assert "release" in outcome, "helm install did not return"
        release: Obj = outcome["release"]
        # The Deployment the operator was started from is the one Helm installed.
        assert one(manifest_objects(release), "Deployment") == deployment
        return release, operator
    except BaseException:
        operator.stop()
        thread.join(timeout + 30)
        raise


@contextlib.contextmanager
def installed(
    directory: Path,
    values: Obj | None = None,
    *,
    start_operator: bool = True,
    jobset: bool = True,
    server: Cluster | None = None,
) -> Iterator[Installed]:
    """The chart installed by Helm into ``server`` (a fresh stand-in by default) with JobSet's CRD,
    and the operator running as its Deployment says (on free ports).

    On the real control plane the release is uninstalled at the end whatever happened, and what the
    plane's other tests rely on is put back (:func:`restore_real_plane`)."""
    values = merge(port_values(), values or {})
    own = server is None
    cluster: Cluster = local_apiserver().start() if server is None else server
    try:
        install_prerequisites(cluster, jobset=jobset)
        mark = cluster.audit_mark()
        with helm_config(cluster, directory) as cfg:
            try:
                if isinstance(cluster, RealCluster) and start_operator:
                    release, operator = install_and_wait(cfg, cluster, values, directory)
                else:
                    release = cfg.install(str(CHART), RELEASE, values, create_namespace=True, timeout=60)
                    operator = OperatorProcess(
                        cluster, one(manifest_objects(release), "Deployment"), directory
                    )
                    if start_operator:
                        operator.start().wait_ready()
                objects = manifest_objects(release)
                try:
                    yield Installed(cluster, cfg, release, objects, operator, values, mark)
                finally:
                    operator.stop()
            finally:
                if isinstance(cluster, RealCluster):
                    with contextlib.suppress(helm.HelmError):
                        cfg.uninstall(RELEASE, timeout=120, ignore_not_found=True)
    finally:
        if isinstance(cluster, LocalAPIServer) and own:
            cluster.stop()
        elif isinstance(cluster, RealCluster):
            with contextlib.suppress(APIError):
                cluster.delete("coordination.k8s.io/v1", "Lease", "trainer.kubeflow.org", NAMESPACE)
            # A failed install or uninstall can leave the release's webhooks behind, calling an
            # operator that is gone: they would refuse every write below and the plane's later tests.
            for kind, configuration in _webhook_configurations(cluster):
                with contextlib.suppress(APIError):
                    cluster.delete(WEBHOOK_API, kind, configuration["metadata"]["name"], "")
            restore_real_plane(cluster)


# The operator's own webhook certificate's objects, which the chart grants by name
# (templates/webhook/certificate-rbac.yaml): (resource, namespace, name).
CERTIFICATE_OBJECTS = {
    ("secrets", NAMESPACE, f"{RELEASE}-webhook-cert"),
    ("validatingwebhookconfigurations", "", "validator.trainer.kubeflow.org"),
    ("mutatingwebhookconfigurations", "", "defaulter.trainer.kubeflow.org"),
}


def certificate_call(record: Any) -> bool:
    """A call on one of the certificate's objects (granted by name, not by the ClusterRole)."""
    return (record.resource, record.namespace or "", record.name) in CERTIFICATE_OBJECTS


def operator_permissions(result: ScenarioResult, user: str) -> set[rbac_audit.Permission]:
    """The permissions the operator used for its workload: its calls (not those on the webhook
    certificate's objects, which are granted by name), and what its ownerReferences ask of
    admission."""
    calls = [r for r in result.audit if not certificate_call(r)]
    return rbac_audit.permissions_from_audit(calls, user) | rbac_audit.owner_finalizer_permissions(
        result.created, OWNER_KINDS
    )
