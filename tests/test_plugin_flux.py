"""Flux: the wrapped command, the installer init container, the scripts ConfigMap, the CURVE Secret."""

from __future__ import annotations

import base64
import copy
import hashlib
import re
import shutil
import subprocess
import sys
from typing import Any

import kubernetes_validate
import pytest
from render_helpers import ROOT, container, env, only, render, replicated_job, rjob, runtime, trainjob
from trainer.plugins import flux

from trainer.offline.cluster import OfflineCluster, trainjob_uid
from trainer.runtime import framework as fw
from trainer.runtime import render as core

Obj = dict[str, Any]
NOW = "1970-01-01T00:00:00Z"


def flux_runtime(
    *, num_proc: int = 1, node_env: list[Obj] | None = None, init: list[Obj] | None = None
) -> Obj:
    node: Obj = {
        "name": "node",
        "image": "app:img",
        "command": ["python3", "train.py"],
        "args": ["--epochs", "1"],
    }
    if node_env:
        node["env"] = node_env
    rj = replicated_job("node", "trainer", [node])
    if init:
        rj["template"]["spec"]["template"]["spec"]["initContainers"] = init
    return runtime(ml_policy={"numNodes": 1, "flux": {"numProcPerNode": num_proc}}, jobs=[rj])


def rendered(*objects: Obj) -> OfflineCluster:
    cluster = render(*objects)
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    return cluster


def scripts(cluster: OfflineCluster, name: str = "fx") -> dict[str, str]:
    data: dict[str, str] = only(cluster, "ConfigMap", f"{name}-flux-entrypoint")["data"]
    return data


def test_trainer_command_is_wrapped_and_trainjob_args_folded_in() -> None:
    tj = trainjob("fx", trainer={"numNodes": 2, "command": ["trainjob"], "args": ["trainjob"]})
    node = container(only(rendered(flux_runtime(), tj), "JobSet"), "node")
    assert node["command"] == ["/bin/bash", "/etc/flux-config/entrypoint.sh", "trainjob trainjob"]
    assert node["args"] == ["--epochs", "1"], "the template's own args stay"


def test_template_command_is_wrapped_when_the_trainjob_has_none() -> None:
    node = container(
        only(rendered(flux_runtime(), trainjob("fx", trainer={"numNodes": 1})), "JobSet"), "node"
    )
    assert node["command"] == ["/bin/bash", "/etc/flux-config/entrypoint.sh", "python3 train.py"]


def test_volumes_installer_and_mounts() -> None:
    jobset = only(rendered(flux_runtime(), trainjob("fx", trainer={"numNodes": 2})), "JobSet")
    pod = rjob(jobset, "node")["template"]["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "spack-install", "emptyDir": {}},
        {"name": "flux-install", "emptyDir": {}},
        {"name": "fx-flux-entrypoint", "configMap": {"name": "fx-flux-entrypoint", "defaultMode": 0o755}},
        {"name": "shared-memory", "emptyDir": {"medium": "Memory"}},
        {"name": "flux-curve", "secret": {"secretName": "fx-flux-curve", "defaultMode": 0o400}},
    ]
    assert pod["initContainers"] == [
        {
            "name": "flux-installer",
            "image": "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy",
            "command": ["/bin/bash", "/etc/flux-config/init.sh"],
            "volumeMounts": [
                {"name": "flux-install", "mountPath": "/mnt/flux"},
                {"name": "fx-flux-entrypoint", "mountPath": "/etc/flux-config", "readOnly": True},
            ],
        }
    ]
    assert pod["containers"][0]["volumeMounts"] == [
        {"name": "flux-install", "mountPath": "/mnt/flux"},
        {"name": "spack-install", "mountPath": "/opt/software"},
        {"name": "fx-flux-entrypoint", "mountPath": "/etc/flux-config", "readOnly": True},
        {"name": "flux-curve", "mountPath": "/curve", "readOnly": True},
        {"name": "shared-memory", "mountPath": "/dev/shm", "readOnly": True},
    ]
    assert rjob(jobset, "node")["template"]["spec"]["parallelism"] == 2


