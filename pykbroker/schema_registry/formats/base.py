"""What every schema type shares: the errors, the protocol of a parsed schema, the type and level names."""

from __future__ import annotations

from typing import Protocol

SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")

LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)


class InvalidSchema(Exception):
    """The schema text does not parse or violates its type's rules (HTTP 422, error code 42201)."""


class InvalidReference(InvalidSchema):
    """A reference the schema needs is missing or does not resolve (42201, as Confluent)."""


class ParsedSchema(Protocol):
    schema_type: str

    def canonical(self) -> str: ...

    def normalized(self) -> str: ...

    def formatted(self, fmt: str) -> str: ...
