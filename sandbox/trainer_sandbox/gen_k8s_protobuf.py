"""Generate the field table with which the local API server decodes protobuf bodies of built-in kinds.

kubectl (client-go) sends the bodies of built-in kinds it builds itself (``kubectl create
namespace``, ``create configmap``, ``create secret``...) as ``application/vnd.kubernetes.protobuf``
and has no JSON fallback for a 415 on it, so the stand-in must read them. The decoder
(``trainer_sandbox.apiserver.protobuf``) is driven by this table: for each message, in the order of
the Go struct's fields (the order of the JSON the real server writes), the field number, the JSON
name, the protobuf type, and how Go's ``encoding/json`` treats the field (pointer, ``omitempty``,
``omitzero``, inline embedding).

The table is derived from the sources the real kube-apiserver is built from, in the Go module cache
(``cluster/`` fills it when it builds the control plane; ``$GOMODCACHE``, else ``~/go/pkg/mod``):
field numbers and types from each package's ``generated.proto``, JSON names and Go shapes from the
struct tags of its Go types, for every message reachable from the kinds the stand-in serves
(``gen_k8s_schemas.KINDS``), the kinds ``kubectl create`` makes that it does not serve (yet), and
``DeleteOptions``. Types whose JSON Go writes by hand (``MarshalJSON``: Time, Quantity,
IntOrString...) are decoded by the decoder's own handlers; the script fails should a reachable type
have a ``MarshalJSON`` the decoder has no handler for. ``tests/testing/test_apiserver_protobuf.py``
fails when the committed file is stale.

Run: ``python -m trainer_sandbox.gen_k8s_protobuf [OUTPUT] [--modcache DIR]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer_sandbox.apiserver.protobuf import CUSTOM_JSON, SCALARS
from trainer_sandbox.gen_k8s_schemas import KINDS, KUBERNETES_VERSION

OUTPUT = Path(__file__).with_name("k8s_protobuf.json.gz")

# The staging modules are versioned v0.X.Y for Kubernetes v1.X.Y.
STAGING_VERSION = "v0." + KUBERNETES_VERSION.removeprefix("v1.")
MODULES = ("k8s.io/api", "k8s.io/apimachinery", "k8s.io/apiextensions-apiserver")

# What `kubectl create` makes that the stand-in does not serve: decoded all the same, so that
# serving one later needs no new table, and the decoder is tried on every kind kubectl makes.
KUBECTL_CREATE_ONLY = {
    "v1/ResourceQuota": "io.k8s.api.core.v1.ResourceQuota",
    "batch/v1/CronJob": "io.k8s.api.batch.v1.CronJob",
    "networking.k8s.io/v1/Ingress": "io.k8s.api.networking.v1.Ingress",
}
# The body of a delete: registered in every group-version, so sent under any apiVersion.
ANY_VERSION = {"DeleteOptions": "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"}


class ProtobufSourceError(RuntimeError):
    """The sources are not what the generator expects (a missing package, a proto field without its
    Go field, a type whose JSON is written by hand without a handler in the decoder)."""


def go_type(definition: str) -> tuple[str, str]:
    """The Go package and type name of an OpenAPI definition name:
    ``io.k8s.api.core.v1.Pod`` -> (``k8s.io/api/core/v1``, ``Pod``)."""
    package, _, name = definition.removeprefix("io.k8s.").rpartition(".")
    return "k8s.io/" + package.replace(".", "/"), name


# -- the .proto files ------------------------------------------------------------------------------


@dataclass
class ProtoField:
    number: int
    name: str
    type: str | tuple[str, str]  # a scalar, a message's full name, or (key, value) of a map
    repeated: bool


@dataclass
class ProtoFile:
    package: str  # k8s.io.api.core.v1
    go_package: str  # k8s.io/api/core/v1
    imports: list[str]
    messages: dict[str, list[ProtoField]] = field(default_factory=dict)


_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(r"//[^\n]*")
_MESSAGE = re.compile(r"message\s+(\w+)\s*\{(.*?)\}", re.S)
_FIELD = re.compile(r"^(optional|repeated)\s+([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;$")
_MAP_FIELD = re.compile(r"^map<\s*([\w.]+)\s*,\s*([\w.]+)\s*>\s+(\w+)\s*=\s*(\d+)\s*;$")


def parse_proto(text: str, where: str) -> ProtoFile:
    """The messages of a generated.proto (proto2, no nested messages, enums or oneofs)."""
    text = _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", text))
    package = re.search(r"^package\s+([\w.]+)\s*;", text, re.M)
    go_package = re.search(r'^option\s+go_package\s*=\s*"([^"]+)"\s*;', text, re.M)
    if package is None or go_package is None:
        raise ProtobufSourceError(f"{where}: no package or go_package")
    imports = re.findall(r'^import\s+"([^"]+)"\s*;', text, re.M)
    out = ProtoFile(package[1], go_package[1], imports)

    def qualify(type_name: str) -> str:
        if type_name in SCALARS:
            return type_name
        if type_name.startswith("."):
            return type_name[1:]
        if "." in type_name:
            raise ProtobufSourceError(f"{where}: relative type name {type_name}")
        return f"{out.package}.{type_name}"

    for name, body in _MESSAGE.findall(text):
        fields: list[ProtoField] = []
        for line in (s.strip() for s in body.split("\n")):
            if not line:
                continue
            if found := _FIELD.match(line):
                label, type_name, field_name, number = found.groups()
                fields.append(ProtoField(int(number), field_name, qualify(type_name), label == "repeated"))
            elif found := _MAP_FIELD.match(line):
                key, value, field_name, number = found.groups()
                fields.append(ProtoField(int(number), field_name, (qualify(key), qualify(value)), False))
            else:
                raise ProtobufSourceError(f"{where}: message {name}: cannot read {line!r}")
        out.messages[name] = fields
    return out


# -- the Go types ----------------------------------------------------------------------------------


@dataclass
class GoField:
    name: str  # the Go field name; "" when embedded
    type: str  # the Go type as written: *metav1.Time, []Container, map[string]string
    json: str | None  # the JSON tag (None: no tag)
    protobuf: str | None  # the protobuf tag


@dataclass
class GoPackage:
    structs: dict[str, list[GoField] | str]  # a struct's fields, or why they could not be read
    custom_json: set[str]  # types with a MarshalJSON method


_STRUCT = re.compile(r"^type\s+(\w+)\s+struct\s*\{\s*$")
_EMPTY_STRUCT = re.compile(r"^type\s+(\w+)\s+struct\s*\{\s*\}", re.M)
_GO_FIELD = re.compile(r"^(?:(?P<name>[A-Za-z_]\w*)\s+)?(?P<type>[^\s`]+)\s*(?:`(?P<tag>[^`]*)`)?$")
_MARSHAL_JSON = re.compile(r"^func\s+\(\s*\w*\s*\*?(\w+)\s*\)\s+MarshalJSON\(\)", re.M)


def _tag(tag: str, key: str) -> str | None:
    found = re.search(rf'(?:^|\s){key}:"([^"]*)"', tag)
    return found[1] if found else None


def parse_go_package(directory: Path) -> GoPackage:
    """The struct types of a Go package (its non-test files), with their fields' tags, and the
    types that marshal their own JSON. A struct the parser cannot read (a func-typed field, an
    anonymous struct: never an API type's) is an error only if a message needs it."""
    structs: dict[str, list[GoField] | str] = {}
    custom: set[str] = set()
    for path in sorted(directory.glob("*.go")):
        if path.name.endswith("_test.go"):
            continue
        text = path.read_text()
        custom.update(_MARSHAL_JSON.findall(text))
        structs.update((name, []) for name in _EMPTY_STRUCT.findall(text))
        lines = text.split("\n")
        i = 0
        while i < len(lines):
            found = _STRUCT.match(lines[i])
            i += 1
            if not found:
                continue
            fields: list[GoField] = []
            problem = ""
            in_comment = False
            while lines[i] != "}":
                line = _strip_go_comment(lines[i]).strip()
                i += 1
                # A /* ... */ block inside a struct (DaemonEndpoint has one), on lines of its own.
                if line.startswith("/*") or in_comment:
                    in_comment = "*/" not in line
                    continue
                parsed = _GO_FIELD.match(line)
                if not line or problem:
                    continue
                if parsed is None or line.endswith("{"):
                    problem = f"{path}: struct {found[1]}: cannot read {line!r}"
                    continue
                tag = parsed["tag"] or ""
                fields.append(
                    GoField(parsed["name"] or "", parsed["type"], _tag(tag, "json"), _tag(tag, "protobuf"))
                )
            structs[found[1]] = problem or fields
    return GoPackage(structs, custom)


def _strip_go_comment(line: str) -> str:
    """A line without its ``//`` comment (struct tags, in backquotes, hold none)."""
    in_tag = False
    for i, char in enumerate(line):
        if char == "`":
            in_tag = not in_tag
        elif not in_tag and line.startswith("//", i):
            return line[:i]
    return line


# -- the table -------------------------------------------------------------------------------------


class Sources:
    """The Go module cache: packages' proto files and Go types, read once each."""

    def __init__(self, modcache: Path) -> None:
        self.modcache = modcache
        self.protos: dict[str, ProtoFile] = {}  # by proto package
        self.go: dict[str, GoPackage] = {}  # by proto package
        self.versions: dict[str, str] = {}

    def directory(self, go_package: str) -> Path:
        module = next((m for m in MODULES if go_package == m or go_package.startswith(m + "/")), None)
        if module is None:
            raise ProtobufSourceError(f"{go_package} is in none of the modules {MODULES}")
        self.versions[module] = STAGING_VERSION
        path = self.modcache / f"{module}@{STAGING_VERSION}" / go_package.removeprefix(module).lstrip("/")
        if not path.is_dir():
            raise ProtobufSourceError(f"{path} does not exist (is {module}@{STAGING_VERSION} downloaded?)")
        return path

    def load(self, go_package: str) -> ProtoFile:
        """The proto file of a Go package, read with its Go types and the proto files it imports
        (messages name other packages' types by proto package, which only the imports map)."""
        for known in self.protos.values():
            if known.go_package == go_package:
                return known
        directory = self.directory(go_package)
        proto = parse_proto((directory / "generated.proto").read_text(), str(directory / "generated.proto"))
        if proto.go_package != go_package:
            raise ProtobufSourceError(f"{directory}: go_package is {proto.go_package}, not {go_package}")
        self.protos[proto.package] = proto
        self.go[proto.package] = parse_go_package(directory)
        for imported in proto.imports:
            if not imported.endswith("/generated.proto"):
                raise ProtobufSourceError(f"{directory}: unexpected import {imported}")
            self.load(imported.removesuffix("/generated.proto"))
        return proto

    def split(self, message: str) -> tuple[ProtoFile, GoPackage, str]:
        package, _, name = message.rpartition(".")
        if package not in self.protos:
            raise ProtobufSourceError(f"{message}: its package was not imported")
        return self.protos[package], self.go[package], name


def _flags(go: GoField, proto: ProtoField) -> str:
    options = (go.json or "").split(",")[1:]
    flags = ""
    if proto.repeated:
        flags += "r"
    if go.type.startswith("*"):
        flags += "p"
    if "omitempty" in options:
        flags += "o"
    if "omitzero" in options:
        flags += "z"
    if not go.name and not (go.json or "").split(",")[0]:
        flags += "i"
    return flags


def _json_name(go: GoField) -> str:
    """The key Go's encoding/json writes the field under ("" for an inlined embedded struct)."""
    name = (go.json or "").split(",")[0]
    if name:
        return name
    return go.name  # "" when embedded: inlined


def message_fields(sources: Sources, message: str) -> list[list[Any]]:
    """The table's rows of one message: [number, JSON name, type, flags], in Go's field order; a
    type in ``CUSTOM_JSON`` gets its proto fields, named as in the proto, for its handler."""
    proto, go, name = sources.split(message)
    if name not in proto.messages:
        raise ProtobufSourceError(f"{message} is not in {proto.package}'s generated.proto")
    by_number = {f.number: f for f in proto.messages[name]}
    if message in CUSTOM_JSON:
        return [[f.number, f.name, _type(f), "r" if f.repeated else ""] for f in proto.messages[name]]
    if name in go.custom_json:
        raise ProtobufSourceError(
            f"{message} writes its own JSON (MarshalJSON): the decoder needs a handler for it (CUSTOM_JSON)"
        )
    struct = go.structs.get(name)
    if struct is None:
        raise ProtobufSourceError(f"{message}: no Go struct {name} in {proto.go_package}")
    if isinstance(struct, str):
        raise ProtobufSourceError(struct)
    rows: list[list[Any]] = []
    seen: set[int] = set()
    for go_field in struct:
        tag = go_field.protobuf
        json_name = _json_name(go_field)
        if json_name == "-" or (go_field.name and not go_field.name[0].isupper()):
            continue
        if tag is None or tag == "-":
            if go_field.type in ("metav1.TypeMeta", "TypeMeta"):
                continue  # kind and apiVersion: in the envelope
            if "omitempty" in (go_field.json or "") or "omitzero" in (go_field.json or ""):
                continue  # never set by a protobuf client, so never written
            raise ProtobufSourceError(f"{message}.{go_field.name}: no protobuf tag, yet always in its JSON")
        parts = tag.split(",")
        number = int(parts[1])
        proto_field = by_number.get(number)
        names = [p.removeprefix("name=") for p in parts if p.startswith("name=")]
        if proto_field is None or (names and names[0] != proto_field.name):
            raise ProtobufSourceError(f"{message}.{go_field.name}: tag {tag!r} matches no proto field")
        seen.add(number)
        rows.append([number, json_name, _type(proto_field), _flags(go_field, proto_field)])
    missing = set(by_number) - seen
    if missing:
        raise ProtobufSourceError(f"{message}: proto fields {sorted(missing)} have no Go field")
    return rows


def _type(proto_field: ProtoField) -> str | list[str]:
    return list(proto_field.type) if isinstance(proto_field.type, tuple) else proto_field.type


def build(modcache: Path) -> dict[str, Any]:
    """The document the decoder loads: the module versions, the kinds with their messages, and every
    message reachable from them."""
    sources = Sources(modcache)
    roots = {**KINDS, **KUBECTL_CREATE_ONLY, **{f"*/{kind}": name for kind, name in ANY_VERSION.items()}}
    kinds: dict[str, str] = {}
    for kind, definition in sorted(roots.items()):
        go_package, name = go_type(definition)
        proto = sources.load(go_package)
        kinds[kind] = f"{proto.package}.{name}"
    messages: dict[str, list[list[Any]]] = {}
    # Every type the decoder has a handler for, reached or not: the decoder checks it has them all.
    pending = sorted(set(kinds.values()) | set(CUSTOM_JSON))
    while pending:
        message = pending.pop()
        if message in messages:
            continue
        rows = messages[message] = message_fields(sources, message)
        for row in rows:
            for type_name in row[2] if isinstance(row[2], list) else [row[2]]:
                if type_name not in SCALARS and type_name not in messages:
                    pending.append(type_name)
    return {
        "modules": dict(sorted(sources.versions.items())),
        "kinds": kinds,
        "messages": dict(sorted(messages.items())),
    }


def encode(doc: dict[str, Any]) -> bytes:
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return gzip.compress(raw, compresslevel=9, mtime=0)


def decode(data: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gzip.decompress(data))
    return doc


def default_modcache() -> Path:
    """Where Go keeps downloaded modules: ``$GOMODCACHE``, else ``$GOPATH/pkg/mod``, else
    ``~/go/pkg/mod`` (Go's defaults; the go command itself is not needed)."""
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0]
    return Path(gopath) / "pkg" / "mod" if gopath else Path.home() / "go" / "pkg" / "mod"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_sandbox.gen_k8s_protobuf", description=__doc__)
    parser.add_argument("output", nargs="?", type=Path, default=OUTPUT, help=f"default: {OUTPUT}")
    parser.add_argument("--modcache", type=Path, default=None, help="default: Go's module cache")
    args = parser.parse_args(argv)
    doc = build(args.modcache or default_modcache())
    args.output.write_bytes(encode(doc))
    print(
        f"wrote {args.output} ({args.output.stat().st_size} bytes, {len(doc['kinds'])} kinds, "
        f"{len(doc['messages'])} messages)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
