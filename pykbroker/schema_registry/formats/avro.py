"""Avro schemas: validation by fastavro, Confluent's canonical text, and Avro's schema-resolution rules.

Canonical form: what Avro's Java ``Schema.toString()`` prints, which is what Confluent stores and returns: compact
JSON (no whitespace); a primitive without properties as a bare string; named types written once, later uses by name
(the short name when it lives in the enclosing namespace, else the full name); "name" is the short name with
"namespace" only where it differs from the enclosing one; attributes in Java's order (record: type, name, namespace,
doc, fields, other properties, aliases; field: name, type, doc, default, order unless ascending, aliases, other
properties; enum: type, name, namespace, doc, symbols, default, other properties, aliases; fixed: type, name,
namespace, doc, size, other properties, aliases; array/map: type, items/values, other properties). doc, default,
aliases, logicalType and every other property are kept.

Normalized form (``?normalize=true``): the same content with every name written in full (no "namespace"
attribute, aliases and references fully qualified) and other properties sorted by key, so that schemas that differ
only in how names are qualified or in property order get one id.

Validation: fastavro's parser, then every field default checked against its type in depth (records, arrays, maps,
enums; a union's default may match any branch, as the Avro 1.12 specification reads it).

Compatibility follows the Avro specification's schema resolution with the reader and writer of each check.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fastavro.schema

from pykbroker.schema_registry.formats.base import InvalidReference, InvalidSchema

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = frozenset({"record", "error", "enum", "fixed"})
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_RESERVED = {
    "record": ("type", "name", "namespace", "doc", "fields", "aliases"),
    "enum": ("type", "name", "namespace", "doc", "symbols", "default", "aliases"),
    "fixed": ("type", "name", "namespace", "doc", "size", "aliases"),
    "array": ("type", "items"),
    "map": ("type", "values"),
    "field": ("name", "type", "doc", "default", "order", "aliases"),
}

# (reader, writer) pairs the specification lets a reader promote.
_PROMOTIONS = frozenset(
    {
        ("long", "int"),
        ("float", "int"),
        ("float", "long"),
        ("double", "int"),
        ("double", "long"),
        ("double", "float"),
        ("string", "bytes"),
        ("bytes", "string"),
    }
)


def _full_name(name: str, namespace: str | None) -> str:
    if "." in name:
        return name
    return f"{namespace}.{name}" if namespace else name


def _space_of(full: str) -> str | None:
    return full.rsplit(".", 1)[0] if "." in full else None


def _short(full: str) -> str:
    return full.rsplit(".", 1)[-1]


def _qualified(full: str, space: str | None) -> str:
    """Java's Name.getQualified: the short name inside its own namespace, else the full name."""
    own = _space_of(full)
    return _short(full) if own is None or own == space else full


class _Definitions:
    """Named types by full name: those of the references, then those of the schema itself."""

    def __init__(self) -> None:
        self.defs: dict[str, tuple[dict[str, Any], bool]] = {}  # full name -> (definition, from a reference)
        self.full_of: dict[int, str] = {}  # id of a definition -> its full name

    def full_name_of(self, schema: dict[str, Any], space: str | None) -> str:
        known = self.full_of.get(id(schema))
        if known is not None:
            return known
        name = schema["name"]
        return _full_name(name, (schema.get("namespace", space) or None) if "." not in name else None)

    def collect(self, schema: Any, space: str | None, from_reference: bool) -> None:
        if isinstance(schema, list):
            for branch in schema:
                self.collect(branch, space, from_reference)
            return
        if not isinstance(schema, dict):
            return
        kind = schema.get("type")
        if kind in _NAMED:
            name = schema.get("name")
            if not isinstance(name, str):
                raise InvalidSchema(f"Invalid schema: a {kind} needs a name: {json.dumps(schema)[:200]}")
            namespace = schema.get("namespace", space) if "." not in name else None
            full = _full_name(name, namespace or None)
            for part in full.split("."):
                if not _NAME_RE.fullmatch(part):
                    raise InvalidSchema(f"Invalid schema: illegal name {full!r}")
            if full in self.defs and self.defs[full][0] is not schema:
                raise InvalidSchema(f"Invalid schema: can't redefine: {full}")
            self.defs[full] = (schema, from_reference)
            self.full_of[id(schema)] = full
            if kind in ("record", "error"):
                fields = schema.get("fields")
                if not isinstance(fields, list):
                    raise InvalidSchema(f"Invalid schema: record {full} has no fields array")
                names: set[str] = set()
                for f in fields:
                    if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
                        raise InvalidSchema(f"Invalid schema: record {full} has a field without name or type")
                    if f["name"] in names:
                        raise InvalidSchema(f"Invalid schema: duplicate field {f['name']} in record {full}")
                    names.add(f["name"])
                    self.collect(f["type"], _space_of(full), from_reference)
        elif kind in ("array", "map"):
            self.collect(schema.get("items" if kind == "array" else "values"), space, from_reference)
        elif isinstance(kind, (dict, list)):
            self.collect(kind, space, from_reference)

    def resolve(self, name: str, space: str | None) -> str:
        if "." not in name and space and f"{space}.{name}" in self.defs:
            return f"{space}.{name}"
        if name in self.defs:
            return name
        raise InvalidReference(f"Invalid schema: unknown type {name!r}")


