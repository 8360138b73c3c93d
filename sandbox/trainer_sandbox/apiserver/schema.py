"""Walking OpenAPI schemas: CRD structural schemas and the Kubernetes definitions of built-in kinds.

Server-side apply and strategic merge need the list types and map keys of every field, and
built-in kinds are validated against the Kubernetes schema. Both kinds of schema are walked through
one small view that follows ``$ref`` lazily (Kubernetes definitions are recursive).
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

from trainer.apimachinery.errors import FieldError, invalid, required, unsupported

Schema = dict[str, Any]
ANY: Schema = {"x-kubernetes-preserve-unknown-fields": True}

_SCHEMAS_FILE = Path(__file__).resolve().parent.parent / "k8s_schemas.json.gz"


@cache
def k8s_definitions() -> dict[str, Any]:
    """The compact Kubernetes schema document written by ``gen_k8s_schemas``."""
    with gzip.open(_SCHEMAS_FILE, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    return doc


class SchemaView:
    """Navigation over one schema tree; ``definitions`` resolves ``#/definitions/<name>`` refs."""

    def __init__(self, root: Schema | None, definitions: dict[str, Schema] | None = None) -> None:
        self.definitions = definitions or {}
        self.root = self.resolve(root) if root is not None else ANY

    def resolve(self, node: Schema | None) -> Schema:
        while node is not None and "$ref" in node:
            node = self.definitions.get(node["$ref"].rsplit("/", 1)[-1], ANY)
        return node if node is not None else ANY

    def field(self, node: Schema, key: str) -> Schema | None:
        """The schema of field ``key`` of an object node; ``None`` when the field is unknown."""
        props = node.get("properties")
        if props and key in props:
            return self.resolve(props[key])
        addl = node.get("additionalProperties")
        if isinstance(addl, dict):
            return self.resolve(addl)
        if node.get("x-kubernetes-preserve-unknown-fields") or addl is True:
            return ANY
        if not props and node.get("type") in (None, "object") and "items" not in node:
            return ANY
        return None

    def items(self, node: Schema) -> Schema:
        return self.resolve(node.get("items")) if node.get("items") else ANY

    def list_type(self, node: Schema) -> str:
        lt = node.get("x-kubernetes-list-type")
        if lt:
            return str(lt)
        if node.get("x-kubernetes-patch-merge-key"):
            return "map"
        return "atomic"

    def map_keys(self, node: Schema) -> list[str]:
        keys = node.get("x-kubernetes-list-map-keys")
        if keys:
            return list(keys)
        key = node.get("x-kubernetes-patch-merge-key")
        return [key] if key else []

    def is_atomic_map(self, node: Schema) -> bool:
        return node.get("x-kubernetes-map-type") == "atomic"

    def is_object(self, node: Schema) -> bool:
        return node.get("type") == "object" or "properties" in node or "additionalProperties" in node


def builtin_view(api_version: str, kind: str) -> SchemaView | None:
    doc = k8s_definitions()
    name = doc["kinds"].get(f"{api_version}/{kind}")
    if name is None:
        return None
    return SchemaView({"$ref": "#/definitions/" + name}, doc["definitions"])


_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def check_builtin(view: SchemaView, obj: Any) -> tuple[list[str], list[FieldError], list[str]]:
    """Check a built-in object: (decode errors -> 400, field errors -> 422, unknown field paths).

    Kubernetes decodes built-in kinds into Go structs: a wrong JSON type is a decode error (400),
    a missing required field a validation error (422), an unknown field a strict-decoding error or
    a warning, depending on ``fieldValidation``.
    """
    decode: list[str] = []
    errors: list[FieldError] = []
    unknown: list[str] = []
    _walk(view, view.root, obj, "", decode, errors, unknown)
    return decode, errors, unknown


def _walk(
    view: SchemaView,
    node: Schema,
    value: Any,
    path: str,
    decode: list[str],
    errors: list[FieldError],
    unknown: list[str],
) -> None:
    if value is None or (node.get("x-kubernetes-preserve-unknown-fields") and not node.get("properties")):
        return
    if node.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (str, int, float)) and not isinstance(value, bool)
        if not ok or (node.get("format") != "quantity" and isinstance(value, float)):
            decode.append(f"{path or '.'}: cannot unmarshal {_json_type(value)} into int-or-string")
        return
    t = node.get("type")
    if t in _JSON_TYPES:
        types = _JSON_TYPES[t]
        bad = not isinstance(value, types) or (t in ("integer", "number") and isinstance(value, bool))
        if t == "integer" and isinstance(value, float) and value.is_integer():
            bad = False
        if bad:
            decode.append(f"{path or '.'}: cannot unmarshal {_json_type(value)} into {t}")
            return
    # A Go string field decodes "" as unset (defaulted, or allowed: a Toleration's effect), never
    # as a value outside its enum.
    if "enum" in node and value not in node["enum"] and value != "":
        errors.append(unsupported(path, value, [str(v) for v in node["enum"]]))
    if isinstance(value, dict):
        for req in node.get("required") or []:
            if value.get(req) is None or (value.get(req) == "" and req in ("name", "kind")):
                errors.append(required(_join(path, req), ""))
        for key, sub in value.items():
            child = view.field(node, key)
            p = _join(path, key)
            if child is None:
                unknown.append(p)
                continue
            _walk(view, child, sub, p, decode, errors, unknown)
    elif isinstance(value, list):
        item = view.items(node)
        seen: set[Any] = set()
        keys = view.map_keys(node) if view.list_type(node) == "map" else []
        for i, sub in enumerate(value):
            _walk(view, item, sub, f"{path}[{i}]", decode, errors, unknown)
            if keys and isinstance(sub, dict):
                ident = tuple(json.dumps(sub.get(k)) for k in keys)
                if ident in seen and view.list_type(node) == "map" and node.get("x-kubernetes-list-type"):
                    errors.append(
                        FieldError(f"{path}[{i}]", "Duplicate value", "", {k: sub.get(k) for k in keys})
                    )
                seen.add(ident)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


__all__ = ["ANY", "SchemaView", "builtin_view", "check_builtin", "invalid", "k8s_definitions"]
