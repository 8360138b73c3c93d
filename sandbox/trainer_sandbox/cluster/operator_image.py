"""The operator's image, built from the repository's own Dockerfile with buildah, no daemon.

Docker Hub cannot be reached here, so the Dockerfile's ``BASE_IMAGE`` build argument names a base
made from Debian's packages (``images.PYTHON_BASE``). buildah runs the ``RUN`` steps chrooted
(``--isolation chroot``: no container runtime or cgroups of its own needed) with the host's
network, and pip inside is given the host's CA bundle (``PIP_CERT``), for hosts whose way to PyPI
inspects TLS. buildah's storage is a temporary directory, removed after the build: what is kept
is the OCI archive, cached by the hash of everything the Dockerfile copies, and pushed to the
nodes' registry under the chart's image name.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trainer_sandbox.cluster import debs, images, oci

REPO_ROOT = Path(__file__).resolve().parents[3]
CONTEXT = (
    "Dockerfile",
    ".dockerignore",
    "pyproject.toml",
    "requirements.lock",
    "README.md",
    "trainer",
    "plugins",
    "runtimes",
    "crds",
    "examples",
)
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")

Echo = Callable[[str], None]


def chart_image_name() -> str:
    """``<repository>:<appVersion>``, as the chart's default values name the operator's image."""
    import yaml

    chart = REPO_ROOT / "charts" / "kubeflow-trainer"
    values = yaml.safe_load((chart / "values.yaml").read_text())["image"]
    tag = values.get("tag") or yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
    registry = values.get("registry") or ""
    return f"{registry + '/' if registry else ''}{values['repository']}:{tag}"


def context_key() -> str:
    """A hash of the build's inputs: the files the Dockerfile may copy, and the base's recipe."""
    h = hashlib.sha256(images.PYTHON_BASE.digest().encode())
    for name in CONTEXT:
        path = REPO_ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            h.update(str(f.relative_to(REPO_ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build(echo: Echo) -> Path:
    """The operator's image as an OCI archive, built when the cache has none for these sources."""
    cache = debs.cache_root() / "images"
    key = context_key()  # hashes every source file: once
    target = cache / f"operator-{key}.tar"
    if target.exists():
        return target
    if shutil.which("buildah") is None:
        raise RuntimeError(
            "the operator's image is built with buildah: scripts/bootstrap installs it (as root)"
        )
    base_layer = images.rootfs(images.PYTHON_BASE, echo)
    echo("building the operator's image from the Dockerfile with buildah")
    t0 = time.monotonic()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        base = Path(tmp) / "base.tar"
        base_name = images.PYTHON_BASE.names[0]
        oci.write_archive(base, oci.Image(base_name, cmd=["python3"], env=images.BASE_ENV), [base_layer])
        store = ["--root", f"{tmp}/storage", "--runroot", f"{tmp}/run", "--storage-driver", "vfs"]
        tag = f"localhost/trainer-operator:{key}"
        steps = [
            ["buildah", *store, "pull", "--quiet", f"oci-archive:{base}"],
            [
                "buildah", *store, "build", "--quiet", "--isolation", "chroot", "--network", "host", "--pull=never",
                "--build-arg", f"BASE_IMAGE={base_name}",
                *(["--build-arg", "PIP_CERT=/etc/ssl/host-ca.crt", "--volume", f"{HOST_CA}:/etc/ssl/host-ca.crt:ro"]
                  if HOST_CA.exists() else []),
                "--tag", tag, "--file", "Dockerfile", ".",
            ],
            ["buildah", *store, "push", "--quiet", tag, f"oci-archive:{tmp}/operator.tar:{chart_image_name()}"],
        ]  # fmt: skip
        for argv in steps:
            result = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"`{' '.join(argv[:6])} ...` failed:\n{result.stderr[-3000:]}")
        os.replace(f"{tmp}/operator.tar", target)
        for stale in cache.glob("operator-*.tar"):  # builds of older sources
            if stale != target:
                stale.unlink(missing_ok=True)
        # buildah's vfs layers are read-only copies it made as root: remove them with it.
        subprocess.run(["buildah", *store, "rmi", "--all", "--force"], capture_output=True)
    echo(f"{'operator image built':<28} {time.monotonic() - t0:5.1f}s")
    return target
