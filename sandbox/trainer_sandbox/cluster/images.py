"""The training images of the real nodes, made from Debian's packages with ``mmdebstrap``.

Two images, one per bundled runtime family, each with what that runtime's contract needs on CPU:

- ``torch``: Debian 13's ``python3-torch`` (2.6, CPU; PyPI's Linux wheel is the CUDA build with
  gigabytes of NVIDIA libraries), NumPy and the Kubeflow SDK (its progress helper), under the
  torch-distributed runtime's image name.
- ``mpi``: Debian 12's OpenMPI 4.1 with ``mpi4py`` and an SSH server, under the
  deepspeed-distributed runtime's. OpenMPI 4, not Debian 13's 5: the MPI runtimes set
  ``OMPI_MCA_orte_*`` (the hostfile among them), which OpenMPI 5 no longer reads. It meets the
  MPI runtimes' contract: a user ``mpiuser`` (uid 1000) whose ``~/.sshd_config`` runs ``sshd``
  unprivileged on port 2222 with the key the operator mounts in ``~/.ssh``, and an SSH client
  that goes to port 2222 without asking about host keys (every pod's host key is new).

Each root filesystem is one layer, cached by the hash of its recipe, so it is built once per
machine (about a minute each here) and again only when the recipe changes. Both are pushed to the
nodes' registry under the names the bundled runtimes use, so their pods pull them unmodified.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainer_sandbox.cluster import debs, oci

MIRROR = "http://deb.debian.org/debian"
EXCLUDE = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
}
COMMON = r"""#!/bin/sh
set -e
root="$1"
mkdir -p "$root/workspace"
chmod 0777 "$root/workspace"
"""
MPI_CUSTOMIZE = r"""chroot "$root" useradd --uid 1000 --create-home --shell /bin/bash mpiuser
mkdir -p "$root/run/sshd" "$root/workspace"
chmod 0755 "$root/run/sshd"
chmod 0777 "$root/workspace"
cat > "$root/home/mpiuser/.sshd_config" <<'CFG'
Port 2222
HostKey /home/mpiuser/.ssh/id_rsa
PidFile /home/mpiuser/sshd.pid
AuthorizedKeysFile /home/mpiuser/.ssh/authorized_keys
StrictModes no
UsePAM no
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitUserEnvironment no
AcceptEnv OMPI_* PMIX_*
CFG
chroot "$root" chown mpiuser:mpiuser /home/mpiuser/.sshd_config
cat >> "$root/etc/ssh/ssh_config" <<'CFG'

Host *
    Port 2222
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
CFG
rm -f "$root"/etc/ssh/ssh_host_*
"""
TORCH_CUSTOMIZE = r"""# The Kubeflow SDK, for its progress helper (update_trainjob_status): training scripts call it
# unmodified. Its wheels were downloaded on the host ("$2"), whose pip knows the way to PyPI; they
# go to /usr/local beside Debian's packages (pip cannot replace those: it has no record of them).
cp -r "$2" "$root/tmp/wheels"
chroot "$root" pip install --isolated --quiet --no-index --find-links /tmp/wheels --break-system-packages \
    --ignore-installed kubeflow==0.5.0
rm -rf "$root/tmp/wheels"
# Debian builds torch without libuv, yet two TCPStores on torchrun's path (the static rendezvous
# the PET_* env selects, and each worker's client of the agent's store) are made with libuv's
# default and cannot be told otherwise: every torchrun fails at once. Pass the choice that
# USE_LIBUV=0 (in the image's env) makes elsewhere; the build fails if torch's code has moved.
chroot "$root" python3 - <<'PY'
import pathlib
base = pathlib.Path("/usr/lib/python3/dist-packages/torch/distributed")
edits = [
    ("elastic/rendezvous/static_tcp_rendezvous.py",
     "                multi_tenant=True,\n",
     "                multi_tenant=True,\n                use_libuv=False,\n"),
    ("rendezvous.py",
     "            is_master=False,\n            timeout=timeout,\n        )",
     "            is_master=False,\n            timeout=timeout,\n            use_libuv=use_libuv,\n        )"),
]
for name, old, new in edits:
    path = base / name
    text = path.read_text()
    assert text.count(old) == 1, f"torch's {name} changed: the libuv edit does not apply"
    path.write_text(text.replace(old, new))
