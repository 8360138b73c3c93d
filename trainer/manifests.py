"""Reading manifests the way kubectl does: files, directories, stdin; YAML streams, JSON, Lists."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainer.api.objects import Obj


class ManifestError(Exception):
    """A manifest cannot be read: a usage error, not a refusal of an object."""


def _loader() -> Any:
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_documents(text: str, source: str) -> list[Obj]:
    import yaml

    try:
        docs = list(yaml.load_all(text, Loader=_loader()))
    except yaml.YAMLError as exc:
        raise ManifestError(f"{source}: cannot parse YAML or JSON: {exc}") from exc
    objects: list[Obj] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ManifestError(f"{source}: document {i + 1} is not an object")
        if doc.get("kind") == "List" or (str(doc.get("kind", "")).endswith("List") and "items" in doc):
            items = doc.get("items") or []
            objects.extend(item for item in items if isinstance(item, dict))
        else:
            objects.append(doc)
    for obj in objects:
        if not obj.get("apiVersion") or not obj.get("kind"):
            name = (obj.get("metadata") or {}).get("name", "?")
            raise ManifestError(f"{source}: object {name!r} has no apiVersion or kind")
    return objects


def _files(path: str) -> Iterator[tuple[str, str]]:
    if path == "-":
        yield "<stdin>", sys.stdin.read()
        return
    p = Path(path)
    if p.is_dir():
        for child in sorted(p.iterdir()):
            if child.is_file() and child.suffix in (".yaml", ".yml", ".json"):
                yield str(child), _read(child)
        return
    yield path, _read(p)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror or exc}") from exc


def read_manifests(paths: list[str]) -> list[Obj]:
    objects: list[Obj] = []
    for path in paths:
        for source, text in _files(path):
            objects.extend(parse_documents(text, source))
    return objects
