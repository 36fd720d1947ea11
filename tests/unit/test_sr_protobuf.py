"""Protobuf in the schema registry: .proto text and serialized descriptors, canonical text, Confluent's rules."""

from __future__ import annotations

import base64

import pytest
from google.protobuf import (
    any_pb2,
    api_pb2,
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    source_context_pb2,
    struct_pb2,
    timestamp_pb2,
    type_pb2,
)

from pykbroker.schema_registry.formats import InvalidReference, InvalidSchema, check_compatibility, parse
from pykbroker.schema_registry.formats.protobuf import ProtobufSchema


def proto(text: str, references: dict[str, str] | None = None) -> ProtobufSchema:
    parsed = parse("PROTOBUF", text, references or {})
    assert isinstance(parsed, ProtobufSchema)
    return parsed


def b64(serialized: bytes) -> str:
    return base64.standard_b64encode(serialized).decode("ascii")


P3 = 'syntax = "proto3";\n'
P2 = 'syntax = "proto2";\n'
STATUS = "message Status { string test_string = 1; }"

# Confluent's own Protobuf diff examples (the cases of diff-schema-examples.json in Confluent's protobuf provider,
# https://github.com/confluentinc/schema-registry/blob/master/protobuf-provider/src/test/resources/diff-schema-examples.json),
# checked BACKWARD as there, plus FORWARD/FULL variants of Confluent's documented rules
# (https://docs.confluent.io/platform/current/schema-registry/fundamentals/serdes-develop/serdes-protobuf.html).
COMPATIBILITY = [
    # (description, old, new, level, compatible?)
    (
        "field added",
        P3 + "package foo; message TestMessage { string test_string = 1; }",
        P3 + "package foo; message TestMessage { string test_string = 1; float test_float = 3; }",
        "BACKWARD",
        True,
    ),
    (
        "package changed",
        P3 + f"package foo; message TestMessage {{ string s = 1; .foo.TestMessage.Status st = 2; {STATUS} }}",
        P3 + f"package bar; message TestMessage {{ string s = 1; .bar.TestMessage.Status st = 2; {STATUS} }}",
        "BACKWARD",
        False,
    ),
    (
        "name qualification changed",
        P3 + f"message TestMessage {{ string s = 1; Status st = 2; {STATUS} }}",
        P3 + f"message TestMessage {{ string s = 1; .TestMessage.Status st = 2; {STATUS} }}",
        "BACKWARD",
        True,
    ),
    (
        "required field added",
        P2 + "message TestMessage { optional string a = 1; }",
        P2 + "message TestMessage { optional string a = 1; required string b = 2; }",
        "BACKWARD",
        False,
    ),
    (
        "required field removed",
        P2 + "message TestMessage { optional string a = 1; required string b = 2; }",
        P2 + "message TestMessage { optional string a = 1; }",
        "BACKWARD",
        False,
    ),
    (
        "field added to a nested type",
        P3 + "message Wrapper { int32 w = 1; message T { string a = 1; } }",
        P3 + "message Wrapper { int32 w = 1; message T { string a = 1; string b = 2; } }",
        "BACKWARD",
        True,
    ),
    (
        "field removed",
        P3 + "message TestMessage { string a = 1; string b = 2; }",
        P3 + "message TestMessage { string a = 1; }",
        "BACKWARD",
        True,
    ),
    (
        "field number changed",
        P3 + "message TestMessage { string a = 1; }",
        P3 + "message TestMessage { string a = 2; }",
        "BACKWARD",
        True,
    ),
    (
        "int32 to int64",
        P3 + "message TestMessage { string a = 1; int32 n = 2; }",
        P3 + "message TestMessage { string a = 1; int64 n = 2; }",
        "FULL",
        True,
    ),
    (
        "string to bytes",
        P3 + "message TestMessage { string a = 1; string b = 2; }",
        P3 + "message TestMessage { string a = 1; bytes b = 2; }",
        "BACKWARD",
        True,
    ),
    (
        "int32 to enum",
        P3 + "message TestMessage { string a = 1; int32 n = 2; }",
        P3 + "message TestMessage { string a = 1; Status n = 2; } enum Status { ACTIVE = 0; INACTIVE = 1; }",
        "BACKWARD",
        True,
    ),
    (
        "int32 to message",
        P3 + "message TestMessage { string a = 1; int32 n = 2; }",
        P3 + f"message TestMessage {{ string a = 1; .TestMessage.Status n = 2; {STATUS} }}",
        "BACKWARD",
        False,
    ),
    (
        "enum constant renamed",
        P3 + "message M { Status s = 2; } enum Status { ACTIVE = 0; INACTIVE = 1; }",
        P3 + "message M { Status s = 2; } enum Status { ACTIVE = 0; NOT_ACTIVE = 1; }",
        "BACKWARD",
        True,
    ),
    (
        "one field moved into a new oneof",
        P3 + "message M { string a = 1; string b = 2; }",
        P3 + "message M { string a = 1; oneof o { string b = 2; int32 c = 3; } }",
        "BACKWARD",
        True,
    ),
    (
        "two fields moved into a new oneof",
        P3 + "message M { string a = 1; string b = 2; }",
        P3 + "message M { oneof o { string a = 1; string b = 2; int32 c = 3; } }",
        "BACKWARD",
        False,
    ),
    (
        "field added to a oneof",
        P3 + "message M { oneof o { string a = 1; string b = 2; } }",
        P3 + "message M { oneof o { string a = 1; string b = 2; int32 c = 3; } }",
        "BACKWARD",
        True,
    ),
    (
        "field removed from a oneof",
        P3 + "message M { oneof o { string a = 1; string b = 2; int32 c = 3; } }",
        P3 + "message M { oneof o { string a = 1; string b = 2; } }",
        "BACKWARD",
        False,
    ),
    (
        "field moved into an existing (renamed) oneof",
        P3 + "message M { string a = 1; oneof o { string b = 2; string c = 3; } }",
        P3 + "message M { oneof o2 { string a = 1; string b = 2; string c = 3; } }",
        "BACKWARD",
        False,
    ),
    (
        "message type renamed",
        P3 + "message M { string a = 1; T2 t = 2; } message T2 { string s1 = 1; }",
        P3 + "message M { string a = 1; T3 t = 2; } message T3 { string s1 = 1; }",
        "BACKWARD",
        False,
    ),
    (
        "int32 to string",
        P3 + "message M { string a = 1; int32 n = 2; }",
        P3 + "message M { string a = 1; string n = 2; }",
        "BACKWARD",
        False,
    ),
    (
        "map value type changed",
        P3 + "message M { map<string, int32> m = 2; }",
        P3 + "message M { map<string, string> m = 2; }",
        "BACKWARD",
        False,
    ),
    (
        "map value name qualification changed",
        P3 + f"message M {{ map<string, Status> m = 2; {STATUS} }}",
        P3 + f"message M {{ map<string, M.Status> m = 2; {STATUS} }}",
        "BACKWARD",
        True,
    ),
    (
        "optional message to repeated",
        P3 + f"message M {{ optional Status s = 2; {STATUS} }}",
        P3 + f"message M {{ repeated Status s = 2; {STATUS} }}",
        "BACKWARD",
        True,
    ),
    (
        "optional string to repeated",
        P3 + "message M { optional string s = 1; }",
        P3 + "message M { repeated string s = 1; }",
        "BACKWARD",
        True,
    ),
    (
        "optional int32 to repeated",
        P3 + "message M { optional int32 n = 1; }",
        P3 + "message M { repeated int32 n = 1; }",
        "BACKWARD",
        False,
    ),
    (
        "message added",
        P3 + "message M { string a = 1; }",
        P3 + "message M { string a = 1; } message M2 { string a = 1; }",
        "BACKWARD",
        True,
    ),
    (
        "message order changed",
        P3 + "message M { string a = 1; } message M2 { string a = 1; }",
        P3 + "message M2 { string a = 1; } message M { string a = 1; }",
        "FULL",
        True,
    ),
    (
        "message removed",
        P3 + "message M { string a = 1; } message M2 { string a = 1; }",
        P3 + "message M { string a = 1; }",
        "BACKWARD",
        False,
    ),
    (
        "message added, forward",
        P3 + "message M { string a = 1; }",
        P3 + "message M { string a = 1; } message M2 { string a = 1; }",
        "FORWARD",
        False,
    ),
    (
        "nested message's field type changed incompatibly",
        P3 + "message M { Inner i = 1; } message Inner { int32 n = 1; }",
        P3 + "message M { Inner i = 1; } message Inner { double n = 1; }",
        "BACKWARD",
        False,
    ),
    (
        "sint32 to sint64",
        P3 + "message M { sint32 n = 1; }",
        P3 + "message M { sint64 n = 1; }",
        "FULL",
        True,
    ),
    ("sint32 to int32", P3 + "message M { sint32 n = 1; }", P3 + "message M { int32 n = 1; }", "BACKWARD", False),
    ("fixed32 to sfixed32", P3 + "message M { fixed32 n = 1; }", P3 + "message M { sfixed32 n = 1; }", "FULL", True),
    ("fixed32 to fixed64", P3 + "message M { fixed32 n = 1; }", P3 + "message M { fixed64 n = 1; }", "BACKWARD", False),
    (
        "field made proto3 optional",
        P3 + "message M { string a = 1; }",
        P3 + "message M { optional string a = 1; }",
        "FULL",
        True,
    ),
    ("syntax changed", P2 + "message M { optional string a = 1; }", P3 + "message M { string a = 1; }", "FULL", True),
]


