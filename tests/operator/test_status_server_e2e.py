"""Progress reporting on the real control plane (the ``TrainJobStatus`` gate; docs/user-guide.md,
"Report progress"; docs/decisions.md §status-server-auth).

A pod of the TrainJob (kwok runs it; no kubelet mounts anything) gets, through TokenRequest, the
token its projected volume would hold: bound to the pod, with the TrainJob's audience. The Kubeflow
SDK's in-pod helper, unmodified, reads the env the pod was given and reports to the operator's
status server on loopback; ``kubectl`` then shows what it wrote. Every refusal is a request that
would otherwise be accepted, and is checked to have written nothing.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
from cluster_helpers import kubectl
from operator_helpers import OPERATOR_USER, TJ, get_or_none, trainjob, wait_for
from status_helpers import audience, running_pod, token_for
from trainer_sandbox.backends import RealCluster
from trainer_sandbox.embedded_operator import EmbeddedOperator

Obj = dict[str, Any]
JS = "jobset.x-k8s.io/v1alpha2"
RUN_FOREVER = [{"name": "SANDBOX_RUN_SECONDS", "value": "-1"}]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims_of(token: str) -> Obj:
    payload = token.split(".")[1]
    claims: Obj = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims


def signed(real: RealCluster, claims: Obj) -> str:
    """A token signed with the control plane's service-account key, as the API server signs them."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    sa_key = real.kubeconfig.parent / "sa.key"  # the ControlPlane's sa_key, beside its kubeconfig
    key = serialization.load_pem_private_key(sa_key.read_bytes(), None)
    assert isinstance(key, rsa.RSAPrivateKey)
    header = {"alg": "RS256", "typ": "JWT"}
    signing_input = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + _b64(signature)


def trainer_status(real: RealCluster, name: str) -> Obj | None:
    status: Obj | None = (real.get(TJ, "TrainJob", name).get("status") or {}).get("trainerStatus")
    return status


