"""A small evaluator for the CEL that CRD ``x-kubernetes-validations`` rules are written in.

cel-python would do, but importing it and building its parser takes about a quarter of a second,
and ``trainer render`` must start in well under that while still checking every CRD rule. The
rules CRDs carry use a small, stable part of CEL, so a hand-written parser (``cel_parser``) and a
tree-walking evaluator over plain JSON values are enough, and they need only the standard library.

Where Kubernetes' CEL (cel-go with heterogeneous equality and cross-type numeric comparisons)
differs from older CEL implementations, this module follows Kubernetes: ``1 == 1.0`` is true,
``1 < 1.5`` is allowed, and values of different types compare unequal instead of failing.

Not supported: bytes literals, ``type()``, message construction, timestamps and durations, the
Kubernetes ``url``, ``quantity``, ``ip``, ``cidr`` and ``sets`` libraries, optional values, and a
distinct ``uint`` type (uint literals and ``uint()`` give plain ints).

It is longer than the project's modules usually are (tests/test_layers.py lets it be), and stays
one module on purpose: it is one interpreter, whose operators, macros and function library share
CEL's value semantics (heterogeneous equality, numeric promotion, error propagation); split, each
piece would import the others' private rules, and a reader checking one operator against the CEL
specification would need them all open.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Mapping

from trainer.apimachinery import cel_parser as syntax

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs milliseconds to import, and `trainer render` must start fast
    from collections.abc import Callable, Iterator
    from typing import Any, Final, TypeAlias

    Scope: TypeAlias = Mapping[str, Any]
    Evaluator: TypeAlias = Callable[[Scope], Any]

__all__ = ["CELError", "CELEvalError", "CELSyntaxError", "Program", "compile"]


class CELError(Exception):
    """Base of every error this module raises, so callers can catch CEL trouble in one place."""


class CELSyntaxError(CELError):
    """The rule cannot be compiled: bad syntax, or a function or macro CEL does not have."""


class CELEvalError(CELError):
    """The rule compiled but failed on this object: missing key, wrong type, overflow, ..."""


INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
UINT64_MAX: Final = 2**64 - 1

# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null_type"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, Mapping):
        return "map"
    return type(value).__name__


def _no_overload(name: str, *args: Any) -> CELEvalError:
    return CELEvalError(f"no such overload: {name}({', '.join(_type_name(a) for a in args)})")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked(value: int) -> int:
    if value < INT64_MIN or value > INT64_MAX:
        raise CELEvalError("integer overflow")
    return value


def _equals(left: Any, right: Any) -> bool:
    """Kubernetes' heterogeneous equality: numbers compare by value, other type mixes are unequal."""
    if isinstance(left, str) or isinstance(right, str):
        return isinstance(left, str) and isinstance(right, str) and left == right
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if _is_number(left) and _is_number(right):
        return bool(left == right)
    if left is None or right is None:
        return left is None and right is None
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return len(left) == len(right) and all(_equals(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        if len(left) != len(right):
            return False
        for key, value in left.items():
            found, other = _map_lookup(right, key)
            if not found or not _equals(value, other):
                return False
        return True
    return False


def _map_lookup(mapping: Mapping[Any, Any], key: Any) -> tuple[bool, Any]:
    """Find ``key`` without Python's ``True == 1`` making a bool key match an int key."""
    if isinstance(key, (list, tuple, Mapping)):
        raise CELEvalError(f"unsupported map key type: {_type_name(key)}")
    if key is None:
        return False, None
    if isinstance(key, bool) or key == 0 or key == 1:
        for candidate, value in mapping.items():
            if _equals(candidate, key):
                return True, value
        return False, None
    try:
        return True, mapping[key]
    except KeyError:
        return False, None


def _compare(name: str, left: Any, right: Any) -> int:
    """Order two values (-1, 0, 1) the way cel-go with cross-type numeric comparisons does."""
    comparable = (
        (_is_number(left) and _is_number(right))
        or (isinstance(left, str) and isinstance(right, str))
        or (isinstance(left, bool) and isinstance(right, bool))
    )
    if not comparable:
        raise _no_overload(name, left, right)
    if left != left or right != right:  # only NaN is unequal to itself
        raise CELEvalError("NaN values cannot be ordered")
    if left < right:
        return -1
    if left > right:
        return 1
    return 0


def _add(left: Any, right: Any) -> Any:
    if _is_int(left) and _is_int(right):
        return _checked(left + right)
    if isinstance(left, float) and isinstance(right, float):
        return left + right
    if isinstance(left, str) and isinstance(right, str):
        return left + right
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return [*left, *right]
    raise _no_overload("_+_", left, right)


def _subtract(left: Any, right: Any) -> Any:
    if _is_int(left) and _is_int(right):
        return _checked(left - right)
    if isinstance(left, float) and isinstance(right, float):
        return left - right
    raise _no_overload("_-_", left, right)


def _multiply(left: Any, right: Any) -> Any:
    if _is_int(left) and _is_int(right):
        return _checked(left * right)
    if isinstance(left, float) and isinstance(right, float):
        return left * right
    raise _no_overload("_*_", left, right)


def _truncating_divide(left: int, right: int) -> int:
    """Integer division rounding toward zero, as Go and CEL do (Python's // rounds down)."""
    quotient = abs(left) // abs(right)
    return -quotient if (left < 0) != (right < 0) else quotient


def _divide(left: Any, right: Any) -> Any:
    if _is_int(left) and _is_int(right):
        if right == 0:
            raise CELEvalError("division by zero")
        return _checked(_truncating_divide(left, right))
    if isinstance(left, float) and isinstance(right, float):
        if right == 0.0:
            # Python raises where IEEE 754 (and so cel-go) gives an infinity or NaN.
            if left == 0.0 or math.isnan(left):
                return math.nan
            return math.copysign(math.inf, left) * math.copysign(1.0, right)
        return left / right
    raise _no_overload("_/_", left, right)


def _modulo(left: Any, right: Any) -> Any:
    if _is_int(left) and _is_int(right):
        if right == 0:
            raise CELEvalError("modulus by zero")
        if left == INT64_MIN and right == -1:
            raise CELEvalError("integer overflow")
        # CEL's remainder takes the dividend's sign (Go's %), Python's takes the divisor's.
        return left - right * _truncating_divide(left, right)
    raise _no_overload("_%_", left, right)


def _in(element: Any, container: Any) -> bool:
    if isinstance(container, (list, tuple)):
        return any(_equals(element, item) for item in container)
    if isinstance(container, Mapping):
        return _map_lookup(container, element)[0]
    raise _no_overload("@in", element, container)


def _relation(name: str, test: Callable[[int], bool]) -> Callable[[Any, Any], bool]:
    def apply(left: Any, right: Any) -> bool:
        return test(_compare(name, left, right))

    return apply


_BINARY: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "==": _equals,
    "!=": lambda left, right: not _equals(left, right),
    "<": _relation("_<_", lambda c: c < 0),
    "<=": _relation("_<=_", lambda c: c <= 0),
    ">": _relation("_>_", lambda c: c > 0),
    ">=": _relation("_>=_", lambda c: c >= 0),
    "in": _in,
    "+": _add,
    "-": _subtract,
    "*": _multiply,
    "/": _divide,
    "%": _modulo,
}


def _iterate(value: Any, macro: str) -> Iterator[Any]:
    if isinstance(value, (list, tuple)):
        return iter(value)
    if isinstance(value, Mapping):
        return iter(value.keys())
    raise CELEvalError(f"{macro}() needs a list or a map, got {_type_name(value)}")


def _bool_result(value: Any, operator: str) -> bool:
    if isinstance(value, bool):
        return value
    raise _no_overload(operator, value)


# ---------------------------------------------------------------------------------------------
# Evaluator. Each syntax node becomes a closure once, at compile time, so evaluation does no
# dispatch on node types.
# ---------------------------------------------------------------------------------------------


def _build(node: syntax.Node) -> Evaluator:
    match node:
        case syntax.Literal(value):
            return lambda _scope: value
        case syntax.Ident(name):
            return _build_ident(name)
        case syntax.Select(operand, field, test):
            return _build_select(_build(operand), field, test)
        case syntax.Index(operand, index):
            return _build_index(_build(operand), _build(index))
        case syntax.ListExpr(items):
            item_evaluators = [_build(item) for item in items]
            return lambda scope: [evaluate(scope) for evaluate in item_evaluators]
        case syntax.MapExpr(entries):
            return _build_map([(_build(key), _build(value)) for key, value in entries])
        case syntax.Unary(operator, operand):
            return _build_unary(operator, _build(operand))
        case syntax.Binary(operator, left, right):
            function = _BINARY[operator]
            left_eval, right_eval = _build(left), _build(right)
            return lambda scope: function(left_eval(scope), right_eval(scope))
        case syntax.Logical(operator, left, right):
            return _build_logical(operator, _build(left), _build(right))
        case syntax.Conditional(condition, if_true, if_false):
            return _build_conditional(_build(condition), _build(if_true), _build(if_false))
        case syntax.Call(name, target, args):
            implementation = _FUNCTIONS[name][2]
            arg_evals = [_build(arg) for arg in ([target, *args] if target is not None else args)]
            return lambda scope: implementation(*[evaluate(scope) for evaluate in arg_evals])
        case syntax.Comprehension(kind, range_, variable, predicate, transform):
            return _build_comprehension(
                kind,
                _build(range_),
                variable,
                None if predicate is None else _build(predicate),
                None if transform is None else _build(transform),
            )
    raise AssertionError(f"unhandled syntax node {node!r}")


def _build_ident(name: str) -> Evaluator:
    def ident(scope: Scope) -> Any:
        try:
            return scope[name]
        except KeyError:
            raise CELEvalError(f"undeclared reference to '{name}'") from None

    return ident


def _build_select(operand: Evaluator, field: str, test: bool) -> Evaluator:
    def select(scope: Scope) -> Any:
        value = operand(scope)
        if not isinstance(value, Mapping):
            if test:
                raise CELEvalError(f"has() cannot test field {field!r} of a {_type_name(value)}")
            raise CELEvalError(f"type {_type_name(value)} does not support field selection (.{field})")
        if test:
            return field in value
        try:
            return value[field]
        except KeyError:
            raise CELEvalError(f"no such key: {field}") from None

    return select


def _build_index(operand: Evaluator, index: Evaluator) -> Evaluator:
    def lookup(scope: Scope) -> Any:
        container = operand(scope)
        key = index(scope)
        if isinstance(container, Mapping):
            found, value = _map_lookup(container, key)
            if not found:
                raise CELEvalError(f"no such key: {key}")
            return value
        if isinstance(container, (list, tuple)):
            if isinstance(key, float) and key.is_integer():
                key = int(key)
            if not _is_int(key):
                raise _no_overload("_[_]", container, key)
            if not 0 <= key < len(container):
                raise CELEvalError(f"index out of bounds: {key}")
            return container[key]
        raise _no_overload("_[_]", container, key)

    return lookup


def _build_map(entries: list[tuple[Evaluator, Evaluator]]) -> Evaluator:
    def build(scope: Scope) -> Any:
        result: dict[Any, Any] = {}
        for key_eval, value_eval in entries:
            key = key_eval(scope)
            if not isinstance(key, (str, int)):
                raise CELEvalError(f"unsupported map key type: {_type_name(key)}")
            if _map_lookup(result, key)[0]:
                raise CELEvalError(f"repeated key in map literal: {key!r}")
            if key in result:
                raise CELEvalError("a map literal with both bool and int keys is not supported")
            result[key] = value_eval(scope)
        return result

    return build


def _build_unary(operator: str, operand: Evaluator) -> Evaluator:
    if operator == "!":
        return lambda scope: not _bool_result(operand(scope), "!_")

    def negate(scope: Scope) -> Any:
        value = operand(scope)
        if _is_int(value):
            return _checked(-value)
        if isinstance(value, float):
            return -value
        raise _no_overload("-_", value)

    return negate


def _build_logical(operator: str, left: Evaluator, right: Evaluator) -> Evaluator:
    """``&&``/``||`` where a deciding operand wins even if the other one fails, in either order."""
    deciding = operator == "||"
    name = f"_{operator}_"

    def side(evaluate: Evaluator, scope: Scope) -> bool | CELEvalError:
        try:
            value = evaluate(scope)
        except CELEvalError as exc:
            return exc
        return value if isinstance(value, bool) else _no_overload(name, value)

    def logical(scope: Scope) -> Any:
        left_value = side(left, scope)
        if left_value is deciding:
            return deciding
        right_value = side(right, scope)
        if right_value is deciding:
            return deciding
        if isinstance(left_value, CELEvalError):
            raise left_value
        if isinstance(right_value, CELEvalError):
            raise right_value
        return not deciding

    return logical


def _build_conditional(condition: Evaluator, if_true: Evaluator, if_false: Evaluator) -> Evaluator:
    def conditional(scope: Scope) -> Any:
        if _bool_result(condition(scope), "_?_:_"):
            return if_true(scope)
        return if_false(scope)

    return conditional


def _build_comprehension(
    kind: str, range_: Evaluator, variable: str, predicate: Evaluator | None, transform: Evaluator | None
) -> Evaluator:
    """The macros. ``all``/``exists`` let a deciding element win over another element's error."""

    def quantifier(scope: Scope) -> Any:
        assert predicate is not None
        deciding = kind == "exists"
        inner = dict(scope)
        error: CELEvalError | None = None
        for item in _iterate(range_(scope), kind):
            inner[variable] = item
            try:
                result = _bool_result(predicate(inner), kind)
            except CELEvalError as exc:
                error = error or exc
                continue
            if result is deciding:
                return deciding
        if error is not None:
            raise error
        return not deciding

    def exists_one(scope: Scope) -> Any:
        assert predicate is not None
        inner = dict(scope)
        count = 0
        for item in _iterate(range_(scope), kind):
            inner[variable] = item
            count += _bool_result(predicate(inner), kind)
        return count == 1

    def collect(scope: Scope) -> Any:
        inner = dict(scope)
        results: list[Any] = []
        for item in _iterate(range_(scope), kind):
            inner[variable] = item
            if predicate is not None and not _bool_result(predicate(inner), kind):
                continue
            results.append(item if transform is None else transform(inner))
        return results

    if kind in ("all", "exists"):
        return quantifier
    if kind == "exists_one":
        return exists_one
    return collect


# ---------------------------------------------------------------------------------------------
# Functions. Each takes its receiver (for ``x.f()``) as the first argument.
# ---------------------------------------------------------------------------------------------


def _fn_size(value: Any) -> int:
    if isinstance(value, (str, list, tuple, Mapping)):
        return len(value)
    raise _no_overload("size", value)


def _strings(name: str, *args: Any) -> None:
    if not all(isinstance(arg, str) for arg in args):
        raise _no_overload(name, *args)


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> re.Pattern[str]:
    """Compile an RE2 pattern with Python's ``re``, fixing the differences that would change results.

    RE2's ``$`` matches only at the very end (Python's also before a final newline, which would
    let ``"name\\n"`` pass a name rule) and RE2's ``\\d``, ``\\w``, ``\\s`` are ASCII-only.
    """
    translated = pattern if re.search(r"\(\?[a-zA-Z]*m", pattern) else _anchor_dollars(pattern)
    try:
        return re.compile(translated, re.ASCII)
    except re.error as exc:
        raise CELEvalError(f"invalid regular expression {pattern!r}: {exc}") from None


def _anchor_dollars(pattern: str) -> str:
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            escaped = pattern[i : i + 2]
            out.append("\\Z" if escaped == "\\z" and not in_class else escaped)
            i += 2
            continue
        if in_class:
            if char == "]":
                in_class = False
        elif char == "[":
            in_class = True
            # A ']' right after '[' or '[^' is a literal member, not the end of the class.
            lookahead = 2 if pattern[i + 1 : i + 2] == "^" else 1
            if pattern[i + lookahead : i + lookahead + 1] == "]":
                out.append(pattern[i : i + lookahead + 1])
                i += lookahead + 1
                continue
        elif char == "$":
            char = "\\Z"
        out.append(char)
        i += 1
    return "".join(out)


def _fn_matches(text: Any, pattern: Any) -> bool:
    _strings("matches", text, pattern)
    return _regex(pattern).search(text) is not None


def _fn_starts_with(text: Any, prefix: Any) -> bool:
    _strings("startsWith", text, prefix)
    return bool(text.startswith(prefix))


def _fn_ends_with(text: Any, suffix: Any) -> bool:
    _strings("endsWith", text, suffix)
    return bool(text.endswith(suffix))


def _fn_contains(text: Any, part: Any) -> bool:
    _strings("contains", text, part)
    return part in text


# What Go's strconv.ParseInt / ParseFloat accept (Python's int() and float() also take spaces,
# underscores and non-ASCII digits). Kept as text: `re` compiles and caches them on first use.
_INT_TEXT: Final = r"[+-]?[0-9]+"
_FLOAT_TEXT: Final = r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)"


