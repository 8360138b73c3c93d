"""Flux: run the trainer nodes as one Flux instance instead of over SSH.

An init container copies a prebuilt Flux view into a shared volume and writes the broker
configuration; the trainer command is wrapped by an entrypoint that starts a Flux broker on every
node and, on the first node, submits the original command to the whole instance. The brokers
authenticate each other with a CURVE certificate whose key is generated at random and written once,
in a create-only Secret; upstream derives it from the TrainJob's uid (docs/decisions.md
§flux-curve-random).
"""

from __future__ import annotations

import base64
import hashlib
import json
from functools import cache
from typing import Any

from trainer.plugin import (
    CONFIG_MAP,
    SECRET,
    Builds,
    FieldError,
    FluxPolicy,
    Info,
    Obj,
    PluginError,
    PodSet,
    TrainingRuntimeSpec,
    ValidationContext,
    effective_resources,
    gpu_count,
    hookimpl,
    invalid,
    upsert_volume_mounts,
    upsert_volumes,
)
from trainer.plugin import constants as c

INSTALLER = "flux-installer"
ENTRYPOINT_SUFFIX = "-flux-entrypoint"
CURVE_SUFFIX = "-flux-curve"
CURVE_KEY = "curve.cert"
CONFIG_DIR = "/etc/flux-config"
INSTALL_VOLUME, INSTALL_PATH = "flux-install", "/mnt/flux"
SPACK_VOLUME, SPACK_PATH = "spack-install", "/opt/software"
CURVE_VOLUME, CURVE_PATH = "flux-curve", "/curve"
MEMORY_VOLUME, MEMORY_PATH = "shared-memory", "/dev/shm"
BROKER_PORT = 8050

# Settings a runtime's trainer container, then the TrainJob, may override by env var of this name.
DEFAULT_SETTINGS = {
    "FLUX_VIEW_IMAGE": "ghcr.io/converged-computing/flux-view-ubuntu:tag-jammy",
    "FLUX_NETWORK_DEVICE": "eth0",
    "FLUX_QUEUE_POLICY": "fcfs",
}


class FluxPlugin:
    name = "Flux"
    # The entrypoint script, and the CURVE certificate: created once, never rewritten.
    kinds = (
        Builds(CONFIG_MAP, label=c.TRAINJOB_NAME_LABEL),
        Builds(SECRET, label=c.TRAINJOB_NAME_LABEL, patch=False),
    )

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.ml_policy is not None and spec.ml_policy.flux is not None

    @hookimpl
    def trainer_enforce_ml_policy(self, info: Info) -> None:
        if _policy(info) is None:
            return
        node_set = info.pod_set(c.NODE)
        if node_set is None:
            return
        settings = flux_settings(info)
        entrypoint = info.name + ENTRYPOINT_SUFFIX
        _wrap_command(info)
        upsert_volumes(
            node_set.pod_spec,
            [
                {"name": SPACK_VOLUME, "emptyDir": {}},
                {"name": INSTALL_VOLUME, "emptyDir": {}},
                {"name": entrypoint, "configMap": {"name": entrypoint, "defaultMode": 0o755}},
                {"name": MEMORY_VOLUME, "emptyDir": {"medium": "Memory"}},
                {
                    "name": CURVE_VOLUME,
                    "secret": {"secretName": info.name + CURVE_SUFFIX, "defaultMode": 0o400},
                },
            ],
        )
        node_set.init_containers.append(
            {
                "name": INSTALLER,
                "image": settings["FLUX_VIEW_IMAGE"],
                "command": ["/bin/bash", f"{CONFIG_DIR}/init.sh"],
                "volumeMounts": [
                    {"name": INSTALL_VOLUME, "mountPath": INSTALL_PATH},
                    {"name": entrypoint, "mountPath": CONFIG_DIR, "readOnly": True},
                ],
            }
        )
        for container in node_set.containers:
            if container.get("name") == c.NODE:
                upsert_volume_mounts(
                    container,
                    [
                        {"name": INSTALL_VOLUME, "mountPath": INSTALL_PATH},
                        {"name": SPACK_VOLUME, "mountPath": SPACK_PATH},
                        {"name": entrypoint, "mountPath": CONFIG_DIR, "readOnly": True},
                        {"name": CURVE_VOLUME, "mountPath": CURVE_PATH, "readOnly": True},
                        {"name": MEMORY_VOLUME, "mountPath": MEMORY_PATH, "readOnly": True},
                    ],
                )

    @hookimpl
    def trainer_build(self, info: Info) -> list[Obj] | None:
        policy = _policy(info)
        node_set = info.pod_set(c.NODE)
        if policy is None or node_set is None:
            return None
        objects = [entrypoint_configmap(info, policy, node_set)]
        secret_name = info.name + CURVE_SUFFIX
        # Running brokers hold the certificate: an existing Secret is used, never rewritten.
        if info.existing_child("Secret", secret_name) is None:
            objects.append(curve_secret(info))
        return objects

    @hookimpl
    def trainer_validate(self, ctx: ValidationContext) -> list[FieldError] | None:
        policy = ctx.runtime.spec.ml_policy
        if policy is None or policy.flux is None:
            return None
        jobset_spec = ctx.info.jobset_spec if ctx.info is not None else (ctx.runtime.spec.template.spec or {})
        errors: list[FieldError] = []
        for i, rjob in enumerate(jobset_spec.get("replicatedJobs") or []):
            if rjob.get("name") != c.NODE:
                continue
            pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            for k, init in enumerate(pod.get("initContainers") or []):
                if init.get("name") == INSTALLER:
                    errors.append(
                        invalid(
                            "spec.runtimeRef.name",
                            ctx.trainjob.spec.runtime_ref.name,
                            f"InitContainer '{INSTALLER}' is reserved: the Flux plugin adds it, so the runtime's "
                            f"spec.template.spec.replicatedJobs[{i}].template.spec.template.spec.initContainers[{k}] "
                            "must not be named so",
                        )
                    )
        return errors or None


