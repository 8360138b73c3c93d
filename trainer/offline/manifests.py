"""Reading manifests the way kubectl does: files, directories, stdin; YAML streams, JSON, Lists."""

from __future__ import annotations

import json
import re
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


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_BLANK = re.compile(r"[ \t\r\n]*")  # JSON's whitespace


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_stream(text: str) -> list[Any] | None:
    """The documents of a JSON stream, or None if ``text`` is not one (then it is read as YAML).

    As kubectl's decoder guesses: input whose first non-blank character is ``{`` is JSON, one
    object after another. JSON is read as JSON, not as the YAML it nearly is: YAML refuses the
    escaped surrogate pair ``json.dumps`` writes for a character beyond U+FFFF (an emoji). A lone
    surrogate becomes U+FFFD, as Go's decoder makes it. Anything JSON refuses (NaN, a YAML
    document after the first) is left to the YAML reader, as before.
    """
    index = _skip_blank(text, 0)
    if not text.startswith("{", index):
        return None
    decoder = json.JSONDecoder(parse_constant=_not_json)
    docs: list[Any] = []
    try:
        while index < len(text):
            doc, index = decoder.raw_decode(text, index)
            docs.append(doc)
            index = _skip_blank(text, index)
    except ValueError:
        return None
    return [_replace_lone_surrogates(doc) for doc in docs] if _SURROGATE_ESCAPE.search(text) else docs


def _skip_blank(text: str, index: int) -> int:
    match = _BLANK.match(text, index)
    return match.end() if match else index


def _replace_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_replace_lone_surrogates(k): _replace_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_lone_surrogates(v) for v in value]
    return value


def parse_documents(text: str, source: str) -> list[Obj]:
    import yaml

    docs = _json_stream(text)
    if docs is None:
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
            items = [item for item in doc.get("items") or [] if isinstance(item, dict)]
            kind = str(doc.get("kind"))
            if kind != "List":
                # A typed list, as the API serves it (a PyTorchJobList): its items carry no
                # apiVersion or kind of their own; they are the list's.
                items = [
                    {"apiVersion": doc.get("apiVersion"), "kind": kind.removesuffix("List"), **i}
                    for i in items
                ]
            objects.extend(items)
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
