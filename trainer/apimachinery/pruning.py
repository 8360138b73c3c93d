"""Structural pruning: the fields a CRD's schema does not declare, dropped or refused.

The API server drops such fields while decoding a custom resource, or refuses them under strict
field validation, before it defaults or validates anything; the webhooks and the local API server
have to make the same cut at the same point to see the same object.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainer.apimachinery import schema_nodes

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not needed at run time, and `trainer render` must start fast
    from typing import Any, Final

    from trainer.apimachinery.schema_nodes import Schema

__all__ = ["prune", "unknown_fields", "unknown_meta_fields"]

_META_FIELDS: Final = frozenset({"apiVersion", "kind", "metadata"})


def prune(schema: Schema, obj: Any) -> list[str]:
    """Remove, in place, every field ``schema`` does not declare; return their paths.

    Fields under ``x-kubernetes-preserve-unknown-fields: true`` stay, and so do ``apiVersion``,
    ``kind`` and ``metadata`` at the root and in embedded resources (their metadata is kept
    whole). Paths are sorted, as the API server sorts them, and start with a dot, which the API
    server's warnings leave out: ``.spec.foo``, ``.spec.list[0].bar`` (a caller in Strict mode
    refuses with them instead).
    """
    return _unknown(schema, obj, remove=True)


def unknown_fields(schema: Schema, obj: Any) -> list[str]:
    """The paths ``prune`` would remove, leaving ``obj`` untouched."""
    return _unknown(schema, obj, remove=False)


# The fields of ObjectMeta (k8s.io/apimachinery/pkg/apis/meta/v1), as its JSON names them.
_OBJECT_META_FIELDS: Final = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)


def unknown_meta_fields(obj: Any) -> list[str]:
    """The fields of a resource's own ``metadata`` that ObjectMeta does not have, as
    ``.metadata.x`` (the API server decodes metadata into ObjectMeta: strict decoding refuses
    them, and otherwise they are dropped)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return []
    return sorted(f".metadata.{k}" for k in meta if k not in _OBJECT_META_FIELDS)


def _unknown(schema: Schema, obj: Any, *, remove: bool) -> list[str]:
    found: list[str] = []
    _prune(obj, schema, "", found, remove, resource_root=True)
    found.sort()
    return ["." + path for path in found]


def _prune(
    x: Any, s: Schema | None, path: str, found: list[str], remove: bool, resource_root: bool = False
) -> None:
    """apiextensions' structural pruning: unknown fields go, unless the schema preserves them."""
    if s is not None and s.get("x-kubernetes-preserve-unknown-fields") is True:
        _skip_prune(x, s, path, found, remove, resource_root)
        return
    if isinstance(x, dict):
        if s is None:
            found.extend(f"{path}.{k}" if path else k for k in x)
            if remove:
                x.clear()
            return
        embedded = resource_root or s.get("x-kubernetes-embedded-resource") is True
        props = s.get("properties") or schema_nodes.EMPTY
        extra = schema_nodes.additional(s)
        doomed: list[str] = []
        for k, v in x.items():
            if embedded and k in _META_FIELDS:
                continue
            prop = props.get(k)
            child = f"{path}.{k}" if path else k
            if prop is not None:
                _prune(v, prop, child, found, remove)
            elif extra is not None:
                _prune(v, extra, child, found, remove)
            else:
                if k not in _META_FIELDS or path:
                    found.append(child)
                doomed.append(k)
        if remove:
            for k in doomed:
                del x[k]
    elif isinstance(x, list):
        items = schema_nodes.items(s) if s is not None else None
        for i, v in enumerate(x):
            _prune(v, items, f"{path}[{i}]", found, remove)


def _skip_prune(x: Any, s: Schema, path: str, found: list[str], remove: bool, resource_root: bool) -> None:
    """Below ``x-kubernetes-preserve-unknown-fields`` only declared fields are pruned into."""
    if isinstance(x, dict):
        embedded = resource_root or s.get("x-kubernetes-embedded-resource") is True
        props = s.get("properties") or schema_nodes.EMPTY
        extra = schema_nodes.additional(s)
        for k, v in x.items():
            if embedded and k in _META_FIELDS:
                continue
            prop = props.get(k)
            child = f"{path}.{k}" if path else k
            if prop is not None:
                _prune(v, prop, child, found, remove)
            elif extra is not None:
                _prune(v, extra, child, found, remove)
    elif isinstance(x, list):
        items = schema_nodes.items(s)
        if items is not None:
            for i, v in enumerate(x):
                _skip_prune(v, items, f"{path}[{i}]", found, remove, False)
