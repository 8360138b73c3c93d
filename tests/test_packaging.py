"""The wheel carries plugins under the trainer namespace, the CRDs and the runtimes."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from render_helpers import ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (found,) = out.glob("trainer_operator-*.whl")
    return found


def test_wheel_layout(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not any(n.startswith("plugins/") for n in names), (
        "plugins/ must not install as a top-level package"
    )
    for module in ("torch", "mpi", "jobset", "coscheduling", "volcano", "flux", "plainml", "jax", "xgboost"):
        assert f"trainer/plugins/{module}.py" in names
    assert "trainer/crds/openapi.json" in names
    assert "trainer/crds/trainer.kubeflow.org_trainjobs.yaml" in names
    assert "trainer/runtimes/torch_distributed.yaml" in names
    assert "trainer/api/embedded_schemas.json" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "trainer = trainer.cli:main" in text
    from trainer.runtime.framework import BUILTIN_PLUGINS

    for name, module in BUILTIN_PLUGINS.items():
        # Built-ins are declared exactly as a third-party plugin declares itself.
        assert f"{name} = {module}:plugin" in text


def test_installed_wheel_renders_with_bundled_runtimes(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: w}\n"
        "spec: {runtimeRef: {name: torch-distributed}}\n"
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import trainer, trainer.cli; "
        "assert trainer.__file__.startswith(sys.argv[1]), trainer.__file__; "
        "sys.exit(trainer.cli.main(['render', '-f', sys.argv[2]]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(target), str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "kind: JobSet" in out.stdout
