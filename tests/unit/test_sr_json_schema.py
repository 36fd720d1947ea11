"""JSON Schema in the schema registry: metaschema validation, references, canonical text, Confluent's rules."""

from __future__ import annotations

import json

import pytest

from pykbroker.schema_registry.formats import InvalidReference, InvalidSchema, check_compatibility, parse


def js(schema: object, references: dict[str, str] | None = None) -> object:
    return parse("JSON", schema if isinstance(schema, str) else json.dumps(schema), references or {})


def obj(properties: dict[str, object], required: list[str] | None = None, closed: object = None) -> dict[str, object]:
    out: dict[str, object] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    if closed is not None:
        out["additionalProperties"] = closed
    return out


STR = {"type": "string"}
INT = {"type": "integer"}

# Cases from Confluent's JSON Schema compatibility rules: the open, closed and partially open content models
# (https://docs.confluent.io/platform/7.7/schema-registry/fundamentals/serdes-develop/serdes-json.html, section
# "JSON Schema compatibility rules", and the article it points to,
# https://yokota.blog/2021/03/29/understanding-json-schema-compatibility/), read as: BACKWARD = a reader with the
# new schema accepts every document valid under the old one.
COMPATIBILITY = [
    # (description, old, new, level, compatible?)
    ("open model: property added", obj({"a": STR}), obj({"a": STR, "b": INT}), "BACKWARD", False),
    ("open model: property with empty schema added", obj({"a": STR}), obj({"a": STR, "b": {}}), "BACKWARD", True),
    (
        "closed model: optional property added",
        obj({"a": STR}, closed=False),
        obj({"a": STR, "b": INT}, closed=False),
        "BACKWARD",
        True,
    ),
    (
        "closed model: required property added",
        obj({"a": STR}, closed=False),
        obj({"a": STR, "b": INT}, ["b"], closed=False),
        "BACKWARD",
        False,
    ),
    (
        "closed model: required property with a default added",
        obj({"a": STR}, closed=False),
        obj({"a": STR, "b": {"type": "integer", "default": 0}}, ["b"], closed=False),
        "BACKWARD",
        True,
    ),
    ("open model: property removed", obj({"a": STR, "b": INT}), obj({"a": STR}), "BACKWARD", True),
    (
        "closed model: property removed",
        obj({"a": STR, "b": INT}, closed=False),
        obj({"a": STR}, closed=False),
        "BACKWARD",
        False,
    ),
    (
        "partially open model: property removed and covered",
        obj({"a": STR, "b": INT}, closed=INT),
        obj({"a": STR}, closed=INT),
        "BACKWARD",
        True,
    ),
    (
        "partially open model: property removed, not covered",
        obj({"a": STR, "b": INT}, closed=INT),
        obj({"a": STR}, closed=STR),
        "BACKWARD",
        False,
    ),
    (
        "partially open model: property added and covered",
        obj({"a": STR}, closed=INT),
        obj({"a": STR, "b": {"type": "number"}}, closed=INT),
        "BACKWARD",
        True,
    ),
    (
        "closed model: optional property added, forward",
        obj({"a": STR}, closed=False),
        obj({"a": STR, "b": INT}, closed=False),
        "FORWARD",
        False,
    ),
    ("open to closed", obj({"a": STR}), obj({"a": STR}, closed=False), "BACKWARD", False),
    ("closed to open", obj({"a": STR}, closed=False), obj({"a": STR}), "BACKWARD", True),
    ("required removed", obj({"a": STR}, ["a"]), obj({"a": STR}), "BACKWARD", True),
    ("required added", obj({"a": STR}), obj({"a": STR}, ["a"]), "BACKWARD", False),
    ("type widened integer to number", INT, {"type": "number"}, "BACKWARD", True),
    ("type narrowed number to integer", {"type": "number"}, INT, "BACKWARD", False),
    ("type widened to a union", STR, {"type": ["string", "null"]}, "BACKWARD", True),
    ("type widened, full", STR, {"type": ["string", "null"]}, "FULL", False),
    ("type changed", STR, INT, "BACKWARD", False),
    ("enum extended", {"enum": ["a", "b"]}, {"enum": ["a", "b", "c"]}, "BACKWARD", True),
    ("enum narrowed", {"enum": ["a", "b", "c"]}, {"enum": ["a", "b"]}, "BACKWARD", False),
    ("enum to its type", {"type": "string", "enum": ["a", "b"]}, STR, "BACKWARD", True),
    ("enum added", STR, {"type": "string", "enum": ["a"]}, "BACKWARD", False),
    ("maxLength increased", {"type": "string", "maxLength": 5}, {"type": "string", "maxLength": 10}, "BACKWARD", True),
    ("maxLength decreased", {"type": "string", "maxLength": 10}, {"type": "string", "maxLength": 5}, "BACKWARD", False),
    ("maxLength added", STR, {"type": "string", "maxLength": 5}, "BACKWARD", False),
    ("maxLength removed", {"type": "string", "maxLength": 5}, STR, "BACKWARD", True),
    ("minLength decreased", {"type": "string", "minLength": 5}, {"type": "string", "minLength": 2}, "BACKWARD", True),
    ("minLength increased", {"type": "string", "minLength": 2}, {"type": "string", "minLength": 5}, "BACKWARD", False),
    ("pattern added", STR, {"type": "string", "pattern": "^a"}, "BACKWARD", False),
    ("pattern removed", {"type": "string", "pattern": "^a"}, STR, "BACKWARD", True),
    ("maximum increased", {"type": "number", "maximum": 5}, {"type": "number", "maximum": 10}, "BACKWARD", True),
    ("maximum decreased", {"type": "number", "maximum": 10}, {"type": "number", "maximum": 5}, "BACKWARD", False),
    ("minimum added", {"type": "number"}, {"type": "number", "minimum": 0}, "BACKWARD", False),
    (
        "maximum made exclusive",
        {"type": "number", "maximum": 5},
        {"type": "number", "exclusiveMaximum": 5},
        "BACKWARD",
        False,
    ),
    (
        "multipleOf refined",
        {"type": "integer", "multipleOf": 4},
        {"type": "integer", "multipleOf": 2},
        "BACKWARD",
        True,
    ),
    (
        "multipleOf changed",
        {"type": "integer", "multipleOf": 2},
        {"type": "integer", "multipleOf": 4},
        "BACKWARD",
        False,
    ),
    ("maxItems increased", {"type": "array", "maxItems": 2}, {"type": "array", "maxItems": 3}, "BACKWARD", True),
    ("minItems increased", {"type": "array", "minItems": 2}, {"type": "array", "minItems": 3}, "BACKWARD", False),
    (
        "items widened",
        {"type": "array", "items": INT},
        {"type": "array", "items": {"type": "number"}},
        "BACKWARD",
        True,
    ),
    ("items changed", {"type": "array", "items": INT}, {"type": "array", "items": STR}, "BACKWARD", False),
    ("uniqueItems added", {"type": "array"}, {"type": "array", "uniqueItems": True}, "BACKWARD", False),
    ("oneOf extended", {"oneOf": [STR, INT]}, {"oneOf": [STR, INT, {"type": "null"}]}, "BACKWARD", True),
    ("oneOf narrowed", {"oneOf": [STR, INT, {"type": "null"}]}, {"oneOf": [STR, INT]}, "BACKWARD", False),
    ("type to oneOf containing it", STR, {"oneOf": [STR, INT]}, "BACKWARD", True),
    ("oneOf to one of its types", {"oneOf": [STR, INT]}, STR, "BACKWARD", False),
    ("anyOf extended", {"anyOf": [STR]}, {"anyOf": [STR, INT]}, "BACKWARD", True),
    ("allOf narrowed", {"allOf": [STR, {"maxLength": 5}]}, {"allOf": [STR]}, "BACKWARD", True),
    ("allOf extended", {"allOf": [STR]}, {"allOf": [STR, {"maxLength": 5}]}, "BACKWARD", False),
    (
        "nested property type changed",
        obj({"address": obj({"zip": INT})}),
        obj({"address": obj({"zip": STR})}),
        "BACKWARD",
        False,
    ),
    (
        "definition widened through $ref",
        {"definitions": {"n": INT}, "type": "object", "properties": {"x": {"$ref": "#/definitions/n"}}},
        {"definitions": {"n": {"type": "number"}}, "type": "object", "properties": {"x": {"$ref": "#/definitions/n"}}},
        "BACKWARD",
        True,
    ),
    (
        "definition narrowed through $ref",
        {"definitions": {"n": {"type": "number"}}, "type": "object", "properties": {"x": {"$ref": "#/definitions/n"}}},
        {"definitions": {"n": INT}, "type": "object", "properties": {"x": {"$ref": "#/definitions/n"}}},
        "BACKWARD",
        False,
    ),
    ("not narrowed", {"not": {"type": "string"}}, {"not": {"type": ["string", "null"]}}, "BACKWARD", False),
    ("not widened", {"not": {"type": ["string", "null"]}}, {"not": {"type": "string"}}, "BACKWARD", True),
    ("anything to true", obj({"a": STR}), True, "BACKWARD", True),
    ("anything goes under NONE", STR, INT, "NONE", True),
]


