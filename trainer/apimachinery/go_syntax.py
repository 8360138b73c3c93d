"""Values printed as Go's fmt prints them, for the API server's error messages.

Kubernetes builds its messages with ``%q``, ``%v`` and ``%#v``; a message that is to read word
for word like a cluster's needs names quoted and numbers and objects printed the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from trainer.apimachinery.errors import GoValue

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not needed at run time, and `trainer render` must start fast
    from typing import Any, Final

__all__ = ["bad_value", "float_text", "quote", "value_text"]

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


def quote(text: str) -> str:
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


def float_text(value: float) -> str:
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


def value_text(value: Any) -> str:
    """Go's %#v of a decoded JSON value: how the API server prints objects in errors."""
    if value is None:
        return "interface {}(nil)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return float_text(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, Mapping):
        entries = ", ".join(f"{quote(str(k))}:{value_text(value[k])}" for k in sorted(value))
        return "map[string]interface {}{" + entries + "}"
    if isinstance(value, (list, tuple)):
        return "[]interface {}{" + ", ".join(value_text(v) for v in value) + "}"
    return quote(str(value))


def bad_value(value: Any) -> Any:
    """The value to show in an error: scalars as they are, objects and lists in Go syntax."""
    if isinstance(value, (Mapping, list, tuple)):
        return GoValue(value_text(value))
    return value