class _Printer:
    """Prints a schema as Java's Schema.toString() does (or the normalized variant)."""

    def __init__(self, defs: _Definitions, normalized: bool, inline_references: bool) -> None:
        self.defs = defs
        self.normalized = normalized
        self.inline_references = inline_references
        self.printed: set[str] = set()

    def _props(self, schema: dict[str, Any], reserved: tuple[str, ...]) -> list[tuple[str, Any]]:
        props = [(k, v) for k, v in schema.items() if k not in reserved]
        return sorted(props) if self.normalized else props

    def _name_ref(self, full: str, space: str | None) -> str:
        return full if self.normalized else _qualified(full, space)

    def _write_name(self, out: dict[str, Any], full: str, space: str | None) -> None:
        if self.normalized:
            out["name"] = full
            return
        out["name"] = _short(full)
        own = _space_of(full)
        if own is not None:
            if own != space:
                out["namespace"] = own
        elif space is not None:
            out["namespace"] = ""

    def _aliases(self, aliases: Any, own_space: str | None) -> list[str]:
        fulls = [_full_name(a, own_space) for a in aliases]
        return fulls if self.normalized else [_qualified(a, own_space) for a in fulls]

    def emit(self, schema: Any, space: str | None) -> Any:
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return schema
            full = self.defs.resolve(schema, space)
            if full not in self.printed and (self.inline_references or not self.defs.defs[full][1]):
                return self.emit(self.defs.defs[full][0], space)
            return self._name_ref(full, space)
        if isinstance(schema, list):
            return [self.emit(branch, space) for branch in schema]
        if not isinstance(schema, dict):
            raise InvalidSchema(f"Invalid schema: {json.dumps(schema)[:200]}")
        kind = schema.get("type")
        if isinstance(kind, (dict, list)):
            return self.emit(kind, space)
        if not isinstance(kind, str):
            raise InvalidSchema(f"Invalid schema: no type in {json.dumps(schema)[:200]}")
        if kind in PRIMITIVES:
            props = self._props(schema, ("type",))
            return dict([("type", kind), *props]) if props else kind
        if kind in ("array", "map"):
            child = "items" if kind == "array" else "values"
            items = [("type", kind), (child, self.emit(schema.get(child), space))]
            return dict([*items, *self._props(schema, _RESERVED[kind])])
        if kind not in _NAMED:
            return self.emit(kind, space)
        full = self.defs.full_name_of(schema, space)
        if full in self.printed:
            return self._name_ref(full, space)
        self.printed.add(full)
        own = _space_of(full)
        out: dict[str, Any] = {"type": kind}
        self._write_name(out, full, space)
        if "doc" in schema:
            out["doc"] = schema["doc"]
        reserved = _RESERVED["record" if kind == "error" else kind]
        if kind in ("record", "error"):
            out["fields"] = [self._field(f, own) for f in schema["fields"]]
        elif kind == "enum":
            out["symbols"] = schema.get("symbols")
            if "default" in schema:
                out["default"] = schema["default"]
        else:
            out["size"] = schema.get("size")
        out.update(self._props(schema, reserved))
        if schema.get("aliases"):
            out["aliases"] = self._aliases(schema["aliases"], own)
        return out

    def _field(self, f: dict[str, Any], space: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"name": f["name"], "type": self.emit(f["type"], space)}
        if "doc" in f:
            out["doc"] = f["doc"]
        if "default" in f:
            out["default"] = f["default"]
        if f.get("order", "ascending") != "ascending":
            out["order"] = f["order"]
        if f.get("aliases"):
            out["aliases"] = list(f["aliases"])
        out.update(self._props(f, _RESERVED["field"]))
        return out


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------------------------------------------------------
# The resolved model the compatibility rules walk (named types are shared nodes, so recursion is a cycle).


@dataclass(eq=False)
class _Type:
    kind: str  # a primitive name, or record/enum/fixed/array/map/union
    name: str = ""
    aliases: tuple[str, ...] = ()
    fields: list[_Field] = field(default_factory=list)
    symbols: tuple[str, ...] = ()
    enum_default: str | None = None
    size: int = 0
    children: list[_Type] = field(default_factory=list)  # items / values / union branches

    def describe(self) -> str:
        return f"{self.kind} {self.name}" if self.name else self.kind