@pytest.mark.parametrize(
    ("description", "old", "new", "level", "compatible"), COMPATIBILITY, ids=[c[0] for c in COMPATIBILITY]
)
def test_compatibility(description: str, old: str, new: str, level: str, compatible: bool) -> None:
    messages = check_compatibility(level, proto(new), [proto(old)])
    assert (messages == []) is compatible, messages


def test_incompatibility_messages_name_the_rule_and_path() -> None:
    old = proto(P3 + "message M { string a = 1; int32 n = 2; }")
    new = proto(P3 + "message M { string a = 1; string n = 2; }")
    assert check_compatibility("BACKWARD", new, [old]) == [
        "FIELD_SCALAR_KIND_CHANGED: The kind of a SCALAR field at path '#/M/2' in the reader schema does not match "
        "its kind in the writer schema"
    ]


STRUCT_PROTO = """
// Protocol Buffers - Google's data interchange format (the well-known Struct types, written by hand)
syntax = "proto3";

package google.protobuf;

option cc_enable_arenas = true;
option go_package = "google.golang.org/protobuf/types/known/structpb";
option java_package = "com.google.protobuf";
option java_outer_classname = "StructProto";
option java_multiple_files = true;
option objc_class_prefix = "GPB";
option csharp_namespace = "Google.Protobuf.WellKnownTypes";

message Struct {
  map<string, Value> fields = 1;  /* a map field */
}

message Value {
  oneof kind {
    NullValue null_value = 1;
    double number_value = 2;
    string string_value = 3;
    bool bool_value = 4;
    Struct struct_value = 5;
    ListValue list_value = 6;
  }
}

enum NullValue {
  NULL_VALUE = 0;
}

message ListValue {
  repeated Value values = 1;
}
"""


