"""Nulls and defaults: what the API server fills in or drops before it validates.

A custom resource is validated as the API server stores it, with its schema's defaults applied
and its meaningless nulls gone; rendering, the webhooks and the local API server must start from
that same object, or they would pass or refuse what a cluster does not.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainer.apimachinery import schema_nodes

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not needed at run time, and `trainer render` must start fast
    from typing import Any

    from trainer.apimachinery.schema_nodes import Schema

__all__ = ["apply_defaults", "drop_non_nullable_nulls"]


def drop_non_nullable_nulls(schema: Schema, obj: Any) -> list[str]:
    """Remove, in place, null fields that are neither nullable nor defaulted; return their paths.

    The API server does this while decoding, before defaulting, so a ``null`` sent for an
    ordinary field means "unset" rather than a type error. Paths are like ``prune``'s.
    """
    found: list[str] = []
    _drop_nulls(obj, schema, "", found)
    return ["." + path for path in found]


def _drop_nulls(x: Any, s: Schema, path: str, found: list[str]) -> None:
    """apiextensions' PruneNonNullableNullsWithoutDefaults: properties and map values alike."""
    if isinstance(x, dict):
        props = s.get("properties") or schema_nodes.EMPTY
        extra = s.get("additionalProperties")
        extra = extra if isinstance(extra, Mapping) else None
        for k in list(x):
            prop = props.get(k, extra)
            if prop is None:
                continue
            child = f"{path}.{k}" if path else k
            if x[k] is None and prop.get("default") is None and not prop.get("nullable"):
                del x[k]
                found.append(child)
            else:
                _drop_nulls(x[k], prop, child, found)
    elif isinstance(x, list):
        items = schema_nodes.items(s)
        if items is not None:
            for i, v in enumerate(x):
                _drop_nulls(v, items, f"{path}[{i}]", found)


def apply_defaults(schema: Schema, obj: Any) -> Any:
    """Apply the schema's defaults to ``obj`` in place, and return it.

    As the API server does: in every object, each declared property that is absent, or null
    without ``nullable: true``, gets a copy of its ``default``; then defaulting goes on into every
    property (a defaulted object gets its own nested defaults), list item and
    additionalProperties value. A ``default: null`` is no default.
    """
    _default(obj, schema)
    return obj


def _default(x: Any, s: Schema) -> None:
    if isinstance(x, dict):
        props = s.get("properties")
        if props:
            for k, prop in props.items():
                default = prop.get("default")
                if default is not None and (k not in x or (x[k] is None and not prop.get("nullable"))):
                    x[k] = _copy(default)
        extra = schema_nodes.additional(s)
        if props or extra is not None:
            for k, v in x.items():
                prop = props.get(k) if props else None
                if prop is not None:
                    _default(v, prop)
                elif extra is not None:
                    _default(v, extra)
    elif isinstance(x, list):
        items = schema_nodes.items(s)
        if items is not None:
            for v in x:
                _default(v, items)


def _copy(value: Any) -> Any:
    """Deep copy of a JSON value: a default must never be shared between objects."""
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return value
