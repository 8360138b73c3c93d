"""OCI image archives written without a container engine: what `ctr images import` reads.

The real nodes cannot pull (no route off the machine), so the images they run are written here
and imported into each node's containerd: the pause image and CoreDNS from binaries built in
``cluster/``, larger ones from root filesystems. An image is a config, a manifest and layers, each
a blob named by its SHA-256; the archive is a tar of those blobs with an ``index.json`` naming the
image. Layers are stored uncompressed: they are imported on the same machine, where gzip would
only cost time.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAYER = "application/vnd.oci.image.layer.v1.tar"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
EPOCH = 0  # every mtime in a layer: the same inputs give the same digest


@dataclass(frozen=True)
class File:
    """One file of a layer: ``source`` on disk or ``data`` in memory, at ``path`` in the image."""

    path: str
    mode: int = 0o755
    source: Path | None = None
    data: bytes | None = None
    link: str | None = None  # a symbolic link to this target instead of a file


@dataclass
class Image:
    """What goes into the image's config: entrypoint, env, user, working directory."""

    name: str
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    user: str = ""
    workdir: str = ""


def file_layer(files: Iterable[File]) -> bytes:
    """A layer tar holding ``files`` (and their parent directories), owned by root, dated 1970."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for f in sorted(files, key=lambda f: f.path):
            parts = f.path.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
                    tar.addfile(info)
            info = tarfile.TarInfo("/".join(parts))
            if f.link is not None:
                info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, f.link, 0o777, EPOCH
                tar.addfile(info)
                continue
            data = f.data if f.data is not None else (f.source.read_bytes() if f.source else b"")
            info.size, info.mode, info.mtime = len(data), f.mode, EPOCH
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int
    source: Path | bytes


@dataclass(frozen=True)
class Blobs:
    """An image as a registry or an archive stores it: the manifest, the config, the layers."""

    manifest: bytes
    config: Blob
    layers: tuple[Blob, ...]

    @property
    def manifest_digest(self) -> str:
        return _digest(self.manifest)


def image_blobs(image: Image, layers: Sequence[Path | bytes]) -> Blobs:
    """The blobs of ``image`` with ``layers`` (uncompressed tars, bottom first). A layer given as a
    path is hashed by streaming, never read whole (a root filesystem is a gigabyte or more)."""
    blobs: list[Blob] = []
    for layer in layers:
        if isinstance(layer, bytes):
            blobs.append(Blob(_digest(layer), len(layer), layer))
            continue
        h = hashlib.sha256()
        size = 0
        with layer.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
        blobs.append(Blob("sha256:" + h.hexdigest(), size, layer))
    config: dict[str, Any] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            k: v
            for k, v in {
                "Entrypoint": list(image.entrypoint) or None,
                "Cmd": list(image.cmd) or None,
                "Env": [f"{k}={v}" for k, v in image.env.items()] or None,
                "User": image.user or None,
                "WorkingDir": image.workdir or None,
            }.items()
            if v is not None
        },
        "rootfs": {"type": "layers", "diff_ids": [b.digest for b in blobs]},
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_blob = Blob(_digest(config_bytes), len(config_bytes), config_bytes)
    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": config_blob.digest, "size": config_blob.size},
        "layers": [{"mediaType": LAYER, "digest": b.digest, "size": b.size} for b in blobs],
    }
    return Blobs(json.dumps(manifest, sort_keys=True).encode(), config_blob, tuple(blobs))


def write_archive(path: Path, image: Image, layers: Sequence[Path | bytes]) -> str:
    """Write ``image`` with ``layers`` as an OCI archive at ``path``; return the manifest's digest."""
    blobs = image_blobs(image, layers)
    manifest_bytes, manifest_digest = blobs.manifest, blobs.manifest_digest
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "annotations": {
                    "io.containerd.image.name": image.name,
                    "org.opencontainers.image.ref.name": image.name.rpartition(":")[2],
                },
            }
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, EPOCH
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index, sort_keys=True).encode())
        add(f"blobs/sha256/{manifest_digest[7:]}", manifest_bytes)
        for blob in (blobs.config, *blobs.layers):
            name = f"blobs/sha256/{blob.digest[7:]}"
            if isinstance(blob.source, bytes):
                add(name, blob.source)
                continue
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = blob.size, 0o644, EPOCH
            with blob.source.open("rb") as f:
                tar.addfile(info, f)
    tmp.replace(path)
    return manifest_digest


def read_archive(path: Path) -> Blobs:
    """The image of an OCI archive of one image (as ``buildah push oci-archive:`` writes it), its
    blobs in memory: for images of tens of megabytes."""
    with tarfile.open(path) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    index = json.loads(files["index.json"])
    digest = index["manifests"][0]["digest"]
    manifest = files[f"blobs/sha256/{digest[7:]}"]
    parsed = json.loads(manifest)

    def blob(desc: dict[str, Any]) -> Blob:
        data = files[f"blobs/sha256/{desc['digest'][7:]}"]
        return Blob(desc["digest"], len(data), data)

    return Blobs(manifest, blob(parsed["config"]), tuple(blob(d) for d in parsed["layers"]))