def _policy(info: Info) -> FluxPolicy | None:
    return info.ml_policy.flux if info.ml_policy is not None else None


def flux_settings(info: Info) -> dict[str, str]:
    """Defaults, overridden by the runtime trainer container's env, then by the TrainJob's."""
    settings = dict(DEFAULT_SETTINGS)
    trainer_set = info.trainer_pod_set()
    node = trainer_set.container(c.NODE) if trainer_set is not None else None
    trainer = info.trainjob.spec.trainer
    for var in [*((node or {}).get("env") or []), *((trainer.env if trainer else None) or [])]:
        if var.get("name") in settings and var.get("value") is not None:
            settings[var["name"]] = str(var["value"])
    return settings


def _wrap_command(info: Info) -> None:
    """The trainer command becomes an argument of the Flux entrypoint; the TrainJob's args are
    folded into it (the template's own args stay on the container, as upstream)."""
    trainer_set = info.trainer_pod_set()
    node = trainer_set.container(c.NODE) if trainer_set is not None else None
    trainer = info.trainjob.spec.trainer
    command = list((node or {}).get("command") or [])
    args: list[str] = []
    if trainer is not None:
        if trainer.command is not None:
            command = list(trainer.command)
        if trainer.args is not None:
            args = list(trainer.args)
    wrapped = ["/bin/bash", f"{CONFIG_DIR}/entrypoint.sh", " ".join([*command, *args]).strip()]
    info.trainer_command = wrapped
    info.trainer_args_cleared = True
    if node is not None:
        node["command"] = list(wrapped)  # also when the TrainJob has no trainer block to apply it


def _range(size: int) -> str:
    """Flux's idset notation for 0..size-1."""
    return "0" if size == 1 else f"0-{size - 1}"


