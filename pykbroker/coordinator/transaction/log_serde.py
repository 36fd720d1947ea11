"""Record formats of ``__transaction_state``: Kafka's TransactionLogKey and TransactionLogValue.

Key: int16 version (0), then the transactional id as an int16-length string.  Value: int16
version; version 0 is written (readable by every Kafka version), versions 0 and 1 (flexible,
with tagged fields) are read.  A null value is a tombstone: the transactional id expired.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")

KEY_VERSION = 0
VALUE_VERSION = 0


class TxnLogSerdeError(ValueError):
    pass


@dataclass(slots=True)
class TxnLogValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    status: int
    partitions: dict[str, list[int]] = field(default_factory=dict)
    last_update_ms: int = -1
    start_ms: int = -1
    previous_producer_id: int = -1
    next_producer_id: int = -1


def encode_key(transactional_id: str) -> bytes:
    data = transactional_id.encode()
    return _I16.pack(KEY_VERSION) + _I16.pack(len(data)) + data


def decode_key(buf: bytes) -> str:
    try:
        version = _I16.unpack_from(buf, 0)[0]
        if version != KEY_VERSION:
            raise TxnLogSerdeError(f"unknown transaction log key version {version}")
        n = _I16.unpack_from(buf, 2)[0]
        if n < 0 or 4 + n != len(buf):
            raise TxnLogSerdeError("bad transactional id length")
        return bytes(buf[4:4 + n]).decode()
    except struct.error as e:
        raise TxnLogSerdeError(str(e)) from None


def encode_value(v: TxnLogValue) -> bytes:
    out = bytearray()
    out += _I16.pack(VALUE_VERSION)
    out += _I64.pack(v.producer_id)
    out += _I16.pack(v.producer_epoch)
    out += _I32.pack(v.timeout_ms)
    out += _I8.pack(v.status)
    out += _I32.pack(len(v.partitions))
    for topic, parts in sorted(v.partitions.items()):
        data = topic.encode()
        out += _I16.pack(len(data)) + data
        out += _I32.pack(len(parts))
        for p in sorted(parts):
            out += _I32.pack(p)
    out += _I64.pack(v.last_update_ms)
    out += _I64.pack(v.start_ms)
    return bytes(out)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, s: struct.Struct) -> int:
        try:
            v = s.unpack_from(self.buf, self.pos)[0]
        except struct.error as e:
            raise TxnLogSerdeError(str(e)) from None
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
        shift = value = 0
        while True:
            if self.pos >= len(self.buf) or shift > 63:
                raise TxnLogSerdeError("truncated varint")
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def raw(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise TxnLogSerdeError("truncated field")
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data


def decode_value(buf: bytes) -> TxnLogValue:
    r = _Reader(bytes(buf))
    version = r.i16()
    if version not in (0, 1):
        raise TxnLogSerdeError(f"unknown transaction log value version {version}")
    flexible = version >= 1
    pid = r.i64()
    epoch = r.i16()
    timeout = r.i32()
    status = r.i8()
    partitions: dict[str, list[int]] = {}
    n = (r.uvarint() - 1) if flexible else r.i32()
    for _ in range(max(n, 0)):
        tlen = (r.uvarint() - 1) if flexible else r.i16()
        topic = r.raw(tlen).decode()
        m = (r.uvarint() - 1) if flexible else r.i32()
        partitions.setdefault(topic, []).extend(r.i32() for _ in range(max(m, 0)))
        if flexible:
            _skip_tags(r)
    last_update = r.i64()
    start = r.i64()
    v = TxnLogValue(pid, epoch, timeout, status, partitions, last_update, start)
    if flexible:
        for _ in range(r.uvarint()):
            tag = r.uvarint()
            size = r.uvarint()
            data = _Reader(r.raw(size))
            if tag == 0:
                v.previous_producer_id = data.i64()
            elif tag == 1:
                v.next_producer_id = data.i64()
    return v


def _skip_tags(r: _Reader) -> None:
    for _ in range(r.uvarint()):
        r.uvarint()
        r.raw(r.uvarint())
