"""The nodes' registry: image names map to the repositories containerd's mirror asks for (the
registry's host as the first path segment), and what it is configured with."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_sandbox.cluster import registry


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