def entrypoint_configmap(info: Info, policy: FluxPolicy, node_set: PodSet) -> Obj:
    nodes = node_set.count
    trainer = info.trainjob.spec.trainer
    tasks = policy.num_proc_per_node
    if trainer is not None and trainer.num_proc_per_node is not None:
        tasks = trainer.num_proc_per_node
    try:
        gpus = gpu_count(effective_resources(info))
    except ValueError as exc:
        raise PluginError(f"spec.trainer.resourcesPerNode: cannot count GPUs: {exc}") from exc
    settings = flux_settings(info)
    subdomain = (info.jobset_spec.get("network") or {}).get("subdomain") or info.name
    main_host = f"{info.name}-{c.NODE}-0-0"
    hosts = f"{info.name}-{c.NODE}-0-[{_range(nodes)}]"
    flags = f"-N {nodes} -n {tasks * nodes}" + (f" -g {gpus}" if gpus > 0 else "")
    resources = f"--cores={_range(tasks)}" + (f" --gpu={_range(gpus)}" if gpus > 0 else "")
    init_template, entrypoint_template = _templates()
    init = init_template.render(
        hosts=hosts,
        main_host=main_host,
        bind=f"tcp://{settings['FLUX_NETWORK_DEVICE']}:%p",
        connect=f"tcp://%h.{subdomain}.{info.namespace}.svc.cluster.local:%p",
        port=BROKER_PORT,
        queue_policy=settings["FLUX_QUEUE_POLICY"],
    )
    entrypoint = entrypoint_template.render(main_host=main_host, flags=flags, resources=resources)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": info.child_metadata(info.name + ENTRYPOINT_SUFFIX),
        "data": {"entrypoint.sh": entrypoint, "init.sh": init},
    }


# --- the CURVE certificate ---

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85(data: bytes) -> str:
    """ZeroMQ's Z85 (RFC 32/Z85): four bytes to five characters; the length must divide by 4."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte groups only")
    out: list[str] = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        out.extend(_Z85[value // 85**k % 85] for k in (4, 3, 2, 1, 0))
    return "".join(out)


def curve_secret(info: Info) -> Obj:
    """The brokers' shared CURVE certificate: an X25519 key pair from :func:`generate_curve_key`.

    Created only when no Secret of its name exists (the caller checks) and immutable, as the MPI
    SSH Secret: running brokers hold the key, so it is never rewritten.
    """
    secret, public = generate_curve_key(info.seed)
    cert = (
        "#  ZeroMQ CURVE Secret Certificate\n"
        "#  Generated by the Kubeflow Trainer operator\n"
        "\n"
        "metadata\n"
        f'    name = "{info.name}"\n'
        "curve\n"
        f'    public-key = "{z85(public)}"\n'
        f'    secret-key = "{z85(secret)}"\n'
    )
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": info.child_metadata(info.name + CURVE_SUFFIX),
        "type": "Opaque",
        "immutable": True,
        "data": {CURVE_KEY: base64.b64encode(cert.encode()).decode("ascii")},
    }


def generate_curve_key(seed: bytes | None) -> tuple[bytes, bytes]:
    """A fresh X25519 key pair, (private, public), 32 raw bytes each.

    Randomness: the operator renders with ``seed`` None, and the key comes from the operating
    system's CSPRNG. Upstream uses SHA-256 of the TrainJob's uid instead, a key that anyone who can
    read the TrainJob can compute (docs/decisions.md §flux-curve-random). ``trainer render`` sets a
    seed derived from the input (:func:`trainer.offline.cluster.render_seed`) so that
    ``--show-secrets`` prints the same bytes for the same input; such a key is predictable from
    the manifest and must never guard a real cluster. The seed is stretched with SHAKE-256 under a
    label of its own, so the key is independent of other material derived from the same seed (the
    MPI SSH key). Any 32 bytes are a valid X25519 private key.

    Nothing here logs or raises with key material in the message.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    if seed is None:
        key = X25519PrivateKey.generate()
    else:
        derived = hashlib.shake_256(b"trainer.kubeflow.org/flux-curve\x00" + seed).digest(32)
        key = X25519PrivateKey.from_private_bytes(derived)
    private = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return private, public


# --- scripts ---


@cache
def _templates() -> tuple[Any, Any]:
    """(init.sh, entrypoint.sh) compiled once per process; jinja2 loads only for Flux runtimes."""
    import jinja2

    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False, trim_blocks=True
    )
    env.filters["toml"] = json.dumps  # a JSON string of printable text is a TOML basic string
    return env.from_string(INIT_SH), env.from_string(ENTRYPOINT_SH)


