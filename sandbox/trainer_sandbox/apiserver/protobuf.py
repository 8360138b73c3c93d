"""Protobuf request bodies of built-in kinds, decoded to the JSON the real API server would store.

client-go sends the objects it builds as ``application/vnd.kubernetes.protobuf`` (every ``kubectl
create <subcommand>``, any typed clientset) and, unlike for CBOR, does not fall back to JSON on a 415. So
the stand-in reads them: the magic ``k8s\\x00``, then a ``runtime.Unknown`` envelope (``typeMeta``
with apiVersion and kind, and ``raw``, the kind's own message), decoded from the protobuf wire format
by the field table ``gen_k8s_protobuf`` derives from Kubernetes' generated.proto files and Go types.

The result is what Go's ``encoding/json`` writes for the object the real server decodes: gogo
protobuf writes every non-pointer field, empty or not, so it is ``omitempty``, ``omitzero``, pointer
and inline embedding, as the table records them, that decide what appears, and an absent field is
the Go zero value (``"spec": {}``, ``"rules": null``). Types that write their own JSON (Time,
Quantity, IntOrString, RawExtension...) have a handler each here, keyed by message name: the
generator fails if a reachable type marshals its own JSON without one.

Responses stay JSON: clients that send protobuf accept JSON too (kubectl's ``Accept`` is
``application/vnd.kubernetes.protobuf,application/json``) and decode what the Content-Type says.
"""

from __future__ import annotations

import base64
import gzip
import json
import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from trainer.api.quantity import canonical_quantity

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

# The proto scalar types the generated.proto files use (and their Go JSON zero values).
SCALARS: dict[str, Any] = {
    "string": "",
    "bytes": b"",
    "bool": False,
    "int32": 0,
    "int64": 0,
    "double": 0.0,
}

_TABLE_FILE = Path(__file__).resolve().parent.parent / "k8s_protobuf.json.gz"
_MAX_DEPTH = 100
_ZERO_TIME_SECONDS = -62135596800  # Go's zero time.Time (0001-01-01T00:00:00Z) in Unix seconds
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class DecodeError(ValueError):
    """The body is not a well-formed Kubernetes protobuf message (a 400, as on a real server)."""


class UnsupportedKind(ValueError):
    """The envelope names a kind the table has no message for (custom kinds, kinds not served)."""

    def __init__(self, api_version: str, kind: str) -> None:
        super().__init__(f"{api_version} {kind}".strip())
        self.api_version = api_version
        self.kind = kind


# -- the wire format -------------------------------------------------------------------------------

# A decoded field: its wire type and value (an int for varint, fixed32 and fixed64, bytes for
# length-delimited).
Wire = tuple[int, int | bytes]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise DecodeError("unexpected end of data in a varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint overflow")


