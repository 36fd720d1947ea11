"""A .proto (proto2 and proto3) parser that builds a ``FileDescriptorProto``, and the printer back to .proto text.

The registry needs the schema as a descriptor (the Python serializers exchange base64 of a serialized
``FileDescriptorProto``) and as text (Java and Go clients send and read .proto text), so both directions live here.
The descriptor built matches what protoc produces for the same file (json_name filled in, map entries as nested
``...Entry`` messages, proto3 ``optional`` as synthetic oneofs, type names fully qualified), so that text and
descriptor of one file print the same canonical text. Semantic validation is left to protobuf's DescriptorPool.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from pykbroker.schema_registry.formats.base import InvalidSchema

FDP = descriptor_pb2.FieldDescriptorProto

SCALARS: dict[str, int] = {
    "double": FDP.TYPE_DOUBLE,
    "float": FDP.TYPE_FLOAT,
    "int64": FDP.TYPE_INT64,
    "uint64": FDP.TYPE_UINT64,
    "int32": FDP.TYPE_INT32,
    "fixed64": FDP.TYPE_FIXED64,
    "fixed32": FDP.TYPE_FIXED32,
    "bool": FDP.TYPE_BOOL,
    "string": FDP.TYPE_STRING,
    "bytes": FDP.TYPE_BYTES,
    "uint32": FDP.TYPE_UINT32,
    "sfixed32": FDP.TYPE_SFIXED32,
    "sfixed64": FDP.TYPE_SFIXED64,
    "sint32": FDP.TYPE_SINT32,
    "sint64": FDP.TYPE_SINT64,
}
SCALAR_NAMES = {v: k for k, v in SCALARS.items()}

MAX_FIELD_NUMBER = 536870911
MAX_ENUM_NUMBER = 2147483647

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
    | (?P<comment>//[^\n]*|/\*.*?\*/)
    | (?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
    | (?P<int>0[xX][0-9A-Fa-f]+|\d+)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    | (?P<symbol>[{}\[\]()<>;=,:.\-+/])
    """,
    re.S | re.X,
)


@dataclass
class _Token:
    kind: str  # ident | int | float | string | symbol | eof
    text: str
    line: int
    start: int
    end: int


def _tokenize(source: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    line = 1
    while pos < len(source):
        match = _TOKEN_RE.match(source, pos)
        if match is None:
            raise InvalidSchema(f"Could not parse Protobuf: unexpected character {source[pos]!r} at line {line}")
        kind = match.lastgroup or ""
        text = match.group()
        if kind not in ("ws", "comment"):
            tokens.append(_Token(kind, text, line, match.start(), match.end()))
        line += text.count("\n")
        pos = match.end()
    tokens.append(_Token("eof", "", line, len(source), len(source)))
    return tokens


_SIMPLE_ESCAPES = {"n": 10, "r": 13, "t": 9, "a": 7, "b": 8, "f": 12, "v": 11, "\\": 92, "'": 39, '"': 34, "?": 63}


def unescape(literal: str) -> bytes:
    """The bytes of one quoted string literal (C escapes, as protoc reads them)."""
    body = literal[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.extend(c.encode("utf-8"))
            i += 1
            continue
        i += 1
        e = body[i]
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
            i += 1
        elif e in "xX":
            digits = re.match(r"[0-9A-Fa-f]{1,2}", body[i + 1 :])
            if not digits:
                raise InvalidSchema(f"Could not parse Protobuf: bad \\x escape in {literal}")
            out.append(int(digits.group(), 16))
            i += 1 + len(digits.group())
        elif e in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[i:])
            assert digits is not None
            out.append(int(digits.group(), 8) & 0xFF)
            i += len(digits.group())
        elif e in "uU":
            n = 4 if e == "u" else 8
            out.extend(chr(int(body[i + 1 : i + 1 + n], 16)).encode("utf-8"))
            i += 1 + n
        else:
            raise InvalidSchema(f"Could not parse Protobuf: unknown escape \\{e} in {literal}")
    return bytes(out)


def c_escape(data: bytes) -> str:
    """protoc's CEscape: printable ASCII as is, the rest as octal escapes."""
    out = []
    for b in data:
        if b == 10:
            out.append("\\n")
        elif b == 13:
            out.append("\\r")
        elif b == 9:
            out.append("\\t")
        elif b in (34, 39, 92):
            out.append("\\" + chr(b))
        elif 32 <= b < 127:
            out.append(chr(b))
        else:
            out.append(f"\\{b:03o}")
    return "".join(out)


def quote(data: bytes | str) -> str:
    return '"' + c_escape(data.encode("utf-8") if isinstance(data, str) else data) + '"'


def json_name(name: str) -> str:
    """protoc's default JSON name: underscores dropped, the letter after each capitalised."""
    out = []
    upper = False
    for c in name:
        if c == "_":
            upper = True
        elif upper:
            out.append(c.upper())
            upper = False
        else:
            out.append(c)
    return "".join(out)


def map_entry_name(field_name: str) -> str:
    out = []
    upper = True
    for c in field_name:
        if c == "_":
            upper = True
        elif upper:
            out.append(c.upper())
            upper = False
        else:
            out.append(c)
    return "".join(out) + "Entry"


@dataclass
class _Constant:
    kind: str  # ident | int | float | string | aggregate
    value: Any  # str for ident/aggregate, int, float, bytes


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = _tokenize(source)
        self.pos = 0
        self.file = descriptor_pb2.FileDescriptorProto()
        self.proto3 = False

    # -- token helpers -------------------------------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def next(self) -> _Token:
        token = self.peek()
        self.pos += 1
        return token

    def fail(self, what: str, token: _Token | None = None) -> InvalidSchema:
        token = token or self.peek()
        found = token.text or "end of input"
        return InvalidSchema(f"Could not parse Protobuf: line {token.line}: {what}, found {found!r}")

    def accept(self, text: str) -> bool:
        token = self.peek()
        if token.kind in ("symbol", "ident") and token.text == text:
            self.pos += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.accept(text):
            raise self.fail(f"expected {text!r}")

    def ident(self) -> str:
        token = self.peek()
        if token.kind != "ident":
            raise self.fail("expected an identifier")
        self.pos += 1
        return token.text

    def full_ident(self) -> str:
        parts = [self.ident()]
        while self.accept("."):
            parts.append(self.ident())
        return ".".join(parts)

    def type_name(self) -> str:
        lead = "." if self.accept(".") else ""
        return lead + self.full_ident()

    def string(self) -> bytes:
        token = self.peek()
        if token.kind != "string":
            raise self.fail("expected a string")
        data = b""
        while self.peek().kind == "string":  # adjacent literals concatenate
            data += unescape(self.next().text)
        return data

    def text_string(self) -> str:
        try:
            return self.string().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail("string is not UTF-8") from exc

    def integer(self) -> int:
        negative = self.accept("-")
        token = self.peek()
        if token.kind != "int":
            raise self.fail("expected an integer")
        self.pos += 1
        value = self.int_literal(token)
        return -value if negative else value

    def int_literal(self, token: _Token) -> int:
        text = token.text
        try:
            if re.fullmatch(r"0[0-9]+", text):
                return int(text, 8)
            return int(text, 0)
        except ValueError as exc:
            raise self.fail("bad integer", token) from exc

    def constant(self) -> _Constant:
        token = self.peek()
        if token.text == "{":
            return _Constant("aggregate", self.aggregate())
        if token.kind == "string":
            return _Constant("string", self.string())
        sign = 1
        if self.accept("-"):
            sign = -1
        else:
            self.accept("+")
        token = self.peek()
        if token.kind == "int":
            self.pos += 1
            return _Constant("int", sign * self.int_literal(token))
        if token.kind == "float":
            self.pos += 1
            return _Constant("float", sign * float(token.text))
        if token.kind == "ident":
            self.pos += 1
            if token.text in ("inf", "nan"):
                return _Constant("float", sign * float(token.text))
            if sign == -1:
                raise self.fail("expected a number after '-'", token)
            name = token.text
            while self.accept("."):
                name += "." + self.ident()
            return _Constant("ident", name)
        raise self.fail("expected a constant")

    def aggregate(self) -> str:
        start = self.peek()
        self.expect("{")
        depth = 1
        while depth:
            token = self.next()
            if token.kind == "eof":
                raise self.fail("unterminated '{'", token)
            if token.text == "{" and token.kind == "symbol":
                depth += 1
            elif token.text == "}" and token.kind == "symbol":
                depth -= 1
        end = self.tokens[self.pos - 1]
        return " ".join(self.source[start.end : end.start].split())

    # -- options ---------------------------------------------------------------------------------------------------

    def option_name(self) -> list[tuple[str, bool]]:
        parts: list[tuple[str, bool]] = []
        while True:
            if self.accept("("):
                parts.append((self.type_name(), True))
                self.expect(")")
            else:
                parts.append((self.ident(), False))
            if not self.accept("."):
                return parts

    def option_assignment(self, options: Message) -> None:
        name = self.option_name()
        self.expect("=")
        value = self.constant()
        set_option(options, name, value, self.fail)

    def option_statement(self, options: Message) -> None:
        self.option_assignment(options)
        self.expect(";")

    # -- file ------------------------------------------------------------------------------------------------------

    def parse(self) -> descriptor_pb2.FileDescriptorProto:
        f = self.file
        if self.accept("syntax"):
            self.expect("=")
            token = self.peek()
            syntax = self.text_string()
            if syntax not in ("proto2", "proto3"):
                raise self.fail('expected "proto2" or "proto3"', token)
            self.expect(";")
            self.proto3 = syntax == "proto3"
            if self.proto3:
                f.syntax = "proto3"
        elif self.peek().text == "edition":
            raise self.fail("Protobuf editions are not supported; use syntax proto2 or proto3")
        while self.peek().kind != "eof":
            token = self.peek()
            if self.accept(";"):
                continue
            if self.accept("package"):
                if f.HasField("package"):
                    raise self.fail("multiple package definitions", token)
                f.package = self.full_ident()
                self.expect(";")
            elif self.accept("import"):
                kind = ""
                if self.peek().text in ("public", "weak") and self.peek().kind == "ident":
                    kind = self.next().text
                path = self.text_string()
                if kind == "public":
                    f.public_dependency.append(len(f.dependency))
                elif kind == "weak":
                    f.weak_dependency.append(len(f.dependency))
                f.dependency.append(path)
                self.expect(";")
            elif self.accept("option"):
                self.option_statement(f.options)
            elif self.accept("message"):
                self.message(f.message_type.add())
            elif self.accept("enum"):
                self.enum(f.enum_type.add())
            elif self.accept("service"):
                self.service(f.service.add())
            elif self.accept("extend"):
                self.extend(f.extension)
            else:
                raise self.fail("expected a top-level statement (package, import, option, message, enum, service)")
        return f

    def message(self, m: descriptor_pb2.DescriptorProto) -> None:
        m.name = self.ident()
        self.expect("{")
        synthetic: list[descriptor_pb2.FieldDescriptorProto] = []
        while not self.accept("}"):
            token = self.peek()
            if token.kind == "eof":
                raise self.fail(f"message {m.name} is not closed")
            if self.accept(";"):
                continue
            keyword = token.text if token.kind == "ident" else ""
            if keyword == "message":
                self.next()
                self.message(m.nested_type.add())
            elif keyword == "enum":
                self.next()
                self.enum(m.enum_type.add())
            elif keyword == "option" and self.peek(1).text != "=":
                self.next()
                self.option_statement(m.options)
            elif keyword == "oneof":
                self.next()
                self.oneof(m)
            elif keyword == "reserved":
                self.next()
                self.reserved(m.reserved_range, m.reserved_name, MAX_FIELD_NUMBER, exclusive=True)
            elif keyword == "extensions":
                self.next()
                self.extensions(m)
            elif keyword == "extend":
                self.next()
                self.extend(m.extension)
            elif token.text == "map" and self.peek(1).text == "<":
                self.next()
                self.map_field(m)
            else:
                field = self.field(m, in_oneof=False)
                if field.proto3_optional:
                    synthetic.append(field)
        # protoc appends proto3 optional fields' synthetic oneofs after the declared ones.
        for field in synthetic:
            names = {o.name for o in m.oneof_decl}
            name = "_" + field.name
            while name in names:
                name = "X" + name
            field.oneof_index = len(m.oneof_decl)
            m.oneof_decl.add().name = name

    def field(self, m: descriptor_pb2.DescriptorProto, in_oneof: bool) -> descriptor_pb2.FieldDescriptorProto:
        token = self.peek()
        label = None
        if token.kind == "ident" and token.text in ("required", "optional", "repeated") and self.peek(1).text != "=":
            if in_oneof:
                raise self.fail("fields in oneofs must not have labels")
            label = self.next().text
        if self.peek().text == "group" and self.peek(1).kind == "ident" and self.peek(2).text == "=":
            raise self.fail("groups are not supported")
        f = m.field.add()
        if label is None:
            if self.proto3 or in_oneof:
                f.label = FDP.LABEL_OPTIONAL
            else:
                raise self.fail("expected 'required', 'optional', or 'repeated'")
        elif label == "required":
            if self.proto3:
                raise self.fail("required fields are not allowed in proto3", token)
            f.label = FDP.LABEL_REQUIRED
        elif label == "repeated":
            f.label = FDP.LABEL_REPEATED
        else:
            f.label = FDP.LABEL_OPTIONAL
            if self.proto3:
                f.proto3_optional = True
        self.field_rest(f)
        return f

    def field_rest(self, f: descriptor_pb2.FieldDescriptorProto) -> None:
        type_name = self.type_name()
        if type_name in SCALARS:
            f.type = SCALARS[type_name]
        else:
            f.type_name = type_name
        f.name = self.ident()
        self.expect("=")
        f.number = self.integer()
        f.json_name = json_name(f.name)
        if self.accept("["):
            while True:
                token = self.peek()
                if token.text == "default" and self.peek(1).text == "=":
                    self.pos += 2
                    f.default_value = self.default_value(self.constant(), token, f.type)
                elif token.text == "json_name" and self.peek(1).text == "=":
                    self.pos += 2
                    f.json_name = self.text_string()
                else:
                    self.option_assignment(f.options)
                if not self.accept(","):
                    break
            self.expect("]")
        self.expect(";")

    def default_value(self, value: _Constant, token: _Token, field_type: int) -> str:
        if value.kind == "string":
            # A string default is kept as text; for bytes fields resolve() turns it into protoc's escaped form.
            return "\0" + c_escape(value.value)
        if value.kind == "ident":
            return str(value.value)
        if value.kind == "int" and field_type not in (FDP.TYPE_FLOAT, FDP.TYPE_DOUBLE):
            return str(value.value)
        if value.kind in ("int", "float"):
            v = float(value.value)
            if v != v:
                return "nan"
            if v in (float("inf"), float("-inf")):
                return "inf" if v > 0 else "-inf"
            # protoc's SimpleFtoa / SimpleDtoa: the shortest of two %g precisions that reads back the same.
            short, full = (6, 9) if field_type == FDP.TYPE_FLOAT else (15, 17)
            text = f"{v:.{short}g}"
            return text if float(text) == v else f"{v:.{full}g}"
        raise self.fail("bad default value", token)

    def map_field(self, m: descriptor_pb2.DescriptorProto) -> None:
        self.expect("<")
        key = self.type_name()
        self.expect(",")
        value = self.type_name()
        self.expect(">")
        f = m.field.add()
        f.label = FDP.LABEL_REPEATED
        name_token = self.peek()
        f.name = self.ident()
        entry = m.nested_type.add()
        entry.name = map_entry_name(f.name)
        entry.options.map_entry = True
        for number, (fname, ftype) in enumerate((("key", key), ("value", value)), start=1):
            ef = entry.field.add()
            ef.name = fname
            ef.number = number
            ef.label = FDP.LABEL_OPTIONAL
            ef.json_name = fname
            if ftype in SCALARS:
                ef.type = SCALARS[ftype]
            else:
                ef.type_name = ftype
        if key not in SCALARS or key in ("float", "double", "bytes"):
            raise self.fail(f"map key type {key!r} is not an integer, bool or string type", name_token)
        f.type = FDP.TYPE_MESSAGE
        f.type_name = entry.name
        self.expect("=")
        f.number = self.integer()
        f.json_name = json_name(f.name)
        if self.accept("["):
            while True:
                if self.peek().text == "json_name" and self.peek(1).text == "=":
                    self.pos += 2
                    f.json_name = self.text_string()
                else:
                    self.option_assignment(f.options)
                if not self.accept(","):
                    break
            self.expect("]")
        self.expect(";")

    def oneof(self, m: descriptor_pb2.DescriptorProto) -> None:
        index = len(m.oneof_decl)
        decl = m.oneof_decl.add()
        decl.name = self.ident()
        self.expect("{")
        while not self.accept("}"):
            if self.peek().kind == "eof":
                raise self.fail(f"oneof {decl.name} is not closed")
            if self.accept(";"):
                continue
            if self.peek().text == "option" and self.peek(1).text != "=":
                self.next()
                self.option_statement(decl.options)
                continue
            f = self.field(m, in_oneof=True)
            f.oneof_index = index

    def reserved(self, ranges: Any, names: Any, maximum: int, exclusive: bool) -> None:
        if self.peek().kind == "string":
            while True:
                names.append(self.text_string())
                if not self.accept(","):
                    break
        else:
            while True:
                start = self.integer()
                end = start
                if self.accept("to"):
                    end = maximum if self.accept("max") else self.integer()
                r = ranges.add()
                r.start = start
                r.end = end + 1 if exclusive else end
                if not self.accept(","):
                    break
        self.expect(";")

    def extensions(self, m: descriptor_pb2.DescriptorProto) -> None:
        added = []
        while True:
            start = self.integer()
            end = start
            if self.accept("to"):
                end = MAX_FIELD_NUMBER if self.accept("max") else self.integer()
            r = m.extension_range.add()
            r.start = start
            r.end = end + 1
            added.append(r)
            if not self.accept(","):
                break
        if self.accept("["):
            options = descriptor_pb2.ExtensionRangeOptions()
            while True:
                self.option_assignment(options)
                if not self.accept(","):
                    break
            self.expect("]")
            for r in added:
                r.options.CopyFrom(options)
        self.expect(";")

    def extend(self, fields: Any) -> None:
        extendee = self.type_name()
        self.expect("{")
        holder = descriptor_pb2.DescriptorProto()
        while not self.accept("}"):
            if self.peek().kind == "eof":
                raise self.fail("extend block is not closed")
            if self.accept(";"):
                continue
            f = self.field(holder, in_oneof=False)
            f.extendee = extendee
        for f in holder.field:
            fields.add().CopyFrom(f)

    def enum(self, e: descriptor_pb2.EnumDescriptorProto) -> None:
        e.name = self.ident()
        self.expect("{")
        while not self.accept("}"):
            token = self.peek()
            if token.kind == "eof":
                raise self.fail(f"enum {e.name} is not closed")
            if self.accept(";"):
                continue
            if token.text == "option" and self.peek(1).text != "=":
                self.next()
                self.option_statement(e.options)
            elif token.text == "reserved" and self.peek(1).text != "=":
                self.next()
                self.reserved(e.reserved_range, e.reserved_name, MAX_ENUM_NUMBER, exclusive=False)
            else:
                v = e.value.add()
                v.name = self.ident()
                self.expect("=")
                v.number = self.integer()
                if self.accept("["):
                    while True:
                        self.option_assignment(v.options)
                        if not self.accept(","):
                            break
                    self.expect("]")
                self.expect(";")

    def service(self, s: descriptor_pb2.ServiceDescriptorProto) -> None:
        s.name = self.ident()
        self.expect("{")
        while not self.accept("}"):
            token = self.peek()
            if token.kind == "eof":
                raise self.fail(f"service {s.name} is not closed")
            if self.accept(";"):
                continue
            if self.accept("option"):
                self.option_statement(s.options)
                continue
            if not self.accept("rpc"):
                raise self.fail("expected 'rpc' or 'option'")
            method = s.method.add()
            method.name = self.ident()
            self.expect("(")
            if self.peek().text == "stream" and self.peek(1).text != ")":
                self.next()
                method.client_streaming = True
            method.input_type = self.type_name()
            self.expect(")")
            self.expect("returns")
            self.expect("(")
            if self.peek().text == "stream" and self.peek(1).text != ")":
                self.next()
                method.server_streaming = True
            method.output_type = self.type_name()
            self.expect(")")
            if self.accept("{"):
                while not self.accept("}"):
                    if self.peek().kind == "eof":
                        raise self.fail(f"rpc {method.name} is not closed")
                    if self.accept(";"):
                        continue
                    self.expect("option")
                    self.option_statement(method.options)
            else:
                self.expect(";")


def set_option(
    options: Message, name: list[tuple[str, bool]], value: _Constant, fail: Callable[[str], InvalidSchema]
) -> None:
    """Set a standard option by name with its declared type; keep a custom one as an uninterpreted option."""
    descriptor = options.DESCRIPTOR
    if len(name) == 1 and not name[0][1] and name[0][0] in descriptor.fields_by_name:
        fd = descriptor.fields_by_name[name[0][0]]
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if value.kind != "aggregate":
                raise fail(f"option {fd.name} needs a {{...}} value")
            target = getattr(options, fd.name).add() if _is_repeated(fd) else getattr(options, fd.name)
            try:
                text_format.Parse(value.value, target)
            except text_format.ParseError as exc:
                raise fail(f"option {fd.name}: {exc}") from exc
            return
        converted = _convert(fd, value, fail)
        if _is_repeated(fd):
            getattr(options, fd.name).append(converted)
        else:
            setattr(options, fd.name, converted)
        return
    if len(name) == 1 and not name[0][1]:
        raise fail(f"Option {name[0][0]!r} unknown")
    option = options.uninterpreted_option.add()
    for part, is_extension in name:
        piece = option.name.add()
        piece.name_part = part
        piece.is_extension = is_extension
    if value.kind == "ident":
        option.identifier_value = value.value
    elif value.kind == "int":
        if value.value >= 0:
            option.positive_int_value = value.value
        else:
            option.negative_int_value = value.value
    elif value.kind == "float":
        option.double_value = value.value
    elif value.kind == "string":
        option.string_value = value.value
    else:
        option.aggregate_value = value.value


def _is_repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


def _convert(fd: FieldDescriptor, value: _Constant, fail: Callable[[str], InvalidSchema]) -> Any:
    t = fd.type
    if t == FieldDescriptor.TYPE_BOOL:
        if value.kind != "ident" or value.value not in ("true", "false"):
            raise fail(f"option {fd.name} needs true or false")
        return value.value == "true"
    if t == FieldDescriptor.TYPE_ENUM:
        if value.kind != "ident" or value.value not in fd.enum_type.values_by_name:
            raise fail(f"option {fd.name} needs one of {', '.join(fd.enum_type.values_by_name)}")
        return fd.enum_type.values_by_name[value.value].number
    if t == FieldDescriptor.TYPE_STRING:
        if value.kind != "string":
            raise fail(f"option {fd.name} needs a string")
        return value.value.decode("utf-8", "replace")
    if t == FieldDescriptor.TYPE_BYTES:
        if value.kind != "string":
            raise fail(f"option {fd.name} needs a string")
        return value.value
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        if value.kind not in ("int", "float"):
            raise fail(f"option {fd.name} needs a number")
        return float(value.value)
    if value.kind != "int":
        raise fail(f"option {fd.name} needs an integer")
    return value.value


def parse_proto(source: str) -> descriptor_pb2.FileDescriptorProto:
    """Parse .proto text into a FileDescriptorProto whose type names are still as written (see resolve_types)."""
    return _Parser(source).parse()


# ---------------------------------------------------------------------------------------------------------------
# Type resolution


def type_symbols(files: Iterator[descriptor_pb2.FileDescriptorProto]) -> tuple[dict[str, str], set[str]]:
    """Full names (no leading dot) of every message ("message") and enum ("enum"), and every package prefix."""
    types: dict[str, str] = {}
    packages: set[str] = set()

    def walk(prefix: str, messages: Any, enums: Any) -> None:
        for e in enums:
            types[f"{prefix}{e.name}"] = "enum"
        for m in messages:
            full = f"{prefix}{m.name}"
            types[full] = "message"
            walk(full + ".", m.nested_type, m.enum_type)

    for f in files:
        parts = f.package.split(".") if f.package else []
        for i in range(1, len(parts) + 1):
            packages.add(".".join(parts[:i]))
        walk(f"{f.package}." if f.package else "", f.message_type, f.enum_type)
    return types, packages


def _lookup(name: str, scope: str, types: dict[str, str], packages: set[str]) -> str | None:
    if name.startswith("."):
        return name[1:] if name[1:] in types else None
    first = name.split(".", 1)[0]
    while True:
        candidate = f"{scope}.{first}" if scope else first
        if candidate in types or candidate in packages:
            full = f"{scope}.{name}" if scope else name
            if full in types:
                return full
        if not scope:
            return None
        scope = scope.rsplit(".", 1)[0] if "." in scope else ""


def resolve_types(f: descriptor_pb2.FileDescriptorProto, types: dict[str, str], packages: set[str]) -> None:
    """Qualify every type name fully (".pkg.Msg"), set message/enum types, finish defaults, as protoc does."""

    def fix_field(field: descriptor_pb2.FieldDescriptorProto, scope: str) -> None:
        if field.type_name:
            full = _lookup(field.type_name, scope, types, packages)
            if full is None:
                raise InvalidSchema(f'Could not parse Protobuf: "{field.type_name}" is not defined')
            field.type_name = "." + full
            kind = types[full]
            if not field.HasField("type") or field.type in (FDP.TYPE_MESSAGE, FDP.TYPE_ENUM):
                field.type = FDP.TYPE_ENUM if kind == "enum" else FDP.TYPE_MESSAGE
        if field.extendee:
            full = _lookup(field.extendee, scope, types, packages)
            if full is None:
                raise InvalidSchema(f'Could not parse Protobuf: "{field.extendee}" is not defined')
            field.extendee = "." + full
        if field.HasField("default_value") and field.default_value.startswith("\0"):
            escaped = field.default_value[1:]
            if field.type == FDP.TYPE_STRING:
                field.default_value = unescape('"' + escaped + '"').decode("utf-8", "replace")
            elif field.type == FDP.TYPE_BYTES:
                field.default_value = escaped
            else:
                raise InvalidSchema(f"Could not parse Protobuf: field {field.name} has a string default")

    def walk(scope: str, messages: Any, extensions: Any) -> None:
        for ext in extensions:
            fix_field(ext, scope)
        for m in messages:
            full = f"{scope}.{m.name}" if scope else m.name
            for field in m.field:
                fix_field(field, full)
            walk(full, m.nested_type, m.extension)

    walk(f.package, f.message_type, f.extension)
    for service in f.service:
        scope = f"{f.package}.{service.name}" if f.package else service.name
        for method in service.method:
            for attr in ("input_type", "output_type"):
                name = getattr(method, attr)
                full = _lookup(name, scope, types, packages)
                if full is None or types.get(full) != "message":
                    raise InvalidSchema(f'Could not parse Protobuf: "{name}" is not a message type')
                setattr(method, attr, "." + full)


# ---------------------------------------------------------------------------------------------------------------
# Printing a descriptor back to .proto text (the canonical form).


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (bytes, str)):
        return quote(value)
    return str(value)


def _option_items(options: Message) -> list[str]:
    """`name = value` for every option set, in field-number order, then the uninterpreted (custom) ones."""
    items: list[str] = []
    for fd, value in options.ListFields():
        if fd.name == "uninterpreted_option":
            continue
        values = value if _is_repeated(fd) else [value]
        for v in values:
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                items.append(f"{fd.name} = {{ {text_format.MessageToString(v, as_one_line=True)} }}")
            elif fd.type == FieldDescriptor.TYPE_ENUM:
                enum_value = fd.enum_type.values_by_number.get(v)
                items.append(f"{fd.name} = {enum_value.name if enum_value else v}")
            else:
                items.append(f"{fd.name} = {_scalar_text(v)}")
    for option in getattr(options, "uninterpreted_option", ()):
        name = ".".join(f"({p.name_part})" if p.is_extension else p.name_part for p in option.name)
        if option.HasField("identifier_value"):
            text = option.identifier_value
        elif option.HasField("positive_int_value"):
            text = str(option.positive_int_value)
        elif option.HasField("negative_int_value"):
            text = str(option.negative_int_value)
        elif option.HasField("double_value"):
            text = _scalar_text(option.double_value)
        elif option.HasField("string_value"):
            text = quote(option.string_value)
        else:
            text = "{ " + option.aggregate_value + " }"
        items.append(f"{name} = {text}")
    return items


