"""How a pydantic field says what its CRD schema is.

The pydantic models in this package are the single source of the trainer CRDs. A model field
carries a :class:`Schema` in its ``Annotated`` metadata for everything OpenAPI and Kubernetes
add on top of the Python type (bounds, defaults, list types, CEL rules). ``trainer crds`` walks
the models and emits structural schemas from them (see :mod:`trainer.api.crdgen`).

The models themselves enforce nothing: admission validates the raw object against the generated
schema (one implementation of every rule, shared with the webhooks and the local API server).
What reads an admitted object reads it through the plain views ``trainer crds`` generates from
the models (:mod:`trainer.api.viewgen`), so pydantic is not on the render path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict


@dataclass(frozen=True)
class Rule:
    """One ``x-kubernetes-validations`` entry."""

    rule: str
    message: str
    reason: str | None = None
    field_path: str | None = None

    def to_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message, "rule": self.rule}
        if self.reason:
            out["reason"] = self.reason
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


IMMUTABLE = Rule("self == oldSelf", "field is immutable")


@dataclass(frozen=True)
class Schema:
    """OpenAPI and Kubernetes facets of one field, placed in ``Annotated[...]`` metadata."""

    default: Any = None
    minimum: int | None = None
    maximum: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    min_items: int | None = None
    max_items: int | None = None
    min_properties: int | None = None
    enum: tuple[Any, ...] | None = None
    format: str | None = None
    pattern: str | None = None
    list_type: str | None = None
    map_keys: tuple[str, ...] | None = None
    map_type: str | None = None
    rules: tuple[Rule, ...] = ()
    embed: str | None = None  # name of a vendored Kubernetes sub-schema, see embedded_schemas.json
    preserve_unknown: bool = False
    required_keys: tuple[str, ...] = field(default=())

    def facets(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.default is not None:
            out["default"] = self.default
        for key, value in (
            ("minimum", self.minimum),
            ("maximum", self.maximum),
            ("minLength", self.min_length),
            ("maxLength", self.max_length),
            ("minItems", self.min_items),
            ("maxItems", self.max_items),
            ("minProperties", self.min_properties),
            ("format", self.format),
            ("pattern", self.pattern),
        ):
            if value is not None:
                out[key] = value
        if self.enum is not None:
            out["enum"] = list(self.enum)
        if self.list_type:
            out["x-kubernetes-list-type"] = self.list_type
        if self.map_keys:
            out["x-kubernetes-list-map-keys"] = list(self.map_keys)
        if self.map_type:
            out["x-kubernetes-map-type"] = self.map_type
        if self.preserve_unknown:
            out["x-kubernetes-preserve-unknown-fields"] = True
        if self.rules:
            out["x-kubernetes-validations"] = [r.to_schema() for r in self.rules]
        return out


class APIModel(BaseModel):
    """Base of every API type: camelCase on the wire, snake_case in Python.

    ``extra="allow"`` because the models are no gate: a field the schema admits but a model does
    not name is kept, never dropped. ``defer_build``: the CRD and view generators read the
    models' fields and never validate, so pydantic's validators are built only when a test
    validates an object.
    """

    model_config = ConfigDict(populate_by_name=True, extra="allow", defer_build=True, frozen=False)
