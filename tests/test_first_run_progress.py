"""What a first run prints: scripts/bootstrap installing .venv, cluster/build compiling the control
plane. Each is run for real, against a fake ``python`` or ``go`` that replays what the real one
prints (no download, no compilation): a line per step with counts, on stderr, without carriage
returns, and nothing at all on a run that finds everything done.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP = ROOT / "scripts" / "bootstrap"
BUILD = ROOT / "cluster" / "build"


def _executable(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# --- scripts/bootstrap -------------------------------------------------------------------------


def _pip_install_report(packages: int, cached: int) -> str:
    """What pip 26 prints on stdout for the project's install when stdout is not a terminal:
    the editable projects prepared, each requirement collected and fetched (a progress bar's last
    state after the larger ones), the editable wheels built, the install."""
    lines = ["Looking in links: /opt/wheels"]
    for project in ("/repo", "/repo/sandbox"):
        lines.append(f"Obtaining file://{project}")
        for step in ("Installing build dependencies", "Preparing editable metadata (pyproject.toml)"):
            lines += [f"  {step}: started", f"  {step}: finished with status 'done'"]
    names = [f"dep{i}" for i in range(packages)]
    for i, name in enumerate(names):
        lines.append(f"Collecting {name}>=1.0 (from trainer-operator==0.1.0)")
        if i < cached:
            lines.append(f"  Using cached {name}-1.0-py3-none-any.whl (12 kB)")
        else:
            lines.append(f"  Downloading {name}-1.0-py3-none-any.whl.metadata (2.1 kB)")
            lines.append(f"  Downloading {name}-1.0-py3-none-any.whl (1.5 MB)")
            lines.append("     ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 1.5/1.5 MB 184.5 MB/s  0:00:00")
    lines += [
        "Building wheels for collected packages: trainer-operator, trainer-sandbox",
        "  Building editable for trainer-operator (pyproject.toml): started",
        "  Building editable for trainer-operator (pyproject.toml): finished with status 'done'",
        "Successfully built trainer-operator trainer-sandbox",
        "Installing collected packages: " + ", ".join([*names, "trainer-operator", "trainer-sandbox"]),
        "  Attempting uninstall: setuptools",
        "Successfully installed "
        + " ".join(f"{n}-1.0" for n in [*names, "trainer-operator", "trainer-sandbox"]),
    ]
    return "\n".join(lines) + "\n"


PIP_UPGRADE_REPORT = """\
Looking in links: /opt/wheels
Requirement already satisfied: pip in ./.venv/lib/python3.11/site-packages (23.2.1)
Collecting pip
  Downloading pip-26.3-py3-none-any.whl (2.0 MB)
Installing collected packages: pip
  Attempting uninstall: pip
Successfully installed pip-26.3
"""


@pytest.fixture
def checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of scripts/bootstrap in a bare project, a fake system ``python3`` whose venv's
    ``python -m pip`` replays pip's report (each call's arguments and PYTHONWARNINGS recorded in
    calls.log), and a PATH of the few commands the script needs: no apt-get, so its part for real
    nodes does nothing even as root."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(BOOTSTRAP, repo / "scripts" / "bootstrap")
    (repo / "pyproject.toml").write_text("[project]\nname = 'trainer-operator'\n")
    (repo / "sandbox" / "trainer_sandbox").mkdir(parents=True)
    (repo / "sandbox" / "pyproject.toml").write_text("[project]\nname = 'trainer-sandbox'\n")
    for folder in ("trainer", "plugins"):
        (repo / folder).mkdir()
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "install.txt").write_text(_pip_install_report(packages=25, cached=5))
    (fake / "upgrade.txt").write_text(PIP_UPGRADE_REPORT)
    venv_python = _executable(
        fake / "venv-python",
        f"""
        #!{shutil.which("bash")}
        if [ "$1 $2" = "-m compileall" ]; then exit 0; fi
        [ "$1 $2 $3" = "-m pip install" ] || exit 9
        shift 3
        echo "$* PYTHONWARNINGS=${{PYTHONWARNINGS-}}" >>"{fake}/calls.log"
        case " $* " in *" --upgrade pip "*) cat "{fake}/upgrade.txt"; exit 0 ;; esac
        cat "{fake}/install.txt"
        echo "WARNING: a warning of pip's own" >&2
        exit "${{FAKE_PIP_EXIT:-0}}"
        """,
    )
    _executable(
        fake / "python3",
        f"""
        #!{shutil.which("bash")}
        if [ "$1" = -c ]; then echo "Python 3.11.99"; exit 0; fi
        [ "$1 $2" = "-m venv" ] || exit 9
        mkdir -p "$3/bin" && cp "{venv_python}" "$3/bin/python"
        """,
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "cat", "cp", "cut", "dirname", "id", "mkdir", "rm", "sha256sum", "touch"):
        found = shutil.which(tool)
        assert found, f"{tool} is not on PATH"
        (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "PYTHON": str(fake / "python3"), "HOME": str(tmp_path)}
    return repo, env


def _bootstrap(repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(repo / "scripts" / "bootstrap")], env=env, capture_output=True, text=True, timeout=60
    )


def _calls(repo: Path) -> list[str]:
    log = repo.parent / "fake" / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_bootstrap_says_what_it_installs_a_line_per_step(checkout: tuple[Path, dict[str, str]]) -> None:
    repo, env = checkout
    run = _bootstrap(repo, env)
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    assert "\r" not in run.stderr
    lines = [re.sub(r"\dm\d\ds", "T", line) for line in run.stderr.splitlines()]  # times vary
    assert "WARNING: a warning of pip's own" in lines  # pip's stderr is shown as it is
    ours = [
        line.removeprefix("scripts/bootstrap: ")
        for line in lines
        if line != "WARNING: a warning of pip's own"
    ]
    assert len(ours) == len(lines) - 1, f"lines not of scripts/bootstrap (pip's report leaking?): {lines}"
    assert ours[0] == f"creating .venv with Python 3.11.99 ({env['PYTHON']})"
    assert ours[1:5] == [
        "upgrading pip in .venv",
        "fetched 1 package: 1 downloaded (2 MB), 0 from pip's cache (T)",
        "installing 1 package: pip",
        "installed 1 package (T)",
    ]
    assert ours[5].startswith("installing trainer-operator with its development tools and trainer-sandbox")
    # Every tenth package found (the first 5 from pip's cache, then 1.5 MB each downloaded; a
    # package is found before it is downloaded), and the downloads' total, metadata not counted.
    assert ours[6:] == [
        "resolving: 10 packages found, 4 downloaded (6 MB), last dep9 (T)",
        "resolving: 20 packages found, 14 downloaded (21 MB), last dep19 (T)",
        "fetched 25 packages: 20 downloaded (30 MB), 5 from pip's cache (T)",
        "building trainer-operator, trainer-sandbox",
        "installing 27 packages: dep0, dep1, dep2, dep3, dep4 and 22 more",
        "installed 27 packages (T)",
        "done (T); the next run checks only that .venv is complete",
    ]
    # pip's report is kept whole; pip was asked for no progress bar, and setuptools' notice about
    # editable installs of a layout like ours was silenced.
    assert (repo / ".venv" / "pip.log").read_text() == (repo.parent / "fake" / "install.txt").read_text()
    upgrade, install = _calls(repo)
    assert upgrade.startswith("--progress-bar off --disable-pip-version-check --upgrade pip")
    assert install.startswith("--progress-bar off --disable-pip-version-check -e .[dev] -e ./sandbox")
    assert install.endswith("PYTHONWARNINGS=ignore:Editable installation")


def test_bootstrap_prints_nothing_when_the_environment_is_complete(
    checkout: tuple[Path, dict[str, str]],
) -> None:
    repo, env = checkout
    assert _bootstrap(repo, env).returncode == 0
    again = _bootstrap(repo, env)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert len(_calls(repo)) == 2  # pip ran on the first run only


def test_bootstrap_stops_when_pip_fails_and_installs_on_the_next_run(
    checkout: tuple[Path, dict[str, str]],
) -> None:
    repo, env = checkout
    failed = _bootstrap(repo, {**env, "FAKE_PIP_EXIT": "1"})
    assert failed.returncode == 1
    assert failed.stderr.splitlines()[-1] == (
        "scripts/bootstrap: pip failed (exit 1): its errors are above, its full report in .venv/pip.log"
    )
    assert not list((repo / ".venv").glob(".installed-*"))
    again = _bootstrap(repo, env)
    assert again.returncode == 0, again.stderr
    assert "scripts/bootstrap: installed 27 packages" in again.stderr
    assert list((repo / ".venv").glob(".installed-*"))


# --- cluster/build -----------------------------------------------------------------------------

FAKE_GO = """
    #!{python}
    # `go version`, `go build -n` (a plan: a banner per package to compile, as Go prints it) and
    # `go build -v` (each package's name as it compiles, then a binary per main in the -o folder).
    import os, sys
    from pathlib import Path

    args = sys.argv[1:]
    if args == ["version"]:
        print("go version go0.0-fake linux/amd64")
        sys.exit(0)
    assert args[0] == "build", args
    packages = int(os.environ.get("FAKE_GO_PACKAGES", "120"))
    if "-n" in args:
        if os.environ.get("FAKE_GO_PLAN_FAILS"):
            print("go: example.com/x@v1.0.0: missing go.sum entry", file=sys.stderr)
            print("cmd/x/main.go:5:2: no required module provides package example.com/y", file=sys.stderr)
            sys.exit(1)
        for i in range(3):
            print(f"go: downloading example.com/mod{{i}} v1.0.{{i}}", file=sys.stderr)
        for i in range(packages):
            print(f"mkdir -p $WORK/b{{i:03}}/\\n\\n#\\n# example.com/pkg{{i}}\\n#\\n", file=sys.stderr)
            print(f"cat >$WORK/b{{i:03}}/importcfg << 'EOF' # internal\\n# import config\\nEOF", file=sys.stderr)
        sys.exit(0)
    out = Path(args[args.index("-o") + 1])
    for i in range(packages):
        print(f"example.com/pkg{{i}}", file=sys.stderr)
        if i == 5:
            print("# example.com/pkg5\\npkg5/a.go:1:1: a compiler's note", file=sys.stderr)
    if os.environ.get("FAKE_GO_FAILS"):
        sys.exit(2)
    for main in args[args.index("-o") + 2 :]:
        binary = out / main.rsplit("/", 1)[-1]
        binary.write_text("")
        binary.chmod(0o755)
"""


@pytest.fixture
def fake_go(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``go`` is the fake, and whose build cache is the test's own."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    _executable(bin_dir / "go", FAKE_GO.format(python=sys.executable))
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "TRAINER_CLUSTER_CACHE": str(tmp_path / "cache"),
    }


def _build(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUILD)], env=env, capture_output=True, text=True, timeout=60)


BINARIES = 21  # cluster/build's list


def test_cluster_build_counts_the_packages_of_its_plan_and_reports_against_that_total(
    fake_go: dict[str, str],
) -> None:
    run = _build(fake_go)
    assert run.returncode == 0, run.stderr
    out = Path(run.stdout.strip())
    assert out.parent.parent == Path(fake_go["TRAINER_CLUSTER_CACHE"]) and out.name == "bin"
    assert len(list(out.iterdir())) == BINARIES
    assert "\r" not in run.stderr
    lines = run.stderr.splitlines()
    # The compiler's messages pass; the package names, the plan and its banners do not.
    assert [x for x in lines if not x.startswith("cluster/build: ")] == [
        "# example.com/pkg5",
        "pkg5/a.go:1:1: a compiler's note",
    ]
    said = [x.removeprefix("cluster/build: ") for x in lines if x.startswith("cluster/build: ")]
    assert said[:5] == [
        f"building the control plane into {out.parent}",
        "counting the packages to compile (go build -n)",
        "downloading Go modules: 1 so far (example.com/mod0 v1.0.0)",
        said[3],
        "120 packages to compile (those Go's build cache lacks), then 21 binaries to link: minutes, mostly linking",
    ]
    assert re.fullmatch(r"downloaded 3 Go modules \(\dm\d\ds\)", said[3])
    compiled = [
        re.fullmatch(r"compiled (\d+) of 120 packages \((\d+)%, \dm\d\ds\): example\.com/pkg(\d+)", x)
        for x in said
        if x.startswith("compiled ")
    ]
    assert all(compiled), said
    # A line at each 5%, naming the package that reached it.
    assert [(int(m[1]), int(m[2]), int(m[3])) for m in compiled if m] == [
        (6 * k, 5 * k, 6 * k - 1) for k in range(1, 21)
    ]
    linked = [
        re.fullmatch(r"linked (\S+) \((\d+) of 21 binaries, \dm\d\ds\)", x)
        for x in said
        if x.startswith("linked ")
    ]
    assert all(linked), said
    assert sorted(m[1] for m in linked if m) == sorted(p.name for p in out.iterdir())
    assert [int(m[2]) for m in linked if m] == list(range(1, BINARIES + 1))
    assert re.fullmatch(r"done in \dm\d\ds", said[-1])


def test_cluster_build_of_a_cold_cache_says_so_in_thousands(fake_go: dict[str, str]) -> None:
    run = _build({**fake_go, "FAKE_GO_PACKAGES": "3750"})
    assert run.returncode == 0, run.stderr
    said = run.stderr.splitlines()
    assert (
        "cluster/build: 3,750 packages to compile (those Go's build cache lacks), then 21 binaries to link: "
        "tens of minutes on 2 cores"
    ) in said
    compiled = [re.sub(r", \dm\d\ds\)", ")", x) for x in said if x.startswith("cluster/build: compiled ")]
    assert len(compiled) == 20
    assert compiled[0] == "cluster/build: compiled 188 of 3,750 packages (5%): example.com/pkg187"
    assert compiled[-1] == "cluster/build: compiled 3,750 of 3,750 packages (100%): example.com/pkg3749"


def test_cluster_build_with_every_package_in_the_cache_only_links(fake_go: dict[str, str]) -> None:
    run = _build({**fake_go, "FAKE_GO_PACKAGES": "0"})
    assert run.returncode == 0, run.stderr
    said = run.stderr.splitlines()
    assert (
        "cluster/build: nothing to compile (Go's build cache holds every package); 21 binaries to link: "
        "a minute or two"
    ) in said
    assert not [x for x in said if "compiled" in x]
    assert len([x for x in said if x.startswith("cluster/build: linked ")]) == BINARIES


def test_cluster_build_prints_only_the_directory_when_built(fake_go: dict[str, str]) -> None:
    first = _build(fake_go)
    assert first.returncode == 0, first.stderr
    again = _build(fake_go)
    assert (again.returncode, again.stdout, again.stderr) == (0, first.stdout, "")


def test_cluster_build_without_a_plan_counts_what_it_compiled(fake_go: dict[str, str]) -> None:
    run = _build({**fake_go, "FAKE_GO_PLAN_FAILS": "1", "FAKE_GO_PACKAGES": "250"})
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    # Go's messages, each once: a compiler-style one as well as its own "go: " lines.
    assert lines.count("go: example.com/x@v1.0.0: missing go.sum entry") == 1
    assert lines.count("cmd/x/main.go:5:2: no required module provides package example.com/y") == 1
    assert "cluster/build: go build -n failed (its messages are above): building without a total" in lines
    counts = [re.match(r"cluster/build: compiled (\d+) packages \(", x) for x in lines]
    # Every hundredth, and the count at the end.
    assert [int(m[1]) for m in counts if m] == [100, 200, 250]


def test_cluster_build_fails_with_go_and_keeps_no_binary(fake_go: dict[str, str]) -> None:
    run = _build({**fake_go, "FAKE_GO_FAILS": "1", "FAKE_GO_PACKAGES": "3"})
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.splitlines()[-1] == "cluster/build: go build failed (exit 2)"
    assert not list(Path(fake_go["TRAINER_CLUSTER_CACHE"]).glob("*/bin"))


def test_go_build_n_has_a_banner_for_each_package_go_build_v_compiles(tmp_path: Path) -> None:
    """What the fake assumes of the real Go, on a module of two packages: the plan's banners are
    the packages the build then names (those Go's build cache holds are in neither)."""
    if not shutil.which("go"):
        if os.environ.get("CI"):
            pytest.fail("CI is set and go is not on PATH")
        pytest.skip("go is not on PATH")
    (tmp_path / "go.mod").write_text("module example.com/m\n\ngo 1.22\n")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "a.go").write_text(f"package a\n\nconst A = {os.getpid()}\n")  # new to the cache
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "main.go").write_text(
        'package main\n\nimport "example.com/m/a"\n\nfunc main() { println(a.A) }\n'
    )
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    args = ["-trimpath", "-o", f"{tmp_path}/out/", "./b"]
    plan = subprocess.run(
        ["go", "build", "-n", *args], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    banners = [x for x in plan.stderr.splitlines() if x.startswith("# ") and x != "# import config"]
    built = subprocess.run(
        ["go", "build", "-v", *args], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert built.stderr.splitlines() == [b.removeprefix("# ") for b in banners]
    assert "example.com/m/a" in built.stderr.splitlines()
