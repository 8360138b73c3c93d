"""What pruning, defaulting and validation read off a node of a structural schema.

The three stages walk the same ``openAPIV3Schema`` dict, as it is; reading a node's items,
additionalProperties and types in one place keeps them agreeing on what a node declares.
"""

from __future__ import annotations

from collections.abc import Mapping

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not needed at run time, and `trainer render` must start fast
    from collections.abc import Sequence
    from typing import Any, Final, TypeAlias

    Schema: TypeAlias = Mapping[str, Any]

__all__ = ["EMPTY", "additional", "items", "types"]

EMPTY: Final[Mapping[str, Any]] = {}
_INT_OR_STRING: Final = ("integer", "string")


def items(s: Schema) -> Schema | None:
    """The schema of list items (a list of schemas, JSON Schema tuples, is not structural)."""
    found = s.get("items")
    return found if isinstance(found, Mapping) else None


def additional(s: Schema) -> Schema | None:
    """The schema of additionalProperties; ``true`` is a schema that declares nothing."""
    extra = s.get("additionalProperties")
    if isinstance(extra, Mapping):
        return extra
    return EMPTY if extra is True else None


def types(s: Schema) -> Sequence[str]:
    """The types a value may have; the API server checks int-or-string as "integer,string"."""
    if s.get("x-kubernetes-int-or-string") is True:
        return _INT_OR_STRING
    t = s.get("type")
    if t:
        return (t,) if isinstance(t, str) else tuple(t)
    return ()
