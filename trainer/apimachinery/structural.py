"""Prune, default and validate objects against a CRD's structural OpenAPI v3 schema.

kube-apiserver does this to every custom resource it stores. Doing it again here, over plain JSON
values, lets ``trainer render``, the operator's webhooks and the local API server refuse exactly
what a cluster refuses, in the words a cluster uses (Kubernetes 1.32: apiextensions-apiserver on
top of kube-openapi's validator), for any CRD. A schema is the parsed ``openAPIV3Schema`` dict,
walked as it is: nothing is derived from it ahead of time (CEL rules are compiled once, through
the CEL module's cache), and the only imports are the standard library and our own modules, so
``trainer render`` starts fast.

The API server's order of work, which callers should keep:

1. ``prune`` (or ``unknown_fields`` to refuse instead): drop fields the schema does not declare.
2. ``drop_non_nullable_nulls`` then ``apply_defaults``.
3. ``validate``: the OpenAPI value checks, then the embedded-resource checks, then list-type
   (set/map) uniqueness, then the ``x-kubernetes-validations`` CEL rules. As in the API server,
   the CEL rules are skipped when an earlier error is one that means the object does not have the
   shape the rules were written for (type, required, enum, too long, too many); a single error
   says so. On update, errors inside parts that did not change are dropped (CRD validation
   ratcheting), and transition rules (rules that read ``oldSelf``) see the matching old value.
4. ``validate_object_meta`` for the generic ObjectMeta checks, when the caller wants them.

Paths follow the API server: ``spec.trainer.env[0].name``. An error about the object as a whole
(for example a rule on the root without ``fieldPath``) is at ``<nil>``, as Kubernetes prints it.
The OpenAPI checks name a map entry ``spec.nodeSelector.key`` and the CEL and list-type checks
``spec.nodeSelector[key]``: the two validators of the API server differ, and so do we.

Known differences from kube-apiserver:

* CEL sees plain JSON values: ``date-time`` strings are not timestamps, ``duration`` strings are
  not durations, root ``self.metadata`` holds every field rather than only name and generateName,
  and an integer in a ``type: number`` field stays an integer. There is no cost budget.
* Formats: ``date-time``, ``date``, ``byte``, ``uuid*``, ``ipv4``, ``ipv6``, ``cidr``, ``mac``,
  ``bsonobjectid``, ``hexcolor``, ``ssn`` and ``password`` are checked; ``uri``, ``email``,
  ``hostname``, ``isbn*``, ``creditcard``, ``rgbcolor`` and ``duration`` are accepted unchecked.
  A number outside the range of its type and format (``int32``, else ``int64`` for an integer;
  ``float`` for a number) is refused as kube-apiserver 1.36 refuses it (``<nil>: Checked value
  must be of type integer with format int32 in PATH``, not blocking the CEL rules).
  ``ipv4``/``ipv6``/``cidr`` use Python's ``ipaddress``, which may differ from Go's parser in
  corner cases.
* ``anyOf``/``oneOf`` report the failing branch with the fewest errors, where kube-openapi picks
  the branch that passed the most checks (the same branch for the int-or-string schemas CRDs use).
* CEL rules directly in ``allOf`` branches are evaluated; rules nested deeper inside a branch are
  not.
* Embedded resources get the apiVersion/kind checks; their metadata is kept whole, not coerced.
* On update, old values are matched as the 1.32 CEL validator matches them (properties, map
  keys, list-map keys), for ratcheting too: items of sets and atomic lists are never matched.
* ``prune`` and ``unknown_fields`` paths start with a dot (``.spec.foo``); the API server's
  warnings print them without it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

from trainer.apimachinery import cel
from trainer.apimachinery.errors import (
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    REQUIRED,
    TOO_LONG,
    TOO_MANY,
    UNSUPPORTED,
    FieldError,
    GoValue,
    unsupported,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not needed at run time, and `trainer render` must start fast
    from collections.abc import Callable, Sequence
    from typing import Any, Final, TypeAlias

    Schema: TypeAlias = Mapping[str, Any]
    Anchor: TypeAlias = tuple[Any, Any] | None

__all__ = [
    "ROOT_PATH",
    "apply_defaults",
    "drop_non_nullable_nulls",
    "prune",
    "unknown_fields",
    "validate",
    "validate_object_meta",
]

ROOT_PATH: Final = "<nil>"
"""Where Kubernetes reports an error about the whole object (Go's nil field path)."""

_EMPTY: Final[Mapping[str, Any]] = {}
_UNSPECIFIED: Final = object()  # a list-map entry without its key (a Go sentinel in apiextensions)
_META_FIELDS: Final = frozenset({"apiVersion", "kind", "metadata"})
_INT_OR_STRING: Final = ("integer", "string")
_NOT_CHECKED: Final = (
    "some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)
# Error types after which the API server does not run CEL rules (besides "type invalid", which
# shares its words with Invalid and is tracked by identity instead).
_BLOCKING: Final = frozenset({REQUIRED, UNSUPPORTED, TOO_LONG, TOO_MANY})
# Formats a CRD schema keeps (apiextensions' supportedFormats, names without dashes); the API
# server clears every other format before validating.
_KEPT_FORMATS: Final = frozenset(
    {
        "bsonobjectid",
        "uri",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "cidr",
        "mac",
        "uuid",
        "uuid3",
        "uuid4",
        "uuid5",
        "isbn",
        "isbn10",
        "isbn13",
        "creditcard",
        "ssn",
        "hexcolor",
        "rgbcolor",
        "byte",
        "password",
        "date",
        "duration",
        "datetime",
    }
)
_MAX_ANNOTATIONS_BYTES: Final = 256 * 1024


# ---------------------------------------------------------------------------------------------
# Pruning
# ---------------------------------------------------------------------------------------------


def prune(schema: Schema, obj: Any) -> list[str]:
    """Remove, in place, every field ``schema`` does not declare; return their paths.

    Fields under ``x-kubernetes-preserve-unknown-fields: true`` stay, and so do ``apiVersion``,
    ``kind`` and ``metadata`` at the root and in embedded resources (their metadata is kept
    whole). Paths are sorted, as the API server sorts them, and start with a dot:
    ``.spec.foo``, ``.spec.list[0].bar`` (a caller in Strict mode refuses with them instead).
    """
    return _unknown(schema, obj, remove=True)


def unknown_fields(schema: Schema, obj: Any) -> list[str]:
    """The paths ``prune`` would remove, leaving ``obj`` untouched."""
    return _unknown(schema, obj, remove=False)


# The fields of ObjectMeta (k8s.io/apimachinery/pkg/apis/meta/v1), as its JSON names them.
_OBJECT_META_FIELDS: Final = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)


def unknown_meta_fields(obj: Any) -> list[str]:
    """The fields of a resource's own ``metadata`` that ObjectMeta does not have, as
    ``.metadata.x`` (the API server decodes metadata into ObjectMeta: strict decoding refuses
    them, and otherwise they are dropped)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return []
    return sorted(f".metadata.{k}" for k in meta if k not in _OBJECT_META_FIELDS)


def _unknown(schema: Schema, obj: Any, *, remove: bool) -> list[str]:
    found: list[str] = []
    _prune(obj, schema, "", found, remove, resource_root=True)
    found.sort()
    return ["." + path for path in found]


def _prune(
    x: Any, s: Schema | None, path: str, found: list[str], remove: bool, resource_root: bool = False
) -> None:
    """apiextensions' structural pruning: unknown fields go, unless the schema preserves them."""
    if s is not None and s.get("x-kubernetes-preserve-unknown-fields") is True:
        _skip_prune(x, s, path, found, remove, resource_root)
        return
    if isinstance(x, dict):
        if s is None:
            found.extend(f"{path}.{k}" if path else k for k in x)
            if remove:
                x.clear()
            return
        embedded = resource_root or s.get("x-kubernetes-embedded-resource") is True
        props = s.get("properties") or _EMPTY
        extra = _additional(s)
        doomed: list[str] = []
        for k, v in x.items():
            if embedded and k in _META_FIELDS:
                continue
            prop = props.get(k)
            child = f"{path}.{k}" if path else k
            if prop is not None:
                _prune(v, prop, child, found, remove)
            elif extra is not None:
                _prune(v, extra, child, found, remove)
            else:
                if k not in _META_FIELDS or path:
                    found.append(child)
                doomed.append(k)
        if remove:
            for k in doomed:
                del x[k]
    elif isinstance(x, list):
        items = _items(s) if s is not None else None
        for i, v in enumerate(x):
            _prune(v, items, f"{path}[{i}]", found, remove)


def _skip_prune(x: Any, s: Schema, path: str, found: list[str], remove: bool, resource_root: bool) -> None:
    """Below ``x-kubernetes-preserve-unknown-fields`` only declared fields are pruned into."""
    if isinstance(x, dict):
        embedded = resource_root or s.get("x-kubernetes-embedded-resource") is True
        props = s.get("properties") or _EMPTY
        extra = _additional(s)
        for k, v in x.items():
            if embedded and k in _META_FIELDS:
                continue
            prop = props.get(k)
            child = f"{path}.{k}" if path else k
            if prop is not None:
                _prune(v, prop, child, found, remove)
            elif extra is not None:
                _prune(v, extra, child, found, remove)
    elif isinstance(x, list):
        items = _items(s)
        if items is not None:
            for i, v in enumerate(x):
                _skip_prune(v, items, f"{path}[{i}]", found, remove, False)


def _items(s: Schema) -> Schema | None:
    """The schema of list items (a list of schemas, JSON Schema tuples, is not structural)."""
    items = s.get("items")
    return items if isinstance(items, Mapping) else None


def _additional(s: Schema) -> Schema | None:
    """The schema of additionalProperties; ``true`` is a schema that declares nothing."""
    extra = s.get("additionalProperties")
    if isinstance(extra, Mapping):
        return extra
    return _EMPTY if extra is True else None


# ---------------------------------------------------------------------------------------------
# Nulls and defaults
# ---------------------------------------------------------------------------------------------


def drop_non_nullable_nulls(schema: Schema, obj: Any) -> list[str]:
    """Remove, in place, null fields that are neither nullable nor defaulted; return their paths.

    The API server does this while decoding, before defaulting, so a ``null`` sent for an
    ordinary field means "unset" rather than a type error. Paths are like ``prune``'s.
    """
    found: list[str] = []
    _drop_nulls(obj, schema, "", found)
    return ["." + path for path in found]


def _drop_nulls(x: Any, s: Schema, path: str, found: list[str]) -> None:
    """apiextensions' PruneNonNullableNullsWithoutDefaults: properties and map values alike."""
    if isinstance(x, dict):
        props = s.get("properties") or _EMPTY
        extra = s.get("additionalProperties")
        extra = extra if isinstance(extra, Mapping) else None
        for k in list(x):
            prop = props.get(k, extra)
            if prop is None:
                continue
            child = f"{path}.{k}" if path else k
            if x[k] is None and prop.get("default") is None and not prop.get("nullable"):
                del x[k]
                found.append(child)
            else:
                _drop_nulls(x[k], prop, child, found)
    elif isinstance(x, list):
        items = _items(s)
        if items is not None:
            for i, v in enumerate(x):
                _drop_nulls(v, items, f"{path}[{i}]", found)


def apply_defaults(schema: Schema, obj: Any) -> Any:
    """Apply the schema's defaults to ``obj`` in place, and return it.

    As the API server does: in every object, each declared property that is absent, or null
    without ``nullable: true``, gets a copy of its ``default``; then defaulting goes on into every
    property (a defaulted object gets its own nested defaults), list item and
    additionalProperties value. A ``default: null`` is no default.
    """
    _default(obj, schema)
    return obj


def _default(x: Any, s: Schema) -> None:
    if isinstance(x, dict):
        props = s.get("properties")
        if props:
            for k, prop in props.items():
                default = prop.get("default")
                if default is not None and (k not in x or (x[k] is None and not prop.get("nullable"))):
                    x[k] = _copy(default)
        extra = _additional(s)
        if props or extra is not None:
            for k, v in x.items():
                prop = props.get(k) if props else None
                if prop is not None:
                    _default(v, prop)
                elif extra is not None:
                    _default(v, extra)
    elif isinstance(x, list):
        items = _items(s)
        if items is not None:
            for v in x:
                _default(v, items)


def _copy(value: Any) -> Any:
    """Deep copy of a JSON value: a default must never be shared between objects."""
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def validate(
    schema: Schema, obj: Any, old: Any = None, *, path: str = "", meta: Sequence[FieldError] = ()
) -> list[FieldError]:
    """Every error the API server would report for ``obj``, in its order and words.

    ``old`` is the stored object on update (None on create): it enables transition rules and
    ratcheting. ``path`` prefixes every path, for a caller that validates a part of an object.
    ``meta`` are the errors of the object's own ObjectMeta (``validate_object_meta``): the API
    server reports them first, and a blocking one (a missing name) stops the CEL rules too.
    Errors come in traversal order (schema property order), grouped as the API server groups
    them: ObjectMeta, OpenAPI, embedded resources, list types, then CEL rules.
    """
    walk = _Walk(path)
    walk.walk(schema, obj, old, path, path, None, True)
    errors = [*meta, *walk.schema_errors, *walk.meta_errors]
    list_errors = walk.list_errors
    if list_errors and old is not None:
        # On update the list-type checks run only if the stored object passed them.
        old_walk = _Walk(path, rules=False, meta=False)
        old_walk.walk(schema, old, None, path, path, None, False)
        if old_walk.list_errors:
            list_errors = []
    errors += list_errors
    type_invalid = {id(e) for e in walk.type_invalid}
    if any(e.type in _BLOCKING or id(e) in type_invalid for e in errors):
        if _has_rules(schema):
            errors.append(FieldError(path or ROOT_PATH, INVALID, _NOT_CHECKED, "null"))
    else:
        errors += walk.rule_errors
    return errors


class _Walk:
    """One pass over an object and its schema, collecting each kind of error in its own list.

    ``rules``, ``lists`` and ``meta`` switch the CEL, list-type and embedded-resource checks;
    the OpenAPI checks are switched per subtree by ``walk``'s ``check`` argument.
    """

    __slots__ = (
        "list_errors",
        "lists",
        "meta",
        "meta_errors",
        "prefix",
        "root",
        "rule_errors",
        "rules",
        "schema_errors",
        "type_invalid",
    )

    def __init__(self, prefix: str, *, rules: bool = True, lists: bool = True, meta: bool = True) -> None:
        self.prefix = prefix
        self.root = prefix or ROOT_PATH
        self.rules = rules
        self.lists = lists
        self.meta = meta
        self.schema_errors: list[FieldError] = []
        self.meta_errors: list[FieldError] = []
        self.list_errors: list[FieldError] = []
        self.rule_errors: list[FieldError] = []
        # "Type invalid" errors read like Invalid ones but stop the CEL rules; kept by identity.
        self.type_invalid: list[FieldError] = []

    # -- traversal ------------------------------------------------------------------------------

    def walk(self, s: Schema, v: Any, old: Any, path: str, opath: str, anchor: Anchor, check: bool) -> None:
        """Check value ``v`` at ``path`` (``opath`` in OpenAPI notation) and everything under it.

        ``old`` is the matching old value (None when there is none to compare with); ``anchor``
        is the nearest (new, old) pair that does have one, for ratcheting CEL errors.
        """
        if v is None:
            if check:
                self._null(s, opath)
            return  # CEL rules, list types and embedded resources ignore nulls
        mark = len(self.schema_errors)
        if old is not None:
            anchor = (v, old)
        kind = _KINDS.get(type(v))
        text = v
        if kind is None:
            kind, text = _odd_kind(v)
        if check:
            if s.get("type") != kind:  # a value of the declared type always passes the type check
                self._type(s, v, kind, opath)
            if "anyOf" in s or "allOf" in s or "oneOf" in s or "not" in s:
                self._composite(s, v, path, opath)
            if kind == "string":
                self._string(s, text, opath)
            elif kind == "integer" or kind == "number":
                self._number_range(s, v, opath)
                self._number(s, v, kind == "integer", opath)
        if self.rules:
            rules = s.get("x-kubernetes-validations")
            if rules:
                self._rules(rules, s.get("type") or "", v, old, path, anchor, s)
            if "allOf" in s:
                for branch in s["allOf"]:
                    branch_rules = branch.get("x-kubernetes-validations")
                    if branch_rules:
                        self._rules(branch_rules, s.get("type") or "", v, old, path, anchor, s)
        if kind == "array":
            self._array(s, v, old, path, opath, anchor, check)
        elif kind == "object":
            if check and "enum" in s:
                self._enum(s, v, opath)
            self._object(s, v, old, path, opath, anchor, check)
        elif check and "enum" in s:
            self._enum(s, v, opath)
        if old is not None and len(self.schema_errors) > mark and _same(v, old):
            del self.schema_errors[mark:]  # ratcheting: this part did not change

    def _array(self, s: Schema, v: Any, old: Any, path: str, opath: str, anchor: Anchor, check: bool) -> None:
        items = _items(s)
        list_type = s.get("x-kubernetes-list-type")
        if self.lists and (list_type == "map" or list_type == "set"):
            self._list_type(s, list_type, v, path)
        if items is not None:
            olds: dict[Any, Any] | None = None
            keys: Sequence[str] = ()
            if old is not None and list_type == "map" and isinstance(old, list):
                keys = s.get("x-kubernetes-list-map-keys") or ()
                olds = _map_list_index(keys, items, old) if keys else None
            for i, item in enumerate(v):
                child = f"{path}[{i}]"
                item_old = None
                if olds and isinstance(item, Mapping):
                    item_old = olds.get(_map_key(keys, items, item))
                self.walk(
                    items, item, item_old, child, child if opath is path else f"{opath}[{i}]", anchor, check
                )
        if check:
            n = len(v)
            least = s.get("minItems")
            if least is not None and n < least:
                self._invalid(opath, n, f"{opath} in body should have at least {least} items")
            most = s.get("maxItems")
            if most is not None and n > most:
                self._add(_too_many(opath or self.root, n, most))
            if s.get("uniqueItems") is True and _has_duplicates(v):
                self._invalid(opath, "", f"{opath} in body shouldn't contain duplicates")
            if "enum" in s:
                self._enum(s, v, opath)

    def _object(
        self, s: Schema, v: Any, old: Any, path: str, opath: str, anchor: Anchor, check: bool
    ) -> None:
        if self.meta and s.get("x-kubernetes-embedded-resource") is True:
            self._embedded(v, path)
        props = s.get("properties")
        extra = _additional(s)
        if check and ("minProperties" in s or "maxProperties" in s or "additionalProperties" in s):
            n = len(v)
            least = s.get("minProperties")
            most = s.get("maxProperties")
            if least is not None and n < least:
                self._invalid(opath, n, f"{opath} in body should have at least {least} properties")
                check = False  # kube-openapi stops checking the object there
            elif most is not None and n > most:
                self._add(_too_many(opath or self.root, n, most))
                check = False
            elif s.get("additionalProperties") is False:
                for k in v:
                    if not props or k not in props:
                        self._invalid(opath, k, f"{opath}.{k} in body is a forbidden property")
        old_map = old if old is not None and isinstance(old, Mapping) else None
        if extra is not None:
            for k, item in v.items():
                if props and k in props:
                    continue
                self.walk(
                    extra,
                    item,
                    old_map.get(k) if old_map is not None else None,
                    f"{path}[{k}]",
                    f"{opath}.{k}" if opath else k,
                    anchor,
                    check,
                )
        if props:
            # Schema order, visiting only what is there (a pod spec declares some forty fields).
            for k in [k for k in props if k in v]:
                child = f"{path}.{k}" if path else k
                self.walk(
                    props[k],
                    v[k],
                    old_map.get(k) if old_map is not None else None,
                    child,
                    child if opath is path else (f"{opath}.{k}" if opath else k),
                    anchor,
                    check,
                )
        if check:
            for k in s.get("required") or ():
                if k not in v:
                    self._add(FieldError(f"{opath}.{k}" if opath else k, REQUIRED))

    # -- OpenAPI value checks -------------------------------------------------------------------

    def _null(self, s: Schema, opath: str) -> None:
        types = _types(s)
        if types and not s.get("nullable"):
            self._type_invalid(opath, "null", f'{opath} in body must be of type {",".join(types)}: "null"')
        if "enum" in s:
            self._enum(s, None, opath)

    def _type(self, s: Schema, v: Any, kind: str, opath: str) -> None:
        """kube-openapi's type check, format quirks included."""
        types = _types(s)
        fmt = _kept_format(s)
        if not types and not fmt:
            return
        float_int = kind == "number" and "integer" in types and _json_integer(v)
        int_float = kind == "integer" and "number" in types
        matches = kind in types or float_int or int_float
        if fmt:
            if kind != "string" and kind != "array":
                if not matches:
                    data_format = "int64" if kind == "integer" else "float64" if kind == "number" else ""
                    self._type_invalid(
                        opath, data_format, f"{opath} in body must be of type {fmt}: {_go_quote(data_format)}"
                    )
                    return
            elif "number" not in types and "integer" not in types:
                return  # a string (or list) where a formatted string is expected passes
        if not matches:
            self._type_invalid(
                opath, kind, f"{opath} in body must be of type {','.join(types)}: {_go_quote(kind)}"
            )

    def _composite(self, s: Schema, v: Any, path: str, opath: str) -> None:
        """anyOf, oneOf, allOf and not, with kube-openapi's messages (reported at the root)."""
        quoted = _go_quote(opath)
        any_of = s.get("anyOf")
        if any_of:
            best: list[FieldError] | None = None
            for branch in any_of:
                failures = self._branch(branch, v, path, opath)
                if not failures:
                    best = None
                    break
                if best is None or len(failures) < len(best):
                    best = failures
            else:
                self._add(
                    FieldError(self.root, INVALID, f"{quoted} must validate at least one schema (anyOf)", "")
                )
            self._merge(best)
        one_of = s.get("oneOf")
        if one_of:
            valid = 0
            best = None
            for branch in one_of:
                failures = self._branch(branch, v, path, opath)
                if not failures:
                    valid += 1
                    best = None
                elif valid == 0 and (best is None or len(failures) < len(best)):
                    best = failures
            if valid != 1:
                found = "Found none valid" if valid == 0 else f"Found {valid} valid alternatives"
                detail = f"{quoted} must validate one and only one schema (oneOf). {found}"
                self._add(FieldError(self.root, INVALID, detail, ""))
                self._merge(best)
        all_of = s.get("allOf")
        if all_of:
            valid = 0
            for branch in all_of:
                failures = self._branch(branch, v, path, opath)
                valid += not failures
                self._merge(failures)
            if valid != len(all_of):
                more = ". None validated" if valid == 0 else ""
                self._add(
                    FieldError(
                        self.root, INVALID, f"{quoted} must validate all the schemas (allOf){more}", ""
                    )
                )
        not_schema = s.get("not")
        if isinstance(not_schema, Mapping) and not self._branch(not_schema, v, path, opath):
            self._add(FieldError(self.root, INVALID, f"{quoted} must not validate the schema (not)", ""))

    def _branch(self, branch: Schema, v: Any, path: str, opath: str) -> list[FieldError]:
        sub = _Walk(self.prefix, rules=False, lists=False, meta=False)
        sub.walk(branch, v, None, path, opath, None, True)
        self.type_invalid.extend(sub.type_invalid)
        return sub.schema_errors

    def _merge(self, errors: list[FieldError] | None) -> None:
        if errors:
            self.schema_errors.extend(errors)

    def _string(self, s: Schema, text: str, opath: str) -> None:
        """Length (in characters), then pattern: kube-openapi reports only the first of these."""
        longest = s.get("maxLength")
        shortest = s.get("minLength")
        pattern = s.get("pattern")
        if longest is not None and len(text) > longest:
            self._add(FieldError(opath or self.root, TOO_LONG, _too_long(longest)))
        elif shortest is not None and len(text) < shortest:
            self._invalid(opath, text, f"{opath} in body should be at least {shortest} chars long")
        elif pattern:
            try:
                matched = _pattern(pattern).search(text) is not None
            except cel.CELError as exc:
                self._invalid(
                    opath, text, f"{opath} in body should match '{pattern}, but pattern is invalid: {exc}'"
                )
            else:
                if not matched:
                    self._invalid(opath, text, f"{opath} in body should match '{pattern}'")
        fmt = _kept_format(s)
        if fmt and not _format_ok(fmt, text):
            self._type_invalid(opath, text, f"{opath} in body must be of type {fmt}: {_go_quote(text)}")

    def _number_range(self, s: Schema, v: Any, opath: str) -> None:
        """kube-openapi's range check of any number against its schema's type and format: an
        ``integer`` field's value must be an integer within ``int32``, or else ``int64``; a
        ``number`` with format ``float`` must fit a float32. Reported at the root with an empty
        value; not blocking the CEL rules."""
        types = _types(s)
        if len(types) != 1:
            return
        fmt = s.get("format")
        if types[0] == "integer":
            fmt = fmt if fmt in ("int32", "int64") else ""
            low, high = _INTEGER_RANGES[fmt or "int64"]
            fits = (not isinstance(v, float) or v.is_integer()) and low <= v <= high
            kind = f"integer with format {fmt}" if fmt else "integer (default format)"
        elif types[0] == "number" and fmt == "float":
            fits = abs(v) <= _FLOAT32_MAX
            kind = "number with format float"
        else:
            return
        if not fits:
            detail = f"Checked value must be of type {kind} in {opath}"
            self._add(FieldError(ROOT_PATH, INVALID, detail, ""))

    def _number(self, s: Schema, v: Any, is_int: bool, opath: str) -> None:
        """multipleOf, minimum, maximum; an integer is compared with the truncated bound, as Go does."""
        factor = s.get("multipleOf")
        if factor is not None:
            if is_int and int(factor) != 0:
                if v % int(factor):
                    self._invalid(opath, v, f"{opath} in body should be a multiple of {int(factor)}")
            else:
                data, f = float(v), float(factor)
                quotient = 1 / f * data if f < 1 else data / f
                if not _json_integer(quotient):
                    self._invalid(opath, v, f"{opath} in body should be a multiple of {_go_float(f)}")
        low = s.get("minimum")
        if low is not None:
            exclusive = s.get("exclusiveMinimum") is True
            bound, shown = _bound(low, is_int)
            if v < bound or (exclusive and v == bound):
                relation = "greater than" if exclusive else "greater than or equal to"
                self._invalid(opath, v, f"{opath} in body should be {relation} {shown}")
        high = s.get("maximum")
        if high is not None:
            exclusive = s.get("exclusiveMaximum") is True
            bound, shown = _bound(high, is_int)
            if v > bound or (exclusive and v == bound):
                relation = "less than" if exclusive else "less than or equal to"
                self._invalid(opath, v, f"{opath} in body should be {relation} {shown}")

    def _enum(self, s: Schema, v: Any, opath: str) -> None:
        allowed = s["enum"] or ()
        if v is not None and any(_enum_equal(v, e) for e in allowed):
            return
        shown = [e if isinstance(e, str) else json.dumps(e, separators=(",", ":")) for e in allowed]
        # Kubernetes prints a null bad value as the string "null".
        self._add(unsupported(opath or self.root, "null" if v is None else _bad_value(v), shown))

    # -- embedded resources and list types ------------------------------------------------------

    def _embedded(self, v: Mapping[str, Any], path: str) -> None:
        """An embedded object needs a string apiVersion and kind (metadata is optional)."""
        api_path = f"{path}.apiVersion" if path else "apiVersion"
        kind_path = f"{path}.kind" if path else "kind"
        out = self.meta_errors
        if "apiVersion" not in v:
            out.append(FieldError(api_path, REQUIRED, "must not be empty"))
        if "kind" not in v:
            out.append(FieldError(kind_path, REQUIRED, "must not be empty"))
        if "apiVersion" in v:
            api_version = v["apiVersion"]
            if not isinstance(api_version, str):
                out.append(FieldError(api_path, INVALID, "must be a string", _bad_value(api_version)))
            elif not api_version:
                out.append(FieldError(api_path, INVALID, "must not be empty", api_version))
            elif api_version != "/" and api_version.count("/") > 1:
                out.append(
                    FieldError(
                        api_path, INVALID, f"unexpected GroupVersion string: {api_version}", api_version
                    )
                )
        if "kind" in v:
            kind = v["kind"]
            if not isinstance(kind, str):
                out.append(FieldError(kind_path, INVALID, "must be a string", _bad_value(kind)))
            elif not kind:
                out.append(FieldError(kind_path, INVALID, "must not be empty", kind))
            else:
                problems = _dns1035_label(kind.lower())
                if problems:
                    detail = "may have mixed case, but should otherwise match: " + ",".join(problems)
                    out.append(FieldError(kind_path, INVALID, detail, kind))

    def _list_type(self, s: Schema, list_type: str, v: list[Any], path: str) -> None:
        """apiextensions' list-type check: a set holds no value twice, a map list no key twice.

        The second occurrence of a repeated value or key is reported (a third is not). Keys are
        compared as sent: defaults were applied before validation.
        """
        out = self.list_errors
        if list_type == "set":
            for i in _repeated(v):
                out.append(FieldError(f"{path}[{i}]", DUPLICATE, "", _bad_value(v[i])))
            return
        for i, x in enumerate(v):
            if x is not None and type(x) is not dict and not isinstance(x, Mapping):
                detail = "must be an object for an array of list-type map"
                out.append(FieldError(f"{path}[{i}]", INVALID, detail, _bad_value(x)))
                return
        keys: Sequence[str] = s.get("x-kubernetes-list-map-keys") or ()
        if len(v) <= 1 or not keys:
            return
        if len(keys) == 1:
            key = keys[0]
            values = [x[key] if x is not None and key in x else _UNSPECIFIED for x in v]
            for i in _repeated(values):
                shown = {} if values[i] is _UNSPECIFIED else {key: values[i]}
                out.append(FieldError(f"{path}[{i}]", DUPLICATE, "", GoValue(_go_syntax(shown))))
            return
        entries = [{k: x[k] for k in keys if k in x} if x is not None else {} for x in v]
        for i in _repeated(entries):
            out.append(FieldError(f"{path}[{i}]", DUPLICATE, "", GoValue(_go_syntax(entries[i]))))

    # -- CEL rules ------------------------------------------------------------------------------

    def _rules(
        self,
        rules: Sequence[Mapping[str, Any]],
        node_type: str,
        v: Any,
        old: Any,
        path: str,
        anchor: Anchor,
        s: Schema,
    ) -> None:
        """Evaluate one node's x-kubernetes-validations as apiextensions' CEL validator does."""
        at = path or self.root
        out = self.rule_errors
        for rule in rules:
            source = rule.get("rule") or ""
            if not source.strip():
                continue
            try:
                program = cel.compile(source)
            except cel.CELError as exc:
                out.append(FieldError(at, INVALID, f"rule compile error: {exc}", node_type))
                continue
            transition = program.uses_old_self
            if transition and old is None:
                continue  # transition rules need a value to compare with: update only
            activation = {"self": v} if old is None else {"self": v, "oldSelf": old}
            if node_type == "integer" and isinstance(v, float):
                # JSON's 1.0 passes an integer field's type check, but CEL gets a float64 there.
                detail = f"invalid data, expected int, got float64 evaluating rule: {_rule_text(rule)}"
                out.append(FieldError(at, INVALID, detail, node_type))
                continue
            try:
                result = program.evaluate(activation)
            except Exception as exc:  # a rule must never crash admission
                text = str(exc)
                if text.startswith("no such overload"):
                    detail = (
                        f"'{text}': call arguments did not match a supported operator, function or macro "
                        f"signature for rule: {_rule_text(rule)}"
                    )
                else:
                    detail = f"{text} evaluating rule: {_rule_text(rule)}"
                out.append(FieldError(at, INVALID, detail, node_type))
                continue
            if result is True:
                continue
            if not transition and anchor is not None and _same(anchor[0], anchor[1]):
                continue  # ratcheting: the failing part did not change
            error_path = at
            field_path = rule.get("fieldPath")
            if field_path:
                normalized = _rule_field_path(s, field_path)
                if normalized:
                    error_path = f"{path}.{normalized}" if path else normalized
            detail = _rule_message(rule, activation)
            reason = rule.get("reason")
            if reason == "FieldValueForbidden":
                out.append(FieldError(error_path, FORBIDDEN, detail))
            elif reason == "FieldValueRequired":
                out.append(FieldError(error_path, REQUIRED, detail))
            elif reason == "FieldValueDuplicate":
                out.append(FieldError(error_path, DUPLICATE, "", node_type))
            else:
                out.append(FieldError(error_path, INVALID, detail, node_type))

    # -- recording ------------------------------------------------------------------------------

    def _add(self, error: FieldError) -> None:
        self.schema_errors.append(error)

    def _invalid(self, opath: str, value: Any, detail: str) -> None:
        self.schema_errors.append(FieldError(opath or self.root, INVALID, detail, _bad_value(value)))

    def _type_invalid(self, opath: str, value: Any, detail: str) -> None:
        error = FieldError(opath or self.root, INVALID, detail, value)
        self.schema_errors.append(error)
        self.type_invalid.append(error)


_KINDS: Final[dict[type, str]] = {
    str: "string",
    dict: "object",
    list: "array",
    bool: "boolean",
    int: "integer",
    float: "number",
}


def _odd_kind(v: Any) -> tuple[str, Any]:
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


def _types(s: Schema) -> Sequence[str]:
    """The types a value may have; the API server checks int-or-string as "integer,string"."""
    if s.get("x-kubernetes-int-or-string") is True:
        return _INT_OR_STRING
    t = s.get("type")
    if t:
        return (t,) if isinstance(t, str) else tuple(t)
    return ()


def _kept_format(s: Schema) -> str:
    fmt = s.get("format")
    if not fmt or not isinstance(fmt, str):
        return ""
    return fmt if fmt.replace("-", "") in _KEPT_FORMATS else ""


def _json_integer(value: Any) -> bool:
    """go-openapi's IsFloat64AJSONInteger: a float that JSON would carry as an integer."""
    if not isinstance(value, float):
        return isinstance(value, int)
    return math.isfinite(value) and value.is_integer() and abs(value) <= 2.0**53


def _bound(limit: Any, is_int: bool) -> tuple[Any, str]:
    if is_int:
        bound = int(limit)  # Go's int64(float64) truncates toward zero
        return bound, str(bound)
    return float(limit), _go_float(float(limit))


def _enum_equal(value: Any, allowed: Any) -> bool:
    if allowed is None:
        return False
    if isinstance(value, bool) or isinstance(allowed, bool):
        return type(value) is type(allowed) and value == allowed
    if isinstance(value, (int, float)) and isinstance(allowed, (int, float)):
        return bool(value == allowed)
    return _same(value, allowed)


def _same(a: Any, b: Any) -> bool:
    """Go's reflect.DeepEqual on JSON values: 1 and 1.0 differ, and so do true and 1."""
    if isinstance(a, Mapping):
        if not isinstance(b, Mapping) or len(a) != len(b):
            return False
        return all(k in b and _same(x, b[k]) for k, x in a.items())
    if isinstance(a, (list, tuple)):
        if not isinstance(b, (list, tuple)) or len(a) != len(b):
            return False
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _hashable(value: Any) -> Any:
    """A dict key that tells JSON values apart as Go's interface comparison does (1 is not 1.0)."""
    if value is None or isinstance(value, (str, int, float)):
        return (type(value), value)
    try:
        return ("json", json.dumps(value, sort_keys=True, separators=(",", ":")))
    except (TypeError, ValueError):  # not a JSON value; compare by its text rather than fail
        return ("repr", repr(value))


def _repeated(values: Sequence[Any]) -> list[int]:
    """Indexes of the second occurrence of each repeated value (apiextensions' validateListSet)."""
    seen: dict[Any, int] = {}
    found = []
    for i, value in enumerate(values):
        key = _hashable(value)
        times = seen.get(key, 0)
        seen[key] = times + 1
        if times == 1:
            found.append(i)
    return found


def _has_duplicates(values: Sequence[Any]) -> bool:
    seen = set()
    for value in values:
        key = _hashable(value)
        if key in seen:
            return True
        seen.add(key)
    return False


def _map_key_value(key: str, items: Schema | None, entry: Mapping[str, Any]) -> Any:
    if key in entry:
        return entry[key]
    props = items.get("properties") if items else None
    prop = props.get(key) if props else None
    return prop.get("default") if prop else None


def _map_key(keys: Sequence[str], items: Schema | None, entry: Mapping[str, Any]) -> Any:
    """The identity of a list-map entry: its key fields, defaulted where absent."""
    return tuple(_hashable(_map_key_value(k, items, entry)) for k in keys)


def _map_list_index(keys: Sequence[str], items: Schema, old: list[Any]) -> dict[Any, Any]:
    return {_map_key(keys, items, entry): entry for entry in old if isinstance(entry, Mapping)}


def _has_rules(s: Any) -> bool:
    """Whether a schema has any x-kubernetes-validations (the API server has no CEL validator else)."""
    if not isinstance(s, Mapping):
        return False
    if s.get("x-kubernetes-validations"):
        return True
    props = s.get("properties")
    if props and any(_has_rules(p) for p in props.values()):
        return True
    if _has_rules(s.get("items")) or _has_rules(s.get("additionalProperties")):
        return True
    return any(_has_rules(branch) for branch in s.get("allOf") or ())


def _too_long(limit: int) -> str:
    return f"may not be more than {limit} {'byte' if limit == 1 else 'bytes'}"


def _too_many(path: str, actual: int, limit: int) -> FieldError:
    return FieldError(
        path, TOO_MANY, f"must have at most {limit} {'item' if limit == 1 else 'items'}", actual
    )


def _rule_text(rule: Mapping[str, Any]) -> str:
    message = rule.get("message") or ""
    return message.strip() if message else str(rule.get("rule") or "").strip()


def _rule_message(rule: Mapping[str, Any], activation: Mapping[str, Any]) -> str:
    """messageExpression's result when it yields a usable message, else message or the rule."""
    expression = rule.get("messageExpression")
    if expression:
        try:
            value = cel.compile(expression).evaluate(activation)
        except Exception:  # the API server logs the failure and falls back to the message
            value = None
        if isinstance(value, str):
            text = value.strip()
            if text and "\n" not in text and len(text.encode()) <= 5 * 1024:
                return text
    message = rule.get("message") or ""
    return message.strip() if message else f"failed rule: {str(rule.get('rule') or '').strip()}"


_FIELD_PATH_TOKEN: Final = r"\.([^.\[\]']+)|\['((?:[^'\\]|\\.)*)'\]"


def _rule_field_path(s: Schema, field_path: str) -> str:
    """A rule's ``fieldPath`` (``.spec.x``, ``['a.b']``) as a field path; "" if it is not valid."""
    out = ""
    position = 0
    node: Schema | None = s
    while position < len(field_path):
        match = re.compile(_FIELD_PATH_TOKEN).match(field_path, position)
        if match is None or node is None:
            return ""
        position = match.end()
        name = match.group(1) if match.group(1) is not None else re.sub(r"\\(.)", r"\1", match.group(2))
        props = node.get("properties")
        if props is not None:
            if name not in props:
                return ""
            out = f"{out}.{name}" if out else name
            node = props[name]
        else:
            node = _additional(node)
            if node is None:
                return ""
            out = f"{out}[{name}]"
    return out


def _pattern(pattern: str) -> re.Pattern[str]:
    """OpenAPI patterns are Go (RE2) regular expressions; reuse the CEL module's translation."""
    return cel._regex(pattern)


# ---------------------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------------------

# Patterns stay text until first use (``re`` caches them): compiling at import would cost
# `trainer render` milliseconds for formats most objects never have.
_DATE: Final = r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
_TIME: Final = r"([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|[+-][0-9]{2}:[0-9]{2})"
_BASE64: Final = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})"
_UUID: Final = "(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?%s-?%s-?[0-9a-f]{12}"
_UUIDS: Final = {
    "uuid": _UUID % ("[0-9a-f]{4}", "[0-9a-f]{4}"),
    "uuid3": _UUID % ("3[0-9a-f]{3}", "[0-9a-f]{4}"),
    "uuid4": _UUID % ("4[0-9a-f]{3}", "[89ab][0-9a-f]{3}"),
    "uuid5": _UUID % ("5[0-9a-f]{3}", "[89ab][0-9a-f]{3}"),
}
_HEX_COLOR: Final = r"#?(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6})"
_SSN: Final = r"[0-9]{3}[- ]?[0-9]{2}[- ]?[0-9]{4}"
_OBJECT_ID: Final = r"[0-9a-fA-F]{24}"


