"""How a pydantic field says what its CRD schema is.

The pydantic models in this package are the single source of the trainer CRDs. A model field
carries a :class:`Schema` in its ``Annotated`` metadata for everything OpenAPI and Kubernetes
add on top of the Python type (bounds, defaults, list types, CEL rules). ``trainer crds`` walks
the models and emits structural schemas from them (see :mod:`trainer.api.crdgen`).

The models themselves enforce nothing: admission validates the raw object against the generated
schema (one implementation of every rule, shared with the webhooks and the local API server),
and only then are the models used as typed views of an admitted object.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self, get_args, get_origin

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
    """Base of every API type: camelCase on the wire, typed views of admitted objects.

    ``extra="allow"`` because the models are views, not gates: a field the schema admits but a
    model does not name is kept, never dropped. ``defer_build`` keeps import cheap for the
    offline CLI, which may never touch most models.
    """

    model_config = ConfigDict(populate_by_name=True, extra="allow", defer_build=True, frozen=False)

    @classmethod
    def view(cls, data: Mapping[str, Any]) -> Self:
        """A typed view of an object the CRD schema has already admitted, built without validation.

        Validating again would check nothing the schema did not, and building pydantic's
        validators costs more than a whole offline render; so nested models are constructed
        field by field and everything else is kept as it came (extra fields included).
        """
        values: dict[str, Any] = {}
        for name, convert in _view_plan(cls).items():
            if name in data:
                value = data[name]
                values[name] = convert(value) if convert is not None and value is not None else value
        values.update({k: v for k, v in data.items() if k not in values})
        return typing.cast(Self, cls.model_construct(**values))


_Converter = Callable[[Any], Any] | None
_PLANS: dict[type[BaseModel], dict[str, _Converter]] = {}


def _view_plan(model: type[BaseModel]) -> dict[str, _Converter]:
    """Wire name -> how to turn its value into a view (None: keep it), computed once per model."""
    plan = _PLANS.get(model)
    if plan is None:
        plan = {
            (info.alias or name): _converter(info.annotation) for name, info in model.model_fields.items()
        }
        _PLANS[model] = plan
    return plan


def _converter(annotation: Any) -> _Converter:
    while True:
        origin = get_origin(annotation)
        if origin is typing.Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return None
            annotation = members[0]
        else:
            break
    if isinstance(annotation, type) and issubclass(annotation, APIModel):
        return annotation.view
    if get_origin(annotation) is list:
        item = _converter(get_args(annotation)[0])
        if item is not None:
            return lambda values: [item(v) if isinstance(v, Mapping) else v for v in values]
    return None
