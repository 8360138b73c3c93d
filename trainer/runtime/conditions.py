"""Kubernetes "set condition" semantics on plain status dicts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.api.objects import Obj

if TYPE_CHECKING:
    from trainer.api.objects import NewCondition


def find(conditions: list[Obj] | None, type_: str) -> Obj | None:
    return next((cond for cond in conditions or [] if cond.get("type") == type_), None)


def is_true(conditions: list[Obj] | None, type_: str) -> bool:
    cond = find(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def set_condition(conditions: list[Obj], new: NewCondition, now: str) -> None:
    """Add or update a condition; lastTransitionTime moves only when the status changes."""
    current = find(conditions, new["type"])
    if current is None:
        conditions.append({**new, "lastTransitionTime": new.get("lastTransitionTime") or now})
        return
    if current.get("status") != new.get("status"):
        current["lastTransitionTime"] = new.get("lastTransitionTime") or now
    current["status"] = new["status"]
    current["reason"] = new["reason"]
    current["message"] = new["message"]


def remove(conditions: list[Obj], type_: str) -> None:
    conditions[:] = [cond for cond in conditions if cond.get("type") != type_]


def is_finished(status: Obj | None) -> bool:
    conditions = (status or {}).get("conditions")
    return is_true(conditions, "Complete") or is_true(conditions, "Failed")