def _is_date(text: str) -> bool:
    """Go's time.Parse("2006-01-02"): fixed widths and a real calendar day."""
    import datetime

    match = re.fullmatch(_DATE, text)
    if match is None:
        return False
    try:
        datetime.date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError:
        return False
    return True


def _is_date_time(text: str) -> bool:
    """go-openapi's IsDateTime: a date, a 'T', a time with a zone; case-insensitive."""
    if len(text) < 4:
        return False
    parts = text.lower().split("t")
    if len(parts) < 2 or not _is_date(parts[0]):
        return False
    match = re.fullmatch(_TIME, parts[1])
    return match is not None and match[1] <= "23" and match[2] <= "59" and match[3] <= "59"


def _is_ip(text: str, separator: str) -> bool:
    import ipaddress

    if separator not in text or "%" in text:
        return False
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_cidr(text: str) -> bool:
    import ipaddress

    if "/" not in text or "%" in text:
        return False
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def _is_mac(text: str) -> bool:
    """Go's net.ParseMAC: 6, 8 or 20 octets, colon, dash or dotted-quad notation."""
    if "." in text:
        groups = text.split(".")
        return len(groups) in (3, 4, 10) and all(re.fullmatch(r"[0-9a-fA-F]{4}", g) for g in groups)
    for separator in ":-":
        if separator in text:
            groups = text.split(separator)
            return len(groups) in (6, 8, 20) and all(re.fullmatch(r"[0-9a-fA-F]{2}", g) for g in groups)
    return False