@dataclass(eq=False)
class _Field:
    name: str
    type: _Type
    has_default: bool
    aliases: tuple[str, ...]
    default: Any = None


class _Builder:
    def __init__(self, defs: _Definitions) -> None:
        self.defs = defs
        self.named: dict[str, _Type] = {}

    def build(self, schema: Any, space: str | None) -> _Type:
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return _Type(schema)
            full = self.defs.resolve(schema, space)
            if full not in self.named:
                self.build(self.defs.defs[full][0], _space_of(full))
            return self.named[full]
        if isinstance(schema, list):
            return _Type("union", children=[self.build(b, space) for b in schema])
        kind = schema["type"]
        if isinstance(kind, (dict, list)):
            return self.build(kind, space)
        if kind in PRIMITIVES:
            return _Type(kind)
        if kind == "array":
            return _Type("array", children=[self.build(schema["items"], space)])
        if kind == "map":
            return _Type("map", children=[self.build(schema["values"], space)])
        if kind not in _NAMED:
            return self.build(kind, space)
        full = self.defs.full_name_of(schema, space)
        if full in self.named:
            return self.named[full]
        own = _space_of(full)
        node = _Type(
            "record" if kind == "error" else kind,
            name=full,
            aliases=tuple(_full_name(a, own) for a in schema.get("aliases", ())),
        )
        self.named[full] = node
        if node.kind == "record":
            node.fields = [
                _Field(
                    f["name"], self.build(f["type"], own), "default" in f, tuple(f.get("aliases", ())), f.get("default")
                )
                for f in schema["fields"]
            ]
        elif kind == "enum":
            node.symbols = tuple(schema.get("symbols", ()))
            node.enum_default = schema.get("default")
        else:
            node.size = int(schema.get("size", 0))
        return node


class _Resolution:
    """Avro's schema resolution: can a reader with one schema read what a writer with another wrote?"""

    def __init__(self) -> None:
        self.cache: dict[tuple[int, int], list[str]] = {}

    def check(self, reader: _Type, writer: _Type, path: str) -> list[str]:
        key = (id(reader), id(writer))
        if key in self.cache:
            return self.cache[key]
        self.cache[key] = []  # assumed while the pair is being compared: recursive types terminate
        result = self._check(reader, writer, path)
        self.cache[key] = result
        return result

    def trial(self, reader: _Type, writer: _Type, path: str) -> bool:
        """Whether the pair resolves; what a failed attempt assumed along the way is forgotten."""
        saved = dict(self.cache)
        if self.check(reader, writer, path):
            self.cache = saved
            return False
        return True

    def _check(self, r: _Type, w: _Type, path: str) -> list[str]:
        if w.kind == "union":
            out: list[str] = []
            for i, branch in enumerate(w.children):
                out.extend(self.check(r, branch, f"{path}/{i}"))
            return out
        if r.kind == "union":
            for branch in r.children:
                if self.trial(branch, w, path):
                    return []
            return [
                _message(
                    "MISSING_UNION_BRANCH",
                    f"The reader schema's union at path '{path or '/'}' has no branch for the writer's {w.describe()}",
                )
            ]
        if r.kind in PRIMITIVES or w.kind in PRIMITIVES:
            if r.kind == w.kind or (r.kind, w.kind) in _PROMOTIONS:
                return []
            return [_type_mismatch(r, w, path)]
        if r.kind != w.kind:
            return [_type_mismatch(r, w, path)]
        if r.kind in ("array", "map"):
            return self.check(r.children[0], w.children[0], f"{path}/{'items' if r.kind == 'array' else 'values'}")
        if not (_short(r.name) == _short(w.name) or w.name in r.aliases):
            return [
                _message(
                    "NAME_MISMATCH",
                    f"The name of the reader's {r.kind} at path '{path or '/'}' ({r.name}) does not match the "
                    f"writer's ({w.name})",
                )
            ]
        if r.kind == "fixed":
            if r.size != w.size:
                return [
                    _message(
                        "FIXED_SIZE_MISMATCH",
                        f"The size of the reader's fixed {r.name} at path '{path or '/'}' is {r.size}, the "
                        f"writer's is {w.size}",
                    )
                ]
            return []
        if r.kind == "enum":
            missing = [s for s in w.symbols if s not in r.symbols]
            if missing and r.enum_default is None:
                return [
                    _message(
                        "MISSING_ENUM_SYMBOLS",
                        f"The reader's enum {r.name} at path '{path or '/'}' lacks the writer's symbols "
                        f"{', '.join(missing)} and has no default",
                    )
                ]
            return []
        out = []
        by_name = {f.name: f for f in w.fields}
        for i, rf in enumerate(r.fields):
            wf = by_name.get(rf.name)
            if wf is None:
                wf = next((by_name[a] for a in rf.aliases if a in by_name), None)
            if wf is not None:
                out.extend(self.check(rf.type, wf.type, f"{path}/fields/{i}/type"))
            elif not rf.has_default:
                out.append(
                    _message(
                        "READER_FIELD_MISSING_DEFAULT_VALUE",
                        f"The field '{rf.name}' at path '{path}/fields/{i}' in the reader schema has no default "
                        "value and is missing in the writer schema",
                    )
                )
        return out


