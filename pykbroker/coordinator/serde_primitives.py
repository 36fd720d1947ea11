"""Primitive encoders and decoders of Kafka's internal record schemas (big-endian, as on the wire).

Used by the record formats of ``__consumer_offsets`` (:mod:`.group.serde`,
:mod:`.group.consumer_records`) and ``__transaction_state`` (:mod:`.transaction.log_serde`):
fixed-width integers, int16-length strings and int32-length bytes (-1 for null), and the
*flexible* encodings (unsigned varints, compact strings/bytes/arrays with length + 1, UUIDs,
tagged-field sections).
"""

from __future__ import annotations

import struct
import uuid
from typing import ClassVar

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class SerdeError(ValueError):
    pass


class Writer:
    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def i8(self, v: int) -> Writer:
        self.buf += _I8.pack(v)
        return self

    def i16(self, v: int) -> Writer:
        self.buf += _I16.pack(v)
        return self

    def i32(self, v: int) -> Writer:
        self.buf += _I32.pack(v)
        return self

    def i64(self, v: int) -> Writer:
        self.buf += _I64.pack(v)
        return self

    def uvarint(self, v: int) -> Writer:
        while v >= 0x80:
            self.buf.append((v & 0x7F) | 0x80)
            v >>= 7
        self.buf.append(v)
        return self

    def raw(self, data: bytes) -> Writer:
        self.buf += data
        return self

    def string(self, v: str | None) -> Writer:
        """A non-flexible (int16 length, -1 for null) string."""
        if v is None:
            return self.i16(-1)
        data = v.encode()
        return self.i16(len(data)).raw(data)

    def bytes_(self, v: bytes | None) -> Writer:
        """Non-flexible (int32 length, -1 for null) bytes."""
        if v is None:
            return self.i32(-1)
        return self.i32(len(v)).raw(v)

    def cstring(self, s: str | None) -> Writer:
        if s is None:
            return self.uvarint(0)
        data = s.encode()
        return self.uvarint(len(data) + 1).raw(data)

    def cbytes(self, data: bytes) -> Writer:
        return self.uvarint(len(data) + 1).raw(data)

    def uuid(self, u: uuid.UUID) -> Writer:
        return self.raw(u.bytes)

    def array_len(self, n: int) -> Writer:
        return self.uvarint(n + 1)

    def no_tags(self) -> Writer:
        return self.uvarint(0)

    def done(self) -> bytes:
        return bytes(self.buf)


class Reader:
    """A cursor over one record's bytes; malformed input raises :attr:`error`."""

    __slots__ = ("data", "pos")
    error: ClassVar[type[ValueError]] = SerdeError

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, s: struct.Struct) -> int:
        if self.pos + s.size > len(self.data):
            raise self.error("truncated record")
        (v,) = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return int(v)

    def i8(self) -> int:
        return self._take(_I8)

    def i16(self) -> int:
        return self._take(_I16)

    def i32(self) -> int:
        return self._take(_I32)

    def i64(self) -> int:
        return self._take(_I64)

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            if self.pos >= len(self.data):
                raise self.error("truncated varint")
            b = self.data[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise self.error("varint too long")

    def raw(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.error("truncated record")
        v = self.data[self.pos:self.pos + n]
        self.pos += n
        return bytes(v)

    def string(self) -> str | None:
        """A non-flexible (int16 length) string; None for null."""
        n = self.i16()
        return None if n < 0 else self.raw(n).decode()

    def bytes_(self) -> bytes | None:
        """Non-flexible (int32 length) bytes; None for null."""
        n = self.i32()
        return None if n < 0 else self.raw(n)

    def cstring(self) -> str | None:
        n = self.uvarint()
        return None if n == 0 else self.raw(n - 1).decode()

    def cbytes(self) -> bytes | None:
        n = self.uvarint()
        return None if n == 0 else self.raw(n - 1)

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.raw(16))

    def array_len(self) -> int:
        n = self.uvarint() - 1
        if n > len(self.data):
            raise self.error("array too long")
        return n

    def tags(self) -> dict[int, bytes]:
        """A tagged-field section: tag -> raw field bytes (read past, whatever the tags)."""
        out: dict[int, bytes] = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            out[tag] = self.raw(self.uvarint())
        return out

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos
