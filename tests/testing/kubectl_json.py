"""What the tests of kubectl against the stand-in share about the JSON kubectl writes."""

from __future__ import annotations

from typing import Any


def without_null_creation_timestamps(node: Any) -> Any:
    """``node`` without ``creationTimestamp: null``: kubectl builds before v1.36 write it, and the
    v1.36 types the servers follow leave a zero time out (``omitzero``)."""
    if isinstance(node, dict):
        return {
            k: without_null_creation_timestamps(v)
            for k, v in node.items()
            if not (k == "creationTimestamp" and v is None)
        }
    if isinstance(node, list):
        return [without_null_creation_timestamps(v) for v in node]
    return node
