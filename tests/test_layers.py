"""The import graph keeps the layers docs/architecture.md draws: arrows point down, no cycles.

Every import counts, at module level, inside functions and under ``TYPE_CHECKING`` alike: an
import put inside a function to dodge a cycle is still an arrow between the two modules. The
graph is read from the source with ``ast``, so plugins (installed as ``trainer.plugins`` from
``plugins/``) and the sandbox package are covered as they are laid out in this repository.

The layers are the operator's; the ban on cycles holds for every Python module of the repository:
the operator, the sandbox, and the tests, benchmarks and tools, which import each other by file
name (``render_helpers``, ``backend_plugin``, ``benchlib``) as they do when they run.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Top to bottom. A module may import its own layer's modules and those of any layer below it.
# Modules in one row are peers that must not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("trainer.cli",),
    ("trainer.migrate",),
    ("trainer.offline", "trainer.controller"),
    ("trainer.admission",),
    ("trainer.optimization",),
    ("trainer.plugins",),
    ("trainer.plugin",),
    ("trainer.runtime",),
    ("trainer.apimachinery", "trainer.exit_codes"),
    ("trainer.api",),
]

# The one module a plugin may import from this project (besides the standard library and
# third-party packages): docs/plugins.md.
PLUGIN_API = "trainer.plugin"

SOURCES = {"trainer": ROOT / "trainer", "trainer.plugins": ROOT / "plugins"}
SANDBOX = ROOT / "sandbox" / "trainer_sandbox"
# The operator's package-data packages (pyproject's package-dir): in no layer, but modules all the same.
DATA_PACKAGES = {
    "trainer.runtimes": ROOT / "runtimes",
    "trainer.crds": ROOT / "crds",
    "trainer.examples": ROOT / "examples",
}
# Directories whose modules are imported by their file name alone: pytest's default "prepend" import
# mode puts the directory of each test file and conftest.py on sys.path (no directory under tests/
# is a package), the chart tests add charts/tools, and the bench scripts run as `python bench/x.py`.
SCRIPT_DIRS = ("tests", "bench", "charts/tools", "scripts")


def _modules(package: str, directory: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(directory.rglob("*.py")):
        parts = [*package.split("."), *path.relative_to(directory).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def _package_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package, directory in SOURCES.items():
        modules.update(_modules(package, directory))
    modules.update(_modules("trainer_sandbox", SANDBOX))
    return modules


def _script_modules() -> dict[str, Path]:
    """The modules of SCRIPT_DIRS by the names they are imported as. A name two files share (the
    conftest.py files, which nothing imports) cannot be imported by it: those go by their path."""
    paths = [path for top in SCRIPT_DIRS for path in sorted((ROOT / top).rglob("*.py"))]
    stems = Counter(path.stem for path in paths)
    return {
        path.stem if stems[path.stem] == 1 else path.relative_to(ROOT).with_suffix("").as_posix(): path
        for path in paths
    }


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytest_plugins" for t in node.targets
            ):
                # pytest imports the plugins a conftest.py names.
                elements = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else []
                targets = [
                    e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


GRAPH = _graph(_package_modules())
# Every Python module of the repository.
REPOSITORY = _graph(
    {
        **_package_modules(),
        **{m: p for package, directory in DATA_PACKAGES.items() for m, p in _modules(package, directory)},
        **_script_modules(),
    }
)


def _layer(module: str) -> tuple[int, str] | None:
    """The module's layer and the unit it belongs to (the longest prefix named in LAYERS)."""
    best: tuple[int, str] | None = None
    for index, row in enumerate(LAYERS):
        for unit in row:
            if (module == unit or module.startswith(unit + ".")) and (
                best is None or len(unit) > len(best[1])
            ):
                best = (index, unit)
    return best


def test_every_trainer_module_has_a_layer() -> None:
    homeless = [m for m in GRAPH if m.startswith("trainer.") and m != "trainer" and _layer(m) is None]
    assert not homeless, f"modules in no layer of LAYERS: {homeless}"


def test_imports_point_down_the_layers() -> None:
    assert GRAPH["trainer.admission.admit"], "the graph has edges (the scan read the imports)"
    wrong = []
    for module, targets in GRAPH.items():
        here = _layer(module)
        if here is None:
            continue
        for target in targets:
            there = _layer(target)
            if there is None:
                continue
            if there[0] < here[0] or (there[0] == here[0] and there[1] != here[1]):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(sorted(wrong))


def test_plugins_import_only_the_plugin_api() -> None:
    plugin_modules = [m for m in GRAPH if m.startswith("trainer.plugins.")]
    assert len(plugin_modules) >= 9, plugin_modules
    wrong = [
        f"{module} -> {target}"
        for module in plugin_modules
        for target in GRAPH[module]
        if target != PLUGIN_API and not target.startswith("trainer.plugins")
    ]
    assert not wrong, "plugins importing past the plugin API:\n" + "\n".join(sorted(wrong))


def test_the_operator_never_imports_the_sandbox() -> None:
    wrong = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module.startswith("trainer") and not module.startswith("trainer_sandbox")
        for target in targets
        if target.startswith("trainer_sandbox")
    ]
    assert not wrong, "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _without_packages_presenting_submodules(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's __init__ importing its own submodules is how a package presents its names;
    a submodule importing its package's __init__ back is the cycle that counts."""
    packages = {module.rpartition(".")[0] for module in graph}
    return {
        module: {t for t in targets if not (module in packages and t.rpartition(".")[0] == module)}
        for module, targets in graph.items()
    }


def test_no_import_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]], "the cycle finder finds one"
    presenting = {"p": {"p.a"}, "p.a": {"q"}, "q": {"p", "p.a"}}
    assert _cycles(_without_packages_presenting_submodules(presenting)) == [["p.a", "q"]], (
        "a package presenting its submodules hides no other cycle"
    )
    scanned = {"trainer.cli", "trainer.plugins.torch", "trainer_sandbox.apiserver.server", "trainer.crds"}
    scanned |= {"backend_plugin", "render_helpers", "operator_helpers", "benchlib", "audit_rbac"}
    assert scanned <= REPOSITORY.keys(), scanned - REPOSITORY.keys()
    assert "backend_plugin" in REPOSITORY["tests/conftest"], "test helpers are imported by file name"
    graph = _without_packages_presenting_submodules(REPOSITORY)
    assert not _cycles(graph), _cycles(graph)


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith("trainer.plugins.")))
def test_each_plugin_module_is_scanned(module: str) -> None:
    assert PLUGIN_API in GRAPH[module] or module == "trainer.plugins", f"{module} does not use the plugin API"


# Modules of trainer/ allowed past MAX_LINES: CEL's parser and evaluator, whose docstrings say why.
MAX_LINES = 800
LONG_ALLOWED = {"trainer/apimachinery/cel.py", "trainer/apimachinery/cel_parser.py"}


def test_no_product_module_is_a_god_module() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for directory in SOURCES.values()
        for path in directory.rglob("*.py")
    }
    assert len(sizes) > 50, "the product's modules were read"
    too_long = {
        path: lines for path, lines in sizes.items() if lines > MAX_LINES and path not in LONG_ALLOWED
    }
    assert not too_long, f"split these by concern (docs/architecture.md): {too_long}"
    for allowed in LONG_ALLOWED:
        assert "tests/test_layers.py" in (ROOT / allowed).read_text(), (
            f"{allowed}'s docstring says why it is long"
        )
