"""The records of ``_schemas``: JSON keys and values in Confluent's layout (which Karapace shares), so that a
``_schemas`` topic copied from either can be replayed here and the reverse.

Keys are written with a fixed field order and no spaces: compaction keeps the last record per key *bytes*, so
two writes of one logical key must encode alike."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "SCHEMA"
CONFIG = "CONFIG"
MODE = "MODE"
DELETE_SUBJECT = "DELETE_SUBJECT"
CLEAR_SUBJECT = "CLEAR_SUBJECT"
NOOP = "NOOP"
KEY_TYPES = (SCHEMA, CONFIG, MODE, DELETE_SUBJECT, CLEAR_SUBJECT, NOOP)


class SerdeError(ValueError):
    """A record of ``_schemas`` this registry cannot read (skipped with a log line on replay)."""


@dataclass(frozen=True, slots=True)
class Reference:
    name: str
    subject: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "subject": self.subject, "version": self.version}


@dataclass(frozen=True, slots=True)
class Key:
    keytype: str
    subject: str | None = None
    version: int | None = None  # SCHEMA keys only


@dataclass(frozen=True, slots=True)
class SchemaValue:
    subject: str
    version: int
    id: int
    schema: str
    schema_type: str = "AVRO"
    references: tuple[Reference, ...] = ()
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class ConfigValue:
    compatibility_level: str | None
    normalize: bool | None = None


@dataclass(frozen=True, slots=True)
class DeleteSubjectValue:
    subject: str
    version: int


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record: its key and its value (None for a tombstone); ``value`` is a SchemaValue,
    ConfigValue, a mode string, a DeleteSubjectValue, or None."""

    key: Key
    value: Any = field(default=None)


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def encode_key(key: Key) -> bytes:
    if key.keytype == SCHEMA:
        return _dumps({"keytype": SCHEMA, "subject": key.subject, "version": key.version, "magic": 1})
    if key.keytype == NOOP:
        return _dumps({"keytype": NOOP, "magic": 0})
    return _dumps({"keytype": key.keytype, "subject": key.subject, "magic": 0})


def schema_key(subject: str, version: int) -> bytes:
    return encode_key(Key(SCHEMA, subject, version))


def encode_schema_value(v: SchemaValue) -> bytes:
    doc: dict[str, Any] = {"subject": v.subject, "version": v.version, "id": v.id}
    if v.schema_type != "AVRO":
        doc["schemaType"] = v.schema_type
    if v.references:
        doc["references"] = [r.to_json() for r in v.references]
    doc["schema"] = v.schema
    doc["deleted"] = v.deleted
    return _dumps(doc)


def config_record(subject: str | None, level: str | None, normalize: bool | None = None
                  ) -> tuple[bytes, bytes | None]:
    """A subject's (or, with None, the global) compatibility level; ``level`` None deletes it."""
    key = encode_key(Key(CONFIG, subject))
    if level is None:
        return key, None
    doc: dict[str, Any] = {"compatibilityLevel": level}
    if normalize is not None:
        doc["normalize"] = normalize
    return key, _dumps(doc)


def mode_record(subject: str | None, mode: str | None) -> tuple[bytes, bytes | None]:
    key = encode_key(Key(MODE, subject))
    return key, None if mode is None else _dumps({"mode": mode})


def noop_record() -> tuple[bytes, bytes | None]:
    return encode_key(Key(NOOP)), _dumps({})


def _loads(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SerdeError(f"{what} is not JSON: {e}") from None


def _str(doc: dict[str, Any], name: str, *, optional: bool = False) -> str | None:
    v = doc.get(name)
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise SerdeError(f"field {name!r} is not a string: {v!r}")
    return v


def _int(doc: dict[str, Any], name: str) -> int:
    v = doc.get(name)
    if not isinstance(v, int) or isinstance(v, bool):
        raise SerdeError(f"field {name!r} is not an integer: {v!r}")
    return v


def decode_key(data: bytes) -> Key:
    doc = _loads(data, "key")
    if not isinstance(doc, dict):
        raise SerdeError(f"key is not a JSON object: {doc!r}")
    keytype = doc.get("keytype")
    if keytype not in KEY_TYPES:
        raise SerdeError(f"unknown keytype {keytype!r}")
    if keytype == SCHEMA:
        return Key(SCHEMA, _str(doc, "subject"), _int(doc, "version"))
    if keytype == NOOP:
        return Key(NOOP)
    optional = keytype in (CONFIG, MODE)  # null subject: the global setting
    return Key(keytype, _str(doc, "subject", optional=optional))


def _reference(doc: Any) -> Reference:
    if not isinstance(doc, dict):
        raise SerdeError(f"reference is not a JSON object: {doc!r}")
    return Reference(str(_str(doc, "name")), str(_str(doc, "subject")), _int(doc, "version"))


def decode_value(key: Key, data: bytes | None) -> Any:
    """The value of a record with this key, None for a tombstone (or a NOOP)."""
    if data is None or key.keytype == NOOP:
        return None
    doc = _loads(data, "value")
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise SerdeError(f"value is not a JSON object: {doc!r}")
    if key.keytype == SCHEMA:
        refs = doc.get("references") or []
        if not isinstance(refs, list):
            raise SerdeError(f"references is not a list: {refs!r}")
        deleted = doc.get("deleted", False)
        return SchemaValue(subject=str(_str(doc, "subject")), version=_int(doc, "version"), id=_int(doc, "id"),
                           schema=str(_str(doc, "schema")),
                           schema_type=_str(doc, "schemaType", optional=True) or "AVRO",
                           references=tuple(_reference(r) for r in refs), deleted=bool(deleted))
    if key.keytype == CONFIG:
        level = _str(doc, "compatibilityLevel", optional=True)
        normalize = doc.get("normalize")
        return ConfigValue(level, normalize if isinstance(normalize, bool) else None)
    if key.keytype == MODE:
        return _str(doc, "mode")
    if key.keytype == DELETE_SUBJECT:
        return DeleteSubjectValue(str(_str(doc, "subject")), _int(doc, "version"))
    return None  # CLEAR_SUBJECT: the key says it all


def decode_record(key: bytes | None, value: bytes | None) -> Record:
    if key is None:
        raise SerdeError("record without a key")
    k = decode_key(key)
    return Record(k, decode_value(k, value))
