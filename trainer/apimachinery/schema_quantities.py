"""Where a schema holds resource quantities, and writing those quantities canonically.

docs/decisions.md §9 asks for two things that both need to know which fields are quantities, wherever
they stand (container resources, pod overhead, an emptyDir's sizeLimit, a PVC template's storage,
a resourceFieldRef's divisor): numbers are accepted where a CRD only accepts quantity strings
(``cpu: 0.5`` in a runtime, ``cpu: 2.0`` from the Kubeflow SDK), and the objects we create carry
canonical quantity strings. The CRD schemas already say which fields those are: an int-or-string
with Kubernetes' quantity pattern. So the set is read from the schema once, as a tree of field
names, rather than listed by hand and forgotten in the next place a quantity appears.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, TypeAlias

from trainer.api.quantity import Quantity, canonical_quantity, resource_list_canonical
from trainer.apimachinery.json_values import json_integer

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)"
    r"|(\.[0-9]+))))?$"
)
ANY = "*"  # a list item or a map value

Fields: TypeAlias = "Mapping[str, Fields] | bool"
"""``True`` where a quantity stands; otherwise the field names (or ``*``) that lead to one."""

_cache: dict[int, tuple[Mapping[str, Any], Fields | None]] = {}


def quantity_fields(schema: Mapping[str, Any]) -> Fields | None:
    """The paths to every quantity in ``schema``, or None when it holds none."""
    found = _cache.get(id(schema))
    if found is None or found[0] is not schema:
        found = (schema, _fields(schema))
        _cache[id(schema)] = found
    return found[1]


def _fields(schema: Mapping[str, Any]) -> Fields | None:
    if schema.get("x-kubernetes-int-or-string") and schema.get("pattern") == QUANTITY_PATTERN:
        return True
    out: dict[str, Fields] = {}
    for name, prop in (schema.get("properties") or {}).items():
        sub = _fields(prop)
        if sub is not None:
            out[name] = sub
    for key in ("items", "additionalProperties"):
        child = schema.get(key)
        if isinstance(child, Mapping):
            sub = _fields(child)
            if sub is not None:
                out[ANY] = sub
    return out or None


def accept_numbers(fields: Fields | None, obj: Any, old: Any = None) -> None:
    """Write fractions found at quantity fields as canonical strings, in place.

    What our defaulting webhooks do before the schema is checked. A whole number is left as the
    user wrote it (the schema stores it), and so, on update, is a number the stored object already
    holds at the same place: rewriting it would trip the schema's immutability rules.
    """
    if fields is None:
        return
    _walk(fields, obj, old, numbers_only=True)


def canonicalize(fields: Fields | None, obj: Any) -> None:
    """Write every quantity at a quantity field canonically, in place (objects we create).

    A map of quantities (a ResourceList) comes out sorted by name, as an API server serializes
    Go maps. A value that is no quantity is left as it is: admission has refused it already.
    """
    if fields is None:
        return
    _walk(fields, obj, None, numbers_only=False)


def _walk(fields: Fields, obj: Any, old: Any, *, numbers_only: bool) -> None:
    if fields is True or not isinstance(fields, Mapping):
        return
    if isinstance(obj, list):
        item = fields.get(ANY)
        if item is None:
            return
        olds = old if isinstance(old, list) else []
        for i, value in enumerate(obj):
            if item is True:
                obj[i] = _convert(value, olds[i] if i < len(olds) else None, numbers_only)
            else:
                _walk(item, value, olds[i] if i < len(olds) else None, numbers_only=numbers_only)
        return
    if not isinstance(obj, dict):
        return
    olds_map = old if isinstance(old, dict) else {}
    any_field = fields.get(ANY)
    if any_field is True and not numbers_only:
        with contextlib.suppress(ValueError):  # a value that is no quantity: leave the map as it is
            canonical = resource_list_canonical(obj)
            obj.clear()
            obj.update(canonical)
        return
    for key, value in obj.items():
        sub = fields.get(key, any_field)
        if sub is None:
            continue
        if sub is True:
            obj[key] = _convert(value, olds_map.get(key), numbers_only)
        else:
            _walk(sub, value, olds_map.get(key), numbers_only=numbers_only)


def _convert(value: Any, old: Any, numbers_only: bool) -> Any:
    if isinstance(value, bool):
        return value
    is_number = isinstance(value, (int, float))
    if numbers_only and is_number and isinstance(old, str) and _same_quantity(value, old):
        # Stored as a string (by a user, or by this webhook before it kept whole numbers): the
        # same amount sent again as a number keeps the stored form, so re-applying an unchanged
        # manifest is no change, and no immutability rule sees one.
        return old
    if numbers_only and (not is_number or json_integer(value) or (type(old) is type(value) and old == value)):
        # Defaulting never rewrites what the schema stores as written: a whole number is an
        # int-or-string's integer, kept as the user set it, so applying the same manifest again
        # is no change (docs/decisions.md §9). Only a fraction, which no CRD schema can store as a
        # number, becomes a quantity string.
        return value
    if not is_number and not isinstance(value, str):
        return value
    with contextlib.suppress(ValueError, OverflowError):
        return canonical_quantity(value)
    return value


def _same_quantity(number: int | float, text: str) -> bool:
    """The same amount, whatever the notation (``1073741824`` and ``"1Gi"``)."""
    with contextlib.suppress(ValueError, OverflowError):
        return bool(Quantity.parse(number) == Quantity.parse(text))
    return False