def read_fields(data: bytes) -> list[tuple[int, Wire]]:
    """The (field number, (wire type, value)) pairs of one message, in order. Groups (wire types 3
    and 4, unused since proto2's early days) are refused."""
    out: list[tuple[int, Wire]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DecodeError("illegal field number 0")
        value: int | bytes
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            if pos + 8 > len(data):
                raise DecodeError("unexpected end of data in a fixed64")
            value, pos = int.from_bytes(data[pos : pos + 8], "little"), pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise DecodeError("unexpected end of data in a length-delimited field")
            value, pos = data[pos : pos + length], pos + length
        elif wire == 5:
            if pos + 4 > len(data):
                raise DecodeError("unexpected end of data in a fixed32")
            value, pos = int.from_bytes(data[pos : pos + 4], "little"), pos + 4
        else:
            raise DecodeError(f"unsupported wire type {wire} (field {number})")
        out.append((number, (wire, value)))
    return out


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _scalar(type_name: str, wire: Wire) -> Any:
    """One scalar value as Go holds it (bytes stay bytes until written as JSON)."""
    kind, value = wire
    if type_name in ("string", "bytes"):
        if not isinstance(value, bytes):
            raise DecodeError(f"wrong wire type {kind} for a {type_name}")
        return value.decode("utf-8", errors="replace") if type_name == "string" else value
    if type_name == "double":
        if kind != 1 or not isinstance(value, int):
            raise DecodeError(f"wrong wire type {kind} for a double")
        return struct.unpack("<d", value.to_bytes(8, "little"))[0]
    if kind != 0 or not isinstance(value, int):
        raise DecodeError(f"wrong wire type {kind} for a {type_name}")
    if type_name == "bool":
        return value != 0
    return _signed(value, 32 if type_name == "int32" else 64)


def _packed(type_name: str, data: bytes) -> list[Any]:
    """The elements of a packed repeated scalar (gogo writes k8s' unpacked, but both are legal)."""
    out: list[Any] = []
    pos = 0
    while pos < len(data):
        if type_name == "double":
            if pos + 8 > len(data):
                raise DecodeError("a packed double runs past its field")
            out.append(struct.unpack("<d", data[pos : pos + 8])[0])
            pos += 8
        else:
            value, pos = _varint(data, pos)
            out.append(_scalar(type_name, (0, value)))
    return out


# -- the table -------------------------------------------------------------------------------------


class Field:
    """One row of the table: a message field and how Go writes it as JSON."""

    __slots__ = ("inline", "map", "name", "number", "omitempty", "omitzero", "pointer", "repeated", "type")

    def __init__(self, row: list[Any]) -> None:
        number, name, type_name, flags = row
        self.number: int = number
        self.name: str = name
        # A map's (key, value) types; ``type`` is then the value's.
        self.map: tuple[str, str] | None = None
        if isinstance(type_name, list):
            self.map = (type_name[0], type_name[1])
            type_name = type_name[1]
        self.type: str = type_name
        self.repeated = "r" in flags
        self.pointer = "p" in flags
        self.omitempty = "o" in flags
        self.omitzero = "z" in flags
        self.inline = "i" in flags


class Decoder:
    """Decodes protobuf bodies with one field table (``k8s_protobuf.json.gz`` by default)."""

    def __init__(self, table: dict[str, Any]) -> None:
        self.kinds: dict[str, str] = table["kinds"]
        self.messages: dict[str, list[Field]] = {
            name: [Field(row) for row in rows] for name, rows in table["messages"].items()
        }
        self.by_number = {name: {f.number: f for f in fields} for name, fields in self.messages.items()}
        missing = {name for name in CUSTOM_JSON if name not in self.messages}
        if missing:
            raise ValueError(f"the protobuf table lacks the custom-JSON types {sorted(missing)}")

    def message_for(self, api_version: str, kind: str) -> str | None:
        return self.kinds.get(f"{api_version}/{kind}") or self.kinds.get(f"*/{kind}")

    def decode(self, body: bytes) -> dict[str, Any]:
        """A request body (magic, ``runtime.Unknown`` envelope, the kind's message) as the JSON
        object the real server would make of it."""
        if not body.startswith(MAGIC):
            raise DecodeError(
                "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]"
            )
        api_version = kind = encoding = ""
        raw = b""
        for number, wire in read_fields(body[len(MAGIC) :]):
            if number == 1:
                for sub, value in read_fields(_bytes(wire)):
                    if sub == 1:
                        api_version = _scalar("string", value)
                    elif sub == 2:
                        kind = _scalar("string", value)
            elif number == 2:
                raw = _bytes(wire)
            elif number == 3:
                encoding = _scalar("string", wire)
        if encoding:
            raise DecodeError(f"unsupported content encoding {encoding!r}")
        if not kind:
            raise DecodeError("Object 'Kind' is missing in the protobuf envelope")
        message = self.message_for(api_version, kind)
        if message is None:
            raise UnsupportedKind(api_version, kind)
        obj: dict[str, Any] = {"kind": kind, "apiVersion": api_version}
        obj.update(self.object(message, raw))
        return obj

    # -- messages ----------------------------------------------------------------------------------
    def _collect(self, message: str, data: bytes) -> dict[int, Any]:
        """Field number -> value, as gogo's Unmarshal leaves it: the last value of a scalar sent
        more than once, the concatenation (proto's merge) of a message sent more than once, every
        element of a repeated field (packed or not), every entry of a map (the last one of a key).
        Unknown fields are skipped, as gogo does."""
        fields = self.by_number[message]
        out: dict[int, Any] = {}
        for number, wire in read_fields(data):
            f = fields.get(number)
            if f is None:
                continue
            if f.map is not None:
                entries: dict[Any, Any] = out.setdefault(number, {})
                key: Any = SCALARS.get(f.map[0], "")
                value: Any = None  # absent: the value type's zero
                for sub, sub_wire in read_fields(_bytes(wire)):
                    if sub == 1:
                        key = _scalar(f.map[0], sub_wire)
                    elif sub == 2:
                        value = _bytes(sub_wire) if f.type not in SCALARS else _scalar(f.type, sub_wire)
                entries[key] = value
            elif f.type not in SCALARS:
                if f.repeated:
                    out.setdefault(number, []).append(_bytes(wire))
                else:
                    out[number] = out.get(number, b"") + _bytes(wire)
            elif f.repeated:
                items = out.setdefault(number, [])
                if wire[0] == 2 and f.type not in ("string", "bytes"):
                    items.extend(_packed(f.type, _bytes(wire)))
                else:
                    items.append(_scalar(f.type, wire))
            else:
                out[number] = _scalar(f.type, wire)
        return out

    def object(self, message: str, data: bytes, depth: int = 0) -> dict[str, Any]:
        """The JSON object Go writes for a (non-custom) message's struct."""
        if depth > _MAX_DEPTH:
            raise DecodeError("the object is nested too deeply")
        values = self._collect(message, data)
        out: dict[str, Any] = {}
        for f in self.messages[message]:
            present = f.number in values
            value = values.get(f.number)
            if f.inline:
                # An embedded struct: its fields are the outer object's (a nil embedded pointer adds
                # none); the outer object's own fields win a clash, as in Go.
                if present or not f.pointer:
                    for key, inner in self.object(f.type, value or b"", depth + 1).items():
                        out.setdefault(key, inner)
                continue
            if f.map is not None or f.repeated:
                if not value:
                    if not (f.omitempty or f.omitzero):
                        out[f.name] = None
                    continue
                if f.map is not None:
                    # encoding/json writes a map's keys sorted.
                    out[f.name] = {k: self._value(f.type, value[k], depth) for k in sorted(value)}
                else:
                    out[f.name] = [self._value(f.type, item, depth) for item in value]
                continue
            if f.pointer:
                if present:
                    out[f.name] = self._value(f.type, value, depth)
                elif not (f.omitempty or f.omitzero):
                    out[f.name] = None
                continue
            if f.type == "bytes" and not present:
                # A nil []byte: omitted, else null.
                if not (f.omitempty or f.omitzero):
                    out[f.name] = None
                continue
            if f.type in SCALARS:
                if (f.omitempty or f.omitzero) and (value is None or value == SCALARS[f.type]):
                    continue  # "", 0, false, an empty []byte
            elif f.omitzero and not present:
                continue  # the zero struct (omitempty leaves structs alone; omitzero does not)
            written = self._value(f.type, value, depth)
            if f.omitzero and f.type not in SCALARS and written == self._value(f.type, None, depth):
                continue  # a struct written as its zero value is (Time's IsZero, Quantity's...)
            out[f.name] = written
        return out

    def _value(self, type_name: str, value: Any, depth: int) -> Any:
        """One value's JSON; ``None`` stands for an absent field (the Go zero value)."""
        if type_name in SCALARS:
            if value is None:
                value = SCALARS[type_name]
            if type_name == "bytes":
                return base64.b64encode(value).decode()
            if type_name == "double":
                return _number(value)
            return value
        data = value if value is not None else b""
        handler = CUSTOM_JSON.get(type_name)
        if handler is not None:
            return handler(self, type_name, data, depth + 1)
        return self.object(type_name, data, depth + 1)

    def fields_by_name(self, message: str, data: bytes) -> dict[str, Any]:
        """A custom-JSON type's proto fields by their proto names (for its handler)."""
        values = self._collect(message, data)
        return {f.name: values[f.number] for f in self.messages[message] if f.number in values}


def _bytes(wire: Wire) -> bytes:
    if not isinstance(wire[1], bytes):
        raise DecodeError(f"wrong wire type {wire[0]} for a length-delimited field")
    return wire[1]


def _number(value: float) -> float | int:
    """A float64 as Go writes it: a whole number without a fraction (``1``, not ``1.0``)."""
    if value != value or value in (float("inf"), float("-inf")):
        raise DecodeError(f"unsupported value {value} (JSON has no NaN or infinity)")
    return int(value) if value.is_integer() and abs(value) < 1e21 else value


# -- types that write their own JSON ---------------------------------------------------------------

Handler = Callable[[Decoder, str, bytes, int], Any]


def _time(decoder: Decoder, message: str, data: bytes, depth: int) -> Any:
    """metav1.Time: seconds only (its Unmarshal drops nanos), RFC 3339 in UTC; empty is the zero
    time, written ``null``."""
    if not data:
        return None
    seconds = decoder.fields_by_name(message, data).get("seconds", 0)
    if seconds == _ZERO_TIME_SECONDS:
        return None
    return _format_time(seconds, 0, "%Y-%m-%dT%H:%M:%SZ")


def _micro_time(decoder: Decoder, message: str, data: bytes, depth: int) -> Any:
    """metav1.MicroTime: seconds and nanos truncated to microseconds, six fraction digits, UTC."""
    if not data:
        return None
    fields = decoder.fields_by_name(message, data)
    seconds, nanos = fields.get("seconds", 0), fields.get("nanos", 0)
    if seconds == _ZERO_TIME_SECONDS and nanos == 0:
        return None
    return _format_time(seconds, nanos // 1000, "%Y-%m-%dT%H:%M:%S.%fZ")


def _format_time(seconds: int, micros: int, layout: str) -> str:
    try:
        moment = _EPOCH + timedelta(seconds=seconds, microseconds=micros)
    except OverflowError:
        raise DecodeError(f"time out of range: {seconds}s") from None
    return f"{moment.year:04d}" + moment.strftime(layout.removeprefix("%Y"))


def _duration(decoder: Decoder, message: str, data: bytes, depth: int) -> Any:
    """metav1.Duration: Go's time.Duration.String() of its nanoseconds."""
    return go_duration(decoder.fields_by_name(message, data).get("duration", 0))


def go_duration(nanos: int) -> str:
    """Go's ``time.Duration.String``: ``1h2m3.5s``, ``1.5ms``, ``0s``."""
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    n = abs(nanos)
    if n < 1_000_000_000:
        for unit, size in (("ns", 1), ("µs", 1_000), ("ms", 1_000_000)):
            if n < size * 1000:
                return sign + _fraction(n, size) + unit
    hours, rest = divmod(n, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = _fraction(rest, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m" + text
    if hours:
        text = f"{hours}h" + text
    return sign + text


def _fraction(value: int, size: int) -> str:
    whole, frac = divmod(value, size)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(len(str(size)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def _quantity(decoder: Decoder, message: str, data: bytes, depth: int) -> Any:
    """resource.Quantity: its string, parsed and written canonical, as the real server does;
    absent is the zero Quantity, ``"0"``."""
    text = decoder.fields_by_name(message, data).get("string")
    if text is None:
        return "0"
    try:
        return canonical_quantity(text)
    except ValueError as err:
        raise DecodeError(f"quantity {text!r}: {err}") from None


def _int_or_string(decoder: Decoder, message: str, data: bytes, depth: int) -> Any:
    fields = decoder.fields_by_name(message, data)
    kind = fields.get("type", 0)
    if kind == 0:
        return fields.get("intVal", 0)
    if kind == 1:
        return fields.get("strVal", "")
    raise DecodeError(f"impossible IntOrString.Type {kind}")


def _raw_json(decoder: Decoder, message: str, data: bytes, depth: int) -> Any:
    """RawExtension, FieldsV1 and apiextensions' JSON: JSON bytes written as they are; none is
    ``null``."""
    fields = decoder.fields_by_name(message, data)
    raw = fields.get("raw", fields.get("Raw", b""))
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise DecodeError(f"{message.rsplit('.', 1)[-1]} holds no JSON") from None


def _schema_or_bool(decoder: Decoder, message: str, data: bytes, depth: int) -> Any:
    fields = decoder.fields_by_name(message, data)
    if "schema" in fields:
        return decoder.object(_schema_props(message), fields["schema"], depth)
    return bool(fields.get("allows", False))


def _schema_or_array(decoder: Decoder, message: str, data: bytes, depth: int) -> Any:
    fields = decoder.fields_by_name(message, data)
    props = _schema_props(message)
    if fields.get("jSONSchemas"):
        return [decoder.object(props, item, depth) for item in fields["jSONSchemas"]]
    if "schema" in fields:
        return decoder.object(props, fields["schema"], depth)
    return None


def _schema_or_string_array(decoder: Decoder, message: str, data: bytes, depth: int) -> Any:
    fields = decoder.fields_by_name(message, data)
    if fields.get("property"):
        return list(fields["property"])
    if "schema" in fields:
        return decoder.object(_schema_props(message), fields["schema"], depth)
    return None


def _schema_props(message: str) -> str:
    return message.rsplit(".", 1)[0] + ".JSONSchemaProps"


_META = "k8s.io.apimachinery.pkg.apis.meta.v1."
_APIEXTENSIONS = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1."

# Message -> handler, for every reachable Go type with a MarshalJSON method.
CUSTOM_JSON: dict[str, Handler] = {
    _META + "Time": _time,
    _META + "MicroTime": _micro_time,
    _META + "Duration": _duration,
    _META + "FieldsV1": _raw_json,
    "k8s.io.apimachinery.pkg.api.resource.Quantity": _quantity,
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": _int_or_string,
    "k8s.io.apimachinery.pkg.runtime.RawExtension": _raw_json,
    _APIEXTENSIONS + "JSON": _raw_json,
    _APIEXTENSIONS + "JSONSchemaPropsOrBool": _schema_or_bool,
    _APIEXTENSIONS + "JSONSchemaPropsOrArray": _schema_or_array,
    _APIEXTENSIONS + "JSONSchemaPropsOrStringArray": _schema_or_string_array,
}


@cache
def decoder() -> Decoder:
    """The decoder of the committed table (loaded on the first protobuf body)."""
    with gzip.open(_TABLE_FILE, "rt") as f:
        return Decoder(json.load(f))


def decode(body: bytes) -> dict[str, Any]:
    return decoder().decode(body)
