"""Kafka principals: ``User:alice``, the identity every authorization decision is about."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    """A principal type (``User``, or ``Group`` in ACL filters) and name, printed ``type:name``."""

    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """``User:alice`` -> KafkaPrincipal("User", "alice"); raises ValueError without a type."""
        kind, sep, name = text.partition(":")
        if not sep or not kind:
            raise ValueError(f"principal {text!r} is not of the form Type:name")
        return cls(kind, name)


USER_TYPE = "User"
ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")