@pytest.mark.parametrize(
    ("trainer", "num_proc", "hosts", "flags", "resources"),
    [
        ({"numNodes": 1}, 1, "fx-node-0-[0]", "-N 1 -n 1", "--cores=0"),
        ({"numNodes": 4}, 2, "fx-node-0-[0-3]", "-N 4 -n 8", "--cores=0-1"),
        ({"numNodes": 3, "numProcPerNode": 4}, 2, "fx-node-0-[0-2]", "-N 3 -n 12", "--cores=0-3"),
        (
            {"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "2"}}},
            1,
            "fx-node-0-[0-1]",
            "-N 2 -n 2 -g 2",
            "--cores=0 --gpu=0-1",
        ),
    ],
)
def test_scripts_carry_hosts_flags_and_resources(
    trainer: Obj, num_proc: int, hosts: str, flags: str, resources: str
) -> None:
    data = scripts(rendered(flux_runtime(num_proc=num_proc), trainjob("fx", trainer=trainer)))
    assert sorted(data) == ["entrypoint.sh", "init.sh"]
    assert f'hosts="{hosts}"' in data["init.sh"]
    assert f'hosts = [{{ host = "{hosts}" }}]' in data["init.sh"]
    assert f"flux run {flags} ${{command}}" in data["entrypoint.sh"]
    assert f"flux R encode --hosts=${{hosts}} {resources} >" in data["entrypoint.sh"]
    assert '"$(hostname)" = "fx-node-0-0"' in data["entrypoint.sh"]


def test_broker_addresses_and_settings_from_env() -> None:
    data = scripts(rendered(flux_runtime(), trainjob("fx", trainer={"numNodes": 2})))
    assert 'default_bind = "tcp://eth0:%p"' in data["init.sh"]
    assert 'default_connect = "tcp://%h.fx.default.svc.cluster.local:%p"' in data["init.sh"]
    assert 'queue-policy = "fcfs"' in data["init.sh"]

    node_env = [
        {"name": "FLUX_NETWORK_DEVICE", "value": "ib0"},
        {"name": "FLUX_VIEW_IMAGE", "value": "runtime/view:1"},
        {"name": "FLUX_QUEUE_POLICY", "value": "easy"},
    ]
    tj = trainjob(
        "fx", trainer={"numNodes": 2, "env": [{"name": "FLUX_VIEW_IMAGE", "value": "trainjob/view:2"}]}
    )
    cluster = rendered(flux_runtime(node_env=node_env), tj)
    data = scripts(cluster)
    assert 'default_bind = "tcp://ib0:%p"' in data["init.sh"]
    assert 'queue-policy = "easy"' in data["init.sh"]
    jobset = only(cluster, "JobSet")
    installer = rjob(jobset, "node")["template"]["spec"]["template"]["spec"]["initContainers"][0]
    assert installer["image"] == "trainjob/view:2", "the TrainJob's env wins over the runtime's"
    assert env(container(jobset, "node"))["FLUX_VIEW_IMAGE"] == "trainjob/view:2"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_scripts_are_valid_bash() -> None:
    data = scripts(rendered(flux_runtime(), trainjob("fx", trainer={"numNodes": 3})))
    for name, text in data.items():
        assert text.startswith("#!/bin/bash\n") and text.endswith("\n")
        checked = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        assert checked.returncode == 0, f"{name}: {checked.stderr}"


def test_z85_matches_the_rfc_test_vector() -> None:
    assert flux.z85(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])) == "HelloWorld"
    with pytest.raises(ValueError):
        flux.z85(b"abc")


CURVE_LINE = re.compile(r'^    (public|secret)-key = "([^"]{40})"$', re.MULTILINE)


