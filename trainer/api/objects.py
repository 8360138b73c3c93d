"""The shapes of Kubernetes objects as this project handles them: JSON, as the API server sends it.

Objects stay plain dicts everywhere outside the typed views of ``trainer.api.views``: admission,
the render core, plugins and the operator pass on fields they do not know (a newer JobSet
field, a user's annotation), and a dict keeps them without a model per kind. So ``Obj`` is one
name for that, defined here, in the lowest layer, so every layer and every plugin (through
``trainer.plugin``) means the same thing by it.

A shape gets a name of its own only where naming it lets mypy catch a mistake: a condition the
project writes must carry its type, status, reason and message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

Obj: TypeAlias = dict[str, Any]
"""A JSON object: a Kubernetes object, or any object-valued field of one."""

ObjList: TypeAlias = list[Obj]
"""A JSON array of objects: the items of a List, containers, conditions, ..."""

# A TypedDict is a plain dict at run time, and making its class costs `trainer render` a millisecond.
if TYPE_CHECKING:
    from typing import NotRequired, TypedDict

    class NewCondition(TypedDict):
        """A status condition as the project is about to write it (``set_condition`` adds the
        transition time). The API type, as the CRD describes it, is ``trainer.api.trainjob.Condition``.

        Conditions read back from a status stay ``Obj``: other writers may add fields.
        """

        type: str
        status: str
        reason: str
        message: str
        lastTransitionTime: NotRequired[str]


def contains(observed: object, desired: object) -> bool:
    """True when every field of ``desired`` is in ``observed`` with the same value.

    Maps may hold more keys than we set; lists must match item by item (we own the lists we
    write), each item compared the same way so defaults inside items are tolerated.
    """
    if isinstance(desired, dict):
        return isinstance(observed, dict) and all(
            k in observed and contains(observed[k], v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(observed, list)
            and len(observed) == len(desired)
            and all(contains(o, d) for o, d in zip(observed, desired, strict=True))
        )
    if isinstance(desired, bool) or isinstance(observed, bool):
        return observed is desired
    return bool(observed == desired)
