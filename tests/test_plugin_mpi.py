"""MPI: node counts, slots, SSH key Secret, hostfile, launcher env per implementation, admission.

Objects are rendered in process through the offline cluster (admission + reconcile), or by calling
the render core directly when a test needs chosen cluster facts.
"""

from __future__ import annotations

import base64
import copy
import subprocess
import sys
import time
from typing import Any

import kubernetes_validate
import pytest
from render_helpers import ROOT, container, env, only, render, replicated_job, rjob, runtime, trainjob
from trainer.plugins import mpi

from trainer.offline.cluster import OfflineCluster
from trainer.runtime import framework as fw
from trainer.runtime import render as core
from trainer.runtime.info import Facts

LABEL = "trainer.kubeflow.org/trainjob-name"

Obj = dict[str, Any]
NOW = "1970-01-01T00:00:00Z"
OMPI_ENV = [
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots",
    "OMPI_MCA_plm_rsh_args",
]


def mpi_runtime(
    *,
    implementation: str | None = "OpenMPI",
    num_proc: int | None = 8,
    as_node: bool = False,
    launcher_container: str = "node",
    node_resources: Obj | None = None,
    **mpi_extra: Any,
) -> Obj:
    """The usual layout (node = trainer ancestor), or deepspeed's with ``as_node`` (launcher = trainer)."""
    policy: Obj = {"runLauncherAsNode": as_node, **mpi_extra}
    if implementation is not None:
        policy["mpiImplementation"] = implementation
    if num_proc is not None:
        policy["numProcPerNode"] = num_proc
    node: Obj = {"name": "node", "image": "mpi:img", "command": ["/usr/sbin/sshd", "-De"]}
    if node_resources is not None:
        node["resources"] = node_resources
    launcher: Obj = {
        "name": launcher_container,
        "image": "mpi:img",
        "command": ["mpirun"],
        "args": ["echo.sh"],
        "env": [{"name": "TEMPLATE_ENV", "value": "1"}],
    }
    init = {"name": "setup", "image": "busybox"}
    jobs = [
        replicated_job("node", None if as_node else "trainer", [node]),
        replicated_job(
            "launcher", "trainer" if as_node else None, [launcher, {"name": "sidecar", "image": "s"}]
        ),
    ]
    jobs[1]["template"]["spec"]["template"]["spec"]["initContainers"] = [init]
    return runtime(ml_policy={"numNodes": 1, "mpi": policy}, jobs=jobs)


def trainer_job(name: str = "alpha", **trainer: Any) -> Obj:
    return trainjob(name, trainer=trainer)


def rendered(*objects: Obj) -> OfflineCluster:
    cluster = render(*objects)
    assert not cluster.refusals, [r.lines() for r in cluster.refusals]
    return cluster


def hostfile_of(cluster: OfflineCluster, name: str = "alpha") -> str:
    text: str = only(cluster, "ConfigMap", f"{name}-mpi-hostfile")["data"]["hostfile"]
    return text


def pod(jobset: Obj, job: str) -> Obj:
    spec: Obj = rjob(jobset, job)["template"]["spec"]["template"]["spec"]
    return spec


# --- pod spec ---


def test_openmpi_launcher_gets_hostfile_ssh_and_env_after_its_own() -> None:
    cluster = rendered(mpi_runtime(), trainer_job(numNodes=2))
    jobset = only(cluster, "JobSet")
    launcher = container(jobset, "launcher")
    assert [e["name"] for e in launcher["env"]] == ["TEMPLATE_ENV", *OMPI_ENV]
    assert env(launcher) == {
        "TEMPLATE_ENV": "1",
        "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_set_default_slots": "8",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
    }
    assert launcher["volumeMounts"] == [
        {"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"},
        {"name": "mpi-hostfile", "mountPath": "/etc/mpi"},
    ]
    assert launcher["command"] == ["mpirun"] and launcher["args"] == ["echo.sh"]
    volumes = pod(jobset, "launcher")["volumes"]
    assert volumes == [
        {
            "name": "mpi-ssh-auth",
            "secret": {
                "secretName": "alpha-mpi-ssh-auth",
                "defaultMode": 0o400,
                "items": [
                    {"key": "ssh-privatekey", "path": "id_rsa", "mode": 0o640},
                    {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 0o644},
                    {"key": "ssh-publickey", "path": "authorized_keys", "mode": 0o644},
                ],
            },
        },
        {
            "name": "mpi-hostfile",
            "configMap": {
                "name": "alpha-mpi-hostfile",
                "items": [{"key": "hostfile", "path": "hostfile", "mode": 0o444}],
            },
        },
    ]