def test_text_and_serialized_descriptor_of_one_file_are_one_schema() -> None:
    from_text = proto(STRUCT_PROTO)
    from_descriptor = proto(b64(struct_pb2.DESCRIPTOR.serialized_pb))
    assert from_text.canonical() == from_descriptor.canonical()
    assert "map<string, .google.protobuf.Value> fields = 1;" in from_text.canonical()
    # The descriptor built from text is what protoc builds, field by field.
    expected = descriptor_pb2.FileDescriptorProto.FromString(struct_pb2.DESCRIPTOR.serialized_pb)
    expected.ClearField("name")
    assert from_text.descriptor == expected
    timestamp_text = P3 + (
        "package google.protobuf;\n"
        'option cc_enable_arenas = true; option go_package = "google.golang.org/protobuf/types/known/timestamppb";\n'
        'option java_package = "com.google.protobuf"; option java_outer_classname = "TimestampProto";\n'
        'option java_multiple_files = true; option objc_class_prefix = "GPB";\n'
        'option csharp_namespace = "Google.Protobuf.WellKnownTypes";\n'
        "message Timestamp { int64 seconds = 1; int32 nanos = 2; }\n"
    )
    assert proto(timestamp_text).canonical() == proto(b64(timestamp_pb2.DESCRIPTOR.serialized_pb)).canonical()


