"""Protobuf schemas: .proto text or base64 of a serialized FileDescriptorProto, and Confluent's compatibility rules.

Java and Go clients register .proto text; confluent-kafka's Python serializer registers base64 of the serialized
``FileDescriptorProto`` of the generated module and reads schemas back with ``?format=serialized``. Both inputs become
one descriptor (imports resolved from the references, or without one from protobuf's own well-known
google/protobuf/*.proto files and Confluent's confluent/meta.proto and confluent/type/decimal.proto), validated
by building it in a fresh protobuf DescriptorPool.

Canonical form: the descriptor printed as .proto text by our printer (type names fully qualified, comments
dropped, fixed element order), so the text and the descriptor of one file get one id. Normalized form: in addition
fields ordered by number and imports sorted (messages keep their order, which the wire format's message indexes
refer to).

Compatibility: Confluent's Protobuf rules (its schema diff): incompatible are a changed package, a removed message,
a field whose kind changes (scalar/enum vs message vs map), a scalar changed outside its wire-compatible group
(int32/uint32/int64/uint64/bool/enum; sint32/sint64; fixed32/sfixed32; fixed64/sfixed64; string/bytes; float;
double), a message field's type renamed or changed incompatibly, a numeric field's label changed (e.g. optional to
repeated), a required field added or removed, a field removed from a oneof, several fields moved into a new oneof,
or a field moved into an existing one. Adding/removing fields, messages, enums, enum values and oneofs, renaming
fields and changing the syntax are compatible, as Confluent documents.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import (
    any_pb2,
    api_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    source_context_pb2,
    struct_pb2,
    timestamp_pb2,
    type_pb2,
    wrappers_pb2,
)
from google.protobuf.message import DecodeError

from pykbroker.schema_registry.formats.base import InvalidReference, InvalidSchema
from pykbroker.schema_registry.formats.proto_parser import SCALAR_NAMES, parse_proto, print_proto, resolve_types
from pykbroker.schema_registry.formats.proto_parser import type_symbols as _type_symbols

FDP = descriptor_pb2.FieldDescriptorProto

# google/protobuf/*.proto are always importable without a reference, as in Confluent's registry.
WELL_KNOWN: dict[str, bytes] = {
    module.DESCRIPTOR.name: module.DESCRIPTOR.serialized_pb
    for module in (
        any_pb2,
        api_pb2,
        descriptor_pb2,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        source_context_pb2,
        struct_pb2,
        timestamp_pb2,
        type_pb2,
        wrappers_pb2,
    )
}

# Confluent's own types, which its registry knows without a reference (the Python serializer never registers them):
# the Meta option attached by data contracts, and the Decimal message.
CONFLUENT_BUILTIN: dict[str, str] = {
    "confluent/meta.proto": """
        syntax = "proto3";
        package confluent;
        import "google/protobuf/descriptor.proto";
        option go_package = "../confluent";
        message Meta {
          string doc = 1;
          map<string, string> params = 2;
          repeated string tags = 3;
          repeated Rule rules = 4;
        }
        message Rule {
          string name = 1;
          string doc = 2;
          string expr = 3;
          string sql = 4;
        }
        extend google.protobuf.FileOptions { Meta file_meta = 1088; }
        extend google.protobuf.MessageOptions { Meta message_meta = 1088; }
        extend google.protobuf.FieldOptions { Meta field_meta = 1088; }
        extend google.protobuf.EnumOptions { Meta enum_meta = 1088; }
        extend google.protobuf.EnumValueOptions { Meta enum_value_meta = 1088; }
    """,
    "confluent/type/decimal.proto": """
        syntax = "proto3";
        package confluent.type;
        message Decimal {
          bytes value = 1;
          uint32 precision = 2;
          int32 scale = 3;
        }
    """,
}

_BASE64_RE = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_VALIDATION_NAME = "__schema_registry_subject__.proto"


def decode_descriptor(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    """The FileDescriptorProto when `text` is base64 of one (what the Python serializers send), else None."""
    compact = "".join(text.split())
    if not compact or not _BASE64_RE.fullmatch(compact):
        return None
    try:
        data = base64.b64decode(compact, validate=True)
        return descriptor_pb2.FileDescriptorProto.FromString(data)
    except (binascii.Error, DecodeError, ValueError):
        return None


class _Loader:
    """Parses a schema and, recursively, the files it imports."""

    def __init__(self, references: Mapping[str, str]) -> None:
        self.references = references
        self.files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        self.loading: list[str] = []

    def load(self, path: str) -> descriptor_pb2.FileDescriptorProto:
        if path in self.files:
            return self.files[path]
        if path in self.loading:
            raise InvalidSchema(f"Invalid schema: import cycle through {' -> '.join([*self.loading, path])}")
        self.loading.append(path)
        try:
            if path in self.references:
                fdp = self.build(self.references[path], path)
            elif path in CONFLUENT_BUILTIN:
                fdp = self.build(CONFLUENT_BUILTIN[path], path)
            elif path in WELL_KNOWN:
                fdp = descriptor_pb2.FileDescriptorProto.FromString(WELL_KNOWN[path])
                for inner in fdp.dependency:
                    self.load(inner)
            else:
                raise InvalidReference(f"Invalid schema: no reference for import {path!r}")
        finally:
            self.loading.pop()
        self.files[path] = fdp
        return fdp

    def closure(self, fdp: descriptor_pb2.FileDescriptorProto) -> list[descriptor_pb2.FileDescriptorProto]:
        """The files `fdp` imports, transitively, each after its own imports."""
        ordered: list[descriptor_pb2.FileDescriptorProto] = []
        seen: set[str] = set()

        def visit(path: str) -> None:
            if path in seen:
                return
            seen.add(path)
            dep = self.files[path]
            for inner in dep.dependency:
                visit(inner)
            ordered.append(dep)

        for path in fdp.dependency:
            visit(path)
        return ordered

    def build(self, text: str, name: str) -> descriptor_pb2.FileDescriptorProto:
        fdp = decode_descriptor(text)
        if fdp is None:
            fdp = parse_proto(text)
        if name:
            fdp.name = name
        else:
            fdp.ClearField("name")  # the main schema's file name is not part of the schema
        for path in fdp.dependency:
            self.load(path)
        types, packages = _type_symbols(iter([*self.closure(fdp), fdp]))
        resolve_types(fdp, types, packages)
        return fdp


def _strip_custom_options(message: Any) -> None:
    """Drop uninterpreted (custom) options: the validating pool may not know their extensions."""
    for fd, value in message.ListFields():
        if fd.name == "uninterpreted_option":
            message.ClearField("uninterpreted_option")
        elif fd.type == fd.TYPE_MESSAGE:
            for item in value if fd.is_repeated else [value]:
                _strip_custom_options(item)


def _validate(fdp: descriptor_pb2.FileDescriptorProto, deps: list[descriptor_pb2.FileDescriptorProto]) -> None:
    pool = descriptor_pool.DescriptorPool()
    for file in [*deps, fdp]:
        copy = descriptor_pb2.FileDescriptorProto()
        copy.CopyFrom(file)
        if not copy.name:
            copy.name = _VALIDATION_NAME
        _strip_custom_options(copy)
        try:
            pool.Add(copy)
        except Exception as exc:  # protobuf raises TypeError or ValueError depending on its backend
            where = "" if file is fdp else f" (in import {file.name!r})"
            reason = str(exc).removeprefix("Couldn't build proto file into descriptor pool: ")
            raise InvalidSchema(f"Invalid schema{where}: {reason}") from exc


@dataclass
class _TypeInfo:
    kind: str  # message | enum
    proto: Any
    package: str
    proto3: bool


def _index(files: list[descriptor_pb2.FileDescriptorProto]) -> dict[str, _TypeInfo]:
    out: dict[str, _TypeInfo] = {}

    def walk(f: descriptor_pb2.FileDescriptorProto, prefix: str, messages: Any, enums: Any) -> None:
        proto3 = f.syntax == "proto3"
        for e in enums:
            out[prefix + e.name] = _TypeInfo("enum", e, f.package, proto3)
        for m in messages:
            out[prefix + m.name] = _TypeInfo("message", m, f.package, proto3)
            walk(f, prefix + m.name + ".", m.nested_type, m.enum_type)

    for f in files:
        walk(f, f"{f.package}." if f.package else "", f.message_type, f.enum_type)
    return out


class ProtobufSchema:
    schema_type = "PROTOBUF"

    def __init__(self, fdp: descriptor_pb2.FileDescriptorProto, deps: list[descriptor_pb2.FileDescriptorProto]) -> None:
        self.descriptor = fdp
        self._deps = deps
        self._canonical = print_proto(fdp)
        self.types = _index([*deps, fdp])

    @classmethod
    def parse(cls, text: str, references: Mapping[str, str]) -> ProtobufSchema:
        if not text.strip():
            raise InvalidSchema("Invalid schema: empty")
        loader = _Loader(references)
        fdp = loader.build(text, "")
        deps = loader.closure(fdp)
        _validate(fdp, deps)
        return cls(fdp, deps)

    def canonical(self) -> str:
        return self._canonical

    def normalized(self) -> str:
        return print_proto(_normalize(self.descriptor))

    def formatted(self, fmt: str) -> str:
        if fmt == "serialized":
            # Custom options stay out: a reader's descriptor pool would have to know their extensions to build it.
            plain = descriptor_pb2.FileDescriptorProto()
            plain.CopyFrom(self.descriptor)
            _strip_custom_options(plain)
            return base64.standard_b64encode(plain.SerializeToString(deterministic=True)).decode("ascii")
        return self._canonical

    def incompatibilities(self, writer: object) -> list[str]:
        """Why a reader with this schema cannot read data written with `writer` ([] when it can)."""
        if not isinstance(writer, ProtobufSchema):
            return [f"Incompatible schema type: {getattr(writer, 'schema_type', '?')} is not PROTOBUF"]
        return _Diff(writer, self).run()


def _normalize(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(fdp)
    order = sorted(range(len(out.dependency)), key=lambda i: out.dependency[i])
    deps = [out.dependency[i] for i in order]
    public = sorted(order.index(i) for i in out.public_dependency)
    weak = sorted(order.index(i) for i in out.weak_dependency)
    del out.dependency[:], out.public_dependency[:], out.weak_dependency[:]
    out.dependency.extend(deps)
    out.public_dependency.extend(public)
    out.weak_dependency.extend(weak)

    def sort_message(m: descriptor_pb2.DescriptorProto) -> None:
        fields = sorted(m.field, key=lambda f: f.number)
        del m.field[:]
        m.field.extend(fields)
        for n in m.nested_type:
            sort_message(n)

    # Messages keep their order: Confluent's wire format names a message by its index in the file.
    for m in out.message_type:
        sort_message(m)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Confluent's Protobuf schema diff (original = the writer's schema, update = the reader's).

COMPATIBLE_CHANGES = frozenset(
    {
        "MESSAGE_ADDED",
        "MESSAGE_MOVED",
        "ENUM_ADDED",
        "ENUM_REMOVED",
        "ENUM_CONST_ADDED",
        "ENUM_CONST_CHANGED",
        "ENUM_CONST_REMOVED",
        "FIELD_ADDED",
        "FIELD_REMOVED",
        "FIELD_NAME_CHANGED",
        "FIELD_STRING_OR_BYTES_LABEL_CHANGED",
        "ONEOF_ADDED",
        "ONEOF_REMOVED",
        "ONEOF_FIELD_ADDED",
    }
)

_DESCRIPTIONS = {
    "PACKAGE_CHANGED": "The package at '{p}' in the reader schema does not match the package in the writer schema",
    "MESSAGE_REMOVED": "The reader schema is missing a MESSAGE type at path '{p}' in the writer schema",
    "FIELD_KIND_CHANGED": "The type of a field at path '{p}' in the reader schema does not match the writer schema",
    "FIELD_SCALAR_KIND_CHANGED": (
        "The kind of a SCALAR field at path '{p}' in the reader schema does not match its kind in the writer schema"
    ),
    "FIELD_NAMED_TYPE_CHANGED": (
        "The type of a MESSAGE field at path '{p}' in the reader schema does not match its type in the writer schema"
    ),
    "FIELD_NUMERIC_LABEL_CHANGED": (
        "The label for a NUMERIC field at path '{p}' in the reader schema does not match its label in the writer schema"
    ),
    "REQUIRED_FIELD_ADDED": "A required field at path '{p}' in the reader schema is missing in the writer schema",
    "REQUIRED_FIELD_REMOVED": "The reader schema is missing a required field at path '{p}' in the writer schema",
    "ONEOF_FIELD_REMOVED": "The reader schema is missing a oneof field at path '{p}' in the writer schema",
    "MULTIPLE_FIELDS_MOVED_TO_ONEOF": (
        "Multiple fields in the oneof at path '{p}' in the reader schema are outside a oneof in the writer schema"
    ),
    "FIELD_MOVED_TO_EXISTING_ONEOF": (
        "A field in the oneof at path '{p}' in the reader schema is outside an existing oneof in the writer schema"
    ),
}

_SCALAR_KIND = {
    "int32": "GENERAL_NUMBER",
    "int64": "GENERAL_NUMBER",
    "uint32": "GENERAL_NUMBER",
    "uint64": "GENERAL_NUMBER",
    "bool": "GENERAL_NUMBER",
    "sint32": "SIGNED_NUMBER",
    "sint64": "SIGNED_NUMBER",
    "string": "STRING_OR_BYTES",
    "bytes": "STRING_OR_BYTES",
    "fixed32": "FIXED32",
    "sfixed32": "FIXED32",
    "fixed64": "FIXED64",
    "sfixed64": "FIXED64",
    "float": "FLOAT",
    "double": "DOUBLE",
}

# A field's type as the diff sees it: ("scalar", name) | ("enum", full) | ("message", full) | ("map", key, value)
_FieldType = tuple[Any, ...]


class _Diff:
    def __init__(self, original: ProtobufSchema, update: ProtobufSchema) -> None:
        self.original = original
        self.update = update
        self.diffs: list[tuple[str, str]] = []
        self.in_progress: set[tuple[str, str]] = set()
        self.memo: dict[tuple[str, str], list[tuple[str, str]]] = {}

    def run(self) -> list[str]:
        o, u = self.original.descriptor, self.update.descriptor
        if o.package != u.package:
            self.diffs.append(("PACKAGE_CHANGED", "#/"))
        self.compare_types(o.message_type, u.message_type, o.package, u.package, "#/")
        out: list[str] = []
        for kind, path in dict.fromkeys(self.diffs):
            if kind not in COMPATIBLE_CHANGES:
                out.append(f"{kind}: {_DESCRIPTIONS[kind].format(p=path)}")
        return out

    def compare_types(self, omsgs: Any, umsgs: Any, oscope: str, uscope: str, path: str) -> None:
        onames = [m.name for m in omsgs if not m.options.map_entry]
        unames = [m.name for m in umsgs if not m.options.map_entry]
        for name in dict.fromkeys([*onames, *unames]):
            p = f"{path}{name}"
            if name not in unames:
                self.diffs.append(("MESSAGE_REMOVED", p))
            elif name not in onames:
                self.diffs.append(("MESSAGE_ADDED", p))
            else:
                ofull = f"{oscope}.{name}" if oscope else name
                ufull = f"{uscope}.{name}" if uscope else name
                self.diffs.extend(self.message_body(ofull, ufull, p))
                om = self.original.types[ofull].proto
                um = self.update.types[ufull].proto
                self.compare_types(om.nested_type, um.nested_type, ofull, ufull, p + "/")

    def message_body(self, ofull: str, ufull: str, path: str) -> list[tuple[str, str]]:
        key = (ofull, ufull)
        if key in self.memo:
            return self.memo[key]
        if key in self.in_progress:
            return []
        self.in_progress.add(key)
        saved, self.diffs = self.diffs, []
        try:
            self._message_body(self.original.types[ofull], self.update.types[ufull], path)
            result = self.diffs
        finally:
            self.diffs = saved
            self.in_progress.discard(key)
        self.memo[key] = result
        return result

    def _message_body(self, oinfo: _TypeInfo, uinfo: _TypeInfo, path: str) -> None:
        om, um = oinfo.proto, uinfo.proto

        def real_oneof(m: Any, f: Any) -> str | None:
            if f.HasField("oneof_index") and not f.proto3_optional:
                return str(m.oneof_decl[f.oneof_index].name)
            return None

        orig_regular = {f.number: f for f in om.field if real_oneof(om, f) is None}
        upd_regular = {f.number: f for f in um.field if real_oneof(um, f) is None}
        orig_oneofs: dict[str, dict[int, Any]] = {}
        upd_oneofs: dict[str, dict[int, Any]] = {}
        for m, target in ((om, orig_oneofs), (um, upd_oneofs)):
            for f in m.field:
                name = real_oneof(m, f)
                if name is not None:
                    target.setdefault(name, {})[f.number] = f
        orig_oneof_numbers = {n for fields in orig_oneofs.values() for n in fields}
        for name, fields in upd_oneofs.items():
            moved = existing = 0
            for number in fields:
                if number in orig_regular:
                    del orig_regular[number]
                    moved += 1
                elif number in orig_oneof_numbers:
                    existing += 1
            if moved > 1:
                self.diffs.append(("MULTIPLE_FIELDS_MOVED_TO_ONEOF", f"{path}/{name}"))
            elif moved == 1 and existing > 0:
                self.diffs.append(("FIELD_MOVED_TO_EXISTING_ONEOF", f"{path}/{name}"))
        for name in dict.fromkeys([*orig_oneofs, *upd_oneofs]):
            p = f"{path}/{name}"
            if name not in upd_oneofs:
                self.diffs.append(("ONEOF_REMOVED", p))
            elif name not in orig_oneofs:
                self.diffs.append(("ONEOF_ADDED", p))
            else:
                ofields, ufields = orig_oneofs[name], upd_oneofs[name]
                for number in dict.fromkeys([*ofields, *ufields]):
                    fp = f"{p}/{number}"
                    if number not in ufields:
                        self.diffs.append(("ONEOF_FIELD_REMOVED", fp))
                    elif number not in ofields:
                        self.diffs.append(("ONEOF_FIELD_ADDED", fp))
                    else:
                        self.compare_field(ofields[number], ufields[number], oinfo, uinfo, fp, in_oneof=True)
        for number in dict.fromkeys([*orig_regular, *upd_regular]):
            fp = f"{path}/{number}"
            of, uf = orig_regular.get(number), upd_regular.get(number)
            if of is not None and uf is not None:
                self.compare_field(of, uf, oinfo, uinfo, fp, in_oneof=False)
            elif of is not None:
                required = of.label == FDP.LABEL_REQUIRED
                self.diffs.append(("REQUIRED_FIELD_REMOVED" if required else "FIELD_REMOVED", fp))
            elif uf is not None:
                required = uf.label == FDP.LABEL_REQUIRED
                self.diffs.append(("REQUIRED_FIELD_ADDED" if required else "FIELD_ADDED", fp))

    def field_type(self, f: Any, types: dict[str, _TypeInfo]) -> _FieldType:
        if f.type in (FDP.TYPE_MESSAGE, FDP.TYPE_GROUP):
            full = f.type_name.lstrip(".")
            info = types.get(full)
            if info is not None and info.proto.options.map_entry:
                key, value = info.proto.field[0], info.proto.field[1]
                return ("map", self.field_type(key, types), self.field_type(value, types))
            return ("message", full)
        if f.type == FDP.TYPE_ENUM:
            return ("enum", f.type_name.lstrip("."))
        return ("scalar", SCALAR_NAMES[f.type])

    def compare_field(self, of: Any, uf: Any, oinfo: _TypeInfo, uinfo: _TypeInfo, path: str, in_oneof: bool) -> None:
        if of.name != uf.name:
            self.diffs.append(("FIELD_NAME_CHANGED", path))
        otype = self.field_type(of, self.original.types)
        utype = self.field_type(uf, self.update.types)
        olabel = None if in_oneof or otype[0] == "map" else _explicit_label(of, oinfo.proto3)
        ulabel = None if in_oneof or utype[0] == "map" else _explicit_label(uf, uinfo.proto3)
        self.compare_types_of_field(olabel, ulabel, otype, utype, path)

    def compare_types_of_field(
        self, olabel: int | None, ulabel: int | None, otype: _FieldType, utype: _FieldType, path: str
    ) -> None:
        okind, ukind = _kind(otype), _kind(utype)
        if okind != ukind:
            self.diffs.append(("FIELD_KIND_CHANGED", path))
        elif okind == "SCALAR":
            oscalar = "GENERAL_NUMBER" if otype[0] == "enum" else _SCALAR_KIND[otype[1]]
            uscalar = "GENERAL_NUMBER" if utype[0] == "enum" else _SCALAR_KIND[utype[1]]
            if oscalar != uscalar:
                self.diffs.append(("FIELD_SCALAR_KIND_CHANGED", path))
            elif olabel is not None and ulabel is not None and olabel != ulabel:
                kind = "FIELD_STRING_OR_BYTES_LABEL_CHANGED" if oscalar == "STRING_OR_BYTES" else None
                self.diffs.append((kind or "FIELD_NUMERIC_LABEL_CHANGED", path))
        elif okind == "MESSAGE":
            ofull, ufull = otype[1], utype[1]
            oinfo, uinfo = self.original.types.get(ofull), self.update.types.get(ufull)
            if oinfo is None or uinfo is None:
                if ofull != ufull:
                    self.diffs.append(("FIELD_NAMED_TYPE_CHANGED", path))
                return
            if _local(ofull, oinfo.package) != _local(ufull, uinfo.package):
                self.diffs.append(("FIELD_NAMED_TYPE_CHANGED", path))
                return
            inner = self.message_body(ofull, ufull, "#/" + _local(ofull, oinfo.package))
            if any(kind not in COMPATIBLE_CHANGES for kind, _ in inner):
                self.diffs.extend(inner)
                self.diffs.append(("FIELD_NAMED_TYPE_CHANGED", path))
        else:
            self.compare_types_of_field(None, None, otype[1], utype[1], path)
            self.compare_types_of_field(None, None, otype[2], utype[2], path)


def _kind(t: _FieldType) -> str:
    return {"scalar": "SCALAR", "enum": "SCALAR", "message": "MESSAGE", "map": "MAP"}[t[0]]


def _local(full: str, package: str) -> str:
    return full[len(package) + 1 :] if package and full.startswith(package + ".") else full


def _explicit_label(f: Any, proto3: bool) -> int | None:
    """The label as written in the .proto (proto3 leaves plain singular fields without one)."""
    if proto3:
        if f.label == FDP.LABEL_REPEATED:
            return int(FDP.LABEL_REPEATED)
        return int(FDP.LABEL_OPTIONAL) if f.proto3_optional else None
    return int(f.label)
