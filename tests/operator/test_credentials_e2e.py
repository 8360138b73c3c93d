"""Credentials that stop working while the operator runs: it gets new ones, without a restart.

Managed clusters hand out tokens that last minutes to an hour, through an exec plugin
(gke-gcloud-auth-plugin, kubelogin, aws eks get-token). Here the plugin asks the real API server's
TokenRequest for a service-account token bound to a Secret: deleting the Secret makes the token
worthless at once (401), as an expired or revoked token of a managed cluster is. The operator must
run the plugin again on the 401 and go on with the new token.

Only the real control plane issues and revokes tokens; the stand-in has no TokenRequest.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_helpers import get_or_none, trainjob, wait_for
from trainer_sandbox.backends import RealCluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

from trainer.controller.config import Configuration

JOBSET = "jobset.x-k8s.io/v1alpha2"
SERVICE_ACCOUNT = "trainer-exec"

# An exec credential plugin: reads its state (which Secret to bind the token to, the admin's
# kubeconfig to ask with), asks TokenRequest for a token bound to that Secret, and prints it as an
# ExecCredential with the token's expiry. Each token it issues is recorded for the test, in a file
# only the test reads (the operator never logs one).
PLUGIN = """\
#!{python}
import base64, json, os, ssl, sys, tempfile, urllib.request
import yaml

state = json.load(open(os.environ["PLUGIN_STATE"]))
config = yaml.safe_load(open(state["admin"]))
cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
with tempfile.TemporaryDirectory() as scratch:
    paths = {{}}
    for name, field in (("ca", "certificate-authority-data"), ("crt", "client-certificate-data"),
                        ("key", "client-key-data")):
        data = cluster.get(field) or user.get(field)
        paths[name] = os.path.join(scratch, name)
        with open(paths[name], "wb") as out:
            out.write(base64.b64decode(data))
    context = ssl.create_default_context(cafile=paths["ca"])
    context.load_cert_chain(paths["crt"], paths["key"])

def call(method, path, body=None):
    request = urllib.request.Request(
        cluster["server"] + path, data=json.dumps(body).encode() if body else None, method=method,
        headers={{"Content-Type": "application/json", "Accept": "application/json"}},
    )
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return json.loads(response.read())

ns, sa, secret = state["namespace"], state["serviceAccount"], state["secret"]
uid = call("GET", f"/api/v1/namespaces/{{ns}}/secrets/{{secret}}")["metadata"]["uid"]
issued = call("POST", f"/api/v1/namespaces/{{ns}}/serviceaccounts/{{sa}}/token", {{
    "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
    "spec": {{"expirationSeconds": 3600,
             "boundObjectRef": {{"apiVersion": "v1", "kind": "Secret", "name": secret, "uid": uid}}}},
}})
token = issued["status"]["token"]
with open(state["issued"], "a") as log:
    log.write(json.dumps({{"secret": secret, "token": token}}) + "\\n")
