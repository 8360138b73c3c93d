"""Field errors in the shape Kubernetes reports them.

Every refusal the project makes (schema, CEL, plugin validation, the webhooks, the local API
server) is a list of these, so a user sees one wording whichever door the object came through.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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

RULES_NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)
"""kube-apiserver's words for the error it adds, at the nil path, when an earlier error stopped the
CRD's CEL rules (``schema_validation.validate`` says when)."""

RULES_NOT_CHECKED_NOTE = (
    "the API server checks the CRD's validation rules only once the errors above are corrected; "
    "they may find more"
)
"""What the ``RULES_NOT_CHECKED`` error means, for a reader of our own output (``refusal_lines``)."""


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


def is_rules_not_checked(error: FieldError) -> bool:
    """Whether ``error`` is the API server's note that CEL rules were not run, rather than a reason."""
    return error.type == INVALID and error.detail == RULES_NOT_CHECKED


def refusal_lines(errors: Sequence[FieldError]) -> tuple[list[str], str | None]:
    """A refusal as we print it to a person: one line per error, and the note (or None).

    The API server adds ``RULES_NOT_CHECKED`` to a refusal as if it were one more error, at
    ``<nil>`` with the value null: the stand-in API server keeps it, as a client reads the
    server's answer. In our own output (``trainer render``, our webhook's denial) it is not an
    error of any field, so it is left out of the error lines and said once, in plain words, after
    them.
    """
    lines = [str(e) for e in errors if not is_rules_not_checked(e)]
    note = RULES_NOT_CHECKED_NOTE if any(is_rules_not_checked(e) for e in errors) else None
    return lines, note
