"""Record formats of ``__transaction_state``: Kafka's TransactionLogKey and TransactionLogValue.

Key: int16 version (0), then the transactional id as an int16-length string.  Value: int16
version; version 0 is written (readable by every Kafka version), versions 0 and 1 (flexible,
with tagged fields) are read.  A null value is a tombstone: the transactional id expired.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pykbroker.coordinator.serde_primitives import Reader, Writer

KEY_VERSION = 0
VALUE_VERSION = 0


class TxnLogSerdeError(ValueError):
    pass


class _Reader(Reader):
    __slots__ = ()
    error = TxnLogSerdeError


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
    return Writer().i16(KEY_VERSION).string(transactional_id).done()


def decode_key(buf: bytes) -> str:
    r = _Reader(bytes(buf))
    version = r.i16()
    if version != KEY_VERSION:
        raise TxnLogSerdeError(f"unknown transaction log key version {version}")
    n = r.i16()
    if n < 0 or r.remaining != n:
        raise TxnLogSerdeError("bad transactional id length")
    return r.raw(n).decode()


def encode_value(v: TxnLogValue) -> bytes:
    w = (Writer().i16(VALUE_VERSION).i64(v.producer_id).i16(v.producer_epoch).i32(v.timeout_ms).i8(v.status)
         .i32(len(v.partitions)))
    for topic, parts in sorted(v.partitions.items()):
        w.string(topic).i32(len(parts))
        for p in sorted(parts):
            w.i32(p)
    return w.i64(v.last_update_ms).i64(v.start_ms).done()


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
            r.tags()
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
