"""Credentials: kubeconfig files and in-cluster service accounts, without the official client's weight."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


def test_exec_plugins_go_through_the_official_client(tmp_path: Path) -> None:
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": "from-exec"},
    }
    path = kubeconfig(
        tmp_path / "config",
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": sys.executable,
                "args": ["-c", f"print({json.dumps(json.dumps(credential))})"],
            }
        },
    )
    info = login(str(path))
    assert (info.scheme, info.token) == ("Bearer", "from-exec")


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
    path = kubeconfig(tmp_path / "config", {"token": "abc"})
    code = (
        "import sys; import trainer.controller.main; from trainer.controller.operator import login; "
        f"login({str(path)!r}); print('kubernetes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


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
