"""Where the upstream reference data is: the one place the tests look for it.

Some tests compare our CRDs, schemas and runtimes with upstream's own files (the CRDs and default
runtimes of kubeflow/trainer, and the CRDs of JobSet, scheduler-plugins, Volcano, cert-manager and
the Prometheus Operator). Those files are upstream's, so the repository does not carry them;
docs/reference-data.md says what they are and how to get them. The tests find them in:

1. ``$TRAINER_REFERENCE_DIR``, when set;
2. else ``../shared/reference`` beside the repository root (where CI puts them).

A test that needs them says so with :func:`needs_reference` (or calls :func:`require`). When they
are missing it fails in CI (``CI`` set, as CI services do) and is skipped elsewhere, with a reason
that names the missing path; tests/conftest.py prints one line at the end of the run counting
those skips, so a local run never passes quietly without them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

ENV_VAR = "TRAINER_REFERENCE_DIR"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT.parent / "shared" / "reference"
MARKER = "reference_data"
# Every skip and failure for lack of the data starts with this, so conftest.py can count them.
MISSING = "upstream reference data missing"


def reference_dir() -> Path:
    """The reference directory the tests use (it may not exist)."""
    configured = os.environ.get(ENV_VAR)
    return Path(configured) if configured else DEFAULT


def available(*relative: str) -> bool:
    base = reference_dir()
    return base.is_dir() and all((base / r).exists() for r in relative)


def in_ci() -> bool:
    """Whether this run is CI's: ``CI`` set to anything but empty, ``0`` or ``false``."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_reason(*relative: str) -> str:
    base = reference_dir()
    missing = base if not base.is_dir() else next(base / r for r in relative if not (base / r).exists())
    where = f"${ENV_VAR}" if os.environ.get(ENV_VAR) else f"../shared/reference (${ENV_VAR} is not set)"
    return (
        f"{MISSING}: {missing} does not exist. The tests read upstream's CRDs and runtimes from "
        f"{where}; set {ENV_VAR} to a directory holding crds/ and runtimes/ as "
        "docs/reference-data.md describes."
    )


def require(*relative: str) -> Path:
    """The reference directory, checked to hold ``relative`` paths; skips the test when it does
    not (fails it in CI)."""
    if not available(*relative):
        reason = missing_reason(*relative)
        if in_ci():
            pytest.fail(f"{reason} CI must provide it.", pytrace=False)
        pytest.skip(reason)
    return reference_dir()


def needs_reference(*relative: str) -> pytest.MarkDecorator:
    """Mark a test (or, as ``pytestmark``, a module) that reads the reference data, or only the
    given paths inside it; tests/conftest.py calls :func:`require` before it runs."""
    return getattr(pytest.mark, MARKER)(*relative)


def params(values: Sequence[Any], arity: int = 1, within: str = "") -> list[Any]:
    """Parametrize values read from the reference data (from ``within`` it, when given). When the
    data is missing there are none, and pytest would skip the test for an "empty parameter set";
    one placeholder instead lets the test be skipped (or failed in CI) for the real reason."""
    where = (within,) if within else ()
    if values or available(*where):
        return list(values)
    return [pytest.param(*([None] * arity), id="no-reference-data", marks=needs_reference(*where))]


# Upstream's own sources, as the Go module proxy serves them (never committed): its chart's values,
# for the drop-in tests. The release whose API and runtimes we implement (trainer.UPSTREAM_VERSION).
UPSTREAM_MODULE = "github.com/kubeflow/trainer/v2"


def upstream_module(version: str) -> Path:
    """The directory of upstream's module at ``version`` in the Go module cache, downloaded from the
    module proxy when not there yet. Skips the test without Go (fails it in CI, which has Go)."""
    import json
    import shutil
    import subprocess

    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        reason = f"{MISSING}: go is not on PATH to fetch {UPSTREAM_MODULE}@{version} from the module proxy"
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    found = subprocess.run(
        [go, "mod", "download", "-json", f"{UPSTREAM_MODULE}@{version}"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    info = json.loads(found.stdout or "{}")
    if found.returncode != 0 or not info.get("Dir"):
        pytest.fail(f"go mod download {UPSTREAM_MODULE}@{version}: {info.get('Error') or found.stderr}")
    return Path(info["Dir"])