def curve_keys(secret: Obj) -> dict[str, str]:
    """The certificate's Z85 keys, {"public": ..., "secret": ...}."""
    cert = base64.b64decode(secret["data"]["curve.cert"]).decode()
    return dict(CURVE_LINE.findall(cert))


def operator_render(cluster: OfflineCluster, name: str = "fx") -> list[Obj]:
    """Reconcile the admitted TrainJob as the operator does: with the cluster's facts, no seed."""
    return core.render(
        copy.deepcopy(cluster.trainjobs[("default", name)]), cluster.facts, fw.default(), NOW
    ).objects


def curve_of(name: str) -> Obj:
    """The CURVE Secret `trainer render` writes for a fresh TrainJob of that name."""
    return only(
        rendered(flux_runtime(), trainjob(name, trainer={"numNodes": 1})), "Secret", f"{name}-flux-curve"
    )


def upstream_key(name: str) -> str:
    """Upstream's secret key, SHA-256 of the uid, in Z85."""
    return flux.z85(hashlib.sha256(trainjob_uid("default", name).encode()).digest())


def curve_secrets(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] == "Secret"]


def test_curve_secret_is_an_immutable_certificate_whose_keys_match() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    secret = curve_of("fx")
    assert secret["type"] == "Opaque" and secret["immutable"] is True
    assert list(secret["data"]) == ["curve.cert"]
    keys = curve_keys(secret)
    cert = base64.b64decode(secret["data"]["curve.cert"]).decode()
    assert cert == (
        "#  ZeroMQ CURVE Secret Certificate\n"
        "#  Generated by the Kubeflow Trainer operator\n"
        "\n"
        "metadata\n"
        '    name = "fx"\n'
        "curve\n"
        f'    public-key = "{keys["public"]}"\n'
        f'    secret-key = "{keys["secret"]}"\n'
    )
    private = z85_decode(keys["secret"])
    public = X25519PrivateKey.from_private_bytes(private).public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert keys["public"] == flux.z85(raw)
    for seed in (None, b"seed"):
        private, public_raw = flux.generate_curve_key(seed)
        assert len(private) == len(public_raw) == 32
        derived = X25519PrivateKey.from_private_bytes(private).public_key()
        assert derived.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == public_raw


def test_curve_key_is_not_derived_from_the_uid() -> None:
    """Upstream's key, SHA-256 of the uid, is computable by anyone who can read the TrainJob."""
    cluster = rendered(flux_runtime(), trainjob("fx", trainer={"numNodes": 1}))
    upstream = upstream_key("fx")
    assert curve_keys(only(cluster, "Secret", "fx-flux-curve"))["secret"] != upstream
    cluster.facts.remove("Secret", "default", "fx-flux-curve")
    (operator,) = curve_secrets(operator_render(cluster))
    assert curve_keys(operator)["secret"] != upstream


def test_curve_keys_are_random_without_a_seed_and_reproducible_with_one() -> None:
    assert flux.generate_curve_key(None) != flux.generate_curve_key(None)
    assert flux.generate_curve_key(b"seed") == flux.generate_curve_key(b"seed")
    assert flux.generate_curve_key(b"seed") != flux.generate_curve_key(b"other")
    # The operator (no seed): two reconciles of one TrainJob without its Secret, two keys.
    cluster = rendered(flux_runtime(), trainjob("fx", trainer={"numNodes": 1}))
    cluster.facts.remove("Secret", "default", "fx-flux-curve")
    (first,) = curve_secrets(operator_render(cluster))
    (second,) = curve_secrets(operator_render(cluster))
    assert curve_keys(first) != curve_keys(second), "no seed: keys come from the os's randomness"
    # `trainer render` (seeded from the input): another TrainJob, another key; the same, the same bytes.
    secret = curve_of("fx")
    assert curve_keys(curve_of("fy")) != curve_keys(secret)
    assert curve_of("fx") == secret


