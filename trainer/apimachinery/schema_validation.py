"""Validation of an object against a CRD's structural OpenAPI v3 schema, CEL rules included.

kube-apiserver does this to every custom resource it stores. Doing it again here, over plain JSON
values, lets ``trainer render``, the operator's webhooks and the local API server refuse exactly
what a cluster refuses, in the words a cluster uses (Kubernetes 1.32: apiextensions-apiserver on
top of kube-openapi's validator), for any CRD. A schema is the parsed ``openAPIV3Schema`` dict,
walked as it is: nothing is derived from it ahead of time (CEL rules are compiled once, through
the CEL module's cache), and the only imports are the standard library and our own modules, so
``trainer render`` starts fast.

The API server's order of work, which callers should keep:

1. ``pruning.prune`` (or ``pruning.unknown_fields`` to refuse instead): drop fields the schema
   does not declare.
2. ``defaulting.drop_non_nullable_nulls`` then ``defaulting.apply_defaults``.
3. ``validate``: the OpenAPI value checks, then the embedded-resource checks, then list-type
   (set/map) uniqueness, then the ``x-kubernetes-validations`` CEL rules. As in the API server,
   the CEL rules are skipped when an earlier error is one that means the object does not have the
   shape the rules were written for (type, required, enum, too long, too many); a single error
   says so. On update, errors inside parts that did not change are dropped (CRD validation
   ratcheting), and transition rules (rules that read ``oldSelf``) see the matching old value.
4. ``object_meta.validate_object_meta`` for the generic ObjectMeta checks, when the caller wants
   them.

Paths follow the API server: ``spec.trainer.env[0].name``. An error about the object as a whole
(for example a rule on the root without ``fieldPath``) is at ``<nil>``, as Kubernetes prints it.
The OpenAPI checks name a map entry ``spec.nodeSelector.key`` and the CEL and list-type checks
``spec.nodeSelector[key]``: the two validators of the API server differ, and so do we.

Known differences from kube-apiserver (and see ``formats`` for the formats):

* CEL sees plain JSON values: ``date-time`` strings are not timestamps, ``duration`` strings are
  not durations, root ``self.metadata`` holds every field rather than only name and generateName,
  and an integer in a ``type: number`` field stays an integer. There is no cost budget.
* A number outside the range of its type and format (``int32``, else ``int64`` for an integer;
  ``float`` for a number) is refused as kube-apiserver 1.36 refuses it (``<nil>: Checked value
  must be of type integer with format int32 in PATH``, not blocking the CEL rules).
* ``anyOf``/``oneOf`` report the failing branch with the fewest errors, where kube-openapi picks
  the branch that passed the most checks (the same branch for the int-or-string schemas CRDs use).
* CEL rules directly in ``allOf`` branches are evaluated; rules nested deeper inside a branch are
  not.
* Embedded resources get the apiVersion/kind checks; their metadata is kept whole, not coerced.
* On update, old values are matched as the 1.32 CEL validator matches them (properties, map
  keys, list-map keys), for ratcheting too: items of sets and atomic lists are never matched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from trainer.apimachinery import cel, formats, go_syntax, json_values, object_meta, schema_nodes
from trainer.apimachinery.errors import (
    DUPLICATE,
    FORBIDDEN,
    INVALID,
    REQUIRED,
    RULES_NOT_CHECKED,
    TOO_LONG,
    TOO_MANY,
    UNSUPPORTED,
    FieldError,
    GoValue,
    unsupported,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not needed at run time, and `trainer render` must start fast
    from collections.abc import Sequence
    from typing import Any, Final, TypeAlias

    from trainer.apimachinery.schema_nodes import Schema

    Anchor: TypeAlias = tuple[Any, Any] | None

__all__ = ["ROOT_PATH", "validate"]

ROOT_PATH: Final = "<nil>"
"""Where Kubernetes reports an error about the whole object (Go's nil field path)."""

_UNSPECIFIED: Final = object()  # a list-map entry without its key (a Go sentinel in apiextensions)
# Error types after which the API server does not run CEL rules (besides "type invalid", which
# shares its words with Invalid and is tracked by identity instead).
_BLOCKING: Final = frozenset({REQUIRED, UNSUPPORTED, TOO_LONG, TOO_MANY})


def validate(
    schema: Schema, obj: Any, old: Any = None, *, path: str = "", meta: Sequence[FieldError] = ()
) -> list[FieldError]:
    """Every error the API server would report for ``obj``, in its order and words.

    ``old`` is the stored object on update (None on create): it enables transition rules and
    ratcheting. ``path`` prefixes every path, for a caller that validates a part of an object.
    ``meta`` are the errors of the object's own ObjectMeta
    (``object_meta.validate_object_meta``): the API server reports them first, and a blocking
    one (a missing name) stops the CEL rules too.
    Errors come in traversal order (schema property order), grouped as the API server groups
    them: ObjectMeta, OpenAPI, embedded resources, list types, then CEL rules.

    When the CEL rules are not run, and the "not checked" error: kube-apiserver 1.36 (the
    custom resource strategy's ``Validate`` and ``ValidateUpdate``) has a CEL validator only when
    the schema has a rule somewhere under its properties, items or additionalProperties (a rule
    only inside an ``allOf`` branch does not count); without one no rule runs and nothing is
    added. With one, if any error found before it (ObjectMeta, OpenAPI, embedded resources, list
    types; on update after ratcheting) is Required, Unsupported, Too long, Too many or a type
    error, it runs no rule and adds one error instead: ``errors.RULES_NOT_CHECKED`` at ``<nil>``
    with the value null, whichever fields the rules are on. Otherwise the rules run and it adds
    nothing. We return that error as the server does, for the stand-in API server's answers;
    ``errors.refusal_lines`` says it in plain words where we print a refusal ourselves.
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
    if not _has_rules(schema):
        return errors  # no CEL validator: no rule runs, nothing is said about them
    type_invalid = {id(e) for e in walk.type_invalid}
    if any(e.type in _BLOCKING or id(e) in type_invalid for e in errors):
        errors.append(FieldError(path or ROOT_PATH, INVALID, RULES_NOT_CHECKED, "null"))
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
        kind = json_values.KINDS.get(type(v))
        text = v
        if kind is None:
            kind, text = json_values.odd_kind(v)
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
        if old is not None and len(self.schema_errors) > mark and json_values.same(v, old):
            del self.schema_errors[mark:]  # ratcheting: this part did not change

    def _array(self, s: Schema, v: Any, old: Any, path: str, opath: str, anchor: Anchor, check: bool) -> None:
        items = schema_nodes.items(s)
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
            if s.get("uniqueItems") is True and json_values.has_duplicates(v):
                self._invalid(opath, "", f"{opath} in body shouldn't contain duplicates")
            if "enum" in s:
                self._enum(s, v, opath)

    def _object(
        self, s: Schema, v: Any, old: Any, path: str, opath: str, anchor: Anchor, check: bool
    ) -> None:
        if self.meta and s.get("x-kubernetes-embedded-resource") is True:
            self._embedded(v, path)
        props = s.get("properties")
        extra = schema_nodes.additional(s)
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
        types = schema_nodes.types(s)
        if types and not s.get("nullable"):
            self._type_invalid(opath, "null", f'{opath} in body must be of type {",".join(types)}: "null"')
        if "enum" in s:
            self._enum(s, None, opath)

    def _type(self, s: Schema, v: Any, kind: str, opath: str) -> None:
        """kube-openapi's type check, format quirks included."""
        types = schema_nodes.types(s)
        fmt = formats.kept(s)
        if not types and not fmt:
            return
        float_int = kind == "number" and "integer" in types and json_values.json_integer(v)
        int_float = kind == "integer" and "number" in types
        matches = kind in types or float_int or int_float
        if fmt:
            if kind != "string" and kind != "array":
                if not matches:
                    data_format = "int64" if kind == "integer" else "float64" if kind == "number" else ""
                    self._type_invalid(
                        opath,
                        data_format,
                        f"{opath} in body must be of type {fmt}: {go_syntax.quote(data_format)}",
                    )
                    return
            elif "number" not in types and "integer" not in types:
                return  # a string (or list) where a formatted string is expected passes
        if not matches:
            self._type_invalid(
                opath, kind, f"{opath} in body must be of type {','.join(types)}: {go_syntax.quote(kind)}"
            )

    def _composite(self, s: Schema, v: Any, path: str, opath: str) -> None:
        """anyOf, oneOf, allOf and not, with kube-openapi's messages (reported at the root)."""
        quoted = go_syntax.quote(opath)
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
            self._add(FieldError(opath or self.root, TOO_LONG, object_meta.too_long(longest)))
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
        fmt = formats.kept(s)
        if fmt and not formats.valid(fmt, text):
            self._type_invalid(opath, text, f"{opath} in body must be of type {fmt}: {go_syntax.quote(text)}")

    def _number_range(self, s: Schema, v: Any, opath: str) -> None:
        """kube-openapi's range check of any number against its schema's type and format: an
        ``integer`` field's value must be an integer within ``int32``, or else ``int64``; a
        ``number`` with format ``float`` must fit a float32. Reported at the root with an empty
        value; not blocking the CEL rules."""
        types = schema_nodes.types(s)
        if len(types) != 1:
            return
        fmt = s.get("format")
        if types[0] == "integer":
            fmt = fmt if fmt in ("int32", "int64") else ""
            low, high = formats.INTEGER_RANGES[fmt or "int64"]
            fits = (not isinstance(v, float) or v.is_integer()) and low <= v <= high
            kind = f"integer with format {fmt}" if fmt else "integer (default format)"
        elif types[0] == "number" and fmt == "float":
            fits = abs(v) <= formats.FLOAT32_MAX
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
                if not json_values.json_integer(quotient):
                    self._invalid(
                        opath, v, f"{opath} in body should be a multiple of {go_syntax.float_text(f)}"
                    )
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
        self._add(unsupported(opath or self.root, "null" if v is None else go_syntax.bad_value(v), shown))

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
                out.append(
                    FieldError(api_path, INVALID, "must be a string", go_syntax.bad_value(api_version))
                )
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
                out.append(FieldError(kind_path, INVALID, "must be a string", go_syntax.bad_value(kind)))
            elif not kind:
                out.append(FieldError(kind_path, INVALID, "must not be empty", kind))
            else:
                problems = object_meta.dns1035_label(kind.lower())
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
            for i in json_values.repeated(v):
                out.append(FieldError(f"{path}[{i}]", DUPLICATE, "", go_syntax.bad_value(v[i])))
            return
        for i, x in enumerate(v):
            if x is not None and type(x) is not dict and not isinstance(x, Mapping):
                detail = "must be an object for an array of list-type map"
                out.append(FieldError(f"{path}[{i}]", INVALID, detail, go_syntax.bad_value(x)))
                return
        keys: Sequence[str] = s.get("x-kubernetes-list-map-keys") or ()
        if len(v) <= 1 or not keys:
            return
        if len(keys) == 1:
            key = keys[0]
            values = [x[key] if x is not None and key in x else _UNSPECIFIED for x in v]
            for i in json_values.repeated(values):
                shown = {} if values[i] is _UNSPECIFIED else {key: values[i]}
                out.append(FieldError(f"{path}[{i}]", DUPLICATE, "", GoValue(go_syntax.value_text(shown))))
            return
        entries = [{k: x[k] for k in keys if k in x} if x is not None else {} for x in v]
        for i in json_values.repeated(entries):
            out.append(FieldError(f"{path}[{i}]", DUPLICATE, "", GoValue(go_syntax.value_text(entries[i]))))

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
            if not transition and anchor is not None and json_values.same(anchor[0], anchor[1]):
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
        self.schema_errors.append(FieldError(opath or self.root, INVALID, detail, go_syntax.bad_value(value)))

    def _type_invalid(self, opath: str, value: Any, detail: str) -> None:
        error = FieldError(opath or self.root, INVALID, detail, value)
        self.schema_errors.append(error)
        self.type_invalid.append(error)


def _bound(limit: Any, is_int: bool) -> tuple[Any, str]:
    if is_int:
        bound = int(limit)  # Go's int64(float64) truncates toward zero
        return bound, str(bound)
    return float(limit), go_syntax.float_text(float(limit))


def _enum_equal(value: Any, allowed: Any) -> bool:
    if allowed is None:
        return False
    if isinstance(value, bool) or isinstance(allowed, bool):
        return type(value) is type(allowed) and value == allowed
    if isinstance(value, (int, float)) and isinstance(allowed, (int, float)):
        return bool(value == allowed)
    return json_values.same(value, allowed)


def _map_key_value(key: str, items: Schema | None, entry: Mapping[str, Any]) -> Any:
    if key in entry:
        return entry[key]
    props = items.get("properties") if items else None
    prop = props.get(key) if props else None
    return prop.get("default") if prop else None


def _map_key(keys: Sequence[str], items: Schema | None, entry: Mapping[str, Any]) -> Any:
    """The identity of a list-map entry: its key fields, defaulted where absent."""
    return tuple(json_values.hashable(_map_key_value(k, items, entry)) for k in keys)


def _map_list_index(keys: Sequence[str], items: Schema, old: list[Any]) -> dict[Any, Any]:
    return {_map_key(keys, items, entry): entry for entry in old if isinstance(entry, Mapping)}


def _has_rules(s: Any) -> bool:
    """Whether the API server makes a CEL validator for a schema (it has none else, so runs no rule).

    Its test looks for x-kubernetes-validations on the node, its properties, items and
    additionalProperties only: a schema whose only rules are inside ``allOf`` branches gets none.
    """
    if not isinstance(s, Mapping):
        return False
    if s.get("x-kubernetes-validations"):
        return True
    props = s.get("properties")
    if props and any(_has_rules(p) for p in props.values()):
        return True
    return _has_rules(s.get("items")) or _has_rules(s.get("additionalProperties"))


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
            node = schema_nodes.additional(node)
            if node is None:
                return ""
            out = f"{out}[{name}]"
    return out


def _pattern(pattern: str) -> re.Pattern[str]:
    """OpenAPI patterns are Go (RE2) regular expressions; reuse the CEL module's translation."""
    return cel._regex(pattern)