def _to_integer(name: str, value: Any, low: int, high: int) -> int:
    if _is_int(value) or isinstance(value, float):
        result = int(value)  # truncates toward zero, like Go's conversion
    elif isinstance(value, str) and re.fullmatch(_INT_TEXT, value):
        result = int(value)
    elif isinstance(value, str):
        raise CELEvalError(f"{name}({value!r}): not a decimal integer")
    else:
        raise _no_overload(name, value)
    if not low <= result <= high:
        raise CELEvalError(f"{name}({value!r}) is out of range")
    return result


def _fn_int(value: Any) -> int:
    # cel-go's bounds: float64(MinInt64) is refused too, and float64(MaxInt64) rounds up to 2**63.
    if isinstance(value, float) and not -(2.0**63) < value < 2.0**63:
        raise CELEvalError(f"int({_format_double(value)}) is out of range")
    return _to_integer("int", value, INT64_MIN, INT64_MAX)


def _fn_uint(value: Any) -> int:
    if isinstance(value, float) and not 0.0 <= value < 2.0**64:
        raise CELEvalError(f"uint({_format_double(value)}) is out of range")
    return _to_integer("uint", value, 0, UINT64_MAX)


def _fn_double(value: Any) -> float:
    if isinstance(value, float):
        return value
    if _is_int(value):
        return float(value)
    if isinstance(value, str):
        if not re.fullmatch(_FLOAT_TEXT, value, re.IGNORECASE):
            raise CELEvalError(f"double({value!r}): not a number")
        result = float(value)
        if math.isinf(result) and "inf" not in value.lower():
            raise CELEvalError(f"double({value!r}) is out of range")
        return result
    raise _no_overload("double", value)


