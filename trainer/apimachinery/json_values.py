"""Decoded JSON values told apart as the API server's Go code tells them apart.

Python calls ``1 == 1.0 == True``; Go's interface comparisons and reflect.DeepEqual do not, and
neither do Kubernetes' messages, which name a value's JSON kind. Validation and the ObjectMeta
checks both need that view of a value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not needed at run time, and `trainer render` must start fast
    from collections.abc import Sequence
    from typing import Any, Final

__all__ = ["KINDS", "has_duplicates", "hashable", "json_integer", "odd_kind", "repeated", "same"]

KINDS: Final[dict[type, str]] = {
    str: "string",
    dict: "object",
    list: "array",
    bool: "boolean",
    int: "integer",
    float: "number",
}


def odd_kind(v: Any) -> tuple[str, Any]:
    """The JSON kind of a value that is not a plain JSON type (and its text, for strings).

    YAML loaders turn unquoted timestamps into datetimes; the API server would see the text.
    """
    if isinstance(v, bool):
        return "boolean", v
    if isinstance(v, str):
        return "string", str(v)
    if isinstance(v, int):
        return "integer", v
    if isinstance(v, float):
        return "number", v
    if isinstance(v, Mapping):
        return "object", v
    if isinstance(v, (list, tuple)):
        return "array", v
    isoformat = getattr(v, "isoformat", None)
    if callable(isoformat):
        text = isoformat()
        return "string", text.replace("+00:00", "Z") if "T" in text else text
    return type(v).__name__, v


def json_integer(value: Any) -> bool:
    """go-openapi's IsFloat64AJSONInteger: a float that JSON would carry as an integer."""
    if not isinstance(value, float):
        return isinstance(value, int)
    return math.isfinite(value) and value.is_integer() and abs(value) <= 2.0**53


def same(a: Any, b: Any) -> bool:
    """Go's reflect.DeepEqual on JSON values: 1 and 1.0 differ, and so do true and 1."""
    if isinstance(a, Mapping):
        if not isinstance(b, Mapping) or len(a) != len(b):
            return False
        return all(k in b and same(x, b[k]) for k, x in a.items())
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return False
        return all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def hashable(value: Any) -> Any:
    """A dict key that tells JSON values apart as Go's interface comparison does (1 is not 1.0)."""
    if value is None or isinstance(value, (str, int, float)):
        return (type(value), value)
    try:
        return ("json", json.dumps(value, sort_keys=True, separators=(",", ":")))
    except (TypeError, ValueError):  # not a JSON value; compare by its text rather than fail
        return ("repr", repr(value))


def repeated(values: Sequence[Any]) -> list[int]:
    """Indexes of the second occurrence of each repeated value (apiextensions' validateListSet)."""
    seen: dict[Any, int] = {}
    found = []
    for i, value in enumerate(values):
        key = hashable(value)
        times = seen.get(key, 0)
        seen[key] = times + 1
        if times == 1:
            found.append(i)
    return found


def has_duplicates(values: Sequence[Any]) -> bool:
    seen = set()
    for value in values:
        key = hashable(value)
        if key in seen:
            return True
        seen.add(key)
    return False