def test_the_curve_secret_this_trainjob_made_is_kept() -> None:
    cluster = rendered(flux_runtime(), trainjob("fx", trainer={"numNodes": 2}, suspend=True))
    made = only(cluster, "Secret", "fx-flux-curve")
    # Resuming reconciles again: the Secret it made is kept, never written over.
    cluster.apply(trainjob("fx", trainer={"numNodes": 2}, suspend=False))
    assert not cluster.refusals and only(cluster, "Secret", "fx-flux-curve") == made
    # The operator's reconcile, too, leaves it alone but writes the ConfigMap.
    objects = operator_render(cluster)
    assert not curve_secrets(objects)
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"] == ["fx-flux-entrypoint"]


def test_a_curve_secret_planted_under_its_name_is_refused_never_mounted() -> None:
    """A namespace peer's Secret named ``<name>-flux-curve`` would have been the brokers' key."""
    planted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "fx-flux-curve", "namespace": "default"},
        "type": "Opaque",
        "data": {"curve.cert": "Y2VydA=="},
    }
    cluster = render(planted, flux_runtime(), trainjob("fx", trainer={"numNodes": 2}))
    assert not [o for o in cluster.output() if o["kind"] in ("JobSet", "Secret")]
    conditions = cluster.trainjobs[("default", "fx")]["status"]["conditions"]
    (failed,) = [c for c in conditions if c["type"] == "ReconcileFailed"]
    assert "Secret default/fx-flux-curve exists and is not this TrainJob's" in failed["message"]


def test_render_cli_show_secrets_gives_the_same_curve_key(tmp_path: Any) -> None:
    import yaml

    manifest = tmp_path / "flux.yaml"
    manifest.write_text(yaml.safe_dump_all([flux_runtime(), trainjob("fx", trainer={"numNodes": 2})]))
    command = [sys.executable, "-m", "trainer.cli", "render", "--no-default-runtimes", "-f", str(manifest)]
    shown = [
        subprocess.run(
            [*command, "--show-secrets"], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout
        for _ in range(2)
    ]
    assert shown[0] == shown[1]
    (secret,) = [d for d in yaml.safe_load_all(shown[0]) if d["kind"] == "Secret"]
    assert curve_keys(secret)["secret"] != upstream_key("fx")


def z85_decode(text: str) -> bytes:
    """The inverse of flux.z85, for reading a certificate's keys back."""
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for ch in text[i : i + 5]:
            value = value * 85 + flux._Z85.index(ch)
        out += value.to_bytes(4, "big")
    return bytes(out)


def test_children_are_valid_and_owned() -> None:
    cluster = rendered(flux_runtime(), trainjob("fx", trainer={"numNodes": 2}))
    for kind, name in (("ConfigMap", "fx-flux-entrypoint"), ("Secret", "fx-flux-curve")):
        obj = only(cluster, kind, name)
        assert obj["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-name": "fx"}
        assert obj["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
        kubernetes_validate.validate(obj, "1.32", strict=True)


def test_reserved_installer_init_container_is_refused() -> None:
    rt = flux_runtime(init=[{"name": "flux-installer", "image": "ubuntu:22.04"}])
    cluster = render(rt, trainjob("fx", trainer={"numNodes": 1}))
    (line,) = [line for refusal in cluster.refusals for line in refusal.lines()]
    assert "InitContainer 'flux-installer' is reserved" in line
    assert "spec.template.spec.replicatedJobs[0].template.spec.template.spec.initContainers[0]" in line
    other = flux_runtime(init=[{"name": "prepare", "image": "ubuntu:22.04"}])
    pod = rjob(only(rendered(other, trainjob("fx", trainer={"numNodes": 1})), "JobSet"), "node")
    names = [c["name"] for c in pod["template"]["spec"]["template"]["spec"]["initContainers"]]
    assert names == ["prepare", "flux-installer"]