def _format_double(value: float) -> str:
    """Format like Go's ``%g``, which cel-go's ``string(double)`` uses.

    That is the shortest digits that round-trip, in exponent form below 1e-4 and from 1e6 up.
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + (int(exponent) if exponent else 0)  # value = 0.<digits> * 10**point
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    power = point - 1
    if power < -4 or power >= 6:
        head = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{head}e{'-' if power < 0 else '+'}{abs(power):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _fn_string(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _format_double(value)
    raise _no_overload("string", value)


_BOOL_TEXT: Final = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}


def _fn_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value not in _BOOL_TEXT:
            raise CELEvalError(f"bool({value!r}): not a boolean")
        return _BOOL_TEXT[value]
    raise _no_overload("bool", value)


def _fn_dyn(value: Any) -> Any:
    return value


_UPPER: Final = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER: Final = "abcdefghijklmnopqrstuvwxyz"
_TO_LOWER: Final = str.maketrans(_UPPER, _LOWER)
_TO_UPPER: Final = str.maketrans(_LOWER, _UPPER)
# Go's unicode.IsSpace, which strings.TrimSpace (and so cel-go's trim) uses.
_GO_SPACE: Final = (
    "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)


def _fn_lower_ascii(text: Any) -> str:
    _strings("lowerAscii", text)
    return str(text.translate(_TO_LOWER))


def _fn_upper_ascii(text: Any) -> str:
    _strings("upperAscii", text)
    return str(text.translate(_TO_UPPER))


def _fn_trim(text: Any) -> str:
    _strings("trim", text)
    return str(text.strip(_GO_SPACE))


def _fn_split(text: Any, separator: Any, limit: Any = -1) -> list[str]:
    _strings("split", text, separator)
    if not _is_int(limit):
        raise _no_overload("split", text, separator, limit)
    if limit == 0:
        return []
    if separator == "":
        chars: list[str] = list(text)
        if 0 < limit < len(chars):
            return [*chars[: limit - 1], "".join(chars[limit - 1 :])]
        return chars
    return list(text.split(separator, limit - 1 if limit > 0 else -1))


def _fn_join(items: Any, separator: Any = "") -> str:
    if not isinstance(items, (list, tuple)) or not isinstance(separator, str):
        raise _no_overload("join", items, separator)
    if not all(isinstance(item, str) for item in items):
        raise CELEvalError("join() needs a list of strings")
    return separator.join(items)


def _fn_index_of(target: Any, part: Any, offset: Any = None) -> int:
    if isinstance(target, (list, tuple)) and offset is None:
        return next((i for i, item in enumerate(target) if _equals(item, part)), -1)
    _strings("indexOf", target, part)
    if offset is None:
        return int(target.find(part))
    if not _is_int(offset):
        raise _no_overload("indexOf", target, part, offset)
    if part == "":
        return int(offset)
    if not 0 <= offset < len(target):
        raise CELEvalError(f"index out of range: {offset}")
    return int(target.find(part, offset))


def _fn_last_index_of(target: Any, part: Any, offset: Any = None) -> int:
    if isinstance(target, (list, tuple)) and offset is None:
        return next((i for i in range(len(target) - 1, -1, -1) if _equals(target[i], part)), -1)
    _strings("lastIndexOf", target, part)
    if offset is None:
        return int(target.rfind(part))
    if not _is_int(offset):
        raise _no_overload("lastIndexOf", target, part, offset)
    if part == "":
        return int(offset)
    if not 0 <= offset < len(target):
        raise CELEvalError(f"index out of range: {offset}")
    return int(target.rfind(part, 0, offset + len(part)))


def _fn_replace(text: Any, old: Any, new: Any, limit: Any = -1) -> str:
    _strings("replace", text, old, new)
    if not _is_int(limit):
        raise _no_overload("replace", text, old, new, limit)
    return str(text.replace(old, new, limit if limit >= 0 else -1))


def _fn_substring(text: Any, start: Any, end: Any = None) -> str:
    stop = len(text) if end is None and isinstance(text, str) else end
    if not isinstance(text, str) or not _is_int(start) or not _is_int(stop):
        raise _no_overload("substring", text, start, end)
    if not 0 <= start <= len(text):
        raise CELEvalError(f"index out of range: {start}")
    if not start <= stop <= len(text):
        raise CELEvalError(f"index out of range: {stop}")
    return str(text[start:stop])


def _fn_char_at(text: Any, index: Any) -> str:
    if not isinstance(text, str) or not _is_int(index):
        raise _no_overload("charAt", text, index)
    if not 0 <= index <= len(text):
        raise CELEvalError(f"index out of range: {index}")
    return str(text[index : index + 1])


def _list_argument(name: str, value: Any) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise _no_overload(name, value)
    return value


def _fn_is_sorted(items: Any) -> bool:
    items = _list_argument("isSorted", items)
    return all(_compare("isSorted", a, b) <= 0 for a, b in itertools.pairwise(items))


def _fn_sum(items: Any) -> Any:
    items = _list_argument("sum", items)
    if not items:
        return 0
    total = items[0]
    if not _is_number(total):
        raise _no_overload("sum", items)
    for item in items[1:]:
        total = _add(total, item)
    return total


def _extreme(name: str, items: Any, sign: int) -> Any:
    items = _list_argument(name, items)
    if not items:
        raise CELEvalError(f"{name} called on empty list")
    best = items[0]
    for item in items[1:]:
        if _compare(name, item, best) == sign:
            best = item
    return best


def _fn_min(items: Any) -> Any:
    return _extreme("min", items, -1)


def _fn_max(items: Any) -> Any:
    return _extreme("max", items, 1)


# name -> (argument counts as a global call, argument counts as a method call, implementation).
# A method call's receiver is not counted; the implementation receives it first.
_FUNCTIONS: Final[dict[str, tuple[frozenset[int], frozenset[int], Callable[..., Any]]]] = {
    "size": (frozenset({1}), frozenset({0}), _fn_size),
    "matches": (frozenset({2}), frozenset({1}), _fn_matches),
    "startsWith": (frozenset(), frozenset({1}), _fn_starts_with),
    "endsWith": (frozenset(), frozenset({1}), _fn_ends_with),
    "contains": (frozenset(), frozenset({1}), _fn_contains),
    "int": (frozenset({1}), frozenset(), _fn_int),
    "uint": (frozenset({1}), frozenset(), _fn_uint),
    "double": (frozenset({1}), frozenset(), _fn_double),
    "string": (frozenset({1}), frozenset(), _fn_string),
    "bool": (frozenset({1}), frozenset(), _fn_bool),
    "dyn": (frozenset({1}), frozenset(), _fn_dyn),
    "lowerAscii": (frozenset(), frozenset({0}), _fn_lower_ascii),
    "upperAscii": (frozenset(), frozenset({0}), _fn_upper_ascii),
    "trim": (frozenset(), frozenset({0}), _fn_trim),
    "split": (frozenset(), frozenset({1, 2}), _fn_split),
    "join": (frozenset(), frozenset({0, 1}), _fn_join),
    "indexOf": (frozenset(), frozenset({1, 2}), _fn_index_of),
    "lastIndexOf": (frozenset(), frozenset({1, 2}), _fn_last_index_of),
    "replace": (frozenset(), frozenset({2, 3}), _fn_replace),
    "substring": (frozenset(), frozenset({1, 2}), _fn_substring),
    "charAt": (frozenset(), frozenset({1}), _fn_char_at),
    "isSorted": (frozenset(), frozenset({0}), _fn_is_sorted),
    "sum": (frozenset(), frozenset({0}), _fn_sum),
    "min": (frozenset(), frozenset({0}), _fn_min),
    "max": (frozenset(), frozenset({0}), _fn_max),
}

_SIGNATURES: Final = {
    name: (as_function, as_method) for name, (as_function, as_method, _) in _FUNCTIONS.items()
}

# ---------------------------------------------------------------------------------------------
# Public interface
# ---------------------------------------------------------------------------------------------


class Program:
    """A compiled rule; cheap to evaluate many times against different objects."""

    __slots__ = ("_evaluate", "_uses_old_self", "source")

    def __init__(self, source: str, root: syntax.Node) -> None:
        self.source = source
        self._evaluate = _build(root)
        self._uses_old_self = "oldSelf" in set(syntax.free_names(root))

    @property
    def uses_old_self(self) -> bool:
        """Kubernetes evaluates rules that read ``oldSelf`` (transition rules) only on updates."""
        return self._uses_old_self

    def evaluate(self, activation: Mapping[str, Any]) -> Any:
        try:
            return self._evaluate(activation)
        except CELEvalError:
            raise
        except RecursionError:
            raise CELEvalError(f"value nests too deeply to evaluate {self.source!r}") from None
        except (TypeError, ValueError, OverflowError) as exc:
            # Reachable only with values outside the JSON model, e.g. a set in the activation.
            raise CELEvalError(f"cannot evaluate {self.source!r}: {exc}") from exc

    def __repr__(self) -> str:
        return f"Program({self.source!r})"


@functools.lru_cache(maxsize=1024)
def compile(expr: str) -> Program:
    """Parse ``expr`` once: CRDs have few rules and every object is checked against them."""
    try:
        return Program(expr, syntax.parse(expr, _SIGNATURES))
    except syntax.ParseError as exc:
        raise CELSyntaxError(str(exc)) from None
    except RecursionError:
        raise CELSyntaxError(f"expression nests too deeply: {expr[:80]!r}") from None
