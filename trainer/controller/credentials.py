"""Credentials for one cluster: an explicit kubeconfig, else in-cluster, else ``KUBECONFIG``.

Tokens, client certificates and CA bundles (files or inline data) are read here, and credential
plugins (a kubeconfig user's ``exec``) are run here as client-go runs them: the operator has no
use for the official ``kubernetes`` client, whose import costs about 40 MiB of its memory. A
user's ``auth-provider`` (gcp and azure, removed from client-go in Kubernetes 1.26; oidc,
deprecated) is refused, naming the exec plugins that replace them.

The credentials are read once, at start-up; an exec plugin's ``expirationTimestamp`` is passed on.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import kopf

from trainer.api.objects import Obj

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class CredentialsError(Exception):
    """No usable credentials; the message says where they were looked for."""


def login(kubeconfig: str | None = None) -> kopf.ConnectionInfo:
    if kubeconfig:
        return from_kubeconfig([kubeconfig])
    in_cluster = from_service_account()
    if in_cluster is not None:
        return in_cluster
    paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if not paths and Path("~/.kube/config").expanduser().exists():
        paths = ["~/.kube/config"]
    if not paths:
        raise CredentialsError("not in a cluster, and neither KUBECONFIG nor ~/.kube/config is set")
    return from_kubeconfig(paths)


def from_service_account(root: Path = SERVICE_ACCOUNT) -> kopf.ConnectionInfo | None:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    token_path = root / "token"
    if not host or not port or not token_path.exists():
        return None
    if ":" in host:
        host = f"[{host}]"
    ca = root / "ca.crt"
    namespace = root / "namespace"
    return kopf.ConnectionInfo(
        server=f"https://{host}:{port}",
        ca_path=str(ca) if ca.exists() else None,
        scheme="Bearer",
        token=token_path.read_text().strip(),
        default_namespace=namespace.read_text().strip() if namespace.exists() else None,
    )


def from_kubeconfig(paths: list[str]) -> kopf.ConnectionInfo:
    """The current context of the merged kubeconfig files (the first file to set a name wins)."""
    import yaml

    current: str | None = None
    contexts: dict[str, Obj] = {}
    clusters: dict[str, tuple[Obj, Path]] = {}
    users: dict[str, tuple[Obj, Path]] = {}
    for raw in paths:
        path = Path(raw).expanduser()
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise CredentialsError(f"kubeconfig {path}: {exc}") from exc
        if not isinstance(config, dict):
            raise CredentialsError(f"kubeconfig {path}: not a mapping")
        current = current or config.get("current-context")
        for item in config.get("contexts") or []:
            contexts.setdefault(item["name"], item.get("context") or {})
        for item in config.get("clusters") or []:
            clusters.setdefault(item["name"], (item.get("cluster") or {}, path.parent))
        for item in config.get("users") or []:
            users.setdefault(item["name"], (item.get("user") or {}, path.parent))
    if not current or current not in contexts:
        raise CredentialsError(f"kubeconfig {', '.join(paths)}: no current context")
    context = contexts[current]
    if context.get("cluster") not in clusters:
        raise CredentialsError(f"kubeconfig: context {current!r} names an unknown cluster")
    cluster, cluster_dir = clusters[context["cluster"]]
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise CredentialsError(f"kubeconfig: cluster {context['cluster']!r} has no server")
    user, user_dir = users.get(context.get("user", ""), ({}, cluster_dir))
    where = f"kubeconfig {', '.join(paths)}: users[{context.get('user', '')!r}].user"
    if user.get("auth-provider"):
        provider = user["auth-provider"].get("name") if isinstance(user["auth-provider"], dict) else None
        raise CredentialsError(
            f"{where}.auth-provider ({provider or 'unnamed'}): auth providers are not supported "
            "(client-go removed gcp and azure in Kubernetes 1.26 and deprecates oidc); use the exec "
            "plugin that replaces it: gke-gcloud-auth-plugin, kubelogin, or an OIDC one such as "
            "kubectl oidc-login"
        )
    expiration: datetime | None = None
    if user.get("exec") and not _has_static_credentials(user):
        user, expiration = _with_exec_credential(user, f"{where}.exec", user_dir, cluster, cluster_dir)

    def file(value: str | None, base: Path) -> str | None:
        return str(base / value) if value else None  # relative paths are relative to their file

    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = Path(file(user["tokenFile"], user_dir) or "").read_text().strip()
    return kopf.ConnectionInfo(
        server=server,
        ca_path=file(cluster.get("certificate-authority"), cluster_dir),
        ca_data=cluster.get("certificate-authority-data"),
        insecure=cluster.get("insecure-skip-tls-verify"),
        certificate_path=file(user.get("client-certificate"), user_dir),
        certificate_data=user.get("client-certificate-data"),
        private_key_path=file(user.get("client-key"), user_dir),
        private_key_data=user.get("client-key-data"),
        username=user.get("username"),
        password=user.get("password"),
        scheme="Bearer" if token else None,
        token=token,
        default_namespace=context.get("namespace"),
        proxy_url=cluster.get("proxy-url"),
        expiration=expiration,
    )


# --- credential plugins: client-go's ExecCredential protocol ---

EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
INTERACTIVE_MODES = ("Never", "IfAvailable", "Always")
# Where a cluster's plugin configuration lives among its extensions (provideClusterInfo).
EXEC_EXTENSION = "client.authentication.k8s.io/exec"


def _has_static_credentials(user: Obj) -> bool:
    """client-go runs the plugin only when the user has no token, basic auth or client certificate."""
    cert = user.get("client-certificate") or user.get("client-certificate-data")
    key = user.get("client-key") or user.get("client-key-data")
    return bool(user.get("token") or user.get("tokenFile") or user.get("username") or (cert and key))


def _with_exec_credential(
    user: Obj, where: str, base: Path, cluster: Obj, cluster_dir: Path
) -> tuple[Obj, datetime | None]:
    """The user with the token or client certificate its exec plugin prints, and when they expire.

    As client-go: the command (relative to the kubeconfig's directory when it has a path separator,
    else looked up on PATH) runs with the process environment plus the plugin's ``env`` and
    ``KUBERNETES_EXEC_INFO``; its stderr is passed through, its stdout is an ExecCredential. Neither
    the token nor the key is ever put in a message or a log.
    """
    import json
    import subprocess
    import sys

    spec = user["exec"]
    if not isinstance(spec, dict):
        raise CredentialsError(f"{where}: must be a mapping")
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise CredentialsError(f"{where}.command: required")
    api_version = spec.get("apiVersion")
    if api_version not in EXEC_API_VERSIONS:
        raise CredentialsError(
            f"{where}.apiVersion: {api_version!r} is not supported, use one of {', '.join(EXEC_API_VERSIONS)}"
        )
    mode = spec.get("interactiveMode") or (None if api_version.endswith("/v1") else "IfAvailable")
    if mode is None:
        raise CredentialsError(f"{where}.interactiveMode: required for {api_version}")
    if mode not in INTERACTIVE_MODES:
        raise CredentialsError(
            f"{where}.interactiveMode: unsupported value {mode!r}, use one of {', '.join(INTERACTIVE_MODES)}"
        )
    terminal = sys.stdin is not None and sys.stdin.isatty()
    if mode == "Always" and not terminal:
        raise CredentialsError(f"{where}.interactiveMode: Always, but standard input is not a terminal")
    interactive = terminal and mode != "Never"
    args = spec.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise CredentialsError(f"{where}.args: must be a list of strings")
    env = dict(os.environ)
    for index, item in enumerate(spec.get("env") or []):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            raise CredentialsError(f"{where}.env[{index}].name: required")
        env[name] = str(item.get("value") or "")
    info: Obj = {"interactive": interactive}
    if spec.get("provideClusterInfo"):
        info["cluster"] = _exec_cluster(cluster, cluster_dir)
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": api_version, "kind": "ExecCredential", "spec": info}
    )
    if os.sep in command and not os.path.isabs(command):
        command = str(base / command)
    try:
        done = subprocess.run(
            [command, *args],
            env=env,
            stdin=None if interactive else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            check=False,
        )
    except OSError as exc:
        hint = spec.get("installHint")
        raise CredentialsError(
            f"{where}.command: executable {command} not found ({exc.strerror})"
            + (f"\n\n{hint}" if hint else "")
        ) from None
    if done.returncode != 0:
        raise CredentialsError(f"{where}: executable {command} failed with exit code {done.returncode}")
    return _read_exec_credential(done.stdout, where, api_version, user)


def _read_exec_credential(
    stdout: bytes, where: str, api_version: str, user: Obj
) -> tuple[Obj, datetime | None]:
    import json

    try:
        credential = json.loads(stdout)
    except ValueError as exc:  # the message gives a position, never the text
        raise CredentialsError(f"{where}: the plugin's output is not JSON: {exc}") from None
    if not isinstance(credential, dict) or credential.get("kind") != "ExecCredential":
        raise CredentialsError(f"{where}: the plugin's output is not an ExecCredential")
    if credential.get("apiVersion") != api_version:
        raise CredentialsError(
            f"{where}.apiVersion: the plugin is configured to use {api_version}, "
            f"it returned {credential.get('apiVersion')!r}"
        )
    status = credential.get("status")
    if not isinstance(status, dict):
        raise CredentialsError(f"{where}: the plugin's ExecCredential has no status")
    token = status.get("token")
    cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
    for name, value in (("token", token), ("clientCertificateData", cert), ("clientKeyData", key)):
        if value is not None and not isinstance(value, str):
            raise CredentialsError(f"{where}: the plugin's status.{name} must be a string")
    if not token and not cert and not key:
        raise CredentialsError(
            f"{where}: the plugin returned neither status.token nor status.clientCertificateData "
            "and status.clientKeyData"
        )
    if bool(cert) != bool(key):
        given, missing = (
            ("clientCertificateData", "clientKeyData") if cert else ("clientKeyData", "clientCertificateData")
        )
        raise CredentialsError(f"{where}: the plugin returned status.{given} without status.{missing}")
    expiration: datetime | None = None
    stamp = status.get("expirationTimestamp")
    if stamp:
        try:
            expiration = datetime.fromisoformat(str(stamp))
        except ValueError:
            raise CredentialsError(
                f"{where}: the plugin's status.expirationTimestamp {stamp!r} is not an RFC 3339 time"
            ) from None
    out = dict(user)
    if token:
        out["token"] = token
    if cert and key:  # PEM, which kopf takes as it takes base64
        out.update({"client-certificate-data": cert, "client-key-data": key})
        out.pop("client-certificate", None)
        out.pop("client-key", None)
    return out, expiration


def _exec_cluster(cluster: Obj, cluster_dir: Path) -> Obj:
    """The cluster as client-go describes it to a plugin with provideClusterInfo (empty fields left out)."""
    import base64

    ca = cluster.get("certificate-authority-data")
    if not ca and cluster.get("certificate-authority"):
        try:
            ca = base64.b64encode((cluster_dir / cluster["certificate-authority"]).read_bytes()).decode()
        except OSError as exc:
            raise CredentialsError(f"kubeconfig: cluster certificate-authority: {exc}") from exc
    config = next(
        (
            e.get("extension")
            for e in cluster.get("extensions") or []
            if isinstance(e, dict) and e.get("name") == EXEC_EXTENSION
        ),
        None,
    )
    out = {
        "server": cluster.get("server"),
        "tls-server-name": cluster.get("tls-server-name"),
        "insecure-skip-tls-verify": cluster.get("insecure-skip-tls-verify"),
        "certificate-authority-data": ca,
        "proxy-url": cluster.get("proxy-url"),
        "disable-compression": cluster.get("disable-compression"),
        "config": config,
    }
    return {k: v for k, v in out.items() if v}
