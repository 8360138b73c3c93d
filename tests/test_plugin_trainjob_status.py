"""TrainJobStatus (feature gate): the trainer step's containers get the status server's env, a
token for this TrainJob's audience and the CA, and a ``<name>-tls-config`` ConfigMap holds the CA."""

from __future__ import annotations

import copy
from typing import Any

from render_helpers import only, render, replicated_job, rjob, runtime, trainjob

from trainer.offline.cluster import OfflineCluster
from trainer.runtime import framework as fw
from trainer.runtime.info import StatusServer

Obj = dict[str, Any]
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
URL = "https://status.example:10443"
GATED = fw.PluginConfig(feature_gates={"TrainJobStatus": True})
AUDIENCE = "trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/job/status"


def two_step_runtime() -> Obj:
    """A launcher (the first trainer step, two containers), then workers (a second trainer step)."""
    return runtime(
        jobs=[
            replicated_job("dataset-initializer", "dataset-initializer"),
            replicated_job(
                "launcher",
                "trainer",
                [{"name": "node", "image": "img"}, {"name": "sidecar", "image": "img"}],
            ),
            replicated_job("node", "trainer"),
        ]
    )


def render_with(server: StatusServer | None, *objects: Obj, gates: fw.PluginConfig = GATED) -> OfflineCluster:
    cluster = OfflineCluster(framework=fw.load(gates))
    cluster.facts.status_server = server
    for obj in objects:
        cluster.apply(copy.deepcopy(obj))
    return cluster


def pod_spec(jobset: Obj, job: str) -> Obj:
    spec: Obj = rjob(jobset, job)["template"]["spec"]["template"]["spec"]
    return spec


def test_every_container_of_the_first_trainer_step_gets_the_env_the_mount_and_the_volume() -> None:
    cluster = render_with(StatusServer(url=URL + "/", ca_cert=CA), two_step_runtime(), trainjob())
    assert not cluster.refusals
    jobset = only(cluster, "JobSet")
    launcher = pod_spec(jobset, "launcher")
    for container in launcher["containers"]:
        assert container["env"] == [
            {
                "name": "KUBEFLOW_TRAINER_SERVER_URL",
                "value": URL + "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/job/status",
            },
            {"name": "KUBEFLOW_TRAINER_SERVER_CA_CERT", "value": "/var/run/secrets/kubeflow/trainer/ca.crt"},
            {"name": "KUBEFLOW_TRAINER_SERVER_TOKEN", "value": "/var/run/secrets/kubeflow/trainer/token"},
        ]
        assert container["volumeMounts"] == [
            {
                "name": "kubeflow-trainer-token",
                "mountPath": "/var/run/secrets/kubeflow/trainer",
                "readOnly": True,
            }
        ]
    assert launcher["volumes"] == [
        {
            "name": "kubeflow-trainer-token",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": AUDIENCE,
                            "expirationSeconds": 3600,
                            "path": "token",
                        }
                    },
                    {"configMap": {"name": "job-tls-config", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                ]
            },
        }
    ]
    # Only the first trainer step; initializers are not the training.
    for job in ("node", "dataset-initializer"):
        spec = pod_spec(jobset, job)
        assert "volumes" not in spec and all("env" not in ct for ct in spec["containers"]), job
    config_map = only(cluster, "ConfigMap", "job-tls-config")
    assert config_map["data"] == {"ca.crt": CA}
    meta = config_map["metadata"]
    assert meta["labels"] == {"trainer.kubeflow.org/trainjob-name": "job"}
    (owner,) = meta["ownerReferences"]
    assert owner["kind"] == "TrainJob" and owner["name"] == "job" and owner["controller"] is True


