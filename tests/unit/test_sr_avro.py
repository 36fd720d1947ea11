"""Avro in the schema registry: validation, Confluent's canonical text, and Avro's schema-resolution rules."""

from __future__ import annotations

import json

import fastavro
import pytest

from pykbroker.schema_registry.formats import InvalidReference, InvalidSchema, check_compatibility, parse


def avro(schema: object, references: dict[str, str] | None = None) -> object:
    written = isinstance(schema, str) and schema.lstrip()[:1] in ("{", "[", '"')
    return parse("AVRO", schema if written else json.dumps(schema), references or {})


def record(*fields: dict[str, object], name: str = "User", **extra: object) -> dict[str, object]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


F1 = {"name": "f1", "type": "string"}
F2_DEFAULT = {"name": "f2", "type": "string", "default": "foo"}
F2 = {"name": "f2", "type": "string"}

# Cases from Confluent's "Schema Evolution and Compatibility" page
# (https://docs.confluent.io/platform/current/schema-registry/fundamentals/schema-evolution.md: add optional fields and
# delete fields under BACKWARD, the reverse under FORWARD, only optional ones under FULL; transitive levels against
# every version) and from the Avro specification's schema resolution rules
# (https://avro.apache.org/docs/1.11.1/specification/#schema-resolution: promotions, enums, unions, names, fixed).
COMPATIBILITY = [
    # (description, old, new, level, compatible?)
    ("add a field with a default", record(F1), record(F1, F2_DEFAULT), "BACKWARD", True),
    ("add a field without a default", record(F1), record(F1, F2), "BACKWARD", False),
    ("add a field without a default, forward", record(F1), record(F1, F2), "FORWARD", True),
    ("delete a field", record(F1, F2), record(F1), "BACKWARD", True),
    ("delete a field without default, forward", record(F1, F2), record(F1), "FORWARD", False),
    ("delete a field with default, forward", record(F1, F2_DEFAULT), record(F1), "FORWARD", True),
    ("add an optional field, full", record(F1), record(F1, F2_DEFAULT), "FULL", True),
    ("add a mandatory field, full", record(F1), record(F1, F2), "FULL", False),
    (
        "int promoted to long",
        record({"name": "n", "type": "int"}),
        record({"name": "n", "type": "long"}),
        "BACKWARD",
        True,
    ),
    ("long read as int", record({"name": "n", "type": "int"}), record({"name": "n", "type": "long"}), "FORWARD", False),
    (
        "int promoted to double",
        record({"name": "n", "type": "int"}),
        record({"name": "n", "type": "double"}),
        "BACKWARD",
        True,
    ),
    (
        "long promoted to float",
        record({"name": "n", "type": "long"}),
        record({"name": "n", "type": "float"}),
        "BACKWARD",
        True,
    ),
    (
        "float promoted to double",
        record({"name": "n", "type": "float"}),
        record({"name": "n", "type": "double"}),
        "FULL",
        False,
    ),
    (
        "string and bytes interchange",
        record({"name": "s", "type": "string"}),
        record({"name": "s", "type": "bytes"}),
        "FULL",
        True,
    ),
    ("int to string", record({"name": "n", "type": "int"}), record({"name": "n", "type": "string"}), "BACKWARD", False),
    (
        "enum symbol added",
        {"type": "enum", "name": "Suit", "symbols": ["SPADES", "HEARTS"]},
        {"type": "enum", "name": "Suit", "symbols": ["SPADES", "HEARTS", "CLUBS"]},
        "BACKWARD",
        True,
    ),
    (
        "enum symbol added, old reader without default",
        {"type": "enum", "name": "Suit", "symbols": ["SPADES", "HEARTS"]},
        {"type": "enum", "name": "Suit", "symbols": ["SPADES", "HEARTS", "CLUBS"]},
        "FORWARD",
        False,
    ),
    (
        "enum symbol added, old reader with a default",
        {"type": "enum", "name": "Suit", "symbols": ["SPADES", "HEARTS"], "default": "SPADES"},
        {"type": "enum", "name": "Suit", "symbols": ["SPADES", "HEARTS", "CLUBS"]},
        "FORWARD",
        True,
    ),
    ("writer branch found in reader union", "string", ["null", "string"], "BACKWARD", True),
    ("writer union branch missing in reader", ["null", "string"], "string", "BACKWARD", False),
    ("union widened", ["null", "string"], ["null", "string", "int"], "BACKWARD", True),
    ("union narrowed", ["null", "string", "int"], ["null", "string"], "BACKWARD", False),
    ("int written, union with long read", "int", ["null", "long"], "BACKWARD", True),
    ("record renamed", record(F1, name="A"), record(F1, name="B"), "BACKWARD", False),
    ("record renamed with an alias", record(F1, name="A"), record(F1, name="B", aliases=["A"]), "BACKWARD", True),
    ("namespace changed", record(F1, namespace="a"), record(F1, namespace="b"), "FULL", True),
    (
        "field renamed with an alias",
        record(F1),
        record({"name": "first", "type": "string", "aliases": ["f1"]}),
        "BACKWARD",
        True,
    ),
    ("field renamed without an alias", record(F1), record({"name": "first", "type": "string"}), "BACKWARD", False),
    (
        "fixed size changed",
        {"type": "fixed", "name": "Md5", "size": 16},
        {"type": "fixed", "name": "Md5", "size": 32},
        "BACKWARD",
        False,
    ),
    ("array items promoted", {"type": "array", "items": "int"}, {"type": "array", "items": "long"}, "BACKWARD", True),
    ("map values changed", {"type": "map", "values": "int"}, {"type": "map", "values": "string"}, "BACKWARD", False),
    ("array to map", {"type": "array", "items": "int"}, {"type": "map", "values": "int"}, "BACKWARD", False),
    (
        "recursive record gains an optional field",
        record(
            {"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"], "default": None}, name="Node"
        ),
        record(
            {"name": "value", "type": "int"},
            {"name": "next", "type": ["null", "Node"], "default": None},
            {"name": "label", "type": "string", "default": ""},
            name="Node",
        ),
        "FULL",
        True,
    ),
    (
        "nested record field type changed",
        record({"name": "addr", "type": record({"name": "zip", "type": "int"}, name="Address")}),
        record({"name": "addr", "type": record({"name": "zip", "type": "string"}, name="Address")}),
        "BACKWARD",
        False,
    ),
    ("anything goes under NONE", "int", "string", "NONE", True),
]