class Printer:
    """Deterministic .proto text of a FileDescriptorProto."""

    def __init__(self, f: descriptor_pb2.FileDescriptorProto) -> None:
        self.f = f
        self.proto3 = f.syntax == "proto3"
        self.lines: list[str] = []

    def out(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def print(self) -> str:
        f = self.f
        self.out(0, f'syntax = "{"proto3" if self.proto3 else "proto2"}";')
        if f.package:
            self.out(0, f"package {f.package};")
        for i, dep in enumerate(f.dependency):
            kind = "public " if i in f.public_dependency else "weak " if i in f.weak_dependency else ""
            self.out(0, f"import {kind}{quote(dep)};")
        for item in _option_items(f.options):
            self.out(0, f"option {item};")
        for m in f.message_type:
            self.message(m, 0)
        for e in f.enum_type:
            self.enum(e, 0)
        for s in f.service:
            self.service(s)
        self.extensions(f.extension, 0)
        return "\n".join(self.lines) + "\n"

    def type_of(self, field: descriptor_pb2.FieldDescriptorProto) -> str:
        if field.type in SCALAR_NAMES and not field.type_name:
            return SCALAR_NAMES[field.type]
        return field.type_name

    def field_line(self, field: descriptor_pb2.FieldDescriptorProto, in_oneof: bool, type_text: str = "") -> str:
        label = ""
        if not in_oneof and not type_text:
            if field.label == FDP.LABEL_REPEATED:
                label = "repeated "
            elif field.label == FDP.LABEL_REQUIRED:
                label = "required "
            elif not self.proto3 or field.proto3_optional:
                label = "optional "
        items = []
        if field.HasField("default_value"):
            if field.type == FDP.TYPE_STRING:
                items.append(f"default = {quote(field.default_value)}")
            elif field.type == FDP.TYPE_BYTES:
                items.append(f'default = "{field.default_value}"')
            else:
                items.append(f"default = {field.default_value}")
        if field.HasField("json_name") and field.json_name != json_name(field.name):
            items.append(f"json_name = {quote(field.json_name)}")
        items.extend(_option_items(field.options))
        opts = f" [{', '.join(items)}]" if items else ""
        return f"{label}{type_text or self.type_of(field)} {field.name} = {field.number}{opts};"

    def message(self, m: descriptor_pb2.DescriptorProto, depth: int) -> None:
        self.out(depth, f"message {m.name} {{")
        inner = depth + 1
        for item in _option_items(m.options):
            self.out(inner, f"option {item};")
        # Fields and nested messages are interleaved so that reading the text back recreates nested_type in the
        # same order (a map field creates its entry message where it stands): message indexes in Confluent's
        # wire format count nested types, map entries included.
        entries = {n.name: n for n in m.nested_type if n.options.map_entry}
        fields = list(m.field)
        done_oneofs: set[int] = set()
        position = 0

        def entry_of(field: descriptor_pb2.FieldDescriptorProto) -> descriptor_pb2.DescriptorProto | None:
            name = field.type_name.rsplit(".", 1)[-1]
            if field.label != FDP.LABEL_REPEATED or field.type != FDP.TYPE_MESSAGE or name not in entries:
                return None
            return entries[name] if field.type_name.endswith(f"{m.name}.{name}") else None

        def emit_until(last: int) -> None:
            nonlocal position
            while position <= last:
                self.member(m, fields[position], entry_of(fields[position]), done_oneofs, inner)
                position += 1

        for nested in m.nested_type:
            if nested.options.map_entry:
                owner = next((i for i, f in enumerate(fields) if entry_of(f) is nested), -1)
                emit_until(owner)
            else:
                self.message(nested, inner)
        emit_until(len(fields) - 1)
        for e in m.enum_type:
            self.enum(e, inner)
        for r in m.extension_range:
            end = "max" if r.end - 1 >= MAX_FIELD_NUMBER else str(r.end - 1)
            text = str(r.start) if r.end - 1 == r.start else f"{r.start} to {end}"
            items = _option_items(r.options)
            self.out(inner, f"extensions {text}{' [' + ', '.join(items) + ']' if items else ''};")
        self.extensions(m.extension, inner)
        self.reserved(m.reserved_range, m.reserved_name, inner, MAX_FIELD_NUMBER, exclusive=True)
        self.out(depth, "}")

    def member(
        self,
        m: descriptor_pb2.DescriptorProto,
        field: descriptor_pb2.FieldDescriptorProto,
        entry: descriptor_pb2.DescriptorProto | None,
        done_oneofs: set[int],
        depth: int,
    ) -> None:
        """One field of a message; a oneof is printed whole where its first field stands."""
        if field.HasField("oneof_index") and not field.proto3_optional:
            index = field.oneof_index
            if index in done_oneofs:
                return
            done_oneofs.add(index)
            decl = m.oneof_decl[index]
            self.out(depth, f"oneof {decl.name} {{")
            for item in _option_items(decl.options):
                self.out(depth + 1, f"option {item};")
            for other in m.field:
                if other.HasField("oneof_index") and other.oneof_index == index and not other.proto3_optional:
                    self.out(depth + 1, self.field_line(other, in_oneof=True))
            self.out(depth, "}")
        elif entry is not None:
            key, value = self.type_of(entry.field[0]), self.type_of(entry.field[1])
            self.out(depth, self.field_line(field, in_oneof=False, type_text=f"map<{key}, {value}>"))
        else:
            self.out(depth, self.field_line(field, in_oneof=False))

    def reserved(self, ranges: Any, names: Any, depth: int, maximum: int, exclusive: bool) -> None:
        parts = []
        for r in ranges:
            end = r.end - 1 if exclusive else r.end
            if end == r.start:
                parts.append(str(r.start))
            else:
                parts.append(f"{r.start} to {'max' if end >= maximum else end}")
        if parts:
            self.out(depth, f"reserved {', '.join(parts)};")
        if names:
            self.out(depth, f"reserved {', '.join(quote(n) for n in names)};")

    def enum(self, e: descriptor_pb2.EnumDescriptorProto, depth: int) -> None:
        self.out(depth, f"enum {e.name} {{")
        for item in _option_items(e.options):
            self.out(depth + 1, f"option {item};")
        for v in e.value:
            items = _option_items(v.options)
            self.out(depth + 1, f"{v.name} = {v.number}{' [' + ', '.join(items) + ']' if items else ''};")
        self.reserved(e.reserved_range, e.reserved_name, depth + 1, MAX_ENUM_NUMBER, exclusive=False)
        self.out(depth, "}")

    def service(self, s: descriptor_pb2.ServiceDescriptorProto) -> None:
        self.out(0, f"service {s.name} {{")
        for item in _option_items(s.options):
            self.out(1, f"option {item};")
        for method in s.method:
            cin = "stream " if method.client_streaming else ""
            cout = "stream " if method.server_streaming else ""
            head = f"rpc {method.name}({cin}{method.input_type}) returns ({cout}{method.output_type})"
            items = _option_items(method.options)
            if items:
                self.out(1, head + " {")
                for item in items:
                    self.out(2, f"option {item};")
                self.out(1, "}")
            else:
                self.out(1, head + ";")
        self.out(0, "}")

    def extensions(self, fields: Any, depth: int) -> None:
        groups: dict[str, list[descriptor_pb2.FieldDescriptorProto]] = {}
        for field in fields:
            groups.setdefault(field.extendee, []).append(field)
        for extendee, members in groups.items():
            self.out(depth, f"extend {extendee} {{")
            for field in members:
                self.out(depth + 1, self.field_line(field, in_oneof=False))
            self.out(depth, "}")


def print_proto(f: descriptor_pb2.FileDescriptorProto) -> str:
    return Printer(f).print()