def test_canonical_text_parses_back_to_the_same_descriptor() -> None:
    # descriptor.proto is a large proto2 file: nested enums, defaults, extension ranges, reserved ranges,
    # packed and deprecated options, message-valued options.
    original = proto(b64(descriptor_pb2.DESCRIPTOR.serialized_pb))
    again = proto(original.canonical())
    assert again.canonical() == original.canonical()
    expected = descriptor_pb2.FileDescriptorProto.FromString(descriptor_pb2.DESCRIPTOR.serialized_pb)
    expected.ClearField("name")
    assert again.descriptor == expected
    assert "optional bool packed = 2;" in original.canonical()
    assert "optional .google.protobuf.FieldOptions.CType ctype = 1 [default = STRING];" in original.canonical()


def test_canonical_ignores_layout_and_comments() -> None:
    a = proto(P3 + "package p;\nmessage M {\n  string a = 1; // the name\n  int32 b = 2;\n}\n")
    b = proto('syntax="proto3";package p;/* x */message M{string a=1;int32 b=2;}')
    assert a.canonical() == b.canonical()
    assert a.canonical() == 'syntax = "proto3";\npackage p;\nmessage M {\n  string a = 1;\n  int32 b = 2;\n}\n'
    c = proto(P3 + "package p; message M { string a = 1; int64 b = 2; }")
    assert c.canonical() != a.canonical()


def test_normalized_orders_fields_by_number() -> None:
    a = proto(P3 + "message M { string a = 1; int32 b = 2; }")
    b = proto(P3 + "message M { int32 b = 2; string a = 1; }")
    assert a.canonical() != b.canonical()
    assert a.normalized() == b.normalized()


def test_proto_features_survive_the_round_trip() -> None:
    text = (
        P2
        + """
    package shop.v1;
    import "google/protobuf/timestamp.proto";
    option java_package = "com.shop";
    message Order {
      option deprecated = true;
      required int64 id = 1 [json_name = "orderId"];
      optional string note = 2 [default = "a \\"quoted\\" note\\n"];
      optional bytes raw = 3 [default = "\\001\\377"];
      optional Kind kind = 4 [default = SMALL];
      repeated int32 sizes = 5 [packed = true];
      optional .google.protobuf.Timestamp at = 6;
      map<string, Line> lines = 7;
      oneof payment { string card = 8; string cash = 9; }
      optional double ratio = 10 [default = -1.5];
      enum Kind {
        option allow_alias = true; SMALL = 0; LITTLE = 0; LARGE = 1 [deprecated = true];
        reserved 5 to 9, 20 to max; reserved "HUGE";
      }
      message Line { optional string sku = 1; }
      reserved 15, 100 to 200;
      reserved "old";
      extensions 1000 to max;
    }
    extend Order { optional string tag = 1000; }
    service Orders {
      rpc Get(Order) returns (stream Order);
      rpc Put(Order) returns (Order) { option deprecated = true; }
    }
    """
    )
    parsed = proto(text)
    again = proto(parsed.canonical())
    assert again.canonical() == parsed.canonical()
    assert again.descriptor == parsed.descriptor
    canonical = parsed.canonical()
    for piece in (
        'import "google/protobuf/timestamp.proto";',
        'required int64 id = 1 [json_name = "orderId"];',
        'optional string note = 2 [default = "a \\"quoted\\" note\\n"];',
        'optional bytes raw = 3 [default = "\\001\\377"];',
        "optional .shop.v1.Order.Kind kind = 4 [default = SMALL];",
        "repeated int32 sizes = 5 [packed = true];",
        "map<string, .shop.v1.Order.Line> lines = 7;",
        "oneof payment {",
        "optional double ratio = 10 [default = -1.5];",
        "reserved 5 to 9, 20 to max;",
        "reserved 15, 100 to 200;",
        "extensions 1000 to max;",
        "extend .shop.v1.Order {",
        "rpc Get(.shop.v1.Order) returns (stream .shop.v1.Order);",
    ):
        assert piece in canonical, piece
    field = next(f for f in parsed.descriptor.message_type[0].field if f.name == "note")
    assert field.default_value == 'a "quoted" note\n'


def test_proto3_optional_fields_get_synthetic_oneofs() -> None:
    parsed = proto(P3 + "message M { optional string x = 1; oneof o { int32 y = 2; } optional int32 z = 3; }")
    message = parsed.descriptor.message_type[0]
    assert [o.name for o in message.oneof_decl] == ["o", "_x", "_z"]  # where protoc puts them
    assert [f.oneof_index for f in message.field] == [1, 0, 2]
    assert "  optional string x = 1;\n  oneof o {\n    int32 y = 2;\n  }\n  optional int32 z = 3;" in parsed.canonical()
    assert proto(parsed.canonical()).descriptor == parsed.descriptor


