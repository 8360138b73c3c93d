"""docs/architecture.md is "the truth about how the project is put together": every module, file
and Python name it cites exists, so a reader following it never lands on a path that moved."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
# Where a path the doc gives relative to a package is looked for, as the doc writes them
# (`controller/informer.py` is trainer's, `tests/...` the repository's).
BASES = (ROOT, ROOT / "trainer", ROOT / "sandbox" / "trainer_sandbox", ROOT / "sandbox")
PACKAGES = {
    "trainer": ROOT / "trainer",
    "trainer.plugins": ROOT / "plugins",
    "trainer_sandbox": ROOT / "sandbox" / "trainer_sandbox",
}

_TABLE_DIR = re.compile(r"^(?P<path>[\w./]+/)\s")
_TABLE_FILE = re.compile(r"^(?P<path>[\w./]+\.py)\s")
_TABLE_ENTRY = re.compile(r"^ {2}(?P<names>[\w.]+\.py(?:, [\w.]+\.py)*)\s")
_CITED_PATH = re.compile(r"`(?P<path>[\w./-]+\.(?:py|md|yaml|toml))`")
_CITED_MODULE = re.compile(r"`(?P<name>(?:trainer|trainer_sandbox)(?:\.\w+)+)`")


def _layer_table() -> list[Path]:
    text = DOC.read_text()
    block = text[text.index("## Layers") :]
    block = block[block.index("```") + 3 :]
    block = block[: block.index("```")]
    paths: list[Path] = []
    directory: Path | None = None
    for line in block.splitlines():
        if found := _TABLE_DIR.match(line):
            directory = ROOT / found["path"]
            paths.append(directory)
        elif found := _TABLE_FILE.match(line):
            directory = None
            paths.append(ROOT / found["path"])
        elif (found := _TABLE_ENTRY.match(line)) and directory is not None:
            paths.extend(directory / name for name in found["names"].split(", "))
    return paths


def test_every_module_of_the_layer_table_exists() -> None:
    paths = _layer_table()
    assert len(paths) > 50, "the table was read"
    missing = [str(p.relative_to(ROOT)) for p in paths if not p.exists()]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_the_layer_table_lists_every_module_of_the_operator() -> None:
    """The table is complete for the operator's own packages: a new module gets its line."""
    listed = {p for p in _layer_table() if p.suffix == ".py"}
    for package in ("controller", "runtime", "apimachinery", "offline", "admission"):
        modules = {p for p in (ROOT / "trainer" / package).glob("*.py") if p.name != "__init__.py"}
        unlisted = sorted(str(p.relative_to(ROOT)) for p in modules - listed)
        assert not unlisted, f"docs/architecture.md's layer table lacks {unlisted}"


def test_every_path_the_doc_cites_exists() -> None:
    cited = set(_CITED_PATH.findall(DOC.read_text()))
    assert len(cited) > 20
    # A bare file name (`hookspecs.py`, in a paragraph about its package) is found by its name.
    everywhere = {
        p.name for base in (ROOT / "trainer", ROOT / "plugins", ROOT / "sandbox") for p in base.rglob("*.py")
    }
    missing = sorted(
        path
        for path in cited
        if not any((base / path).exists() for base in BASES) and not ("/" not in path and path in everywhere)
    )
    assert not missing, f"docs/architecture.md cites paths that do not exist: {missing}"


def _module_file(name: str) -> tuple[Path, list[str]] | None:
    """The file of the longest module prefix of a dotted name, and the names left over."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        package = max(
            (p for p in PACKAGES if prefix == p or prefix.startswith(p + ".")), key=len, default=None
        )
        if package is None:
            continue
        inner = prefix[len(package) :].lstrip(".").split(".") if prefix != package else []
        directory = PACKAGES[package].joinpath(*inner)
        for candidate in (directory / "__init__.py", directory.with_suffix(".py") if inner else None):
            if candidate is not None and candidate.exists():
                return candidate, parts[end:]
    return None


def test_every_python_name_the_doc_cites_exists() -> None:
    cited = set(_CITED_MODULE.findall(DOC.read_text()))
    assert len(cited) > 5
    wrong = []
    for name in sorted(cited):
        found = _module_file(name)
        if found is None:
            wrong.append(name)
            continue
        path, rest = found
        if rest and not re.search(
            rf"^(?:class|def|async def) {rest[0]}\b|^{rest[0]}\b.*=", path.read_text(), re.M
        ):
            wrong.append(name)
    assert not wrong, f"docs/architecture.md cites names that do not exist: {wrong}"