def test_private_key_is_never_readable_by_others() -> None:
    jobset = only(rendered(mpi_runtime(), trainer_job(numNodes=2)), "JobSet")
    for job in ("node", "launcher"):
        secret = next(v for v in pod(jobset, job)["volumes"] if v["name"] == "mpi-ssh-auth")["secret"]
        private = [item for item in secret["items"] if item["key"] == "ssh-privatekey"]
        assert private and all(item["mode"] & 0o007 == 0 for item in private)
        assert secret["defaultMode"] & 0o077 == 0


def test_nodes_get_ssh_only_and_other_containers_nothing() -> None:
    jobset = only(
        rendered(mpi_runtime(), trainer_job(numNodes=2, env=[{"name": "TJ", "value": "v"}])), "JobSet"
    )
    node = container(jobset, "node")
    assert node["volumeMounts"] == [{"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"}]
    assert not set(env(node)) & set(OMPI_ENV)
    assert [v["name"] for v in pod(jobset, "node")["volumes"]] == ["mpi-ssh-auth"]
    sidecar = container(jobset, "launcher", "sidecar")
    assert "volumeMounts" not in sidecar and "env" not in sidecar
    assert pod(jobset, "launcher")["initContainers"] == [{"name": "setup", "image": "busybox"}]
    assert "TJ" not in env(container(jobset, "launcher"))


def test_launcher_container_not_named_node_gets_volumes_but_no_mounts_or_env() -> None:
    jobset = only(rendered(mpi_runtime(launcher_container="launcher"), trainer_job(numNodes=2)), "JobSet")
    launcher = container(jobset, "launcher", "launcher")
    assert "volumeMounts" not in launcher
    assert set(env(launcher)) == {"TEMPLATE_ENV"}
    assert [v["name"] for v in pod(jobset, "launcher")["volumes"]] == ["mpi-ssh-auth", "mpi-hostfile"]


def test_yaml_anchors_shared_between_jobs_do_not_carry_launcher_env_to_nodes() -> None:
    import yaml

    text = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: rt}
spec:
  mlPolicy: {numNodes: 1, mpi: {}}
  template:
    spec:
      replicatedJobs:
      - name: node
        template:
          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
          spec: {template: {spec: {containers: &same [{name: node, image: img}]}}}
      - name: launcher
        template:
          spec: {template: {spec: {containers: *same}}}