# Runs in the flux-installer init container: the view and the broker configuration go into the
# shared flux-install volume, where the trainer container picks them up.
INIT_SH = """\
#!/bin/bash
# Written by the Kubeflow Trainer operator (Flux plugin): prepares Flux for the trainer container.
set -eu

install_root=/mnt/flux/config
view_root=/mnt/flux
main_host="{{ main_host }}"
hosts="{{ hosts }}"
echo "Preparing Flux on $(hostname); the lead broker is ${main_host}"

export PATH=/opt/view/bin:$PATH
mkdir -p /opt/view/bin
mkdir -p ${install_root}/etc/flux/system/cron.d ${install_root}/etc/flux/config
mkdir -p ${install_root}/var/lib/flux ${install_root}/run/flux ${install_root}/etc/curve

echo "${hosts}" > ${install_root}/etc/flux/system/hostlist

cat > ${install_root}/etc/flux/config/broker.toml << 'EOT'
[access]
allow-guest-user = true
allow-root-owner = true

[bootstrap]
curve_cert = "/mnt/flux/config/etc/curve/curve.cert"
default_port = {{ port }}
default_bind = {{ bind | toml }}
default_connect = {{ connect | toml }}
hosts = [{ host = {{ hosts | toml }} }]

[sched-fluxion-qmanager]
queue-policy = {{ queue_policy | toml }}
EOT
echo "Broker configuration:"
cat ${install_root}/etc/flux/config/broker.toml

# /opt/view links into a spack view; copy the view and the software it links to.
mkdir -p ${view_root}/view
view="/opt/views/._view/$(ls /opt/views/._view/)"
cp -R ${view}/* ${view_root}/view
cp -R /opt/software ${view_root}/
touch ${view_root}/flux-operator-done.txt
echo "Flux is ready in ${view_root}"
"""

# Runs as the trainer container's command, with the original command as its one argument.
ENTRYPOINT_SH = """\
#!/bin/bash
# Written by the Kubeflow Trainer operator (Flux plugin): starts a Flux broker on this node and,
# on the lead node, runs the trainer command across the whole Flux instance.

view_base=/mnt/flux
view_root=${view_base}/view
config_root=${view_base}/config
cfg=${config_root}/etc/flux/config
command="$@"

# After the container's own PATH, so its software wins over the view's (Python, say).
export PATH=$PATH:${view_root}/bin
cp -R ${view_base}/software/* /opt/software/

# Flux's Python modules come from the view.
python_root=$(find ${view_root} -maxdepth 2 -type d -path "${view_root}/lib/python3*" 2>/dev/null | head -n 1)
export PYTHONPATH=${PYTHONPATH:-}:${python_root}/site-packages
export FLUX_RC_EXTRA=${view_root}/etc/flux/rc1.d

cat > ${view_base}/flux-view.sh << EOT
#!/bin/bash
export PATH=$PATH
export PYTHONPATH=$PYTHONPATH
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:${view_root}/lib
export fluxsocket=local://${config_root}/run/flux/local
EOT

# The brokers' certificate must be private to the user that runs them.
curve=${config_root}/etc/curve/curve.cert
cp /curve/curve.cert ${curve}
chmod 600 ${curve}
chown $(id -u) ${curve}

hosts=$(cat ${config_root}/etc/flux/system/hostlist)
flux R encode --hosts=${hosts} {{ resources }} > ${config_root}/etc/flux/system/R

export STATE_DIR=${config_root}/var/lib/flux
export FLUX_OUTPUT_DIR=/tmp/fluxout
mkdir -p ${STATE_DIR} ${FLUX_OUTPUT_DIR} ${config_root}/etc/flux/system/cron.d
broker_options="-Scron.directory=${config_root}/etc/flux/system/cron.d -Stbon.fanout=256 \\
  -Srundir=${config_root}/run/flux -Sstatedir=${STATE_DIR} \\
  -Slocal-uri=local://${config_root}/run/flux/local -Slog-stderr-level=0 -Slog-stderr-mode=local"

if [ "$(hostname)" = "{{ main_host }}" ]; then
  if [ -z "${command}" ]; then
    echo "No command given: running an interactive Flux instance"
    flux broker --config-path ${cfg} ${broker_options}
  else
    echo "Running across the Flux instance: flux run {{ flags }} ${command}"
    flux start -o --config ${cfg} ${broker_options} flux run {{ flags }} ${command}
  fi
else
  # Followers join the lead broker, retrying until it is up and then until it finishes cleanly.
  while true; do
    flux start -o --config ${cfg} ${broker_options}
    status=$?
    if [ "${status}" -eq 0 ]; then
      echo "The follower broker exited cleanly"
      break
    fi
    echo "The follower broker exited with ${status}; retrying in 15s"
    sleep 15
  done
fi
touch ${view_base}/flux-operator-complete.txt
"""


plugin = FluxPlugin()