@pytest.mark.parametrize(
    ("description", "old", "new", "level", "compatible"), COMPATIBILITY, ids=[c[0] for c in COMPATIBILITY]
)
def test_compatibility(description: str, old: object, new: object, level: str, compatible: bool) -> None:
    messages = check_compatibility(level, js(new), [js(old)])
    assert (messages == []) is compatible, messages


def test_recursive_schema_terminates() -> None:
    tree = {
        "$id": "https://example.com/tree.json",
        "type": "object",
        "properties": {"value": INT, "children": {"type": "array", "items": {"$ref": "#"}}},
    }
    wider = json.loads(json.dumps(tree))
    wider["properties"]["value"] = {"type": "number"}
    assert check_compatibility("BACKWARD", js(wider), [js(tree)]) == []
    assert check_compatibility("FORWARD", js(wider), [js(tree)]) != []


def test_messages_name_the_rule_and_path() -> None:
    messages = check_compatibility("BACKWARD", js(obj({"a": STR}, ["a", "b"])), [js(obj({"a": STR}, ["a"]))])
    assert messages == ["REQUIRED_ATTRIBUTE_ADDED: The reader schema requires 'b' at path '#/required'"]


def test_canonical_keeps_key_order_and_normalized_sorts() -> None:
    a = js('{ "type": "object",\n  "properties": { "b": {"type": "string"}, "a": {"type": "integer"} } }')
    b = js('{"properties":{"a":{"type":"integer"},"b":{"type":"string"}},"type":"object"}')
    assert a.canonical() == '{"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer"}}}'
    assert a.canonical() != b.canonical()
    assert (
        a.normalized()
        == b.normalized()
        == '{"properties":{"a":{"type":"integer"},"b":{"type":"string"}},"type":"object"}'
    )
    assert js('{"type": "string"}').canonical() == js('{"type":"string"}').canonical()


