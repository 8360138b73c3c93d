"""Credentials: kubeconfig files and in-cluster service accounts, without the official client's weight."""

from __future__ import annotations

import ast
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from render_helpers import ROOT

from trainer.controller.cache import Cache
from trainer.controller.credentials import CredentialsError, from_service_account, login


def kubeconfig(path: Path, user: dict[str, object], cluster: dict[str, object] | None = None) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "ctx",
                "contexts": [
                    {"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}
                ],
                "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443"}}],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


def test_token_and_ca_data(tmp_path: Path) -> None:
    info = login(
        str(
            kubeconfig(
                tmp_path / "config",
                {"token": "abc"},
                {"server": "https://k:6443", "certificate-authority-data": "Q0E="},
            )
        )
    )
    assert (info.server, info.scheme, info.token, info.ca_data) == ("https://k:6443", "Bearer", "abc", "Q0E=")
    assert info.default_namespace == "team-a"


def test_files_are_relative_to_their_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "token").write_text("from-file\n")
    path = kubeconfig(
        tmp_path / "config",
        {"tokenFile": "creds/token", "client-certificate": "creds/c.crt", "client-key": "/abs/c.key"},
        {"server": "https://k:6443", "certificate-authority": "creds/ca.crt"},
    )
    info = login(str(path))
    assert info.token == "from-file"
    assert info.ca_path == str(tmp_path / "creds" / "ca.crt")
    assert info.certificate_path == str(tmp_path / "creds" / "c.crt")
    assert info.private_key_path == "/abs/c.key"


def plugin(tmp_path: Path, body: str, name: str = "plugin.py") -> Path:
    """An exec credential plugin: a Python script that sees ``info`` (KUBERNETES_EXEC_INFO) and ``env``."""
    path = tmp_path / name
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "env = os.environ\n"
        "def emit(status, api='client.authentication.k8s.io/v1'):\n"
        "    print(json.dumps({'apiVersion': api, 'kind': 'ExecCredential', 'status': status}))\n" + body
    )
    path.chmod(0o755)
    return path


def exec_user(command: str, /, **fields: object) -> dict[str, object]:
    """A kubeconfig user with an exec plugin; a field given as None is left out."""
    spec = {"apiVersion": "client.authentication.k8s.io/v1", "interactiveMode": "Never", "command": command}
    return {"exec": {k: v for k, v in {**spec, **fields}.items() if v is not None}}


