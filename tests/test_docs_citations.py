"""The repository stands alone: it cites its own docs, and the docs it cites say what is cited.

Code, tests and docs explain themselves by citing docs/decisions.md (where we differ from upstream)
and docs/upstream-behaviour.md (the upstream behaviour we follow) by section, as
`docs/decisions.md §3` or, inside docs/, `[decisions.md](decisions.md) §3`. Those citations must
name a file and a section that exist. Nothing may cite the reference material the project was
written from, which is not part of the repository; only tests/reference_data.py knows where the
upstream reference data for the tests lives.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SCANNED = ("trainer", "plugins", "sandbox", "tests", "bench", "charts", "docs")
SUFFIXES = (".py", ".md", ".toml")
SKIPPED_DIRS = {
    ".venv",
    "build",
    "dist",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
}
LOCATOR = ROOT / "tests" / "reference_data.py"

# Spelled in pieces so that this file does not match what it looks for.
FORBIDDEN = {
    "../" + "shared": "the reference material beside the repository",
    "DECI" + "SIONS": "the upstream decision list (cite docs/decisions.md)",
    "framework-and" + "-torch": "an upstream spec file (cite docs/upstream-behaviour.md)",
    "mpi-gang" + "-lifecycle": "an upstream spec file (cite docs/upstream-behaviour.md)",
    "local-apiserver" + ".md": "an upstream spec file (cite docs/upstream-behaviour.md)",
    "design/ARCHI" + "TECTURE.md": "the design sketch (cite docs/architecture.md)",
}
# The word "spec" then a section number: a section of a spec file that is not named.
UNNAMED_SPEC = re.compile(r"\bspec §\d")

SECTION_ID = r"[A-Za-z0-9]+(?:[.-][A-Za-z0-9]+)*"
HEADING = re.compile(rf"^#{{1,6}} §({SECTION_ID})\b", re.M)
# `docs/<doc>.md §<section>`, anywhere; `[<doc>.md](<doc>.md) §<section>`, in docs/. A list of
# sections (`§a, §b and §c`) may continue across a line break, in a comment too.
DOCS_CITATION = re.compile(rf"\bdocs/([\w.-]+\.md)[\s#]+§({SECTION_ID})")
LINK_CITATION = re.compile(rf"\]\(([\w.-]+\.md)\)[\s#]*§({SECTION_ID})")
MORE_SECTIONS = re.compile(rf"[\s#]*(?:,|and|or|/)[\s#]*§({SECTION_ID})")
DOCS_MENTION = re.compile(r"\bdocs/([\w.-]+\.md)\b")


def scanned_files() -> list[Path]:
    found = [ROOT / "README.md"]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in parts):
                continue
            if path.is_file() and path.suffix in SUFFIXES:
                found.append(path)
    return found


def sections(doc: Path) -> list[str]:
    return HEADING.findall(doc.read_text())


def citations(path: Path, text: str) -> list[tuple[Path, str, int]]:
    """(cited doc, section, line) for every section citation in ``text``."""
    patterns = [(DOCS_CITATION, ROOT / "docs")]
    if path.parent == DOCS:
        patterns.append((LINK_CITATION, DOCS))
    found = []
    for pattern, base in patterns:
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            doc = base / match.group(1)
            found.append((doc, match.group(2), line))
            end = match.end()
            while more := MORE_SECTIONS.match(text, end):
                found.append((doc, more.group(1), line))
                end = more.end()
    return found


def test_the_cited_docs_exist_and_number_their_sections() -> None:
    for name in ("decisions.md", "upstream-behaviour.md", "reference-data.md"):
        assert (DOCS / name).is_file(), f"docs/{name} is missing"
    for name in ("decisions.md", "upstream-behaviour.md"):
        ids = sections(DOCS / name)
        assert ids, f"docs/{name} has no § sections"
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        assert not duplicates, f"docs/{name} defines these sections twice: {duplicates}"
    # The numbered decisions run 1..N without gaps: their numbers are cited and must never move.
    numbers = [int(i) for i in sections(DOCS / "decisions.md") if i.isdigit()]
    assert numbers == list(range(1, len(numbers) + 1)), numbers


def test_nothing_cites_material_outside_the_repository() -> None:
    offences = []
    for path in scanned_files():
        if path == LOCATOR:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for needle, what in FORBIDDEN.items():
                if needle in line:
                    offences.append(f"{path.relative_to(ROOT)}:{number}: cites {what}: {line.strip()}")
            if UNNAMED_SPEC.search(line):
                offences.append(
                    f"{path.relative_to(ROOT)}:{number}: cites a spec section without a doc of ours: "
                    f"{line.strip()}"
                )
    assert not offences, "\n".join(offences)


def test_every_section_citation_names_a_doc_and_a_section_that_exist() -> None:
    known: dict[Path, set[str]] = {}
    problems = []
    count = 0
    for path in scanned_files():
        text = path.read_text(errors="replace")
        for doc, section, line in citations(path, text):
            count += 1
            where = f"{path.relative_to(ROOT)}:{line}"
            if not doc.is_file():
                problems.append(f"{where}: cites {doc.relative_to(ROOT)}, which does not exist")
                continue
            if doc not in known:
                known[doc] = set(sections(doc))
            if section not in known[doc]:
                problems.append(f"{where}: cites {doc.relative_to(ROOT)} §{section}, which it does not have")
    assert not problems, "\n".join(problems)
    assert count > 20, f"only {count} citations found: is the pattern still right?"


def test_every_doc_mentioned_exists() -> None:
    missing = []
    for path in scanned_files():
        for match in DOCS_MENTION.finditer(path.read_text(errors="replace")):
            if not (ROOT / "docs" / match.group(1)).is_file():
                missing.append(f"{path.relative_to(ROOT)}: docs/{match.group(1)}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("see docs/decisions.md §3.", [("decisions.md", "3")]),
        (
            "(docs/upstream-behaviour.md §torch-nproc, §quirks)",
            [("upstream-behaviour.md", "torch-nproc"), ("upstream-behaviour.md", "quirks")],
        ),
        (
            "docs/decisions.md §5, §8 and\n# §trainjob-spec-required.",
            [("decisions.md", "5"), ("decisions.md", "8"), ("decisions.md", "trainjob-spec-required")],
        ),
        (
            "docs/upstream-behaviour.md\n    §gpu-and-cpu-count).",
            [("upstream-behaviour.md", "gpu-and-cpu-count")],
        ),
        ("docs/decisions.md says so", []),
    ],
)
def test_citations_are_read_as_written(text: str, expected: list[tuple[str, str]]) -> None:
    found = [(doc.name, section) for doc, section, _ in citations(ROOT / "x.py", text)]
    assert found == expected