def test_the_sdk_reports_progress_that_kubectl_shows_and_every_stranger_is_refused(
    real: RealCluster, status_operator: tuple[EmbeddedOperator, int], tmp_path: Path
) -> None:
    _, port = status_operator
    ns = real.namespace
    mark = real.audit_mark()
    for name in ("progress", "other"):
        real.create(trainjob(name, trainer={"numNodes": 1, "env": RUN_FOREVER}))
    tls_config = wait_for(
        lambda: get_or_none(real, "v1", "ConfigMap", "progress-tls-config"), what="the CA ConfigMap"
    )
    assert tls_config["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    pod, other_pod = running_pod(real, "progress"), running_pod(real, "other")

    # The pod's own spec says where to report, as the kubelet would give it to the container.
    node = next(ct for ct in pod["spec"]["containers"] if ct["name"] == "node")
    env = {e["name"]: e.get("value") for e in node.get("env") or []}
    url = env["KUBEFLOW_TRAINER_SERVER_URL"]
    assert (
        url
        == f"https://127.0.0.1:{port}/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/progress/status"
    )
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "kubeflow-trainer-token"]
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["audience"] == audience(ns, "progress")
    assert sources[1]["configMap"]["name"] == "progress-tls-config"

    # The projected volume's files, as the kubelet would write them.
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    ca = mounted / "ca.crt"
    ca.write_text(tls_config["data"]["ca.crt"])
    token = token_for(real, pod, audience(ns, "progress"))
    (mounted / "token").write_text(token)

    sdk = (
        "import sys\n"
        "from kubeflow.trainer import update_trainjob_status\n"
        "ok = update_trainjob_status(progress_percent=42, estimated_remaining_seconds=120,"
        " metrics={'loss': 0.25, 'epoch': 3})\n"
        "sys.exit(0 if ok else 1)\n"
    )
    child_env = {
        **os.environ,
        "KUBEFLOW_TRAINER_SERVER_URL": url,
        "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(ca),
        "KUBEFLOW_TRAINER_SERVER_TOKEN": str(mounted / "token"),
    }
    done = subprocess.run(
        [sys.executable, "-c", sdk], env=child_env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr

    shown = json.loads(kubectl(real, "get", "trainjob", "progress", "-o", "json", "--show-managed-fields"))
    written = shown["status"]["trainerStatus"]
    assert written["progressPercentage"] == 42 and written["estimatedRemainingSeconds"] == 120, written
    assert written["metrics"] == [{"name": "loss", "value": "0.25"}, {"name": "epoch", "value": "3"}]
    assert written["lastUpdatedTime"].endswith("Z")  # the SDK sent microseconds and +00:00
    managers = {(m["manager"], m.get("subresource")) for m in shown["metadata"]["managedFields"]}
    assert ("trainer-status", "status") in managers
    table = kubectl(real, "get", "trainjobs").splitlines()
    header = table[0].split()
    assert header[:4] == ["NAME", "STATE", "PROGRESS", "%"], table
    row = next(line.split() for line in table[1:] if line.split()[0] == "progress")
    assert "42" in row and "120" in row, table

    def post(bearer: str, data: bytes | str, path_of: str = "progress") -> requests.Response:
        target = url.replace("/trainjobs/progress/", f"/trainjobs/{path_of}/")
        return requests.post(
            target,
            data=data,
            headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"},
            verify=str(ca),
            timeout=10,
        )

    body = json.dumps(
        {"trainerStatus": {"progressPercentage": 99, "lastUpdatedTime": "2026-01-01T00:00:00Z"}}
    )

    def refused(response: requests.Response, code: int, reason: str) -> None:
        assert response.status_code == code, response.text
        assert response.json()["reason"] == reason, response.text
        assert trainer_status(real, "progress") == written, "a refused request wrote"

    # A pod of another TrainJob, with a token for this TrainJob's audience: the API server accepts
    # the token; our rule refuses the pod.
    refused(post(token_for(real, other_pod, audience(ns, "progress")), body), 403, "Forbidden")
    # A pod of this TrainJob, with a token for another audience (the other TrainJob's).
    refused(post(token_for(real, pod, audience(ns, "other")), body), 403, "Forbidden")
    # ... which is good for that other TrainJob's path only by audience: the pod is not its.
    assert post(token_for(real, pod, audience(ns, "other")), body, "other").status_code == 403
    assert trainer_status(real, "other") is None
    # An expired token, signed as the API server signs them, with this pod's own claims.
    claims = claims_of(token)
    now = int(time.time())
    expired = {**claims, "iat": now - 7200, "nbf": now - 7200, "exp": now - 3600}
    refused(post(signed(real, expired), body), 403, "Forbidden")
    # A malformed body, and one over 64 KiB, from the right pod with the right token.
    refused(post(token, '{"trainerStatus": {"progressPercentage": "most"'), 422, "Invalid")
    refused(
        post(token, json.dumps({"trainerStatus": {"metrics": [{"name": "m", "value": "x" * 70000}]}})),
        413,
        "RequestEntityTooLarge",
    )
    # A progress the CRD refuses (above 100) is the API server's 422, with its message.
    over = post(
        token,
        json.dumps({"trainerStatus": {"progressPercentage": 101, "lastUpdatedTime": "2026-01-01T00:00:00Z"}}),
    )
    refused(over, 422, "Invalid")
    assert "progressPercentage" in over.json()["message"]

    # The control: the same claims signed the same way but not expired are accepted, so the
    # expired token was refused for its expiry, not for how it was made.
    fresh = {**claims, "iat": now, "nbf": now, "exp": now + 600}
    accepted = post(signed(real, fresh), body)
    assert accepted.status_code == 200, accepted.text
    assert trainer_status(real, "progress") == {
        "progressPercentage": 99,
        "lastUpdatedTime": "2026-01-01T00:00:00Z",
    }
    # The operator's own status writes leave trainerStatus alone (its field manager is trainer-status).
    assert trainer_status(real, "other") is None
    assert get_or_none(real, JS, "JobSet", "progress") is not None

    # The chart's roles sufficed (nothing refused), and the status server's rules were used.
    # (kopf lists namespaces only when it serves some, as here; the chart's operator serves all.)
    calls = [r for r in real.audit_since(mark) if r.user == OPERATOR_USER and r.resource != "namespaces"]
    assert not [r for r in calls if r.status == 403], [f"{r.verb} {r.path}" for r in calls if r.status == 403]
    assert {("create", "tokenreviews"), ("get", "pods"), ("get", "jobs")} <= {
        (r.verb, r.resource) for r in calls
    }
