"""What every typed view is: an admitted object (or an object-valued field of one), read through
typed properties. The one hand-written module of ``trainer.api.views``; the others are generated
from the API models by ``trainer crds`` (trainer/api/viewgen.py).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not needed at run time, and `trainer render` must start fast
    from typing import Any


class View:
    """An admitted object (or an object-valued field of one), read through typed properties."""

    __slots__ = ("_obj",)

    def __init__(self, obj: dict[str, Any]) -> None:
        self._obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, View) and type(other) is type(self) and other._obj == self._obj

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._obj!r})"
