"""The registry's state machine driven by plain calls: ids, versions, deletes, references, configs, modes,
and the replay of its own records (what a restarted or newly elected writer sees)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pykbroker.schema_registry import errors
from pykbroker.schema_registry.registry import Registry, Write, default_formats
from pykbroker.schema_registry.serde import (
    Key,
    Reference,
    SchemaValue,
    config_record,
    decode_record,
    encode_key,
    encode_schema_value,
    mode_record,
    noop_record,
    schema_key,
)


def record(name: str, *fields: tuple[str, Any]) -> str:
    """An Avro record schema; each field (name, default or ...) has a default unless given ``...``."""
    out = []
    for f, default in fields:
        d: dict[str, Any] = {"name": f, "type": "string"}
        if default is not ...:
            d["default"] = default
        out.append(d)
    return json.dumps({"type": "record", "name": name, "fields": out})


class Log:
    """A registry and the records it wrote, applied in offset order as the writer applies them."""

    def __init__(self, compatibility: str = "BACKWARD") -> None:
        self.registry = Registry(compatibility, default_formats())
        self.records: list[tuple[bytes, bytes | None]] = []

    def write(self, w: Write) -> Any:
        for key, value in w.records:
            self.registry.apply(len(self.records), key, value)
            self.records.append((key, value))
        return w.result

    def register(self, subject: str, schema: str, **body: Any) -> int:
        result = self.write(self.registry.plan_register(subject, {"schema": schema, **body}))
        return int(result["id"])

    def replayed(self) -> Registry:
        r = Registry(self.registry.default_compatibility, default_formats())
        for offset, (key, value) in enumerate(self.records):
            r.apply(offset, key, value)
        return r


def code_of(fn: Any, *args: Any, **kwargs: Any) -> tuple[int, int]:
    with pytest.raises(errors.RegistryError) as exc:
        fn(*args, **kwargs)
    return exc.value.http_status, exc.value.error_code


A1 = record("A", ("a", ...))
A2 = record("A", ("a", ...), ("b", "x"))  # adds a field with a default: backward compatible
A3 = record("A", ("a", ...), ("c", ...))  # adds a field without a default: not backward compatible


def test_one_id_per_schema_across_subjects_and_versions_in_order() -> None:
    g = Log()
    assert g.register("s1", A1) == 1
    assert g.register("s1", A1) == 1  # the same schema again: no new version
    assert g.register("s2", A1) == 1  # another subject reuses the id
    assert g.register("s1", A2) == 2
    assert g.registry.list_versions("s1") == [1, 2]
    assert g.registry.list_versions("s2") == [1]
    assert g.registry.list_subjects() == ["s1", "s2"]
    v = g.registry.get_version("s1", "latest")
    assert (v["subject"], v["version"], v["id"]) == ("s1", 2, 2) and "schemaType" not in v
    assert g.registry.get_version("s1", "-1")["version"] == 2
    assert g.registry.subjects_of_id(1) == ["s1", "s2"]
    assert g.registry.versions_of_id(1) == [{"subject": "s1", "version": 1}, {"subject": "s2", "version": 1}]
    assert g.registry.schema_by_id(2)["schema"] == v["schema"]
    assert code_of(g.registry.schema_by_id, 3) == (404, errors.SCHEMA_NOT_FOUND)
    assert code_of(g.registry.get_version, "s1", 3) == (404, errors.VERSION_NOT_FOUND)
    assert code_of(g.registry.get_version, "nope", 1) == (404, errors.SUBJECT_NOT_FOUND)
    for bad in ("0", "-2", "x", str(1 << 31)):
        assert code_of(g.registry.get_version, "s1", bad) == (422, errors.INVALID_VERSION)


def test_compatibility_refused_with_409_and_levels_per_subject() -> None:
    g = Log()
    g.register("s", A1)
    assert code_of(g.registry.plan_register, "s", {"schema": A3}) == (409, errors.INCOMPATIBLE_SCHEMA)
    assert g.registry.check_compatibility("s", "latest", {"schema": A3}, verbose=True)["is_compatible"] is False
    assert g.registry.check_compatibility("s", "latest", {"schema": A2}) == {"is_compatible": True}
    assert g.registry.check_compatibility("new", "latest", {"schema": A3}) == {"is_compatible": True}
    assert code_of(g.registry.check_compatibility, "s", 7, {"schema": A2}) == (404, errors.VERSION_NOT_FOUND)
    assert code_of(g.registry.get_config, "s") == (404, errors.SUBJECT_COMPATIBILITY_NOT_CONFIGURED)
    assert g.registry.get_config("s", default_to_global=True) == {"compatibilityLevel": "BACKWARD"}
    assert g.write(g.registry.plan_set_config("s", {"compatibility": "none"})) == {"compatibility": "NONE"}
    assert g.register("s", A3) == 2
    assert g.registry.get_config("s") == {"compatibilityLevel": "NONE"}
    assert g.registry.get_config(None) == {"compatibilityLevel": "BACKWARD"}
    assert code_of(g.registry.plan_set_config, None, {"compatibility": "SIDEWAYS"}) == \
        (422, errors.INVALID_COMPATIBILITY_LEVEL)
    assert g.write(g.registry.plan_delete_config("s")) == {"compatibilityLevel": "NONE"}
    assert code_of(g.registry.get_config, "s") == (404, errors.SUBJECT_COMPATIBILITY_NOT_CONFIGURED)


def test_soft_then_permanent_deletes_as_confluent() -> None:
    g = Log()
    g.register("s", A1)
    g.register("s", A2)
    assert code_of(g.registry.plan_delete_version, "s", 1, permanent=True) == \
        (404, errors.VERSION_NOT_SOFT_DELETED)
    assert g.write(g.registry.plan_delete_version("s", 1)) == 1
    assert code_of(g.registry.plan_delete_version, "s", 1) == (404, errors.VERSION_SOFT_DELETED)
    assert g.registry.list_versions("s") == [2]
    assert g.registry.list_versions("s", deleted=True) == [1, 2]
    assert g.registry.get_version("s", 1, deleted=True)["id"] == 1
    assert code_of(g.registry.get_version, "s", 1) == (404, errors.VERSION_NOT_FOUND)
    assert code_of(g.registry.plan_delete_subject, "s", permanent=True) == (404, errors.SUBJECT_NOT_SOFT_DELETED)
    assert g.write(g.registry.plan_delete_subject("s")) == [2]
    assert code_of(g.registry.plan_delete_subject, "s") == (404, errors.SUBJECT_SOFT_DELETED)
    assert g.registry.list_subjects() == [] and g.registry.list_subjects(deleted=True) == ["s"]
    assert g.registry.list_subjects(deleted_only=True) == ["s"]
    assert code_of(g.registry.list_versions, "s") == (404, errors.SUBJECT_NOT_FOUND)
    # a version number is never reused while its soft-deleted version exists
    assert g.register("s", A1) == 1
    assert g.registry.list_versions("s") == [3]
    assert g.write(g.registry.plan_delete_subject("s")) == [3]
    assert g.write(g.registry.plan_delete_subject("s", permanent=True)) == [1, 2, 3]
    assert code_of(g.registry.plan_delete_subject, "s") == (404, errors.SUBJECT_NOT_FOUND)
    assert code_of(g.registry.schema_by_id, 1) == (404, errors.SCHEMA_NOT_FOUND)
    # hard-deleted ids are never handed out again
    assert g.register("t", A3) == 3
    assert g.replayed().max_id == 3


def test_references_resolved_and_protected() -> None:
    g = Log()
    g.register("inner", record("Inner", ("x", ...)))
    outer = json.dumps({"type": "record", "name": "Outer", "fields": [{"name": "i", "type": "Inner"}]})
    refs = [{"name": "Inner", "subject": "inner", "version": 1}]
    outer_id = g.register("outer", outer, references=refs)
    assert g.registry.referenced_by("inner", 1) == [outer_id]
    assert g.registry.get_version("outer", 1)["references"] == refs
    assert code_of(g.registry.plan_delete_version, "inner", 1) == (422, errors.REFERENCE_EXISTS)
    assert code_of(g.registry.plan_delete_subject, "inner") == (422, errors.REFERENCE_EXISTS)
    unknown = [{"name": "Inner", "subject": "inner", "version": 9}]
    assert code_of(g.registry.plan_register, "other", {"schema": outer, "references": unknown}) == \
        (422, errors.INVALID_SCHEMA)
    assert code_of(g.registry.plan_register, "other", {"schema": outer}) == (422, errors.INVALID_SCHEMA)
    g.write(g.registry.plan_delete_subject("outer"))
    assert g.write(g.registry.plan_delete_version("inner", 1)) == 1  # only live versions pin it


def test_lookup_finds_the_version_of_a_schema() -> None:
    g = Log()
    g.register("s", A1)
    g.register("s", A2)
    found = g.registry.lookup("s", {"schema": json.dumps(json.loads(A1), indent=2)})  # another spelling
    assert (found["version"], found["id"]) == (1, 1)
    assert code_of(g.registry.lookup, "s", {"schema": A3}) == (404, errors.SCHEMA_NOT_FOUND)
    assert code_of(g.registry.lookup, "x", {"schema": A1}) == (404, errors.SUBJECT_NOT_FOUND)
    g.write(g.registry.plan_delete_version("s", 1))
    assert code_of(g.registry.lookup, "s", {"schema": A1}) == (404, errors.SCHEMA_NOT_FOUND)
    assert g.registry.lookup("s", {"schema": A1}, deleted=True)["version"] == 1


def test_invalid_input_is_42201_or_422() -> None:
    g = Log()
    assert code_of(g.registry.plan_register, "s", {"schema": "{not json"}) == (422, errors.INVALID_SCHEMA)
    assert code_of(g.registry.plan_register, "s", {"schema": ""}) == (422, errors.INVALID_SCHEMA)
    assert code_of(g.registry.plan_register, "s", {"schema": A1, "schemaType": "XML"}) == \
        (422, errors.INVALID_SCHEMA)
    assert code_of(g.registry.plan_register, "s", ["not", "an", "object"]) == (422, 422)
    assert code_of(g.registry.plan_register, "s", {"schema": A1, "references": [{"name": 1}]}) == \
        (422, errors.INVALID_SCHEMA)


def test_modes_readonly_and_import() -> None:
    g = Log()
    g.register("s", A1)
    assert code_of(g.registry.get_mode, "s") == (404, errors.SUBJECT_MODE_NOT_CONFIGURED)
    assert g.registry.get_mode(None) == {"mode": "READWRITE"}
    g.write(g.registry.plan_set_mode("s", {"mode": "READONLY"}))
    assert code_of(g.registry.plan_register, "s", {"schema": A2}) == (422, errors.OPERATION_NOT_PERMITTED)
    assert code_of(g.registry.plan_delete_subject, "s") == (422, errors.OPERATION_NOT_PERMITTED)
    assert g.register("other", A2) == 2  # only that subject
    assert g.write(g.registry.plan_delete_mode("s")) == {"mode": "READONLY"}
    assert code_of(g.registry.plan_set_mode, None, {"mode": "SIDEWAYS"}) == (422, errors.INVALID_MODE)
    # IMPORT: only into an empty registry unless forced; registrations then carry their ids and versions
    assert code_of(g.registry.plan_set_mode, None, {"mode": "IMPORT"}) == (422, errors.OPERATION_NOT_PERMITTED)
    assert code_of(g.registry.plan_register, "imp", {"schema": A1, "id": 50}) == \
        (422, errors.OPERATION_NOT_PERMITTED)
    g.write(g.registry.plan_set_mode("imp", {"mode": "IMPORT"}))
    assert g.register("imp", A3, id=50, version=7) == 50
    assert g.registry.get_version("imp", 7)["id"] == 50
    assert code_of(g.registry.plan_register, "imp", {"schema": A2, "id": 50, "version": 8}) == \
        (422, errors.OPERATION_NOT_PERMITTED)
    g.write(g.registry.plan_set_mode("imp", {"mode": "READWRITE"}))
    assert g.register("after", record("B", ("z", ...))) == 51  # next id past the imported one


def test_replay_rebuilds_the_same_state_and_skips_bad_records() -> None:
    g = Log()
    g.register("s", A1)
    g.register("s", A2)
    g.write(g.registry.plan_set_config(None, {"compatibility": "FULL"}))
    g.write(g.registry.plan_set_mode("s", {"mode": "READONLY"}))
    g.write(g.registry.plan_delete_mode("s"))
    g.write(g.registry.plan_delete_version("s", 1))
    g.records.insert(2, (b"not json", b"{}"))  # a record another writer left: skipped, not fatal
    g.records.append(noop_record())
    r = g.replayed()
    assert r.list_versions("s", deleted=True) == [1, 2]
    assert r.list_versions("s") == [2]
    assert r.get_config(None) == {"compatibilityLevel": "FULL"}
    assert r.get_mode("s", default_to_global=True) == {"mode": "READWRITE"}
    assert r.max_id == 2 and r.next_offset == len(g.records)


def test_confluent_delete_subject_and_clear_subject_records_apply() -> None:
    r = Registry("BACKWARD", default_formats())
    for v in (1, 2, 3):
        value = SchemaValue("s", v, v, record("A", ("a", ...), *((f"f{i}", "d") for i in range(v))))
        r.apply(v - 1, schema_key("s", v), encode_schema_value(value))
    r.apply(3, encode_key(Key("DELETE_SUBJECT", "s")), json.dumps({"subject": "s", "version": 2}).encode())
    assert r.list_versions("s") == [3]
    r.apply(4, encode_key(Key("CLEAR_SUBJECT", "s")), json.dumps({"subject": "s"}).encode())
    assert r.list_versions("s", deleted=True) == [3]
    r.apply(5, schema_key("s", 3), None)
    assert r.list_subjects(deleted=True) == []


def test_serde_keys_are_byte_stable_and_values_round_trip() -> None:
    assert schema_key("s", 1) == b'{"keytype":"SCHEMA","subject":"s","version":1,"magic":1}'
    assert config_record(None, "FULL") == (b'{"keytype":"CONFIG","subject":null,"magic":0}',
                                           b'{"compatibilityLevel":"FULL"}')
    assert mode_record("s", None) == (b'{"keytype":"MODE","subject":"s","magic":0}', None)
    assert noop_record()[0] == b'{"keytype":"NOOP","magic":0}'
    value = SchemaValue("s", 2, 9, "syntax = \"proto3\";", "PROTOBUF", (Reference("o.proto", "o", 1),), True)
    rec = decode_record(schema_key("s", 2), encode_schema_value(value))
    assert rec.key == Key("SCHEMA", "s", 2) and rec.value == value
    avro = json.loads(encode_schema_value(SchemaValue("s", 1, 1, "\"string\"")))
    assert "schemaType" not in avro and avro["deleted"] is False