def test_exec_plugin_token_env_args_and_exec_info(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    plugin(
        tmp_path / "bin",
        "assert info == {'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',"
        " 'spec': {'interactive': False}}, info\n"
        "assert sys.argv[1:] == ['get-token', '--cluster', 'c1'], sys.argv\n"
        "assert env['REGION'] == 'eu' and 'PATH' in env\n"
        "emit({'token': env['REGION'] + '-token', 'expirationTimestamp': '2030-01-02T03:04:05Z'})\n",
    )
    user = exec_user(
        "./bin/plugin.py",  # with a separator: relative to the kubeconfig's directory
        args=["get-token", "--cluster", "c1"],
        env=[{"name": "REGION", "value": "eu"}],
    )
    info = login(str(kubeconfig(tmp_path / "config", user)))
    assert (info.server, info.scheme, info.token) == ("https://10.0.0.1:6443", "Bearer", "eu-token")
    assert info.expiration == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert info.default_namespace == "team-a"


def test_exec_plugin_client_certificate_and_cluster_info(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(b"CA PEM")
    plugin(
        tmp_path,
        "cluster = info['spec']['cluster']\n"
        "assert cluster == {'server': 'https://k:6443', 'certificate-authority-data': 'Q0EgUEVN',"
        " 'config': {'audience': 'trainer'}}, cluster\n"
        "emit({'clientCertificateData': '-----BEGIN CERTIFICATE-----\\nC', "
        "'clientKeyData': '-----BEGIN PRIVATE KEY-----\\nK'}, api='client.authentication.k8s.io/v1beta1')\n",
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",  # interactiveMode defaults here
            "command": str(tmp_path / "plugin.py"),
            "provideClusterInfo": True,
        }
    }
    cluster = {
        "server": "https://k:6443",
        "certificate-authority": "ca.crt",
        "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"audience": "trainer"}}],
    }
    info = login(str(kubeconfig(tmp_path / "config", user, cluster)))
    assert info.token is None and info.certificate_path is None and info.private_key_path is None
    assert info.certificate_data == "-----BEGIN CERTIFICATE-----\nC"
    assert info.private_key_data == "-----BEGIN PRIVATE KEY-----\nK"


def test_a_static_token_wins_over_the_exec_plugin(tmp_path: Path) -> None:
    """As client-go: the plugin runs only for a user with no token, basic auth or certificate."""
    user = {"token": "static", **exec_user(str(tmp_path / "never-run"))}
    info = login(str(kubeconfig(tmp_path / "config", user)))
    assert info.token == "static"


@pytest.mark.parametrize(
    ("body", "fields", "message"),
    [
        ("", {"command": ""}, r"users\['u'\]\.user\.exec\.command: required"),
        ("", {"apiVersion": "client.authentication.k8s.io/v1alpha1"}, r"exec\.apiVersion: .*v1alpha1"),
        ("", {"interactiveMode": None}, r"exec\.interactiveMode: required for client.authentication"),
        ("", {"interactiveMode": "Sometimes"}, r"exec\.interactiveMode: unsupported value 'Sometimes'"),
        ("", {"interactiveMode": "Always"}, r"exec\.interactiveMode: Always, but standard input"),
        ("", {"env": [{"value": "x"}]}, r"exec\.env\[0\]\.name: required"),
        ("", {"args": "--flag"}, r"exec\.args: must be a list of strings"),
        ("sys.exit(3)\n", {}, r"exec: executable .*plugin.py failed with exit code 3"),
        ("print('token: s3cret')\n", {}, r"exec: the plugin's output is not JSON"),
        (
            "print(json.dumps({'kind': 'Config'}))\n",
            {},
            r"exec: the plugin's output is not an ExecCredential",
        ),
        (
            "emit({'token': 's3cret'}, api='client.authentication.k8s.io/v1beta1')\n",
            {},
            r"exec\.apiVersion: the plugin is configured to use client.authentication.k8s.io/v1, it returned 'client.authentication.k8s.io/v1beta1'",
        ),
        ("emit(None)\n", {}, r"exec: the plugin's ExecCredential has no status"),
        ("emit({})\n", {}, r"neither status\.token nor status\.clientCertificateData"),
        (
            "emit({'clientKeyData': 's3cret'})\n",
            {},
            r"status\.clientKeyData without status\.clientCertificateData",
        ),
        (
            "emit({'token': 's3cret', 'expirationTimestamp': 'soon'})\n",
            {},
            r"status\.expirationTimestamp 'soon' is not an RFC 3339",
        ),
    ],
)
def test_exec_plugin_errors_name_the_field_and_never_the_token(
    tmp_path: Path, body: str, fields: dict[str, object], message: str
) -> None:
    command = str(plugin(tmp_path, body))
    user = exec_user(command, **fields)
    with pytest.raises(CredentialsError, match=message) as caught:
        login(str(kubeconfig(tmp_path / "config", user)))
    assert "s3cret" not in str(caught.value)
    assert str(tmp_path / "config") in str(caught.value)  # which kubeconfig


def test_a_missing_exec_plugin_gives_its_install_hint(tmp_path: Path) -> None:
    user = exec_user("gke-gcloud-auth-plugin-missing", installHint="Install it with gcloud components.")
    with pytest.raises(CredentialsError) as caught:
        login(str(kubeconfig(tmp_path / "config", user)))
    text = str(caught.value)
    assert "users['u'].user.exec.command: executable gke-gcloud-auth-plugin-missing not found" in text
    assert text.endswith("Install it with gcloud components.")


def test_auth_providers_are_refused_by_name(tmp_path: Path) -> None:
    user = {"auth-provider": {"name": "gcp", "config": {"access-token": "s3cret"}}}
    with pytest.raises(
        CredentialsError, match=r"users\['u'\]\.user\.auth-provider \(gcp\): .*gke-gcloud-auth-plugin"
    ):
        login(str(kubeconfig(tmp_path / "config", user)))


def test_unusable_kubeconfigs_say_why(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="no current context"):
        (tmp_path / "empty").write_text("apiVersion: v1\nkind: Config\n")
        login(str(tmp_path / "empty"))
    with pytest.raises(CredentialsError, match="missing"):
        login(str(tmp_path / "missing"))


def test_service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert from_service_account(tmp_path) is None
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("...")
    (tmp_path / "namespace").write_text("kubeflow-system")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    info = from_service_account(tmp_path)
    assert info is not None
    assert (info.server, info.token, info.default_namespace) == (
        "https://[fd00::1]:443",
        "sa-token",
        "kubeflow-system",
    )
    assert info.ca_path == str(tmp_path / "ca.crt")


def test_the_operator_does_not_load_the_official_client(tmp_path: Path) -> None:
    """Neither the operator nor what it asks of kopf loads it, so where it is not installed (the
    operator's image; here, an environment of the operator's requirements only) it is not missed.
    Where it is installed, kopf imports it at its own import: the tests install it, so the operator
    process they start runs in that environment (trainer_sandbox.operator_process)."""
    from trainer_sandbox.operator_process import operator_command

    path = kubeconfig(tmp_path / "config", {"token": "abc"})
    code = (
        "import site, sys; site.addsitedir(sys.argv.pop(1)); import kopf; "
        "import trainer.controller.main; from trainer.controller.config import load; "
        "from trainer.controller.operator import Operator, login; "
        f"import asyncio; asyncio.run(login({str(path)!r})); operator = Operator(load(None)); "
        "operator.registry(); "
        "operator.configure(kopf.OperatorSettings()); "
        "import importlib.util; print(importlib.util.find_spec('kubernetes') is None, 'kubernetes' in sys.modules)"
    )
    command = operator_command()
    command[command.index("-c") + 1] = code
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "False"]


def test_no_operator_module_imports_the_official_client() -> None:
    sources = [*Path(ROOT, "trainer").rglob("*.py"), *Path(ROOT, "plugins").rglob("*.py")]
    offenders = [
        str(source.relative_to(ROOT))
        for source in sources
        for node in ast.walk(ast.parse(source.read_text()))
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "kubernetes" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kubernetes")
    ]
    assert not offenders


def test_the_cache_keeps_no_managed_fields() -> None:
    cache = Cache()
    sent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "a",
            "namespace": "default",
            "resourceVersion": "3",
            "managedFields": [{"manager": "x"}],
        },
    }
    cache.observe(sent)
    stored = cache.get("ConfigMap", "default", "a")
    assert stored is not None and "managedFields" not in stored["metadata"]
    assert stored["metadata"]["resourceVersion"] == "3"
    assert "managedFields" in sent["metadata"]  # the caller's object is left alone
