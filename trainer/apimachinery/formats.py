"""OpenAPI formats as a CRD's schema checks them: the string formats and the numbers' ranges.

The API server keeps only some formats of a CRD schema and checks some of those it keeps, with
go-openapi's parsers; numbers must fit the range of their type and format. Validation and the
webhooks' typed-decode check both need these, and the regex patterns stay text until used.

Known differences from kube-apiserver: ``date-time``, ``date``, ``byte``, ``uuid*``, ``ipv4``,
``ipv6``, ``cidr``, ``mac``, ``bsonobjectid``, ``hexcolor``, ``ssn`` and ``password`` are checked;
``uri``, ``email``, ``hostname``, ``isbn*``, ``creditcard``, ``rgbcolor`` and ``duration`` are
accepted unchecked. ``ipv4``/``ipv6``/``cidr`` use Python's ``ipaddress``, which may differ from
Go's parser in corner cases.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from trainer.apimachinery.errors import INVALID, FieldError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not needed at run time, and `trainer render` must start fast
    from collections.abc import Callable
    from typing import Any, Final

    from trainer.apimachinery.schema_nodes import Schema

__all__ = ["FLOAT32_MAX", "INTEGER_RANGES", "integer_overflows", "kept", "valid"]

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


def kept(s: Schema) -> str:
    """The schema's format if the API server keeps it, else ""."""
    fmt = s.get("format")
    if not fmt or not isinstance(fmt, str):
        return ""
    return fmt if fmt.replace("-", "") in _KEPT_FORMATS else ""


# ---------------------------------------------------------------------------------------------
# String formats
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


def valid(fmt: str, text: str) -> bool:
    """Whether ``text`` is a ``fmt`` string; a format that is not checked accepts anything."""
    check = _FORMAT_CHECKS.get(fmt.replace("-", ""))
    return check is None or check(text)


# ---------------------------------------------------------------------------------------------
# Number ranges
# ---------------------------------------------------------------------------------------------

INTEGER_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
FLOAT32_MAX = 3.4028234663852886e38


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
            bounds = INTEGER_RANGES.get(str(s.get("format", "")))
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