@pytest.mark.parametrize(
    ("description", "old", "new", "level", "compatible"), COMPATIBILITY, ids=[c[0] for c in COMPATIBILITY]
)
def test_compatibility(description: str, old: object, new: object, level: str, compatible: bool) -> None:
    messages = check_compatibility(level, avro(new), [avro(old)])
    assert (messages == []) is compatible, messages
    if not compatible:
        assert all(isinstance(m, str) and m for m in messages)


def test_transitive_levels_check_every_version() -> None:
    # v3 reads v2 (which has f2) but not v1 (which lacks f2 while v3 gives it no default).
    v1, v2, v3 = avro(record(F1)), avro(record(F1, F2_DEFAULT)), avro(record(F1, F2))
    assert check_compatibility("BACKWARD", v3, [v1, v2]) == []
    messages = check_compatibility("BACKWARD_TRANSITIVE", v3, [v1, v2])
    assert len(messages) == 1 and "READER_FIELD_MISSING_DEFAULT_VALUE" in messages[0] and "'f2'" in messages[0]
    assert check_compatibility("FULL", v3, [v1, v2]) == []
    assert check_compatibility("FULL_TRANSITIVE", v3, [v1, v2]) != []


def test_mixed_types_are_incompatible() -> None:
    json_schema = parse("JSON", '{"type":"string"}', {})
    messages = check_compatibility("BACKWARD", avro("string"), [json_schema])
    assert messages and "JSON" in messages[0] and "AVRO" in messages[0]


def test_canonical_form_is_what_java_prints() -> None:
    text = """
    {
      "namespace": "com.example",
      "fields": [
        {"type": {"type": "string"}, "name": "name", "doc": "full name"},
        {"default": null, "name": "age", "type": ["null", {"type": "int", "logicalType": "x-age"}]},
        {"name": "friend", "type": ["null", "User"], "default": null, "order": "descending"}
      ],
      "name": "User",
      "type": "record",
      "aliases": ["com.example.Person"],
      "x-owner": "team-a"
    }
    """
    assert avro(text).canonical() == (
        '{"type":"record","name":"User","namespace":"com.example","fields":['
        '{"name":"name","type":"string","doc":"full name"},'
        '{"name":"age","type":["null",{"type":"int","logicalType":"x-age"}],"default":null},'
        '{"name":"friend","type":["null","User"],"default":null,"order":"descending"}],'
        '"x-owner":"team-a","aliases":["Person"]}'
    )


def test_canonical_same_schema_differently_written() -> None:
    a = avro('{"type":"record","name":"a.b.R","fields":[{"name":"x","type":"int"}]}')
    b = avro(
        '{ "fields" : [ { "type" : {"type": "int"}, "name" : "x" } ],\n'
        ' "namespace": "a.b", "name": "R", "type": "record" }'
    )
    assert (
        a.canonical()
        == b.canonical()
        == '{"type":"record","name":"R","namespace":"a.b","fields":[{"name":"x","type":"int"}]}'
    )
    c = avro('{"type":"record","name":"a.b.R","fields":[{"name":"x","type":"long"}]}')
    assert c.canonical() != a.canonical()
    assert avro('"string"').canonical() == avro('{"type": "string"}').canonical() == '"string"'


