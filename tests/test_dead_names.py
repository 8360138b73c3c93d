"""No dead names: every module-level constant, function and class of trainer/ and plugins/ is used.

A name nothing uses (a reason no condition carries, a helper nobody calls) misleads a reader into
thinking some path sets it. "Used" is a whole-word occurrence anywhere in the project's sources
besides its definition: code, tests, the sandbox, chart tools, benchmarks, scripts, docs and
pyproject.toml (entry points name functions there).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFINED_IN = ("trainer", "plugins")
USED_IN = ("trainer", "plugins", "sandbox/trainer_sandbox", "tests", "charts", "bench", "scripts", "docs")
SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ""}


def _definitions() -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for top in DEFINED_IN:
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.parse(path.read_text(), str(path)).body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names = [node.name]
                elif isinstance(node, ast.Assign):
                    names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names = [node.target.id]
                else:
                    continue
                for name in names:
                    if not name.startswith("__"):
                        found.setdefault(name, []).append(path)
    return found


def _sources() -> list[str]:
    files = [ROOT / "pyproject.toml", ROOT / "README.md"]
    for top in USED_IN:
        files += [f for f in (ROOT / top).rglob("*") if f.is_file() and f.suffix in SUFFIXES]
    this = Path(__file__).resolve()
    texts = []
    for f in files:
        if f.resolve() == this or "__pycache__" in f.parts:
            continue
        try:
            texts.append(f.read_text())
        except (OSError, UnicodeDecodeError):
            continue
    return texts


def test_every_module_level_name_is_used() -> None:
    definitions = _definitions()
    text = "\n".join(_sources())
    words: dict[str, int] = {}
    for word in re.findall(r"\w+", text):
        if word in definitions:
            words[word] = words.get(word, 0) + 1
    dead = sorted(
        f"{name} ({', '.join(str(p.relative_to(ROOT)) for p in paths)})"
        for name, paths in definitions.items()
        if words.get(name, 0) <= len(paths)  # each definition is one occurrence
    )
    assert not dead, "defined and never used (remove them, or use them): " + ", ".join(dead)
