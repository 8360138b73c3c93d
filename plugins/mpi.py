"""MPI: SSH between the pods, the hostfile mpirun reads, and the launcher env of each implementation.

The launcher reaches every node over SSH with one key pair per TrainJob (a Secret created once
and never re-keyed, because pods that are already running hold the old key) and finds the nodes
in a hostfile (a ConfigMap recomputed on every reconcile, because it only follows the counts).
OpenMPI is upstream's contract (docs/upstream-behaviour.md §mpi); Intel MPI and MPICH follow the Kubeflow
MPI Operator's conventions (docs/decisions.md §5).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from trainer.plugin import (
    CONFIG_MAP,
    SECRET,
    Builds,
    FieldError,
    Info,
    MPIPolicy,
    Obj,
    PluginError,
    PodSet,
    TrainingRuntimeSpec,
    ValidationContext,
    effective_resources,
    env_value,
    gpu_count,
    hookimpl,
    invalid,
    upsert_env,
    upsert_volume_mounts,
    upsert_volumes,
)
from trainer.plugin import constants as c

SSH_AUTH_VOLUME = "mpi-ssh-auth"
SSH_AUTH_SUFFIX = "-mpi-ssh-auth"
SSH_PRIVATE_KEY = "ssh-privatekey"
SSH_PUBLIC_KEY = "ssh-publickey"
SSH_AUTH_SECRET_TYPE = "kubernetes.io/ssh-auth"
HOSTFILE_VOLUME = "mpi-hostfile"
HOSTFILE_SUFFIX = "-mpi-hostfile"
HOSTFILE_KEY = "hostfile"
HOSTFILE_DIR = "/etc/mpi"
HOSTFILE_PATH = f"{HOSTFILE_DIR}/{HOSTFILE_KEY}"
SSH_ARGS = "-o ConnectionAttempts=10"

# File modes as the API carries them (decimal). The private key is readable by its owner and
# group only, never by others; the public half is world-readable as OpenSSH expects.
MODE_0400 = 0o400
MODE_0640 = 0o640
MODE_0644 = 0o644
MODE_0444 = 0o444

# A ConfigMap's data, keys plus values, is at most 1 MiB (k8s.io/api core validation).
CONFIGMAP_LIMIT = 1024 * 1024

OPENMPI, INTEL, MPICH = "OpenMPI", "Intel", "MPICH"


@dataclass(frozen=True)
class Implementation:
    """What differs between MPI implementations: the hostfile line and the launcher env."""

    name: str
    suffix_format: str  # what follows the host on its line, newline included; "{slots}" placeholder
    env: tuple[tuple[str, str | None], ...]  # None: the slots value

    @property
    def reserved_env(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.env)

    def suffix(self, slots: int) -> str:
        return self.suffix_format.format(slots=slots)

    def launcher_env(self, slots: int) -> list[Obj]:
        return [env_value(name, str(slots) if value is None else value) for name, value in self.env]


IMPLEMENTATIONS: dict[str, Implementation] = {
    OPENMPI: Implementation(
        OPENMPI,
        " slots={slots}\n",
        (
            ("OMPI_MCA_orte_default_hostfile", HOSTFILE_PATH),
            ("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
            ("OMPI_MCA_orte_set_default_slots", None),
            ("OMPI_MCA_plm_rsh_args", SSH_ARGS),
        ),
    ),
    INTEL: Implementation(
        INTEL,
        ":{slots}\n",
        (("I_MPI_HYDRA_HOST_FILE", HOSTFILE_PATH), ("I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", SSH_ARGS)),
    ),
    MPICH: Implementation(
        MPICH,
        ":{slots}\n",
        (("HYDRA_HOST_FILE", HOSTFILE_PATH), ("HYDRA_LAUNCH_EXTRA_ARGS", SSH_ARGS)),
    ),
}


class MPIPlugin:
    name = "MPI"
    # The hostfile, and the SSH keys: made once, never rewritten (an existing Secret is used).
    kinds = (
        Builds(CONFIG_MAP, label=c.TRAINJOB_NAME_LABEL),
        Builds(SECRET, label=c.TRAINJOB_NAME_LABEL, patch=False),
    )

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.ml_policy is not None and spec.ml_policy.mpi is not None

    @hookimpl
    def trainer_enforce_ml_policy(self, info: Info) -> None:
        mpi = _policy(info)
        if mpi is None:
            return
        node_set = info.pod_set(c.NODE)
        if node_set is not None:
            node_set.count = node_count(info, node_set.count)
        implementation = IMPLEMENTATIONS.get(mpi.mpi_implementation)
        launcher_slots = slots(info)
        for pod_set in info.pod_sets:
            if pod_set.name not in (c.NODE, c.LAUNCHER):
                continue
            _add_ssh_auth(info, pod_set, mpi)
            if pod_set.name != c.LAUNCHER:
                continue
            upsert_volumes(pod_set.pod_spec, [_hostfile_volume(info)])
            node = pod_set.container(c.NODE)
            if node is None:
                continue  # only containers named node get mounts and env (docs/upstream-behaviour.md §mpi)
            if implementation is None:
                raise PluginError(
                    f"MPI implementation {mpi.mpi_implementation!r} is not supported: "
                    f"spec.mlPolicy.mpi.mpiImplementation of the runtime {info.runtime.name!r} "
                    f"must be one of {', '.join(IMPLEMENTATIONS)}"
                )
            upsert_volume_mounts(node, [{"name": HOSTFILE_VOLUME, "mountPath": HOSTFILE_DIR}])
            upsert_env(node, implementation.launcher_env(launcher_slots))

    @hookimpl
    def trainer_build(self, info: Info) -> list[Obj] | None:
        mpi = _policy(info)
        if mpi is None:
            return None
        objects: list[Obj] = []
        secret_name = info.name + SSH_AUTH_SUFFIX
        if info.existing_child("Secret", secret_name) is None:
            objects.append(ssh_auth_secret(info, secret_name))
        objects.append(hostfile_configmap(info, mpi))
        return objects

    @hookimpl
    def trainer_validate(self, ctx: ValidationContext) -> list[FieldError] | None:
        policy = ctx.runtime.spec.ml_policy
        if policy is None or policy.mpi is None:
            return None
        mpi = policy.mpi
        errors: list[FieldError] = []
        trainer = ctx.trainjob.spec.trainer
        if trainer is not None:
            num_nodes = trainer.num_nodes if trainer.num_nodes is not None else 1
            jobs = _job_names(ctx)
            if num_nodes >= 2 and mpi.run_launcher_as_node and not {c.LAUNCHER, c.NODE} <= jobs:
                errors.append(
                    invalid(
                        "spec.trainer.numNodes",
                        num_nodes,
                        "must be 1 when the MPI runtime enables runLauncherAsNode but does not have "
                        "both a launcher and a node replicated job",
                    )
                )
            # The empty implementation (which the schema admits and the launcher cannot run) keeps
            # OpenMPI's reserved names, as upstream reserves them whatever the implementation.
            implementation = IMPLEMENTATIONS.get(mpi.mpi_implementation or OPENMPI)
            reserved = implementation.reserved_env if implementation else ()
            used = sorted({str(var.get("name")) for var in trainer.env or [] if var.get("name") in reserved})
            if used:
                errors.append(
                    invalid(
                        "spec.trainer.env",
                        used,
                        f"must not have reserved envs, invalid envs configured: [{' '.join(used)}] "
                        f"(reserved for {implementation.name if implementation else ''})",
                    )
                )
        if ctx.info is not None:
            errors += _validate_hostfile_size(ctx.info, mpi)
        return errors or None


def _policy(info: Info) -> MPIPolicy | None:
    return info.ml_policy.mpi if info.ml_policy is not None else None


def _job_names(ctx: ValidationContext) -> set[str]:
    if ctx.info is not None:
        return {ps.name for ps in ctx.info.pod_sets}
    jobs = (ctx.runtime.spec.template.spec or {}).get("replicatedJobs") or []
    return {str(rj.get("name", "")) for rj in jobs}


# --- counts ---


def node_count(info: Info, current: int, num_nodes: int | None = None) -> int:
    """The node pod set's count (docs/upstream-behaviour.md §mpi): the TrainJob's numNodes, less the
    launcher when it is a node itself; ``current`` (from the runtime) when the TrainJob does not say."""
    mpi = _policy(info)
    if num_nodes is None:
        trainer = info.trainjob.spec.trainer
        num_nodes = trainer.num_nodes if trainer is not None else None
    if num_nodes is None or mpi is None:
        return current
    return max(num_nodes - 1, 1) if mpi.run_launcher_as_node else num_nodes


def slots(info: Info) -> int:
    """Processes per node (docs/upstream-behaviour.md §mpi): the TrainJob's number, else the runtime's,
    where a runtime value of 1 (the default) gives way to the GPU count per node."""
    mpi = _policy(info)
    assert mpi is not None
    trainer = info.trainjob.spec.trainer
    if trainer is not None and trainer.num_proc_per_node is not None:
        return trainer.num_proc_per_node
    if mpi.num_proc_per_node != 1:
        return mpi.num_proc_per_node
    try:
        gpus = gpu_count(effective_resources(info))
    except ValueError as exc:
        raise PluginError(f"cannot count the trainer node's GPUs for MPI slots: {exc}") from exc
    return gpus if gpus > 1 else 1


def _in_hostfile(pod_set: PodSet, mpi: MPIPolicy) -> bool:
    return pod_set.name == c.NODE or (pod_set.name == c.LAUNCHER and mpi.run_launcher_as_node)


# --- pod spec ---


def _add_ssh_auth(info: Info, pod_set: PodSet, mpi: MPIPolicy) -> None:
    upsert_volumes(
        pod_set.pod_spec,
        [
            {
                "name": SSH_AUTH_VOLUME,
                "secret": {
                    "secretName": info.name + SSH_AUTH_SUFFIX,
                    "defaultMode": MODE_0400,
                    "items": [
                        {"key": SSH_PRIVATE_KEY, "path": "id_rsa", "mode": MODE_0640},
                        {"key": SSH_PUBLIC_KEY, "path": "id_rsa.pub", "mode": MODE_0644},
                        {"key": SSH_PUBLIC_KEY, "path": "authorized_keys", "mode": MODE_0644},
                    ],
                },
            }
        ],
    )
    for container in pod_set.containers:
        if container.get("name") == c.NODE:
            upsert_volume_mounts(container, [{"name": SSH_AUTH_VOLUME, "mountPath": mpi.ssh_auth_mount_path}])


def _hostfile_volume(info: Info) -> Obj:
    return {
        "name": HOSTFILE_VOLUME,
        "configMap": {
            "name": info.name + HOSTFILE_SUFFIX,
            "items": [{"key": HOSTFILE_KEY, "path": HOSTFILE_KEY, "mode": MODE_0444}],
        },
    }


# --- the hostfile ---


def hostfile(info: Info, mpi: MPIPolicy) -> str:
    """One line per endpoint of the node pod set (and the launcher's when it is a node), in
    replicated-job order; every line ends in a newline. Empty for an unknown implementation."""
    implementation = IMPLEMENTATIONS.get(mpi.mpi_implementation)
    if implementation is None:
        return ""
    hosts = [host for pod_set in info.pod_sets if _in_hostfile(pod_set, mpi) for host in pod_set.endpoints]
    if not hosts:
        return ""
    suffix = implementation.suffix(slots(info))
    return suffix.join(hosts) + suffix  # one join: 10,000 lines in about a millisecond


def hostfile_configmap(info: Info, mpi: MPIPolicy) -> Obj:
    size = hostfile_size(info, mpi)  # before building it: a hostfile of 2^31 lines is never made
    if size > CONFIGMAP_LIMIT:
        # Admission refuses this; a TrainJob that got past it (admitted by an older operator)
        # fails here with the same explanation instead of an API server refusal.
        raise PluginError(
            f"the MPI hostfile ConfigMap would be {size} bytes, over the {CONFIGMAP_LIMIT}-byte limit of a "
            "ConfigMap: lower spec.trainer.numNodes"
        )
    text = hostfile(info, mpi)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": info.child_metadata(info.name + HOSTFILE_SUFFIX),
        "data": {HOSTFILE_KEY: text},
    }


def _digits_below(n: int) -> int:
    """Decimal digits written when printing 0, 1, ..., n-1."""
    total, low, high, width = 0, 0, 10, 1
    while low < n:
        total += (min(n, high) - low) * width
        low, high, width = high, high * 10, width + 1
    return total


def hostfile_size(info: Info, mpi: MPIPolicy, num_nodes: int | None = None) -> int:
    """Bytes of the hostfile ConfigMap's data (key plus value), computed without building it.

    Admission must answer for any numNodes up to 2^31, so this is arithmetic, not a loop: a line
    is ``<name>-<job>-<r>-<p>.<subdomain>`` plus the implementation's slots suffix.
    """
    implementation = IMPLEMENTATIONS.get(mpi.mpi_implementation)
    if implementation is None:
        return len(HOSTFILE_KEY)
    subdomain = (info.jobset_spec.get("network") or {}).get("subdomain") or info.name
    n_slots = slots(info)
    total = len(HOSTFILE_KEY)
    for pod_set in info.pod_sets:
        if not _in_hostfile(pod_set, mpi):
            continue
        count = node_count(info, pod_set.count, num_nodes) if pod_set.name == c.NODE else pod_set.count
        replicas = pod_set.replicas
        # Everything in a line but the two indexes: "<name>-<job>-", "-", ".<subdomain>", the suffix.
        host = len(f"{info.name}-{pod_set.name}--.{subdomain}".encode())
        fixed = host + len(implementation.suffix(n_slots).encode())
        total += replicas * count * fixed + count * _digits_below(replicas) + replicas * _digits_below(count)
    return total


def _validate_hostfile_size(info: Info, mpi: MPIPolicy) -> list[FieldError]:
    """docs/decisions.md §6: refuse a TrainJob whose hostfile cannot be stored, saying what fits."""
    try:
        size = hostfile_size(info, mpi)
    except PluginError:
        return []  # the GPU count is unreadable; the schema reports the quantity itself
    if size <= CONFIGMAP_LIMIT:
        return []
    trainer = info.trainjob.spec.trainer
    node_set = info.pod_set(c.NODE)
    requested = trainer.num_nodes if trainer is not None and trainer.num_nodes is not None else None
    if requested is None:
        requested = node_set.count if node_set is not None else 1
    low, high = 0, requested  # largest numNodes whose hostfile fits: low fits (or is 0), high does not
    while high - low > 1:
        middle = (low + high) // 2
        if hostfile_size(info, mpi, middle) <= CONFIGMAP_LIMIT:
            low = middle
        else:
            high = middle
    return [
        invalid(
            "spec.trainer.numNodes",
            requested,
            f"must be at most {low}: the MPI hostfile for {requested} nodes would take {size} bytes, over "
            f"the ConfigMap limit of {CONFIGMAP_LIMIT} bytes (key plus value); {low} nodes fit with this "
            "TrainJob name and slots per node",
        )
    ]


# --- the SSH key Secret ---


def ssh_auth_secret(info: Info, name: str) -> Obj:
    private_pem, public_line = generate_ssh_key(info.seed)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": info.child_metadata(name),
        "type": SSH_AUTH_SECRET_TYPE,
        "immutable": True,
        "data": {
            SSH_PRIVATE_KEY: base64.b64encode(private_pem).decode("ascii"),
            SSH_PUBLIC_KEY: base64.b64encode(public_line).decode("ascii"),
        },
    }


def generate_ssh_key(seed: bytes | None) -> tuple[bytes, bytes]:
    """A fresh ECDSA P-521 key: (SEC1 PEM "EC PRIVATE KEY", OpenSSH authorized_keys line).

    Randomness: the operator renders with ``seed`` None, and the key comes from the operating
    system's CSPRNG, as upstream's does. ``trainer render`` sets a seed derived from the TrainJob's
    uid (see :func:`trainer.offline.cluster.render_seed`) so that ``--show-secrets`` prints the same bytes
    for the same input; such a key is predictable from the manifest and must never guard a real
    cluster. The seed is stretched with SHAKE-256 under a label of its own, so other plugins can
    derive independent material from the same seed.

    Nothing here logs or raises with key material in the message.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    curve = ec.SECP521R1()
    key = ec.generate_private_key(curve) if seed is None else _derive_key(seed, curve)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    public_line = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private_pem, public_line + b"\n"


def _derive_key(seed: bytes, curve: Any) -> Any:
    """Rejection sampling of 521-bit candidates: uniform over the valid scalars, and a candidate
    outside [1, n-1] (probability about 2^-260) only moves on to the next counter."""
    from cryptography.hazmat.primitives.asymmetric import ec

    for counter in range(16):
        label = b"trainer.kubeflow.org/mpi-ssh-auth\x00%d\x00" % counter
        stretched = hashlib.shake_256(label + seed).digest(66)
        candidate = int.from_bytes(stretched, "big") >> 7  # 528 bits -> 521
        try:
            return ec.derive_private_key(candidate, curve)
        except ValueError:
            continue  # out of range; the message says nothing about the value, but keep it unsaid
    raise PluginError("cannot derive the MPI SSH key from the render seed")


plugin = MPIPlugin()
