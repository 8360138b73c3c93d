"""Which version this is, and which upstream Kubeflow Trainer release it implements: one place each.

The package's own version is its distribution's (pyproject.toml); the upstream release is
``trainer.UPSTREAM_VERSION``, which the chart (Chart.yaml's annotation, hence the
``kubeflow-trainer-public`` ConfigMap; tests/chart/test_chart_render.py) and the sandbox repeat.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from trainer_sandbox import sandbox

import trainer
from trainer import cli

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "kubeflow-trainer" / "Chart.yaml"


def test_the_implemented_upstream_release_is_v2_3_0() -> None:
    assert trainer.UPSTREAM_VERSION == "v2.3.0"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", trainer.UPSTREAM_VERSION)


def test_the_package_version_is_the_distributions() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert trainer.__version__ == version("trainer-operator") == project


def test_the_chart_and_the_sandbox_say_the_same_upstream_release() -> None:
    chart = yaml.safe_load(CHART.read_text())
    assert chart["annotations"]["trainer.kubeflow.org/upstream-version"] == trainer.UPSTREAM_VERSION
    # appVersion is the operator's image tag: this package's version, not upstream's.
    assert chart["appVersion"] == trainer.__version__
    assert sandbox.TRAINER_VERSION == trainer.UPSTREAM_VERSION


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code in (0, None)
    out, err = capsys.readouterr()
    assert out == f"trainer {trainer.__version__} (Kubeflow Trainer {trainer.UPSTREAM_VERSION} API)\n"
    assert err == ""


def test_version_command_line() -> None:
    """As a user runs it: the console script, exit 0, and no command required."""
    script = Path(sys.executable).parent / "trainer"
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"trainer {version('trainer-operator')} (Kubeflow Trainer v2.3.0 API)\n"