PY
"""

Echo = Callable[[str], None]


@dataclass(frozen=True)
class Recipe:
    """One image: a Debian suite, its packages, a customize script, the config, the names."""

    key: str
    suite: str
    packages: tuple[str, ...]
    customize: str
    names: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    wheels: tuple[str, ...] = ()  # requirements downloaded from PyPI for the image's Python
    python: str = "3.13"

    def digest(self) -> str:
        text = "\n".join([self.suite, MIRROR, *self.packages, COMMON, self.customize, *EXCLUDE, *self.wheels])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def blobs(self, layer: Path) -> oci.Blobs:
        image = oci.Image(self.names[-1], cmd=["python3"], env={**BASE_ENV, **self.env}, workdir="/workspace")
        return oci.image_blobs(image, [layer])


TORCH = Recipe(
    key="torch",
    suite="trixie",
    packages=("python3", "python3-torch", "python3-numpy", "python3-pip", "ca-certificates", "procps"),
    customize=TORCH_CUSTOMIZE,
    names=("pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime", "localhost/trainer/torch:1"),
    env={"USE_LIBUV": "0"},
    wheels=("kubeflow==0.5.0",),
)
MPI = Recipe(
    key="mpi",
    suite="bookworm",
    packages=(
        "python3",
        "python3-mpi4py",
        "python3-numpy",
        "openmpi-bin",
        "openssh-server",
        "openssh-client",
        "ca-certificates",
        "procps",
    ),
    customize=MPI_CUSTOMIZE,
    names=("ghcr.io/kubeflow/trainer/deepspeed-runtime", "localhost/trainer/mpi:1"),
    # No InfiniBand or UCX on these nodes: OpenMPI's TCP transport, without probing the rest.
    env={
        "OMPI_MCA_pml": "ob1",
        "OMPI_MCA_btl": "tcp,self",
        "OMPI_MCA_btl_tcp_if_include": "eth0",
        "OMPI_MCA_oob_tcp_if_include": "eth0",
    },
)
RECIPES = (TORCH, MPI)
# The base the operator's Dockerfile is built on here (its BASE_IMAGE build argument), where
# python:3.11-slim-bookworm cannot be pulled: Debian 12's Python 3.11 with venv, `python` on PATH.
PYTHON_BASE = Recipe(
    key="python-base",
    suite="bookworm",
    packages=("python3", "python3-venv", "python-is-python3", "ca-certificates"),
    customize="",
    names=("localhost/trainer/python-base:3.11-bookworm",),
)


def rootfs(recipe: Recipe, echo: Echo) -> Path:
    """``recipe``'s root filesystem as a tar (the image's one layer), built when the cache has none
    for this recipe."""
    cache = debs.cache_root() / "images"
    target = cache / f"{recipe.key}-{recipe.suite}-{recipe.digest()}.tar"
    if target.exists():
        return target
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError(
            "the training images are built with mmdebstrap: scripts/bootstrap installs it (as root)"
        )
    cache.mkdir(parents=True, exist_ok=True)
    echo(f"building the {recipe.key} image from Debian {recipe.suite} with mmdebstrap (about a minute)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        hook = Path(tmp) / "customize.sh"
        hook.write_text(COMMON + recipe.customize)
        hook.chmod(0o755)
        out = Path(tmp) / "rootfs.tar"
        wheels = Path(tmp) / "wheels"
        wheels.mkdir()
        if recipe.wheels:
            _download_wheels(recipe, wheels)
        argv = [
            "mmdebstrap",
            "--variant=minbase",
            f"--include={','.join(recipe.packages)}",
            f'--customize-hook={shlex.quote(str(hook))} "$1" {shlex.quote(str(wheels))}',
            *(f"--dpkgopt=path-exclude={p}" for p in EXCLUDE),
            recipe.suite,
            str(out),
            MIRROR,
        ]
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"mmdebstrap failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
        os.replace(out, target)
    for stale in cache.glob(f"{recipe.key}-{recipe.suite}-*.tar"):  # older recipes' builds
        if stale != target:
            stale.unlink(missing_ok=True)
    echo(f"{recipe.key + ' image built':<28} {time.monotonic() - t0:5.1f}s")
    return target


def _download_wheels(recipe: Recipe, into: Path) -> None:
    """Binary wheels of ``recipe.wheels`` and their dependencies for the image's Python on
    x86-64 Linux, fetched with this interpreter's pip (and its configuration)."""
    tag = recipe.python.replace(".", "")
    argv = [
        sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(into), "--only-binary=:all:",
        "--python-version", recipe.python, "--implementation", "cp", "--abi", f"cp{tag}",
        "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
        "--platform", "manylinux2014_x86_64", *recipe.wheels,
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip download {' '.join(recipe.wheels)} failed:\n{result.stderr[-3000:]}")