_FORMAT_CHECKS: Final[dict[str, Callable[[str], bool]]] = {
    "datetime": _is_date_time,
    "date": _is_date,
    "byte": lambda text: re.fullmatch(_BASE64, text) is not None,
    "uuid": lambda text: re.fullmatch(_UUIDS["uuid"], text) is not None,
    "uuid3": lambda text: re.fullmatch(_UUIDS["uuid3"], text) is not None,
    "uuid4": lambda text: re.fullmatch(_UUIDS["uuid4"], text) is not None,
    "uuid5": lambda text: re.fullmatch(_UUIDS["uuid5"], text) is not None,
    "ipv4": lambda text: _is_ip(text, "."),
    "ipv6": lambda text: _is_ip(text, ":"),
    "cidr": _is_cidr,
    "mac": _is_mac,
    "hexcolor": lambda text: re.fullmatch(_HEX_COLOR, text) is not None,
    "ssn": lambda text: re.fullmatch(_SSN, text) is not None,
    "bsonobjectid": lambda text: re.fullmatch(_OBJECT_ID, text) is not None,
}


def _format_ok(fmt: str, text: str) -> bool:
    check = _FORMAT_CHECKS.get(fmt.replace("-", ""))
    return check is None or check(text)


# ---------------------------------------------------------------------------------------------
# Go renderings
# ---------------------------------------------------------------------------------------------