_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def _valid_default(t: _Type, value: Any) -> bool:
    """Whether a field default is a JSON value of the field's type (a union's default may match any branch)."""
    kind = t.kind
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in _INT_RANGE:
        low, high = _INT_RANGE[kind]
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    if kind in ("float", "double"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in ("string", "bytes", "fixed"):
        return isinstance(value, str)
    if kind == "enum":
        return value in t.symbols
    if kind == "array":
        return isinstance(value, list) and all(_valid_default(t.children[0], v) for v in value)
    if kind == "map":
        return isinstance(value, dict) and all(_valid_default(t.children[0], v) for v in value.values())
    if kind == "union":
        return any(_valid_default(branch, value) for branch in t.children)
    if not isinstance(value, dict):
        return False
    return all(_valid_default(f.type, value[f.name]) if f.name in value else f.has_default for f in t.fields)


def _message(kind: str, description: str) -> str:
    return f"{kind}: {description}"


def _type_mismatch(r: _Type, w: _Type, path: str) -> str:
    return _message(
        "TYPE_MISMATCH",
        f"The type at path '{path or '/'}' in the reader schema ({r.describe()}) does not match the writer "
        f"schema's ({w.describe()})",
    )


class AvroSchema:
    schema_type = "AVRO"

    def __init__(self, document: Any, defs: _Definitions) -> None:
        self._document = document
        self._defs = defs
        self._canonical = _dumps(_Printer(defs, normalized=False, inline_references=False).emit(document, None))
        builder = _Builder(defs)
        self._root = builder.build(document, None)
        for named in builder.named.values():
            for f in named.fields:
                if f.has_default and not _valid_default(f.type, f.default):
                    raise InvalidSchema(
                        f"Invalid schema: the default {_dumps(f.default)} of field {f.name!r} in {named.name} "
                        f"is not a {f.type.describe()}"
                    )

    @classmethod
    def parse(cls, text: str, references: Mapping[str, str]) -> AvroSchema:
        document = _load_json(text, "schema")
        named: dict[str, Any] = {}
        pending = {name: _load_json(ref, f"reference {name!r}") for name, ref in references.items()}
        # References may use each other's types: parse until no pending one makes progress.
        while pending:
            progress = False
            failure = ""
            for name, ref in list(pending.items()):
                try:
                    fastavro.schema.parse_schema(copy.deepcopy(ref), named, _write_hint=False)
                except Exception as exc:  # fastavro raises several unrelated types for bad schemas
                    failure = f"reference {name!r}: {exc}"
                    continue
                del pending[name]
                progress = True
            if not progress:
                raise InvalidReference(f"Invalid schema: {failure}")
        try:
            fastavro.schema.parse_schema(copy.deepcopy(document), named, _write_hint=False)
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            if type(exc).__name__ == "UnknownType":
                raise InvalidReference(f"Invalid schema: unknown type {reason}") from exc
            raise InvalidSchema(f"Invalid schema: {reason}") from exc
        defs = _Definitions()
        for ref_text in references.values():
            defs.collect(json.loads(ref_text), None, True)
        defs.collect(document, None, False)
        return cls(document, defs)

    def canonical(self) -> str:
        return self._canonical

    def normalized(self) -> str:
        return _dumps(_Printer(self._defs, normalized=True, inline_references=False).emit(self._document, None))

    def formatted(self, fmt: str) -> str:
        if fmt == "resolved":
            return _dumps(_Printer(self._defs, normalized=False, inline_references=True).emit(self._document, None))
        return self._canonical

    def incompatibilities(self, writer: object) -> list[str]:
        """Why a reader with this schema cannot read data written with `writer` ([] when it can)."""
        if not isinstance(writer, AvroSchema):
            return [f"Incompatible schema type: {getattr(writer, 'schema_type', '?')} is not AVRO"]
        return _Resolution().check(self._root, writer._root, "")


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise InvalidSchema(f"Invalid schema: the {what} is not JSON: {exc}") from exc