def test_namespace_printing_of_nested_types() -> None:
    schema = record(
        {"name": "a", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
        {"name": "b", "type": {"type": "fixed", "name": "other.F", "size": 2}},
        {"name": "c", "type": "E"},
        {"name": "d", "type": "other.F"},
        name="R",
        namespace="ns",
    )
    assert avro(schema).canonical() == (
        '{"type":"record","name":"R","namespace":"ns","fields":['
        '{"name":"a","type":{"type":"enum","name":"E","symbols":["X"]}},'
        '{"name":"b","type":{"type":"fixed","name":"F","namespace":"other","size":2}},'
        '{"name":"c","type":"E"},{"name":"d","type":"other.F"}]}'
    )
    assert avro(schema).normalized() == (
        '{"type":"record","name":"ns.R","fields":['
        '{"name":"a","type":{"type":"enum","name":"ns.E","symbols":["X"]}},'
        '{"name":"b","type":{"type":"fixed","name":"other.F","size":2}},'
        '{"name":"c","type":"ns.E"},{"name":"d","type":"other.F"}]}'
    )


def test_normalized_sorts_properties() -> None:
    a = avro({"type": "string", "b": 1, "a": 2})
    b = avro({"type": "string", "a": 2, "b": 1})
    assert a.canonical() != b.canonical()
    assert a.normalized() == b.normalized() == '{"type":"string","a":2,"b":1}'


ADDRESS = json.dumps(record({"name": "street", "type": "string"}, name="Address", namespace="com.example"))


def test_references_resolve_named_types() -> None:
    schema = record({"name": "home", "type": "com.example.Address"}, name="Customer", namespace="com.shop")
    parsed = avro(schema, {"com.example.Address": ADDRESS})
    assert parsed.canonical() == (
        '{"type":"record","name":"Customer","namespace":"com.shop","fields":'
        '[{"name":"home","type":"com.example.Address"}]}'
    )
    resolved = json.loads(parsed.formatted("resolved"))
    assert resolved["fields"][0]["type"]["fields"] == [{"name": "street", "type": "string"}]
    assert resolved["fields"][0]["type"]["namespace"] == "com.example"
    # The resolved text stands alone.
    fastavro.parse_schema(resolved)
    changed = record({"name": "street", "type": "int"}, name="Address", namespace="com.example")
    newer = avro(schema, {"com.example.Address": json.dumps(changed)})
    assert check_compatibility("BACKWARD", newer, [parsed]) != []


def test_references_may_depend_on_each_other() -> None:
    city = json.dumps({"type": "enum", "name": "com.example.City", "symbols": ["PARIS"]})
    place = json.dumps(record({"name": "city", "type": "com.example.City"}, name="com.example.Place"))
    refs = {"com.example.Place": place, "com.example.City": city}  # dependent one first
    parsed = avro(record({"name": "p", "type": "com.example.Place"}, name="Trip"), refs)
    assert "com.example.Place" in parsed.canonical()


def test_missing_reference_is_invalid() -> None:
    with pytest.raises(InvalidReference, match="com.example.Address"):
        avro(record({"name": "home", "type": "com.example.Address"}))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON"),
        ('{"type": "nosuchtype"}', "nosuchtype"),
        (json.dumps(record({"name": "n", "type": "int", "default": "x"})), "(?i)default"),
        ('{"type": "record", "name": "R"}', "fields"),
        (json.dumps({"type": "enum", "name": "E", "symbols": ["A", "A"]}), "unique"),
        (json.dumps({"type": "fixed", "name": "F"}), "size"),
    ],
)
def test_invalid_schemas_say_why(text: str, reason: str) -> None:
    with pytest.raises(InvalidSchema, match=reason):
        avro(text)


def test_what_the_python_serializer_registers_round_trips() -> None:
    # AvroSerializer registers the schema string as the application wrote it; the deserializer parses what the
    # registry returns with fastavro.
    text = json.dumps(
        {
            "type": "record",
            "name": "User",
            "namespace": "confluent.io.examples.serialization.avro",
            "fields": [
                {"name": "name", "type": "string"},
                {"name": "favorite_number", "type": "long"},
                {"name": "favorite_color", "type": "string"},
                {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            ],
        },
        indent=2,
    )
    parsed = avro(text)
    again = avro(parsed.canonical())
    assert again.canonical() == parsed.canonical()
    assert check_compatibility("FULL", again, [parsed]) == []
    reader = fastavro.parse_schema(json.loads(parsed.canonical()))
    assert reader["name"] == "confluent.io.examples.serialization.avro.User"