print(json.dumps({{
    "apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
    "status": {{"token": token, "expirationTimestamp": issued["status"]["expirationTimestamp"]}},
}}))
"""


def _secret(cluster: RealCluster, name: str) -> None:
    cluster.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {}})


def _admin_cluster_entry(cluster: RealCluster) -> dict[str, Any]:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    entry: dict[str, Any] = config["clusters"][0]["cluster"]
    return entry


def _kubeconfig(path: Path, cluster_entry: dict[str, Any], user: dict[str, Any], namespace: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "real", "cluster": cluster_entry}],
                "users": [{"name": "operator", "user": user}],
                "contexts": [
                    {
                        "name": "ctx",
                        "context": {"cluster": "real", "user": "operator", "namespace": namespace},
                    }
                ],
                "current-context": "ctx",
            }
        )
    )
    path.chmod(0o600)
    return path


def _status_with_token(cluster: RealCluster, token: str) -> int:
    """What the API server answers a request made with ``token`` alone (no client certificate)."""
    ca = base64.b64decode(_admin_cluster_entry(cluster)["certificate-authority-data"]).decode()
    context = ssl.create_default_context(cadata=ca)
    request = urllib.request.Request(
        f"{cluster.server}/api/v1/namespaces/{cluster.namespace}/configmaps",
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _issued(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_revoked_exec_token_is_replaced_without_a_restart(real: RealCluster, tmp_path: Path) -> None:
    ns = real.namespace
    real.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT}})
    real.grant(f"system:serviceaccount:{ns}:{SERVICE_ACCOUNT}")
    _secret(real, "bound-1")
    issued = tmp_path / "issued.jsonl"
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps(
            {
                "admin": str(real.kubeconfig),
                "namespace": ns,
                "serviceAccount": SERVICE_ACCOUNT,
                "secret": "bound-1",
                "issued": str(issued),
            }
        )
    )
    plugin = tmp_path / "token-plugin.py"
    plugin.write_text(PLUGIN.format(python=sys.executable))
    plugin.chmod(0o755)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "interactiveMode": "Never",
            "command": str(plugin),
            "env": [{"name": "PLUGIN_STATE", "value": str(state)}],
        }
    }
    kubeconfig = _kubeconfig(tmp_path / "operator.kubeconfig", _admin_cluster_entry(real), user, ns)

    with EmbeddedOperator(kubeconfig, Configuration(), namespaces=[ns]) as op:
        running = op.operator.running
        real.create(trainjob("before"))
        wait_for(lambda: get_or_none(real, JOBSET, "JobSet", "before"), what="the first JobSet")
        first = _issued(issued)
        assert first and {t["secret"] for t in first} == {"bound-1"}
        assert _status_with_token(real, first[-1]["token"]) == 200

        # Revoke: the Secret the token is bound to goes, and with it the token, at once.
        real.delete("v1", "Secret", "bound-1")
        wait_for(lambda: _status_with_token(real, first[-1]["token"]) == 401, what="the token revoked")
        _secret(real, "bound-2")
        state.write_text(json.dumps({**json.loads(state.read_text()), "secret": "bound-2"}))

        real.create(trainjob("after"))
        wait_for(
            lambda: get_or_none(real, JOBSET, "JobSet", "after"),
            timeout=30,
            what="the JobSet after revocation",
        )
        assert op.operator.running is running, "the same operator, not restarted"
        assert _issued(issued)[-1]["secret"] == "bound-2", "a new token, from the plugin run again"


def _bound_token(cluster: RealCluster, account: str, secret: str) -> str:
    """A token of service account ``account`` bound to Secret ``secret``: it dies with the Secret."""
    uid = cluster.get("v1", "Secret", secret)["metadata"]["uid"]
    issued = cluster.http.request(
        "POST",
        f"/api/v1/namespaces/{cluster.namespace}/serviceaccounts/{account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": secret, "uid": uid},
            },
        },
    )
    return str(issued["status"]["token"])


def test_a_rotated_service_account_token_file_is_read_again(
    real: RealCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a pod the kubelet writes a new projected token before the old one expires; here the old
    one is revoked as the new one is written, so only a token read again lets the operator on."""
    from trainer.controller import credentials

    ns = real.namespace
    real.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT}})
    real.grant(f"system:serviceaccount:{ns}:{SERVICE_ACCOUNT}")
    _secret(real, "pod-1")
    mount = tmp_path / "serviceaccount"  # what the kubelet mounts at /var/run/secrets/kubernetes.io/...
    mount.mkdir()
    ca = base64.b64decode(_admin_cluster_entry(real)["certificate-authority-data"])
    (mount / "ca.crt").write_bytes(ca)
    (mount / "namespace").write_text(ns)
    (mount / "token").write_text(_bound_token(real, SERVICE_ACCOUNT, "pod-1"))
    host, _, port = real.server.removeprefix("https://").rpartition(":")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host.strip("[]"))
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT", mount)

    # No kubeconfig: the in-cluster credentials, as in a pod.
    with EmbeddedOperator("", Configuration(), namespaces=[ns]) as op:
        running = op.operator.running
        real.create(trainjob("before"))
        wait_for(lambda: get_or_none(real, JOBSET, "JobSet", "before"), what="the first JobSet")

        old = (mount / "token").read_text()
        _secret(real, "pod-2")
        new = _bound_token(real, SERVICE_ACCOUNT, "pod-2")
        rotated = mount / "token.new"  # the kubelet swaps the file whole
        rotated.write_text(new)
        rotated.replace(mount / "token")
        real.delete("v1", "Secret", "pod-1")
        wait_for(lambda: _status_with_token(real, old) == 401, what="the old token revoked")

        real.create(trainjob("after"))
        wait_for(
            lambda: get_or_none(real, JOBSET, "JobSet", "after"), timeout=30, what="the JobSet after rotation"
        )
        assert op.operator.running is running, "the same operator, not restarted"


# --- proxy-url: the operator's requests go through the kubeconfig's HTTP proxy ---


class ConnectProxy:
    """An HTTP proxy that tunnels each CONNECT to ``upstream`` and records the target asked for.

    The kubeconfig's server is an address nothing listens on: only through the proxy is the API
    server reached, as behind a corporate proxy.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.tunnels: list[str] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(4096)
                if not chunk:
                    return
                head += chunk
            method, target = head.split(b" ", 2)[:2]
            if method != b"CONNECT":
                client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                return
            self.tunnels.append(target.decode())
            with socket.create_connection(self.upstream) as upstream:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                rest = head.split(b"\r\n\r\n", 1)[1]
                if rest:
                    upstream.sendall(rest)
                pump = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
                pump.start()
                self._pump(client, upstream)
                pump.join(5)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def test_the_operator_talks_through_the_kubeconfig_proxy_url(real: RealCluster, tmp_path: Path) -> None:
    ns = real.namespace
    real.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT}})
    account = f"system:serviceaccount:{ns}:{SERVICE_ACCOUNT}"
    real.grant(account)
    user = yaml.safe_load(real.write_kubeconfig(tmp_path / "sa.kubeconfig", user=account).read_text())[
        "users"
    ][0]["user"]
    host, _, port = real.server.removeprefix("https://").rpartition(":")
    # A port bound but not listening: a direct connection is refused. The server's certificate is
    # for its IP address, so the same host on this port verifies through the tunnel.
    with socket.socket() as unreachable:
        unreachable.bind((host, 0))
        nowhere = f"{host}:{unreachable.getsockname()[1]}"
        proxy = ConnectProxy((host, int(port)))
        try:
            entry = {
                **_admin_cluster_entry(real),
                "server": f"https://{nowhere}",
                "proxy-url": f"http://127.0.0.1:{proxy.port}",
            }
            kubeconfig = _kubeconfig(tmp_path / "operator.kubeconfig", entry, user, ns)
            with EmbeddedOperator(kubeconfig, Configuration(), namespaces=[ns]):
                real.create(trainjob("proxied"))
                wait_for(lambda: get_or_none(real, JOBSET, "JobSet", "proxied"), what="the JobSet")
            assert proxy.tunnels and set(proxy.tunnels) == {nowhere}, proxy.tunnels
        finally:
            proxy.close()