_GO_ESCAPES: Final = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def _go_quote(text: str) -> str:
    """Go's %q (strconv.Quote), which the API server's messages use for names and values."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = []
    for char in text:
        escape = _GO_ESCAPES.get(char)
        if escape is not None:
            out.append(escape)
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def _go_float(value: float) -> str:
    """Go's %v for a float64: shortest digits, exponent form below 1e-4 and from 1e+06."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    point = len(whole) + (int(exponent) if exponent else 0) - (len(whole + fraction) - len(digits))
    digits = digits.rstrip("0")
    power = point - 1
    if power < -4 or power >= 6:
        tail = f".{digits[1:]}" if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{tail}e{'-' if power < 0 else '+'}{abs(power):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _go_syntax(value: Any) -> str:
    """Go's %#v of a decoded JSON value: how the API server prints objects in errors."""
    if value is None:
        return "interface {}(nil)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, str):
        return _go_quote(value)
    if isinstance(value, Mapping):
        entries = ", ".join(f"{_go_quote(str(k))}:{_go_syntax(value[k])}" for k in sorted(value))
        return "map[string]interface {}{" + entries + "}"
    if isinstance(value, (list, tuple)):
        return "[]interface {}{" + ", ".join(_go_syntax(v) for v in value) + "}"
    return _go_quote(str(value))


def _bad_value(value: Any) -> Any:
    """The value to show in an error: scalars as they are, objects and lists in Go syntax."""
    if isinstance(value, (Mapping, list, tuple)):
        return GoValue(_go_syntax(value))
    return value


# ---------------------------------------------------------------------------------------------
# ObjectMeta
# ---------------------------------------------------------------------------------------------

_DNS1123_LABEL: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN: Final = _DNS1123_LABEL + r"(\." + _DNS1123_LABEL + ")*"
_DNS1035_LABEL: Final = "[a-z]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED_NAME: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE: Final = "(" + _QUALIFIED_NAME + ")?"


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    """apimachinery's RegexError wording, examples and all."""
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{pattern}')"


def _matches(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text, re.ASCII) is not None


def dns1123_subdomain(value: str) -> list[str]:
    """What is wrong with ``value`` as a DNS-1123 subdomain, in Kubernetes' words."""
    problems = []
    if len(value) > 253:
        problems.append("must be no more than 253 characters")
    if not _matches(_DNS1123_SUBDOMAIN, value):
        message = (
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character"
        )
        problems.append(_regex_error(message, _DNS1123_SUBDOMAIN, "example.com"))
    return problems


def _dns1123_label(value: str) -> list[str]:
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _matches(_DNS1123_LABEL, value):
        message = (
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
            "and must start and end with an alphanumeric character"
        )
        problems.append(_regex_error(message, _DNS1123_LABEL, "my-name", "123-abc"))
    return problems


def _dns1035_label(value: str) -> list[str]:
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _matches(_DNS1035_LABEL, value):
        message = (
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
            "start with an alphabetic character, and end with an alphanumeric character"
        )
        problems.append(_regex_error(message, _DNS1035_LABEL, "my-name", "abc-123"))
    return problems


def _qualified_name(value: str) -> list[str]:
    message = (
        "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
        "alphanumeric character"
    )
    parts = value.split("/")
    problems = []
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            problems.extend("prefix part " + p for p in dns1123_subdomain(prefix))
    else:
        return [
            "a qualified name "
            + _regex_error(message, _QUALIFIED_NAME, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    if not _matches(_QUALIFIED_NAME, name):
        problems.append("name part " + _regex_error(message, _QUALIFIED_NAME, "MyName", "my.name", "123-abc"))
    return problems


def _label_value(value: str) -> list[str]:
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _matches(_LABEL_VALUE, value):
        message = (
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
        problems.append(_regex_error(message, _LABEL_VALUE, "MyValue", "my_value", "12345"))
    return problems


def validate_object_meta(
    meta: Any, *, path: str = "metadata", namespaced: bool | None = None, require_name: bool = False
) -> list[FieldError]:
    """The generic ObjectMeta checks the API server makes for a custom resource.

    A name, when present, must be a DNS subdomain of at most 253 characters (generateName the
    same, as a prefix); a namespace a DNS label; label keys and annotation keys qualified names,
    label values at most 63 characters of the label alphabet; annotations at most 256 KiB in all.
    ``require_name`` asks for a name or generateName; ``namespaced`` True requires a namespace and
    False forbids one (None checks only its form). Kept apart from ``validate`` because a CRD's
    own rules (TrainJob's RFC 1035 name) may be what a caller wants instead.
    """
    if not isinstance(meta, Mapping):
        kind = "null" if meta is None else _KINDS.get(type(meta)) or _odd_kind(meta)[0]
        return [FieldError(path, INVALID, f'{path} in body must be of type object: "{kind}"', kind)]
    errors: list[FieldError] = []

    def text_field(name: str) -> str | None:
        value = meta.get(name)
        if value is None or isinstance(value, str):
            return value
        kind = _KINDS.get(type(value)) or _odd_kind(value)[0]
        errors.append(
            FieldError(
                f"{path}.{name}", INVALID, f'{path}.{name} in body must be of type string: "{kind}"', kind
            )
        )
        return None

    generate_name = text_field("generateName")
    if generate_name:
        # A generated name gets a random suffix, so a trailing '-' is fine (apimachinery's mask).
        masked = (
            generate_name[:-2] + "a"
            if generate_name.endswith("-") and len(generate_name) > 1
            else generate_name
        )
        for problem in dns1123_subdomain(masked):
            errors.append(FieldError(f"{path}.generateName", INVALID, problem, generate_name))
    name = text_field("name")
    if name:
        for problem in dns1123_subdomain(name):
            errors.append(FieldError(f"{path}.name", INVALID, problem, name))
    elif require_name and not generate_name:
        errors.append(FieldError(f"{path}.name", REQUIRED, "name or generateName is required"))
    namespace = text_field("namespace")
    if namespace:
        if namespaced is False:
            errors.append(FieldError(f"{path}.namespace", FORBIDDEN, "not allowed on this type"))
        else:
            for problem in _dns1123_label(namespace):
                errors.append(FieldError(f"{path}.namespace", INVALID, problem, namespace))
    elif namespaced:
        errors.append(FieldError(f"{path}.namespace", REQUIRED))
    errors.extend(_string_map(meta.get("labels"), f"{path}.labels", labels=True))
    errors.extend(_string_map(meta.get("annotations"), f"{path}.annotations", labels=False))
    return errors


def _string_map(values: Any, path: str, *, labels: bool) -> list[FieldError]:
    if values is None:
        return []
    if not isinstance(values, Mapping):
        kind = _KINDS.get(type(values)) or _odd_kind(values)[0]
        return [FieldError(path, INVALID, f'{path} in body must be of type object: "{kind}"', kind)]
    errors: list[FieldError] = []
    size = 0
    for key, value in values.items():
        for problem in _qualified_name(key if labels else key.lower()):
            errors.append(FieldError(path, INVALID, problem, key))
        if not isinstance(value, str):
            kind = "null" if value is None else _KINDS.get(type(value)) or _odd_kind(value)[0]
            detail = f'{path}.{key} in body must be of type string: "{kind}"'
            errors.append(FieldError(f"{path}[{key}]", INVALID, detail, kind))
            continue
        if labels:
            # ValidateLabels names the map, not the entry, for a bad value (as for a bad key).
            for problem in _label_value(value):
                errors.append(FieldError(path, INVALID, problem, value))
        size += len(key.encode()) + len(value.encode())
    if not labels and size > _MAX_ANNOTATIONS_BYTES:
        errors.append(FieldError(path, TOO_LONG, _too_long(_MAX_ANNOTATIONS_BYTES)))
    return errors


_INTEGER_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_FLOAT32_MAX = 3.4028234663852886e38


def integer_overflows(schema: Schema, obj: Any, path: str = "") -> list[FieldError]:
    """Integers outside the range of their ``int32``/``int64`` format, as a typed decode refuses them.

    The webhooks' check (see ``admit``): upstream's decode into Go structs. A 1.36 API server
    refuses these first (``validate``), so on a cluster it is a second line only.
    """
    found: list[FieldError] = []

    def walk(s: Schema, v: Any, p: str) -> None:
        if isinstance(v, bool):
            return
        if isinstance(v, int):
            bounds = _INTEGER_RANGES.get(str(s.get("format", "")))
            if bounds is not None and not bounds[0] <= v <= bounds[1]:
                found.append(
                    FieldError(p, INVALID, f"must fit in {s['format']}: from {bounds[0]} to {bounds[1]}", v)
                )
        elif isinstance(v, Mapping):
            props = s.get("properties") or {}
            extra = s.get("additionalProperties")
            for k, item in v.items():
                if k in props:
                    walk(props[k], item, f"{p}.{k}" if p else str(k))
                elif isinstance(extra, Mapping):
                    walk(extra, item, f"{p}[{k}]")
        elif isinstance(v, list):
            items = s.get("items")
            if isinstance(items, Mapping):
                for i, item in enumerate(v):
                    walk(items, item, f"{p}[{i}]")

    walk(schema, obj, path)
    return found
