"""The nodes' registry: image names map to the repositories containerd's mirror asks for (the
registry's host as the first path segment), and what it is configured with."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from trainer_sandbox.cluster import oci, registry
from trainer_sandbox.ports import free_ports


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (
            "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
            ("docker.io/pytorch/pytorch", "2.13.0-cuda13.0-cudnn9-runtime"),
        ),
        ("trainer-operator:0.1.0", ("docker.io/library/trainer-operator", "0.1.0")),
        (
            "ghcr.io/kubeflow/trainer/deepspeed-runtime",
            ("ghcr.io/kubeflow/trainer/deepspeed-runtime", "latest"),
        ),
        ("nvcr.io/nvidia/jax:25.10-py3", ("nvcr.io/nvidia/jax", "25.10-py3")),
        ("localhost/trainer/torch:1", ("localhost/trainer/torch", "1")),
        ("localhost:5000/x/y", ("localhost:5000/x/y", "latest")),
    ],
)
def test_image_names_map_to_mirrored_repositories(image: str, expected: tuple[str, str]) -> None:
    assert registry.repository(image) == expected


def test_every_mirrored_registry_resolves_through_ours_first(tmp_path: Path) -> None:
    registry.write_hosts(tmp_path, "10.246.0.1:5555")
    for name in ("docker.io", "ghcr.io", "nvcr.io", "localhost"):
        text = (tmp_path / name / "hosts.toml").read_text()
        assert f'[host."http://10.246.0.1:5555/v2/{name}"]' in text
        assert "override_path = true" in text and '"pull", "resolve"' in text


@pytest.fixture
def registries(bin_dir: Path, tmp_path: Path) -> Iterator[tuple[registry.Client, registry.Client, Path]]:
    """The registry built in cluster/, as `up` runs it: a writer and a read-only server of one
    storage, on loopback."""
    storage = tmp_path / "storage"
    push, serve = free_ports(2)
    writer = registry.write_config(tmp_path / "w.yaml", storage, f"127.0.0.1:{push}")
    reader = registry.write_config(tmp_path / "r.yaml", storage, f"127.0.0.1:{serve}", read_only=True)
    procs = [
        subprocess.Popen([str(bin_dir / "registry"), "serve", str(c)], stderr=subprocess.DEVNULL)
        for c in (writer, reader)
    ]
    clients = registry.Client(f"127.0.0.1:{push}"), registry.Client(f"127.0.0.1:{serve}")
    try:
        deadline = time.monotonic() + 30
        while not all(c.ping() for c in clients):
            assert time.monotonic() < deadline, "the registries did not start"
            time.sleep(0.1)
        yield clients[0], clients[1], writer
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def _image(content: bytes) -> oci.Blobs:
    return oci.image_blobs(oci.Image("localhost/x/y:1"), [oci.file_layer([oci.File("f", data=content)])])


def test_pushes_are_idempotent_and_the_nodes_side_is_read_only(
    registries: tuple[registry.Client, registry.Client, Path],
) -> None:
    writer, reader, _ = registries
    blobs = _image(b"one")
    assert writer.push("pytorch/pytorch:2", blobs) == 2  # the config and the layer
    assert writer.push("pytorch/pytorch:2", blobs) == 0  # already there
    assert writer.push("ghcr.io/kubeflow/trainer/deepspeed-runtime", blobs) == 0  # mounted, not sent
    assert reader.manifest_digest("pytorch/pytorch:2") == blobs.manifest_digest
    assert (
        reader.manifest_digest("ghcr.io/kubeflow/trainer/deepspeed-runtime:latest") == blobs.manifest_digest
    )
    with pytest.raises(registry.RegistryError):  # what a pod could try: the served side takes no pushes
        reader.push("pytorch/pytorch:2", _image(b"poisoned"))
    assert reader.manifest_digest("pytorch/pytorch:2") == blobs.manifest_digest


def test_garbage_collection_removes_only_what_no_tag_references(
    registries: tuple[registry.Client, registry.Client, Path], bin_dir: Path
) -> None:
    writer, _, config = registries
    old, new = _image(b"old"), _image(b"new")
    writer.push("pytorch/pytorch:2", old)
    writer.push("pytorch/pytorch:2", new)  # the tag moves to the rebuilt image
    storage = Path(yaml.safe_load(config.read_text())["storage"]["filesystem"]["rootdirectory"])
    registry.collect_garbage(bin_dir / "registry", config, storage)
    kept = {p.name for p in (storage / "docker/registry/v2/blobs/sha256").rglob("*") if len(p.name) == 64}
    assert new.layers[0].digest[7:] in kept and new.config.digest[7:] in kept
    assert old.layers[0].digest[7:] not in kept


def test_a_storage_nothing_was_pushed_to_has_nothing_to_collect(tmp_path: Path, bin_dir: Path) -> None:
    """A machine's first cluster: the registry's collector fails on a storage without repositories
    ("Path not found: /docker/registry/v2/repositories"), which must not stop the cluster."""
    storage = tmp_path / "empty"
    storage.mkdir()
    config = registry.write_config(tmp_path / "registry.yaml", storage, "127.0.0.1:1")
    registry.collect_garbage(bin_dir / "registry", config, storage)
    assert list(storage.iterdir()) == []
