"""Image archives written without an engine: every blob is named by its digest, the index names
the image, and the same inputs give the same archive (so the nodes' images are cached by content)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from trainer_sandbox.cluster import oci


def _blobs(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_an_archive_is_a_valid_oci_layout(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_bytes(b"\x7fELF not really")
    layer = oci.file_layer([oci.File("bin/tool", source=binary), oci.File("bin/alias", link="tool")])
    digest = oci.write_archive(
        tmp_path / "image.tar",
        oci.Image("localhost/x/tool:7", entrypoint=["/bin/tool"], user="65532"),
        [layer],
    )
    files = _blobs(tmp_path / "image.tar")
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rpartition("/")[2], name
    index = json.loads(files["index.json"])
    [entry] = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "localhost/x/tool:7"
    manifest = json.loads(files[f"blobs/sha256/{digest[7:]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    assert config["config"]["Entrypoint"] == ["/bin/tool"] and config["config"]["User"] == "65532"
    assert config["rootfs"]["diff_ids"] == [layer["digest"] for layer in manifest["layers"]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["bin/tool"].mode == 0o755 and members["bin/alias"].issym()
    assert members["bin/alias"].linkname == "tool" and members["bin"].isdir()


def test_the_same_inputs_give_the_same_archive(tmp_path: Path) -> None:
    def build(name: str) -> bytes:
        layer = oci.file_layer([oci.File("a", data=b"same")])
        oci.write_archive(tmp_path / name, oci.Image("localhost/x/a:1"), [layer])
        return (tmp_path / name).read_bytes()

    assert build("one.tar") == build("two.tar")