"""
    rt = yaml.safe_load(text)
    jobs = rt["spec"]["template"]["spec"]["replicatedJobs"]
    assert (
        jobs[0]["template"]["spec"]["template"]["spec"]["containers"]
        is (jobs[1]["template"]["spec"]["template"]["spec"]["containers"])
    )
    cluster = render(rt, trainer_job(numNodes=2))
    jobset = only(cluster, "JobSet")
    assert "env" not in container(jobset, "node")
    assert [m["name"] for m in container(jobset, "node")["volumeMounts"]] == ["mpi-ssh-auth"]
    assert set(env(container(jobset, "launcher"))) == set(OMPI_ENV)


@pytest.mark.parametrize(
    ("implementation", "expected_env", "line"),
    [
        (
            "Intel",
            {
                "I_MPI_HYDRA_HOST_FILE": "/etc/mpi/hostfile",
                "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-o ConnectionAttempts=10",
            },
            "alpha-node-0-{i}.alpha:8\n",
        ),
        (
            "MPICH",
            {"HYDRA_HOST_FILE": "/etc/mpi/hostfile", "HYDRA_LAUNCH_EXTRA_ARGS": "-o ConnectionAttempts=10"},
            "alpha-node-0-{i}.alpha:8\n",
        ),
        (
            "OpenMPI",
            {
                "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
                "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                "OMPI_MCA_orte_set_default_slots": "8",
                "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            },
            "alpha-node-0-{i}.alpha slots=8\n",
        ),
    ],
)
def test_each_implementation_has_its_env_and_hostfile_lines(
    implementation: str, expected_env: Obj, line: str
) -> None:
    cluster = rendered(mpi_runtime(implementation=implementation), trainer_job(numNodes=3))
    launcher = container(only(cluster, "JobSet"), "launcher")
    assert env(launcher) == {"TEMPLATE_ENV": "1", **expected_env}
    assert [m["name"] for m in launcher["volumeMounts"]] == ["mpi-ssh-auth", "mpi-hostfile"]
    assert hostfile_of(cluster) == "".join(line.format(i=i) for i in range(3))
    only(cluster, "Secret", "alpha-mpi-ssh-auth")


def test_empty_implementation_is_a_clear_reconcile_error() -> None:
    cluster = rendered(mpi_runtime(implementation=""), trainer_job(numNodes=2))
    kinds = [o["kind"] for o in cluster.output()]
    assert kinds == ["TrainJob", "ConfigMap"], "only the runtime snapshot is written when the build fails"
    (cond,) = only(cluster, "TrainJob")["status"]["conditions"]
    assert cond["type"] == "ReconcileFailed" and cond["status"] == "True"
    assert cond["message"].startswith(
        "TrainJob resources reconciliation failed: MPI implementation '' is not supported"
    )
    assert "spec.mlPolicy.mpi.mpiImplementation" in cond["message"] and "0x" not in cond["message"]


def test_a_failed_first_build_pins_the_runtime_it_read() -> None:
    """The snapshot is written before the phases run, so fixing the runtime later does not reach
    a TrainJob whose first build failed (upstream writes it first too)."""
    broken, fixed = mpi_runtime(implementation=""), mpi_runtime()
    relabelled = trainer_job(numNodes=2)
    relabelled["metadata"]["labels"] = {"try": "again"}
    cluster = rendered(broken, trainer_job(numNodes=2), fixed, relabelled)
    assert sorted(o["kind"] for o in cluster.output()) == ["ConfigMap", "TrainJob"]
    snapshot = only(cluster, "ConfigMap", "alpha-runtime-snapshot")["data"]["runtime"]
    assert "mpiImplementation: ''" in snapshot
    (cond,) = only(cluster, "TrainJob")["status"]["conditions"]
    assert cond["type"] == "ReconcileFailed"


def test_empty_implementation_without_a_launcher_node_container_renders() -> None:
    cluster = rendered(mpi_runtime(implementation="", launcher_container="launcher"), trainer_job(numNodes=2))
    assert hostfile_of(cluster) == ""


def test_absent_fields_take_the_crd_defaults() -> None:
    cluster = rendered(mpi_runtime(implementation=None, num_proc=None), trainer_job(numNodes=2))
    launcher = container(only(cluster, "JobSet"), "launcher")
    assert env(launcher)["OMPI_MCA_orte_set_default_slots"] == "1"
    assert launcher["volumeMounts"][0] == {"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"}
    assert hostfile_of(cluster) == "alpha-node-0-0.alpha slots=1\nalpha-node-0-1.alpha slots=1\n"


# --- counts and slots ---


@pytest.mark.parametrize(("num_nodes", "nodes"), [(1, 1), (2, 1), (3, 2), (10, 9)])
def test_launcher_as_node_takes_one_node(num_nodes: int, nodes: int) -> None:
    cluster = rendered(mpi_runtime(as_node=True, num_proc=1), trainer_job("ds", numNodes=num_nodes))
    jobset = only(cluster, "JobSet")
    assert rjob(jobset, "node")["template"]["spec"]["parallelism"] == nodes
    assert rjob(jobset, "launcher")["template"]["spec"]["parallelism"] == 1
    lines = [f"ds-node-0-{i}.ds slots=1\n" for i in range(nodes)] + ["ds-launcher-0-0.ds slots=1\n"]
    assert hostfile_of(cluster, "ds") == "".join(lines)


def test_counts_from_the_runtime_when_the_trainjob_gives_none() -> None:
    rt = mpi_runtime()
    rt["spec"]["mlPolicy"]["numNodes"] = 3
    assert hostfile_of(rendered(rt, trainjob("alpha"))).count("\n") == 3


def test_hostfile_uses_subdomain_and_replicas() -> None:
    rt = mpi_runtime()
    rt["spec"]["template"]["spec"]["network"] = {"subdomain": "mpi"}
    cluster = rendered(rt, trainer_job(numNodes=2))
    assert hostfile_of(cluster) == "alpha-node-0-0.mpi slots=8\nalpha-node-0-1.mpi slots=8\n"


@pytest.mark.parametrize(
    ("runtime_nproc", "trainjob_extra", "slots"),
    [
        (1, {"numProcPerNode": 8}, 8),
        (1, {"resourcesPerNode": {"requests": {"custom.com/gpu": "5"}}}, 5),
        (1, {"resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}}, 4),
        (1, {"resourcesPerNode": {"requests": {"nvidia.com/gpu": "1"}}}, 1),
        (1, {}, 1),
        (4, {"resourcesPerNode": {"requests": {"nvidia.com/gpu": "8"}}}, 4),
        (4, {"numProcPerNode": 2, "resourcesPerNode": {"requests": {"nvidia.com/gpu": "8"}}}, 2),
    ],
)
def test_slots(runtime_nproc: int, trainjob_extra: Obj, slots: int) -> None:
    cluster = rendered(mpi_runtime(num_proc=runtime_nproc), trainer_job(numNodes=1, **trainjob_extra))
    assert env(container(only(cluster, "JobSet"), "launcher"))["OMPI_MCA_orte_set_default_slots"] == str(
        slots
    )
    assert hostfile_of(cluster) == f"alpha-node-0-0.alpha slots={slots}\n"


def test_slots_from_runtime_gpus_when_the_trainjob_has_no_resources() -> None:
    rt = mpi_runtime(num_proc=1, node_resources={"limits": {"nvidia.com/gpu": "2"}})
    assert hostfile_of(rendered(rt, trainer_job(numNodes=1))) == "alpha-node-0-0.alpha slots=2\n"


def test_an_empty_resources_block_is_the_one_slots_are_read_from() -> None:
    """The first `node` container with a resources block counts, even an empty one
    (docs/upstream-behaviour.md §mpi)."""
    rt = mpi_runtime(num_proc=1, as_node=True, node_resources={})
    launcher = rt["spec"]["template"]["spec"]["replicatedJobs"][1]
    launcher["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": 4}
    }
    hostfile = hostfile_of(rendered(rt, trainer_job(numNodes=2)))
    assert hostfile == "alpha-node-0-0.alpha slots=1\nalpha-launcher-0-0.alpha slots=1\n"


# --- the SSH Secret ---


def test_ssh_secret_is_an_immutable_p521_key_pair() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    secret = only(rendered(mpi_runtime(), trainer_job(numNodes=2)), "Secret")
    assert secret["type"] == "kubernetes.io/ssh-auth" and secret["immutable"] is True
    assert sorted(secret["data"]) == ["ssh-privatekey", "ssh-publickey"]
    meta = secret["metadata"]
    assert meta["name"] == "alpha-mpi-ssh-auth"
    assert meta["labels"] == {"trainer.kubeflow.org/trainjob-name": "alpha"}
    (owner,) = meta["ownerReferences"]
    assert owner["kind"] == "TrainJob" and owner["name"] == "alpha" and owner["controller"] is True
    pem = base64.b64decode(secret["data"]["ssh-privatekey"])
    public = base64.b64decode(secret["data"]["ssh-publickey"])
    assert pem.startswith(b"-----BEGIN EC PRIVATE KEY-----\n")
    key = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp521r1"
    assert (
        public.startswith(b"ecdsa-sha2-nistp521 AAAA") and public.endswith(b"\n") and public.count(b"\n") == 1
    )
    expected = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert public == expected + b"\n"
    kubernetes_validate.validate(secret, "1.32", strict=True)


def test_hostfile_configmap_is_a_valid_child() -> None:
    configmap = only(rendered(mpi_runtime(), trainer_job(numNodes=2)), "ConfigMap", "alpha-mpi-hostfile")
    assert configmap["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-name": "alpha"}
    assert configmap["metadata"]["ownerReferences"][0]["uid"]
    kubernetes_validate.validate(configmap, "1.32", strict=True)


def test_keys_are_random_without_a_seed_and_reproducible_with_one() -> None:
    assert mpi.generate_ssh_key(None) != mpi.generate_ssh_key(None)
    assert mpi.generate_ssh_key(b"seed") == mpi.generate_ssh_key(b"seed")
    assert mpi.generate_ssh_key(b"seed") != mpi.generate_ssh_key(b"other")


def admitted_cluster(*objects: Obj) -> tuple[OfflineCluster, Obj]:
    cluster = rendered(*objects)
    (trainjob_obj,) = cluster.trainjobs.values()
    return cluster, trainjob_obj


def test_operator_reconcile_uses_fresh_keys_and_never_rekeys() -> None:
    framework = fw.default()
    cluster, tj = admitted_cluster(mpi_runtime(), trainer_job(numNodes=2))
    kept = cluster.facts.get("Secret", "default", "alpha-mpi-ssh-auth")
    assert kept is not None
    cluster.facts.remove("Secret", "default", "alpha-mpi-ssh-auth")
    first = core.render(copy.deepcopy(tj), cluster.facts, framework, NOW)
    second = core.render(copy.deepcopy(tj), cluster.facts, framework, NOW)
    cluster.facts.put(kept)
    secrets = [next(o for o in out.objects if o["kind"] == "Secret") for out in (first, second)]
    assert secrets[0]["data"] != secrets[1]["data"], "no seed: the operator's keys come from os randomness"
    # With the Secret present the reconcile leaves it alone but still writes the hostfile.
    again = core.render(copy.deepcopy(tj), cluster.facts, framework, NOW)
    assert again.error is None, "the Secret it made is this TrainJob's: kept"
    assert "Secret" not in [o["kind"] for o in again.objects]
    assert any(o["metadata"]["name"] == "alpha-mpi-hostfile" for o in again.objects)


def test_a_secret_planted_under_the_keys_name_is_refused_never_mounted() -> None:
    """A namespace peer's Secret named ``<name>-mpi-ssh-auth`` was mounted as the job's SSH key:
    whoever planted it held the key to every node. An existing Secret is kept only when this
    TrainJob controls it (docs/decisions.md §11); otherwise the TrainJob says
    so on its status and in an Event, and nothing is built."""
    planted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "alpha-mpi-ssh-auth", "namespace": "default", "labels": {LABEL: "alpha"}},
        "type": "kubernetes.io/ssh-auth",
        "data": {"ssh-privatekey": "a2V5", "ssh-publickey": "cHVi"},
    }
    cluster = render(planted, mpi_runtime(), trainjob("alpha", trainer={"numNodes": 2}))
    out = cluster.output()
    built = {(o["kind"], o["metadata"]["name"]) for o in out if o["kind"] not in ("Secret", "TrainJob")}
    assert not [o for o in out if o["kind"] == "Secret"], "no key made over it"
    # Only the runtime snapshot, which is pinned before anything is built (as upstream does).
    assert built == {("ConfigMap", "alpha-runtime-snapshot")}
    status = cluster.trainjobs[("default", "alpha")]["status"]
    failed = {c["type"]: c for c in status["conditions"]}["ReconcileFailed"]
    assert failed["status"] == "True"
    assert (
        "Secret default/alpha-mpi-ssh-auth exists and is not this TrainJob's (it has no controller)"
        in (failed["message"])
    )


def test_a_secret_another_trainjob_controls_is_refused() -> None:
    """The controller's uid decides, not the name or our label."""
    owner = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": "beta",
        "uid": "beta-uid",
        "controller": True,
    }
    planted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "alpha-mpi-ssh-auth",
            "namespace": "default",
            "labels": {LABEL: "alpha"},
            "ownerReferences": [owner],
        },
        "type": "kubernetes.io/ssh-auth",
        "data": {"ssh-privatekey": "a2V5", "ssh-publickey": "cHVi"},
    }
    cluster = render(planted, mpi_runtime(), trainjob("alpha", trainer={"numNodes": 2}))
    assert not [o for o in cluster.output() if o["kind"] == "JobSet"]
    conditions = cluster.trainjobs[("default", "alpha")]["status"]["conditions"]
    (failed,) = [c for c in conditions if c["type"] == "ReconcileFailed"]
    assert "(controlled by TrainJob beta uid beta-uid)" in failed["message"]


