"""Credentials for one cluster: an explicit kubeconfig, else in-cluster, else ``KUBECONFIG``.

Tokens, client certificates and CA bundles (files or inline data) are read here, and credential
plugins (a kubeconfig user's ``exec``) are run here as client-go runs them: the operator has no
use for the official ``kubernetes`` client, whose import costs about 40 MiB of its memory. A
user's ``auth-provider`` (gcp and azure, removed from client-go in Kubernetes 1.26; oidc,
deprecated) is refused, naming the exec plugins that replace them.

Credentials do not last: :class:`Credentials` keeps them fresh while the operator runs, as
client-go does. A token read from a file (the projected service-account token the kubelet rotates,
a kubeconfig's ``tokenFile``) is read again every minute; an exec plugin is run again when what it
printed expires (its ``expirationTimestamp``); and whatever the source, the credentials are fetched
again when the API server answers 401 (a token revoked, or expired early). The server, its CA and
``proxy-url`` (an ``http://`` proxy; other schemes are refused) are read once, at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import kopf

from trainer.api.objects import Obj

logger = logging.getLogger("trainer.credentials")

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
REREAD_SECONDS = 60.0  # a token file is read again this often (client-go's CachedFileTokenSource)
EXPIRY_MARGIN = 10.0  # expiring credentials are fetched again this long before they expire (at most)
RETRY_SECONDS = 1.0  # after a failed fetch, none is tried again for this long


class CredentialsError(Exception):
    """No usable credentials; the message says where they were looked for (and never holds a token)."""


@dataclass(frozen=True)
class Loaded:
    """Credentials as one source gave them; ``reread``: their token came from a file, read again
    every minute (an exec plugin is run again only on expiry or a 401)."""

    info: kopf.ConnectionInfo
    reread: bool = False


def source(kubeconfig: str | None = None, service_account: Path | None = None) -> Callable[[], Loaded]:
    """Where the credentials come from, chosen once: an explicit kubeconfig, else in-cluster, else
    ``KUBECONFIG`` (or ``~/.kube/config``). Calling the result reads them (again).

    ``service_account`` is the directory of the in-cluster token, CA and namespace files
    (:data:`SERVICE_ACCOUNT` when not given, read when called: a test may point it elsewhere).
    """
    service_account = service_account or SERVICE_ACCOUNT
    if kubeconfig:
        paths = [kubeconfig]
    elif from_service_account(service_account) is not None:

        def in_cluster() -> Loaded:
            try:
                info = from_service_account(service_account)
            except OSError as exc:
                raise CredentialsError(f"the service-account token: {exc}") from None
            if info is None:
                raise CredentialsError(f"the service-account token {service_account / 'token'} is gone")
            return Loaded(info, reread=True)

        return in_cluster
    else:
        paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        if not paths and Path("~/.kube/config").expanduser().exists():
            paths = ["~/.kube/config"]
        if not paths:
            raise CredentialsError("not in a cluster, and neither KUBECONFIG nor ~/.kube/config is set")
    return lambda: _load_kubeconfig(paths)


def login(kubeconfig: str | None = None, service_account: Path | None = None) -> kopf.ConnectionInfo:
    """The credentials, read once (:class:`Credentials` keeps them fresh)."""
    return source(kubeconfig, service_account)().info


class Credentials:
    """The operator's credentials, fetched again when they expire, when a token file's minute is
    up, and when the API server refuses them (:meth:`refresh`, on a 401).

    One fetch at a time: the requests that meet a 401 together share the one fetch it causes,
    and a request refused with credentials already replaced just uses the new ones. A fetch that
    fails keeps the credentials held (a request with them then meets its 401) and is not tried again
    for a second; its message, logged once, names the source and never a token.
    """

    def __init__(self, load: Callable[[], Loaded], clock: Callable[[], float] = time.time) -> None:
        self._load_fn = load
        self.clock = clock
        self._info: kopf.ConnectionInfo | None = None
        self._fetched = 0.0
        self._reread_at: float | None = None  # when a token file is read again
        self._not_before = 0.0  # no fetch before this, after a failed one
        self._lock = asyncio.Lock()
        self._given_to_kopf: kopf.ConnectionInfo | None = None
        self.fetches = 0  # fetches that succeeded, the first included
        self.failures = 0

    @classmethod
    def of(cls, kubeconfig: str | None = None, service_account: Path | None = None) -> Credentials:
        return cls(source(kubeconfig, service_account))

    @property
    def info(self) -> kopf.ConnectionInfo:
        """The credentials held now (as last fetched: :meth:`current` fetches them when due)."""
        if self._info is None:
            raise CredentialsError("no credentials fetched yet")
        return self._info

    def _due(self) -> bool:
        if self._info is None:
            return True
        now = self.clock()
        if now < self._not_before:
            return False
        if self._reread_at is not None and now >= self._reread_at:
            return True
        expiration = self._info.expiration
        if expiration is None:
            return False
        if expiration.tzinfo is None:  # a naive time is UTC, as kopf takes it
            expiration = expiration.replace(tzinfo=UTC)
        expires = expiration.timestamp()
        margin = min(EXPIRY_MARGIN, max(0.0, expires - self._fetched) / 2)
        return now >= expires - margin

    async def current(self) -> kopf.ConnectionInfo:
        """The credentials for the next request, fetched again first when they are due.

        Raises CredentialsError only when there are none at all (the first fetch failed); a later
        failure is logged and the credentials held are returned.
        """
        if self._due():
            held = self._info
            try:
                await self._fetch(held, forced=False)
            except CredentialsError:
                if self._info is None:
                    raise
        return self.info

    async def refresh(self, rejected: kopf.ConnectionInfo) -> bool:
        """The API server refused ``rejected`` (401): fetch new credentials, unless that was done
        since. True if the credentials held now differ from ``rejected`` (worth a retry)."""
        with contextlib.suppress(CredentialsError):  # logged; the caller's request meets its 401
            await self._fetch(rejected, forced=True)
        return self._info is not None and self._info != rejected

    async def for_kopf(self) -> kopf.ConnectionInfo:
        """For kopf's login handler. kopf asks again only when what it was given expired or was
        refused (401): then new credentials are fetched, and if none differ from those, the
        CredentialsError says so (kopf would refuse them and stop; it retries a failed login)."""
        given = self._given_to_kopf
        if given is None:
            info = await self.current()
        else:
            await self._fetch(given, forced=True)
            info = self.info
            if info == given:
                raise CredentialsError(
                    "the credentials expired or were refused (401), and no others could be fetched yet"
                )
        self._given_to_kopf = info
        return info

    async def _fetch(self, held: kopf.ConnectionInfo | None, *, forced: bool) -> None:
        async with self._lock:
            if self._info is not held:
                return  # fetched by another request meanwhile
            if self.clock() < self._not_before or (not forced and not self._due()):
                if held is None:
                    raise CredentialsError("fetching credentials failed a moment ago")
                return
            try:
                # A plugin may take seconds (it may ask a cloud's token service): off the loop.
                loaded = await asyncio.to_thread(self._load_fn)
            except CredentialsError as exc:
                self.failures += 1
                self._not_before = self.clock() + RETRY_SECONDS
                if held is not None:
                    logger.warning("fetching new credentials failed, keeping the ones held: %s", exc)
                raise
            now = self.clock()
            self.fetches += 1
            self._fetched = now
            self._reread_at = now + REREAD_SECONDS if loaded.reread else None
            # Unchanged credentials stay the same object: clients keep their TLS context.
            self._info = held if held is not None and loaded.info == held else loaded.info
            if held is not None and self._info is not held:
                why = "the ones held were refused (401)" if forced else "the ones held expired or changed"
                logger.info("new credentials fetched: %s", why)
            if self._due():  # expired on arrival: do not fetch again at once
                self._not_before = now + RETRY_SECONDS


def from_service_account(root: Path | None = None) -> kopf.ConnectionInfo | None:
    root = root or SERVICE_ACCOUNT
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


def _load_kubeconfig(paths: list[str]) -> Loaded:
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
    proxy = _proxy_url(cluster, f"kubeconfig {', '.join(paths)}: clusters[{context['cluster']!r}].cluster")
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
    from_file = not token and bool(user.get("tokenFile"))
    if from_file:
        token_file = Path(file(user["tokenFile"], user_dir) or "")
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise CredentialsError(f"{where}.tokenFile: {exc.strerror}: {token_file}") from None
    info = kopf.ConnectionInfo(
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
        proxy_url=proxy,
        expiration=expiration,
    )
    return Loaded(info, reread=from_file)


def _proxy_url(cluster: Obj, where: str) -> str | None:
    """A cluster's ``proxy-url``: an ``http://`` proxy, which the API server is reached through
    (HTTP CONNECT). client-go also takes https and socks5 proxies; aiohttp, which the operator and
    kopf talk through, does not (socks5), or not for certain (TLS to the proxy): those are refused."""
    from urllib.parse import urlsplit

    url = cluster.get("proxy-url")
    if url is None or url == "":
        return None
    if not isinstance(url, str):
        raise CredentialsError(f"{where}.proxy-url: must be a string")
    parts = urlsplit(url)  # the messages never quote the URL: it may carry a password
    if parts.scheme in ("https", "socks5", "socks5h"):
        raise CredentialsError(
            f"{where}.proxy-url: {parts.scheme} proxies are not supported; use an http:// proxy "
            "(HTTP CONNECT), e.g. http://proxy.example:3128"
        )
    if parts.scheme != "http" or not parts.hostname:
        raise CredentialsError(f"{where}.proxy-url: not an http:// URL (e.g. http://proxy.example:3128)")
    return url


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
