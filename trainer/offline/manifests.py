"""Reading manifests the way kubectl does: files, directories, stdin; YAML streams, JSON, Lists."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.api.objects import Obj

if TYPE_CHECKING:
    import yaml

# Bounds no real manifest comes near (a CRD with a pod template in its schema is some 50 levels deep;
# anchors share a few blocks), low enough that what reads a document afterwards, much of it recursive
# (admission, deepcopy, the YAML writer), neither runs out of stack nor runs for hours on a
# few hundred bytes of aliases ("billion laughs").
MAX_DEPTH = 200  # levels of nesting of a document
MAX_ALIASED_NODES = 100_000  # nodes aliases add when expanded, all documents read together


class ManifestError(Exception):
    """A manifest cannot be read: a usage error, not a refusal of an object."""


@dataclass
class _Aliased:
    """The nodes aliases have added so far: bounded over every document read, not each alone, or
    a stream of small bombs would add up to a large one."""

    nodes: int = 0


def _loader() -> Any:
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_BLANK = re.compile(r"[ \t\r\n]*")  # JSON's whitespace
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_stream(text: str, source: str) -> list[Any] | None:
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
    if _json_depth(text) > MAX_DEPTH:
        # Python's JSON decoder recurses once per level: bounded before it runs.
        raise ManifestError(f"{source}: nested more than {MAX_DEPTH} levels deep")
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


def _json_depth(text: str) -> int:
    """How deep the brackets of ``text`` nest, outside strings: one pass, no recursion."""
    brackets = _JSON_BRACKET.findall(_JSON_STRING.sub("", text))
    return max(accumulate(1 if b in "[{" else -1 for b in brackets), default=0)


def _load_yaml(text: str, source: str, aliased: _Aliased) -> list[Any]:
    """The documents of a YAML stream, each composed and checked (``_aliased_nodes``) before it is
    constructed, so an alias bomb or a recursive alias never becomes Python objects."""
    import yaml

    loader = _loader()(text)
    docs: list[Any] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            where = f"{source}: document {len(docs) + 1}"
            try:
                aliased.nodes += _aliased_nodes(node)
            except ValueError as exc:
                raise ManifestError(f"{where}: {exc}") from None
            if aliased.nodes > MAX_ALIASED_NODES:
                raise ManifestError(
                    f"{where}: aliases expand to more than {MAX_ALIASED_NODES} nodes (an alias bomb?)"
                )
            docs.append(loader.construct_document(node))
    except yaml.YAMLError as exc:
        raise ManifestError(f"{source}: cannot parse YAML or JSON: {exc}") from exc
    except RecursionError:
        # Only the pure-Python parser (no libyaml) recurses while composing.
        raise ManifestError(f"{source}: nested more than {MAX_DEPTH} levels deep") from None
    finally:
        loader.dispose()
    return docs


def _aliased_nodes(root: yaml.Node) -> int:
    """How many nodes the aliases of a composed document add when expanded; ValueError if it is
    too deep or an alias is recursive.

    Aliases make the node graph a DAG (or a cycle). Walked once per node, without recursion, it
    gives each node's size with every alias expanded: what the readers after us would walk.
    """
    import yaml

    size: dict[int, int] = {}  # of each node walked, aliases expanded
    on_path: set[int] = set()  # the collections from the root down to the node at hand
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            # Capped: an expansion only has to be known to be too large.
            size[key] = min(1 + sum(size[id(child)] for child in _children(node)), 2**62)
        elif key in on_path:
            raise ValueError("an alias refers to a node that contains it (a recursive alias)")
        elif key in size:
            continue  # another alias of a node already walked
        elif isinstance(node, yaml.ScalarNode):
            size[key] = 1
        elif len(on_path) >= MAX_DEPTH:
            raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
        else:
            on_path.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))
    return size[id(root)] - len(size)


def _children(node: yaml.Node) -> list[yaml.Node]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]  # keys and values
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


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


def parse_documents(text: str, source: str, aliased: _Aliased | None = None) -> list[Obj]:
    docs = _json_stream(text, source)
    if docs is None:
        docs = _load_yaml(text, source, aliased or _Aliased())
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
        # The bytes, decoded here: the locale's encoding (or a stray byte) is not ours to trust.
        raw = getattr(sys.stdin, "buffer", None)
        yield "<stdin>", _decoded("<stdin>", raw.read()) if raw is not None else sys.stdin.read()
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
        data = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{path}: {exc.strerror or exc}") from exc
    return _decoded(str(path), data)


def _decoded(source: str, data: bytes) -> str:
    """Manifests are UTF-8 (YAML's and JSON's encoding, and kubectl's)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(
            f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def read_manifests(paths: list[str]) -> list[Obj]:
    objects: list[Obj] = []
    aliased = _Aliased()
    for path in paths:
        for source, text in _files(path):
            objects.extend(parse_documents(text, source, aliased))
    return objects
