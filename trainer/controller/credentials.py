"""Credentials for one cluster: an explicit kubeconfig, else in-cluster, else ``KUBECONFIG``.

Tokens, client certificates and CA bundles (files or inline data) are read here, without the
official ``kubernetes`` client: importing it costs about 40 MiB of the operator's memory for
nothing it uses. A kubeconfig whose user runs an ``exec`` plugin or an ``auth-provider`` is handed
to the official client's loader, which knows those.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kopf

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
    contexts: dict[str, Any] = {}
    clusters: dict[str, tuple[Any, Path]] = {}
    users: dict[str, tuple[Any, Path]] = {}
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
    user, user_dir = users.get(context.get("user", ""), ({}, cluster_dir))
    if user.get("exec") or user.get("auth-provider"):
        return _with_official_client(paths)

    def file(value: str | None, base: Path) -> str | None:
        return str(base / value) if value else None  # relative paths are relative to their file

    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = Path(file(user["tokenFile"], user_dir) or "").read_text().strip()
    return kopf.ConnectionInfo(
        server=cluster.get("server"),
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
    )


def _with_official_client(paths: list[str]) -> kopf.ConnectionInfo:
    import kubernetes

    cfg = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_kube_config(
            config_file=os.pathsep.join(str(Path(p).expanduser()) for p in paths), client_configuration=cfg
        )
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise CredentialsError(f"kubeconfig: {exc}") from exc
    header = cfg.get_api_key_with_prefix("authorization") or cfg.get_api_key_with_prefix("BearerToken") or ""
    scheme, _, token = header.partition(" ")
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )
