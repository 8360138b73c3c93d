"""Plugins from other packages: found through the ``trainer.plugins`` entry-point group, loaded only
when the configuration allow-lists them, run after the built-ins.

The plugin package is the worked example of docs/plugins.md, taken verbatim from the page, built
into a wheel with ``python -m build`` and installed with pip into a directory put on ``sys.path``,
as an operator image would install one: the guide cannot drift from what works.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from render_helpers import ROOT, container, only, render, runtime, trainjob

from trainer.runtime import framework as fw
from trainer.runtime.hookspecs import hookimpl

PLUGIN_NAME = "ClusterName"
MODULE = "trainer_cluster_name"
DOCS = ROOT / "docs" / "plugins.md"


def test_docs_example_imports_only_the_plugin_api() -> None:
    _, module = docs_example()
    imports = re.findall(r"^(?:from|import) (trainer[\w.]*)", module, re.M)
    assert imports == ["trainer.plugin"], imports


def docs_example() -> tuple[str, str]:
    """The pyproject.toml and the module of the worked example in docs/plugins.md, verbatim."""
    text = DOCS.read_text()
    (pyproject,) = re.findall(r"`pyproject.toml`:\n\n```toml\n(.*?)```", text, re.S)
    (module,) = re.findall(rf"`{MODULE}.py`:\n\n```python\n(.*?)```", text, re.S)
    return pyproject, module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs' plugin package, built into a wheel and pip-installed into a directory of its own."""
    root = tmp_path_factory.mktemp("plugin")
    source = root / "src"
    source.mkdir()
    pyproject, module = docs_example()
    (source / "pyproject.toml").write_text(pyproject)
    (source / f"{MODULE}.py").write_text(module)
    dist, target = root / "dist", root / "site"
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(source)]
    subprocess.run(build, check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = dist.glob("trainer_cluster_name-0.1.0-*.whl")
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target)]
    subprocess.run([*pip, str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    assert (target / f"{MODULE}.py").is_file()
    return target


@pytest.fixture
def installed(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(site))  # also invalidates import caches
    yield site
    sys.modules.pop(MODULE, None)


TORCH = {"numNodes": 1, "torch": {}}


def env_names(cluster: Any) -> list[str]:
    return [var["name"] for var in container(only(cluster, "JobSet"), "node").get("env", [])]


def test_installed_plugin_is_ignored_unless_allow_listed(installed: Path) -> None:
    assert PLUGIN_NAME in fw._external_entry_points(), "the wheel's entry point is visible"
    framework = fw.load()
    assert PLUGIN_NAME not in framework.enabled
    assert MODULE not in sys.modules, "an installed plugin is not even imported without the allow-list"
    names = env_names(render(runtime(ml_policy=TORCH), trainjob(trainer={"numNodes": 2}), fw=framework))
    assert "PET_NNODES" in names and "CLUSTER_NAME" not in names


def test_allow_listed_plugin_loads_and_runs_after_the_builtins(installed: Path) -> None:
    framework = fw.load(fw.PluginConfig(allowed_external=frozenset({PLUGIN_NAME})))
    assert framework.enabled == [*(n for n in fw.BUILTIN_PLUGINS if n not in fw.GATED), PLUGIN_NAME]
    assert sys.modules[MODULE].__file__ == str(installed / f"{MODULE}.py")
    cluster = render(runtime(ml_policy=TORCH), trainjob(trainer={"numNodes": 2}), fw=framework)
    node = container(only(cluster, "JobSet"), "node")
    # Torch ran first in the ML phase, so its variables come first (docs/decisions.md §1).
    assert [var["name"] for var in node["env"]] == [
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "CLUSTER_NAME",
    ]
    assert node["env"][-1] == {"name": "CLUSTER_NAME", "value": "gpu-east-1"}
    # The TrainJob's own value wins, as the docs promise.
    own = trainjob(trainer={"env": [{"name": "CLUSTER_NAME", "value": "mine"}]})
    node = container(only(render(runtime(ml_policy=TORCH), own, fw=framework), "JobSet"), "node")
    assert [var for var in node["env"] if var["name"] == "CLUSTER_NAME"] == [
        {"name": "CLUSTER_NAME", "value": "mine"}
    ]


def test_allow_listed_but_disabled_plugin_stays_off(installed: Path) -> None:
    config = fw.PluginConfig(allowed_external=frozenset({PLUGIN_NAME}), disabled=frozenset({PLUGIN_NAME}))
    assert PLUGIN_NAME not in fw.load(config).enabled


# --- what an allow-listed plugin must be (entry points faked: no build needed) ---


class FakeEntryPoint:
    def __init__(self, target: Any) -> None:
        self.target = target

    def load(self) -> Any:
        if isinstance(self.target, Exception):
            raise self.target
        return self.target


def load_with(monkeypatch: pytest.MonkeyPatch, name: str, target: Any) -> fw.Framework:
    monkeypatch.setattr(fw, "_external_entry_points", lambda: {name: FakeEntryPoint(target)})
    return fw.load(fw.PluginConfig(allowed_external=frozenset({name})))


class Good:
    name = "Good"

    def needed_by(self, spec: Any) -> bool:
        return False

    @hookimpl
    def trainer_build(self, info: Any) -> None:
        return None


def test_a_plugin_class_is_instantiated(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_with(monkeypatch, "Good", Good).enabled[-1] == "Good"


def test_name_must_match_the_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(fw.PluginConfigError, match="must equal the entry-point name"):
        load_with(monkeypatch, "Other", Good())


def test_ordering_options_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class Pushy(Good):
        name = "Pushy"

        @hookimpl(tryfirst=True)
        def trainer_enforce_ml_policy(self, info: Any) -> None:
            return None

    with pytest.raises(fw.PluginConfigError, match="marked tryfirst"):
        load_with(monkeypatch, "Pushy", Pushy())


def test_misspelled_hooks_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    class Typo(Good):
        name = "Typo"

        @hookimpl
        def trainer_enforce_mlpolicy(self, info: Any) -> None:
            return None

    with pytest.raises(fw.PluginConfigError, match="'trainer_enforce_mlpolicy', which is not a hook"):
        load_with(monkeypatch, "Typo", Typo())


def test_broken_packages_and_builtin_names_are_configuration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(fw.PluginConfigError, match="'Broken' failed to load: no module named nowhere"):
        load_with(monkeypatch, "Broken", ImportError("no module named nowhere"))
    with pytest.raises(fw.PluginConfigError, match="built-in plugins need no allow-listing: MPI"):
        fw.load(fw.PluginConfig(allowed_external=frozenset({"MPI"})))
