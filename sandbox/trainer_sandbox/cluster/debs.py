"""Files out of Debian packages, fetched with ``apt-get download`` and unpacked into a cache of
ours, never installed on the host.

The real nodes' smoke-test image is Debian's static busybox: installing ``busybox-static`` would
replace the host's ``busybox``, so its binary is taken from the package instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """Where cluster/build caches the binaries (the same rule), and the nodes' images, registry
    storage and Debian files beside them."""
    base = os.environ.get("TRAINER_CLUSTER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trainer-cluster"
    )
    return Path(base)


def cache_dir() -> Path:
    return cache_root() / "debs"


def package_file(package: str, path: str) -> Path | None:
    """``path`` (``bin/busybox``) from Debian's ``package``, unpacked once into the cache; None where
    there is no apt (not a Debian-like host) or the download fails."""
    root = cache_dir() / package
    target = root / path
    if target.exists():
        return target
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run(["apt-get", "download", package], cwd=tmp, capture_output=True, text=True)
        debs = list(Path(tmp).glob("*.deb"))
        if got.returncode != 0 or not debs:
            return None
        unpacked = Path(tmp) / "root"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True, capture_output=True)
        root.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.move(str(unpacked), root)
    return target if target.exists() else None
