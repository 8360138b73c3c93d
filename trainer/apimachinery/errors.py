"""Field errors in the shape Kubernetes reports them.

Every refusal the project makes (schema, CEL, plugin validation, the webhooks, the local API
server) is a list of these, so a user sees one wording whichever door the object came through.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# The error types of k8s.io/apimachinery/pkg/util/validation/field, with the words Kubernetes
# prints for each.
INVALID = "Invalid value"
REQUIRED = "Required value"
UNSUPPORTED = "Unsupported value"
FORBIDDEN = "Forbidden"
DUPLICATE = "Duplicate value"
TOO_LONG = "Too long"
TOO_MANY = "Too many"
INTERNAL = "Internal error"

_OMIT = object()


@dataclass(frozen=True)
class GoValue:
    """A bad value already printed the way Go's ``%#v`` prints it.

    Kubernetes shows some values with Go syntax, e.g. the keys of a duplicate list-map entry as
    ``map[string]interface {}{"name":"a"}``; wrapping the text keeps that wording exact.
    """

    text: str

    def __str__(self) -> str:
        return self.text


def render_value(value: Any) -> str:
    """Render a value the way Kubernetes does in field errors: strings quoted, objects by type."""
    if isinstance(value, GoValue):
        return value.text
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return json.dumps(value)  # a list of names says more than its type
        return '"array"'
    return json.dumps(str(value))


@dataclass(frozen=True)
class FieldError:
    """One reason an object is refused, at one field path.

    ``path`` uses Kubernetes notation: ``spec.trainer.env[0].name``, ``metadata.labels[key]``.
    ``value`` is shown only for the types that show one (Invalid, Unsupported, Duplicate, and
    Too many, which shows the actual count: ``Too many: 129: must have at most 128 items``).
    """

    path: str
    type: str
    detail: str = ""
    value: Any = field(default=_OMIT, compare=False)

    def __str__(self) -> str:
        head = f"{self.path}: {self.type}" if self.path else self.type
        if self.value is not _OMIT and self.type in (INVALID, UNSUPPORTED, DUPLICATE, TOO_MANY):
            head += f": {render_value(self.value)}"
        return f"{head}: {self.detail}" if self.detail else head


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, INVALID, detail, value)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, REQUIRED, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(path, FORBIDDEN, detail)


def unsupported(path: str, value: Any, supported: list[str]) -> FieldError:
    detail = "supported values: " + ", ".join(json.dumps(s) for s in supported)
    return FieldError(path, UNSUPPORTED, detail, value)


def internal(path: str, detail: str) -> FieldError:
    return FieldError(path, INTERNAL, detail)


class AdmissionError(Exception):
    """An object is refused: carries every field error found, never a partial list."""

    def __init__(self, errors: list[FieldError], warnings: list[str] | None = None) -> None:
        self.errors = list(errors)
        self.warnings = list(warnings or [])
        super().__init__("; ".join(str(e) for e in self.errors))
