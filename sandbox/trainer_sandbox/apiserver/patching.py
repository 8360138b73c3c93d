"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch for built-in kinds."""

from __future__ import annotations

import copy
import json
from typing import Any

from trainer_sandbox.apiserver.errors import APIError, bad_request

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
APPLY_CBOR = "application/apply-patch+cbor"


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _parse_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise bad_request(f"invalid JSON pointer {pointer!r}")
    return [_unescape(t) for t in pointer[1:].split("/")]


def _container(doc: Any, tokens: list[str], pointer: str) -> Any:
    cur = doc
    for t in tokens:
        if isinstance(cur, dict):
            if t not in cur:
                raise _patch_error(f"doc is missing path: {pointer}")
            cur = cur[t]
        elif isinstance(cur, list):
            idx = _index(t, len(cur), pointer)
            cur = cur[idx]
        else:
            raise _patch_error(f"doc is missing path: {pointer}")
    return cur


def _index(token: str, length: int, pointer: str, allow_end: bool = False) -> int:
    if token == "-" and allow_end:
        return length
    try:
        idx = int(token)
    except ValueError:
        raise _patch_error(f"invalid array index {token!r} in {pointer}") from None
    if idx < 0 or idx > length or (idx == length and not allow_end):
        raise _patch_error(f"unable to access invalid index: {idx}")
    return idx


def _patch_error(message: str) -> APIError:
    # Kubernetes answers a JSON patch that cannot be applied with 422 Invalid.
    return APIError(422, "Invalid", message)


def json_patch(doc: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation: {json.dumps(op)}")
        kind, pointer = op["op"], op["path"]
        tokens = _parse_pointer(pointer)
        if kind == "test":
            try:
                current = _container(doc, tokens, pointer)
            except APIError:
                current = None
            if current != op.get("value"):
                raise _patch_error(f"testing value {pointer} failed: test failed")
            continue
        if kind in ("move", "copy"):
            from_tokens = _parse_pointer(op.get("from", ""))
            value = copy.deepcopy(_container(doc, from_tokens, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, from_tokens, op.get("from", ""))
            doc = _add(doc, tokens, value, pointer)
        elif kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")), pointer)
        elif kind == "remove":
            doc = _remove(doc, tokens, pointer)
        elif kind == "replace":
            _container(doc, tokens, pointer)
            doc = _remove(doc, tokens, pointer)
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")), pointer)
        else:
            raise bad_request(f"Unexpected kind: {kind}")
    return doc


def _add(doc: Any, tokens: list[str], value: Any, pointer: str) -> Any:
    if not tokens:
        return value
    parent = _container(doc, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), pointer, allow_end=True), value)
    else:
        raise _patch_error(f"doc is missing path: {pointer}")
    return doc


def _remove(doc: Any, tokens: list[str], pointer: str) -> Any:
    if not tokens:
        return None
    parent = _container(doc, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _patch_error(f"Unable to remove nonexistent key: {last}: missing value")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(last, len(parent), pointer)]
    else:
        raise _patch_error(f"doc is missing path: {pointer}")
    return doc


def strategic_merge_patch(
    original: dict[str, Any], patch: Any, api_version: str, kind: str
) -> dict[str, Any]:
    """Strategic merge through the project's shared implementation, with merge keys from the schema."""
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    from trainer.apimachinery import strategic_merge  # shared with the render core

    keys = _merge_keys(api_version, kind)
    try:
        result: dict[str, Any] = strategic_merge.strategic_merge(original, patch, keys)
    except ValueError as err:
        raise bad_request(str(err)) from None
    return result


_MERGE_KEYS: dict[tuple[str, str], Any] = {}


def _merge_keys(api_version: str, kind: str) -> Any:
    cached = _MERGE_KEYS.get((api_version, kind))
    if cached is None:
        from trainer.apimachinery import strategic_merge
        from trainer_sandbox.apiserver.schema import k8s_definitions

        doc = k8s_definitions()
        root = doc["kinds"][f"{api_version}/{kind}"]
        cached = strategic_merge.merge_keys_from_openapi(doc["definitions"], root)
        _MERGE_KEYS[(api_version, kind)] = cached
    return cached