def test_serialized_format_feeds_the_python_deserializer() -> None:
    # What confluent-kafka's ProtobufDeserializer does with ?format=serialized: decode, add to a pool, build classes.
    parsed = proto(
        P3 + 'package demo; option (company.owner) = "team-a";\n'
        "message User { string name = 1 [(company.pii) = true]; int64 id = 2; repeated string tags = 3; }"
    )
    assert 'option (company.owner) = "team-a";' in parsed.canonical()
    assert "string name = 1 [(company.pii) = true];" in parsed.canonical()
    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.standard_b64decode(parsed.formatted("serialized")))
    fdp.name = "default"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    user_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("demo.User"))
    user = user_class(name="ann", id=7, tags=["a", "b"])
    assert user_class.FromString(user.SerializeToString()) == user
    assert parsed.formatted("") == parsed.canonical()


def test_what_the_python_serializer_registers_round_trips() -> None:
    # ProtobufSerializer registers base64 of the generated module's FileDescriptorProto; with skip.known.types
    # off it also registers each import (base64 too) under its own subject and passes them as references.
    references = {
        module.DESCRIPTOR.name: b64(module.DESCRIPTOR.serialized_pb)
        for module in (any_pb2, source_context_pb2, type_pb2)
    }
    registered = b64(api_pb2.DESCRIPTOR.serialized_pb)
    with_refs = proto(registered, references)
    builtin = proto(registered)  # google/protobuf/* resolve without references too
    assert with_refs.canonical() == builtin.canonical()
    assert 'import "google/protobuf/source_context.proto";' in builtin.canonical()
    # The lookup the serializer does next sends the same text again: same canonical, so the same id.
    assert proto(registered).canonical() == with_refs.canonical()
    assert check_compatibility("FULL_TRANSITIVE", builtin, [with_refs]) == []


def test_references_resolve_imports() -> None:
    other = P3 + "package other; message Thing { string id = 1; }"
    parsed = proto(P3 + 'import "other.proto"; message M { other.Thing t = 1; }', {"other.proto": other})
    assert "optional" not in parsed.canonical()
    assert ".other.Thing t = 1;" in parsed.canonical()
    changed = P3 + "package other; message Thing { int64 id = 1; }"
    newer = proto(P3 + 'import "other.proto"; message M { other.Thing t = 1; }', {"other.proto": changed})
    assert check_compatibility("BACKWARD", newer, [parsed]) != []
    # A reference given as a serialized descriptor works too.
    as_descriptor = b64(proto(other).descriptor.SerializeToString())
    same = proto(P3 + 'import "other.proto"; message M { other.Thing t = 1; }', {"other.proto": as_descriptor})
    assert same.canonical() == parsed.canonical()


def test_missing_import_is_an_invalid_reference() -> None:
    with pytest.raises(InvalidReference, match="other.proto"):
        proto(P3 + 'import "other.proto"; message M { other.Thing t = 1; }')


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (P3 + "message M { string a = 1 }", "line 2: expected ';'"),
        (P3 + "message M { Unknown a = 1; }", '"Unknown" is not defined'),
        (P3 + "message M { string a = 1; int32 b = 1; }", "duplicate field number"),
        (P3 + "message M { required string a = 1; }", "required fields are not allowed in proto3"),
        (P2 + "message M { string a = 1; }", "expected 'required', 'optional', or 'repeated'"),
        ('syntax = "proto4"; message M {}', "proto2"),
        (P3 + "message M { map<double, string> m = 1; }", "map key type"),
        (P3 + "message M { string a = 1; ", "not closed"),
        ("  \n", "empty"),
        (P3 + "message M { string a = 09; }", "bad integer"),
        ('edition = "2023";', "editions are not supported"),
        (P3 + "message M { string a = 1 [no_such_option = true]; }", "no_such_option"),
    ],
)
def test_invalid_schemas_say_why(text: str, reason: str) -> None:
    with pytest.raises(InvalidSchema, match=reason.replace("(", r"\(").replace(")", r"\)")):
        proto(text)