ADDRESS = json.dumps({"type": "object", "properties": {"street": STR}, "additionalProperties": False})


def test_references_resolve_by_name() -> None:
    customer = {"type": "object", "properties": {"home": {"$ref": "address.json"}}}
    parsed = js(customer, {"address.json": ADDRESS})
    assert parsed.canonical() == json.dumps(customer, separators=(",", ":"))
    narrower = json.dumps({"type": "object", "properties": {"street": {"type": "string", "maxLength": 3}}})
    assert check_compatibility("BACKWARD", js(customer, {"address.json": narrower}), [parsed]) != []
    assert check_compatibility("FULL", js(customer, {"address.json": ADDRESS}), [parsed]) == []


def test_references_resolve_by_id() -> None:
    with_id = json.dumps({"$id": "https://example.com/address.schema.json", **json.loads(ADDRESS)})
    customer = {"type": "object", "properties": {"home": {"$ref": "https://example.com/address.schema.json"}}}
    js(customer, {"address": with_id})


def test_unresolvable_reference_is_invalid() -> None:
    with pytest.raises(InvalidReference, match="address.json"):
        js({"type": "object", "properties": {"home": {"$ref": "address.json"}}})
    with pytest.raises(InvalidReference, match="#/definitions/missing"):
        js({"$ref": "#/definitions/missing"})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON"),
        ('"a string"', "neither a JSON object nor a boolean"),
        ('{"type": 5}', "is not valid under any of the given schemas"),
        ('{"type": "object", "required": "a"}', "is not of type 'array'"),
        ('{"$schema": "https://example.com/unknown", "type": "string"}', "unknown \\$schema"),
        ('{"$schema": "http://json-schema.org/draft-04/schema#", "type": "string", "minLength": -1}', "minLength"),
    ],
)
def test_invalid_schemas_say_why(text: str, reason: str) -> None:
    with pytest.raises(InvalidSchema, match=reason):
        js(text)


@pytest.mark.parametrize(
    "uri",
    [
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-06/schema#",
        "http://json-schema.org/draft-07/schema#",
        "https://json-schema.org/draft/2019-09/schema",
        "https://json-schema.org/draft/2020-12/schema",
    ],
)
def test_drafts_are_chosen_by_schema_keyword(uri: str) -> None:
    parsed = js({"$schema": uri, "type": "object", "properties": {"a": STR}})
    assert json.loads(parsed.canonical())["$schema"] == uri


def test_2020_12_prefix_items() -> None:
    d = "https://json-schema.org/draft/2020-12/schema"
    old = js({"$schema": d, "type": "array", "prefixItems": [INT, STR], "items": False})
    new = js({"$schema": d, "type": "array", "prefixItems": [{"type": "number"}, STR], "items": False})
    assert check_compatibility("BACKWARD", new, [old]) == []
    assert check_compatibility("FORWARD", new, [old]) != []


def test_what_the_python_serializer_registers_round_trips() -> None:
    # JSONSerializer registers the schema string as the application wrote it; the deserializer parses what the
    # registry returns with json.loads and validates with jsonschema.
    text = """
    {
      "$schema": "http://json-schema.org/draft-07/schema#",
      "title": "User",
      "description": "A Confluent Kafka Python User",
      "type": "object",
      "properties": {
        "name": {"description": "User's name", "type": "string"},
        "favorite_number": {"description": "User's favorite number", "type": "number", "exclusiveMinimum": 0},
        "favorite_color": {"description": "User's favorite color", "type": "string"}
      },
      "required": ["name", "favorite_number", "favorite_color"]
    }
    """
    parsed = js(text)
    again = js(parsed.canonical())
    assert again.canonical() == parsed.canonical()
    assert json.loads(parsed.canonical()) == json.loads(text)
    assert check_compatibility("FULL_TRANSITIVE", again, [parsed]) == []
