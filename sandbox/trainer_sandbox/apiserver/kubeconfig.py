"""Kubeconfig files whose bearer token names a user of the local server."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml


def kubeconfig(
    url: str, token: str, user: str, ca_pem: bytes, namespace: str = "default", context: str = "local"
) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {"server": url, "certificate-authority-data": base64.b64encode(ca_pem).decode()},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {"name": context, "context": {"cluster": context, "user": user, "namespace": namespace}}
        ],
        "current-context": context,
        "preferences": {},
    }
    text: str = yaml.safe_dump(doc, sort_keys=False)
    return text


def write(
    path: str | Path, url: str, token: str, user: str, ca_pem: bytes, namespace: str = "default"
) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(kubeconfig(url, token, user, ca_pem, namespace))
    p.chmod(0o600)
    return p
