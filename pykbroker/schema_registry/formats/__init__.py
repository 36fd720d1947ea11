"""The schema types the registry stores: parsing, canonical forms and compatibility rules.

Sans-I/O: nothing here touches the network or the broker, so the registry core can call it from any thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pykbroker.schema_registry.formats.avro import AvroSchema
from pykbroker.schema_registry.formats.base import (
    LEVELS,
    SCHEMA_TYPES,
    InvalidReference,
    InvalidSchema,
    ParsedSchema,
)
from pykbroker.schema_registry.formats.json_schema import JsonSchema
from pykbroker.schema_registry.formats.protobuf import ProtobufSchema

__all__ = ["LEVELS", "SCHEMA_TYPES", "InvalidReference", "InvalidSchema", "ParsedSchema", "check_compatibility",
           "parse"]

def parse(schema_type: str, text: str, references: Mapping[str, str]) -> ParsedSchema:
    """Parse `text` as `schema_type`; `references` maps each reference name to its schema text (transitively)."""
    kind = (schema_type or "AVRO").upper()
    if kind == "AVRO":
        return AvroSchema.parse(text, references)
    if kind == "PROTOBUF":
        return ProtobufSchema.parse(text, references)
    if kind == "JSON":
        return JsonSchema.parse(text, references)
    raise InvalidSchema(f"Invalid schema type {schema_type!r}: expected one of {', '.join(SCHEMA_TYPES)}")


def _pair(reader: ParsedSchema, writer: ParsedSchema, reader_label: str) -> list[str]:
    if reader.schema_type != writer.schema_type:
        return [f"Incompatible schema type: {writer.schema_type} cannot be changed to {reader.schema_type}"]
    check = getattr(reader, "incompatibilities", None)
    if check is None:  # a ParsedSchema from elsewhere: only identical schemas are known to be compatible
        return [] if reader.canonical() == writer.canonical() else [f"Cannot check compatibility of {reader_label}"]
    messages: list[str] = check(writer)
    return messages


def check_compatibility(level: str, new: ParsedSchema, previous: Sequence[ParsedSchema]) -> list[str]:
    """[] when `new` may follow `previous` (oldest first) under `level`, else messages saying why not.

    BACKWARD: a reader with the new schema reads data written with the old; FORWARD: a reader with the old schema
    reads data written with the new; FULL: both. Non-transitive levels check the latest previous version only.
    """
    level = level.upper()
    if level not in LEVELS:
        raise ValueError(f"Invalid compatibility level {level!r}")
    if level == "NONE" or not previous:
        return []
    against = list(previous) if level.endswith("_TRANSITIVE") else [previous[-1]]
    base = level.removesuffix("_TRANSITIVE")
    messages: list[str] = []
    # Newest first, as Confluent reports the latest conflict first.
    for old in reversed(against):
        if base in ("BACKWARD", "FULL"):
            messages.extend(_pair(new, old, "the new schema"))
        if base in ("FORWARD", "FULL"):
            messages.extend(_pair(old, new, "the old schema"))
    return list(dict.fromkeys(messages))
