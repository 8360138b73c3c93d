"""The wheel carries plugins under the trainer namespace, the CRDs and the runtimes, and none of
the local API server stand-in (a distribution of its own, sandbox/)."""

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
    stand_in = sorted(n for n in names if n.startswith(("trainer_sandbox/", "trainer/testing/", "sandbox/")))
    assert not stand_in, f"the operator's wheel carries the stand-in: {stand_in[:5]}"
    assert "trainer/plugin.py" in names and "trainer/apimachinery/schema_validation.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "trainer = trainer.cli:main" in text
    from trainer.runtime.framework import BUILTIN_PLUGINS

    for name, module in BUILTIN_PLUGINS.items():
        # Built-ins are declared exactly as a third-party plugin declares itself.
        assert f"{name} = {module}:plugin" in text


def test_the_operator_does_not_require_the_official_client(wheel: Path) -> None:
    """kopf imports the official client whenever it is installed (40 MiB of the operator's memory);
    credentials are read, exec plugins run, without it. Only the tests install it (dev extra)."""
    archive = zipfile.ZipFile(wheel)
    metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA")))
    requires = [
        line.partition(":")[2].strip()
        for line in metadata.decode().splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert requires and not [r for r in requires if r.lower().startswith("kubernetes")], requires


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
    # The installed wheel knows its version (its own dist-info), and the upstream release it implements.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import trainer.cli; "
        "from importlib.metadata import distribution as d; "
        "assert str(d('trainer-operator').locate_file('')).startswith(sys.argv[1]); "
        "sys.exit(trainer.cli.main(['--version']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(target)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    version = wheel.name.split("-")[1]
    assert out.stdout == f"trainer {version} (Kubeflow Trainer v2.3.0 API)\n"


def test_sandbox_commands_say_how_to_install_the_sandbox(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where trainer-sandbox is not installed (the operator's image), `trainer demo` says so."""
    from trainer import cli

    monkeypatch.setitem(sys.modules, "trainer_sandbox", None)  # as if not installed
    for command in ("demo", "sandbox"):
        assert cli.main([command, "--help"]) == 2
        err = capsys.readouterr().err
        assert f"trainer {command}: needs the trainer-sandbox package" in err
        assert "pip install ./sandbox" in err


def test_sandbox_wheel_carries_the_stand_in(tmp_path: Path) -> None:
    import shutil

    # Built from a copy: setuptools builds in the source tree and would leave build/ in sandbox/.
    source = shutil.copytree(
        ROOT / "sandbox",
        tmp_path / "src",
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run(
        [*pip_wheel, "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (found,) = tmp_path.glob("trainer_sandbox-*.whl")
    names = set(zipfile.ZipFile(found).namelist())
    assert "trainer_sandbox/apiserver/server.py" in names
    assert "trainer_sandbox/crds/jobset.x-k8s.io_jobsets.json" in names
    assert "trainer_sandbox/k8s_schemas.json.gz" in names
    assert not any(n.startswith("trainer/") for n in names)