def test_hostfile_is_rewritten_while_the_jobset_is_frozen() -> None:
    framework = fw.default()
    cluster, tj = admitted_cluster(mpi_runtime(), trainer_job(numNodes=2))
    assert cluster.facts.get("JobSet", "default", "alpha") is not None
    outcome = core.render(copy.deepcopy(tj), cluster.facts, framework, NOW)
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in outcome.objects)
    assert kinds == [("ConfigMap", "alpha-mpi-hostfile")], "running JobSet and Secret are not rewritten"


def test_secret_material_never_reaches_errors_or_events() -> None:
    from trainer.runtime.hookspecs import hookimpl
    from trainer.runtime.info import Info, PluginError

    class FailsAfterMPI:
        name = "FailsAfterMPI"

        def needed_by(self, spec: Any) -> bool:
            return False

        @hookimpl
        def trainer_build(self, info: Info) -> None:
            raise PluginError("build failed")

    framework = fw.load(extra=[FailsAfterMPI()])
    cluster = render(mpi_runtime(), trainer_job(numNodes=2), fw=framework)
    secret = mpi.generate_ssh_key(cluster_seed("alpha"))
    said = " ".join([*cluster.warnings, str(only(cluster, "TrainJob").get("status"))])
    for material in secret:
        assert material.decode().strip() not in said
        assert base64.b64encode(material).decode() not in said
    assert "build failed" in said


def cluster_seed(name: str) -> bytes:
    from trainer.offline.cluster import render_seed, trainjob_uid

    return render_seed(trainjob_uid("default", name))


def test_render_cli_redacts_secrets_and_show_secrets_is_deterministic(tmp_path: Any) -> None:
    import yaml

    manifest = tmp_path / "mpi.yaml"
    manifest.write_text(yaml.safe_dump_all([mpi_runtime(), trainer_job(numNodes=2)]))
    command = [sys.executable, "-m", "trainer.cli", "render", "--no-default-runtimes", "-f", str(manifest)]
    redacted = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    shown = [
        subprocess.run(
            [*command, "--show-secrets"], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout
        for _ in range(2)
    ]
    assert shown[0] == shown[1]
    secret = next(d for d in yaml.safe_load_all(shown[0]) if d["kind"] == "Secret")
    assert base64.b64decode(secret["data"]["ssh-privatekey"]).startswith(b"-----BEGIN EC PRIVATE KEY")
    assert secret["data"]["ssh-privatekey"] not in redacted
    hidden = next(d for d in yaml.safe_load_all(redacted) if d["kind"] == "Secret")
    assert hidden["data"] == {"ssh-privatekey": "<redacted>", "ssh-publickey": "<redacted>"}


# --- admission ---


def refusal_lines(cluster: OfflineCluster) -> list[str]:
    return [line for refusal in cluster.refusals for line in refusal.lines()]


def test_reserved_env_is_refused_per_implementation() -> None:
    envs = [
        {"name": "OMPI_MCA_plm_rsh_args", "value": "x"},
        {"name": "OMPI_MCA_orte_default_hostfile", "value": "x"},
        {"name": "I_MPI_HYDRA_HOST_FILE", "value": "x"},
        {"name": "HYDRA_HOST_FILE", "value": "x"},
    ]
    expected = {
        "OpenMPI": "[OMPI_MCA_orte_default_hostfile OMPI_MCA_plm_rsh_args]",
        # The empty implementation the schema admits reserves OpenMPI's names, as upstream does.
        "": "[OMPI_MCA_orte_default_hostfile OMPI_MCA_plm_rsh_args]",
        "Intel": "[I_MPI_HYDRA_HOST_FILE]",
        "MPICH": "[HYDRA_HOST_FILE]",
    }
    for implementation, names in expected.items():
        lines = refusal_lines(render(mpi_runtime(implementation=implementation), trainer_job(env=envs)))
        assert len(lines) == 1, lines
        assert "spec.trainer.env" in lines[0]
        assert f"must not have reserved envs, invalid envs configured: {names}" in lines[0]


def test_non_reserved_env_is_admitted() -> None:
    rendered(mpi_runtime(implementation="Intel"), trainer_job(env=[{"name": "OMPI_MCA_btl", "value": "tcp"}]))


def test_launcher_as_node_needs_both_jobs_for_several_nodes() -> None:
    rt = runtime(
        ml_policy={"numNodes": 1, "mpi": {"runLauncherAsNode": True}},
        jobs=[replicated_job("node", "trainer", [{"name": "node", "image": "i"}])],
    )
    (line,) = refusal_lines(render(rt, trainer_job(numNodes=2)))
    assert line.startswith("TrainJob default/alpha: spec.trainer.numNodes: Invalid value: 2:")
    assert "runLauncherAsNode" in line and "launcher" in line
    rendered(rt, trainer_job(numNodes=1))


# --- hostfile size (docs/decisions.md §6) ---


def fits(name: str, nodes: int) -> OfflineCluster:
    return render(mpi_runtime(), trainer_job(name, numNodes=nodes))


def test_hostfile_size_arithmetic_matches_the_rendered_hostfile() -> None:
    """The admission check computes the size without building it; it must agree byte for byte."""
    cases = [
        (mpi_runtime(), trainer_job("a", numNodes=1)),
        (mpi_runtime(), trainer_job("abc", numNodes=101)),
        (mpi_runtime(implementation="Intel", num_proc=12), trainer_job("x-y", numNodes=1000)),
        (mpi_runtime(as_node=True), trainer_job("ds", numNodes=11)),
        (mpi_runtime(), trainer_job("n", numNodes=0)),
    ]
    with_replicas = mpi_runtime()
    with_replicas["spec"]["template"]["spec"]["replicatedJobs"][0]["replicas"] = 12
    with_replicas["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["metadata"] = {}
    with_replicas["spec"]["template"]["spec"]["network"] = {"subdomain": "sub"}
    cases.append((with_replicas, trainer_job("r", numNodes=1)))
    for rt, tj in cases:
        cluster = rendered(rt, tj)
        (tj_obj,) = cluster.trainjobs.values()
        info = info_for(cluster, tj_obj)
        policy = info.ml_policy.mpi  # type: ignore[union-attr]
        assert policy is not None
        name = tj_obj["metadata"]["name"]
        assert mpi.hostfile_size(info, policy) == len("hostfile") + len(hostfile_of(cluster, name).encode())


def info_for(cluster: OfflineCluster, tj_obj: Obj) -> Any:
    from trainer.api.views import TrainingRuntime, TrainJob
    from trainer.runtime.build import build_info

    runtime_obj = cluster.facts.get("ClusterTrainingRuntime", None, "rt")
    assert runtime_obj is not None
    return build_info(
        TrainJob(tj_obj),
        tj_obj,
        TrainingRuntime(runtime_obj),
        runtime_obj,
        Facts(),
    )


def test_hostfile_limit_at_its_boundary() -> None:
    """Find a name and node count whose ConfigMap is exactly 1 MiB: admitted; one node more: refused,
    saying how many fit."""
    limit = mpi.CONFIGMAP_LIMIT
    for length in range(1, 64):
        name = "j" * length
        cluster = rendered(mpi_runtime(), trainer_job(name, numNodes=1))
        info = info_for(cluster, next(iter(cluster.trainjobs.values())))
        low, high = 1, limit  # the largest node count that fits, by bisection
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (
                (middle, high)
                if mpi.hostfile_size(info, info.ml_policy.mpi, middle) <= limit
                else (low, middle)
            )
        nodes = low
        if mpi.hostfile_size(info, info.ml_policy.mpi, nodes) == limit:
            break
    else:
        pytest.fail("no name length gives an exact fit")
    at_limit = fits(name, nodes)
    assert not at_limit.refusals, refusal_lines(at_limit)
    assert len("hostfile") + len(hostfile_of(at_limit, name)) == limit
    (line,) = refusal_lines(fits(name, nodes + 1))
    assert "spec.trainer.numNodes" in line
    assert f"must be at most {nodes}:" in line and f"{nodes} nodes fit" in line
    assert str(limit) in line


def test_hostfile_limit_counts_huge_node_counts_without_building_them() -> None:
    import re

    start = time.perf_counter()
    (line,) = refusal_lines(fits("big", 2_000_000_000))
    assert time.perf_counter() - start < 5
    match = re.search(r"must be at most (\d+):", line)
    assert match, line
    fit = int(match.group(1))
    cluster = rendered(mpi_runtime(), trainer_job("big", numNodes=1))
    info = info_for(cluster, next(iter(cluster.trainjobs.values())))
    assert mpi.hostfile_size(info, info.ml_policy.mpi, fit) <= mpi.CONFIGMAP_LIMIT
    assert mpi.hostfile_size(info, info.ml_policy.mpi, fit + 1) > mpi.CONFIGMAP_LIMIT


def test_an_oversized_hostfile_that_got_past_admission_fails_the_reconcile() -> None:
    """A TrainJob admitted elsewhere (an older operator) must fail clearly, not be refused by the API server."""
    cluster = rendered(mpi_runtime(), trainer_job("big", numNodes=1))
    (tj,) = cluster.trainjobs.values()
    tj = copy.deepcopy(tj)
    tj["spec"]["trainer"]["numNodes"] = 50_000
    outcome = core.render(tj, cluster.facts, fw.default(), NOW)
    assert outcome.objects == []
    assert outcome.error is not None and "MPI hostfile ConfigMap would be" in outcome.error
    assert "1048576-byte limit" in outcome.error and "spec.trainer.numNodes" in outcome.error


def test_ten_thousand_nodes_render_in_well_under_a_second() -> None:
    rt, tj = mpi_runtime(), trainer_job("big", numNodes=10_000)
    render(rt, copy.deepcopy(tj))  # warm imports
    start = time.perf_counter()
    cluster = rendered(rt, tj)
    elapsed = time.perf_counter() - start
    assert hostfile_of(cluster, "big").count("\n") == 10_000
    assert elapsed < 1.0, f"{elapsed:.3f}s"