def test_gate_off_adds_nothing() -> None:
    server = StatusServer(url=URL, ca_cert=CA)
    for gates in (fw.PluginConfig(), fw.PluginConfig(feature_gates={"TrainJobStatus": False})):
        cluster = render_with(server, two_step_runtime(), trainjob(), gates=gates)
        assert "TrainJobStatus" not in cluster.framework.enabled
        assert not [o for o in cluster.output() if o["metadata"]["name"].endswith("-tls-config")]
        assert "KUBEFLOW_TRAINER" not in str(only(cluster, "JobSet"))
    # Disabled by name with its gate on: off too.
    disabled = fw.load(
        fw.PluginConfig(disabled=frozenset({"TrainJobStatus"}), feature_gates={"TrainJobStatus": True})
    )
    assert "TrainJobStatus" not in disabled.enabled


def test_the_default_runtimes_render_with_the_gate_on() -> None:
    cluster = render_with(StatusServer(url=URL, ca_cert=CA))
    cluster.load_default_runtimes()
    cluster.apply(trainjob(runtime_name="torch-distributed"))
    cluster.apply(trainjob(name="tj", runtime_name="deepspeed-distributed"))
    assert not cluster.refusals
    jobset = only(cluster, "JobSet", "tj")
    # DeepSpeed's launcher is its first trainer step.
    (launcher,) = pod_spec(jobset, "launcher")["containers"]
    assert launcher["env"][-3]["name"] == "KUBEFLOW_TRAINER_SERVER_URL"
    assert "volumes" not in pod_spec(jobset, "node") or all(
        v["name"] != "kubeflow-trainer-token" for v in pod_spec(jobset, "node")["volumes"]
    )


def condition(cluster: OfflineCluster) -> str:
    trainjob_obj = next(o for o in cluster.output() if o["kind"] == "TrainJob")
    (failed,) = [c for c in trainjob_obj["status"]["conditions"] if c["type"] == "ReconcileFailed"]
    return str(failed["message"])


def test_without_a_ca_the_trainjob_fails_to_reconcile_with_upstreams_messages() -> None:
    missing = render_with(None, two_step_runtime(), trainjob())
    assert "failed to look up status server tls secret: no status server is configured" in condition(missing)
    unreadable = render_with(
        StatusServer(url=URL, ca_error="403 Forbidden: no"), two_step_runtime(), trainjob()
    )
    assert "failed to look up status server tls secret: 403 Forbidden: no" in condition(unreadable)
    empty = render_with(StatusServer(url=URL), two_step_runtime(), trainjob())
    assert "failed to find status server ca.crt in tls secret" in condition(empty)
    for cluster in (missing, unreadable, empty):
        assert not [
            o
            for o in cluster.output()
            if o["kind"] in ("JobSet", "ConfigMap") and "tls" in o["metadata"]["name"]
        ]


def test_render_cli_takes_the_gate_the_url_and_the_ca(tmp_path: Any) -> None:
    import json
    import subprocess
    import sys

    import yaml

    ca = tmp_path / "ca.pem"
    ca.write_text(CA)
    manifest = tmp_path / "tj.yaml"
    manifest.write_text(yaml.safe_dump(trainjob(runtime_name="torch-distributed")))
    args = [sys.executable, "-m", "trainer.cli", "render", "-f", str(manifest), "-o", "json"]
    gated = [
        *args,
        "--feature-gates",
        "TrainJobStatus=true",
        "--status-server-url",
        URL,
        "--status-server-ca",
        str(ca),
    ]
    out = json.loads(subprocess.run(gated, capture_output=True, text=True, check=True).stdout)
    (config_map,) = [o for o in out["items"] if o["metadata"]["name"] == "job-tls-config"]
    assert config_map["data"] == {"ca.crt": CA}
    assert URL + "/apis/" in json.dumps(out)
    plain = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
    assert "KUBEFLOW_TRAINER" not in json.dumps(plain)
    bad = subprocess.run([*args, "--feature-gates", "TrainJobStatus"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--feature-gates" in bad.stderr


def test_unaffected_by_render_defaults() -> None:
    # The default framework (no gates) is what every other test renders with.
    assert "TrainJobStatus" not in render(two_step_runtime(), trainjob()).framework.enabled
