"""Record formats of ``__delayed_records``, the scheduled log of delayed delivery.

Two kinds of records, told apart by the key's kind byte (big-endian, version 0):

* an **entry**: key ``(version, 0, due_ms, uid, partition, topic)``, value ``(version, timestamp, key,
  value, headers)`` -- one original record waiting for its due time; its tombstone (same key, null
  value) says it was delivered (or dropped because its topic is gone);
* a **producer sequence**: key ``(version, 2, producer_id, partition, topic)``, value ``(version, epoch,
  base_sequence, last_offset_delta, timestamp)`` -- the last idempotent batch of that producer whose
  records were all scheduled, so the target's producer state can be given it again after a restart;
* a **delivery intent**: key ``(version, 1, partition, topic)``, value ``(1, base_sequence, offset_before,
  count, uids, producer_id, producer_epoch)`` -- written just before a batch of entries is appended to the
  target, so that a restart (or a new leader in a cluster) can tell whether that append happened, or
  re-send exactly that batch (see :mod:`pykbroker.delay.service`). Version 0 values lack the producer id
  and epoch: they are the single broker's (``2**62 + broker.id``, epoch 0).

Keys are unique per entry and per target partition, so the topic can be compacted: an entry and its
tombstone go away together, and only the latest intent per target partition is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from pykbroker.coordinator.serde_primitives import Reader, SerdeError, Writer

VERSION = 0
INTENT_VERSION = 1
KIND_ENTRY = 0
KIND_INTENT = 1
KIND_SEQUENCE = 2

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Entry:
    """One record waiting for ``due_ms``; ``uid`` is unique on this broker and breaks ties in due order."""

    due_ms: int
    uid: int
    topic: str
    partition: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()

    @property
    def sort_key(self) -> tuple[int, int]:
        return self.due_ms, self.uid

    @property
    def size(self) -> int:
        """Roughly the bytes this record takes in a batch (for splitting deliveries by max.message.bytes)."""
        n = 24 + len(self.key or b"") + len(self.value or b"")
        for k, v in self.headers:
            n += 8 + len(k) + len(v or b"")
        return n


@dataclass(frozen=True, slots=True)
class Intent:
    """A delivery about to be appended to ``topic``-``partition``: ``count`` entries (``uids``) as one
    batch with sequences from ``base_sequence``, at the target's log end offset ``offset_before`` (-1:
    unknown, the target was led by another broker), stamped ``producer_id``/``producer_epoch`` (-1: the
    single broker's own, from a version 0 value)."""

    topic: str
    partition: int
    base_sequence: int
    offset_before: int
    uids: tuple[int, ...]
    producer_id: int = -1
    producer_epoch: int = -1


def entry_key(e: Entry) -> bytes:
    return (Writer().i16(VERSION).i8(KIND_ENTRY).i64(e.due_ms).i64(e.uid).i32(e.partition).string(e.topic)
            .done())


def entry_value(e: Entry) -> bytes:
    w = Writer().i16(VERSION).i64(e.timestamp).bytes_(e.key).bytes_(e.value).i32(len(e.headers))
    for k, v in e.headers:
        w.string(k).bytes_(v)
    return w.done()


def intent_key(topic: str, partition: int) -> bytes:
    return Writer().i16(VERSION).i8(KIND_INTENT).i32(partition).string(topic).done()


def intent_value(i: Intent) -> bytes:
    w = Writer().i16(INTENT_VERSION).i32(i.base_sequence).i64(i.offset_before).i32(len(i.uids))
    for uid in i.uids:
        w.i64(uid)
    return w.i64(i.producer_id).i16(i.producer_epoch).done()


@dataclass(frozen=True, slots=True)
class ProducerSequence:
    """An idempotent batch scheduled instead of appended: what the target's producer state must know."""

    producer_id: int
    topic: str
    partition: int
    epoch: int
    base_sequence: int
    last_offset_delta: int
    timestamp: int


def sequence_key(s: ProducerSequence) -> bytes:
    return Writer().i16(VERSION).i8(KIND_SEQUENCE).i64(s.producer_id).i32(s.partition).string(s.topic).done()


def sequence_value(s: ProducerSequence) -> bytes:
    return Writer().i16(VERSION).i16(s.epoch).i32(s.base_sequence).i32(s.last_offset_delta).i64(s.timestamp).done()


@dataclass(frozen=True, slots=True)
class SequenceKey:
    producer_id: int
    topic: str
    partition: int


def decode_sequence(k: SequenceKey, value: bytes) -> ProducerSequence:
    r = Reader(value)
    version = r.i16()
    if version != VERSION:
        raise SerdeError(f"unknown __delayed_records sequence version {version}")
    return ProducerSequence(k.producer_id, k.topic, k.partition, r.i16(), r.i32(), r.i32(), r.i64())


@dataclass(frozen=True, slots=True)
class EntryKey:
    due_ms: int
    uid: int
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class IntentKey:
    topic: str
    partition: int


def decode_key(data: bytes) -> EntryKey | IntentKey | SequenceKey:
    r = Reader(data)
    version = r.i16()
    if version != VERSION:
        raise SerdeError(f"unknown __delayed_records key version {version}")
    kind = r.i8()
    if kind == KIND_ENTRY:
        due, uid, partition = r.i64(), r.i64(), r.i32()
        topic = r.string()
        if topic is None:
            raise SerdeError("null topic in a __delayed_records key")
        return EntryKey(due, uid, topic, partition)
    if kind == KIND_INTENT:
        partition = r.i32()
        topic = r.string()
        if topic is None:
            raise SerdeError("null topic in a __delayed_records key")
        return IntentKey(topic, partition)
    if kind == KIND_SEQUENCE:
        pid, partition = r.i64(), r.i32()
        topic = r.string()
        if topic is None:
            raise SerdeError("null topic in a __delayed_records key")
        return SequenceKey(pid, topic, partition)
    raise SerdeError(f"unknown __delayed_records key kind {kind}")


def decode_entry(k: EntryKey, value: bytes) -> Entry:
    r = Reader(value)
    version = r.i16()
    if version != VERSION:
        raise SerdeError(f"unknown __delayed_records entry version {version}")
    timestamp = r.i64()
    key, val = r.bytes_(), r.bytes_()
    n = r.i32()
    if n < 0 or n > r.remaining:
        raise SerdeError(f"bad header count {n}")
    headers = []
    for _ in range(n):
        hk = r.string()
        if hk is None:
            raise SerdeError("null header key")
        headers.append((hk, r.bytes_()))
    return Entry(k.due_ms, k.uid, k.topic, k.partition, timestamp, key, val, tuple(headers))


def decode_intent(k: IntentKey, value: bytes) -> Intent:
    r = Reader(value)
    version = r.i16()
    if version not in (0, INTENT_VERSION):
        raise SerdeError(f"unknown __delayed_records intent version {version}")
    base, before, n = r.i32(), r.i64(), r.i32()
    if n < 0 or n * 8 > r.remaining:
        raise SerdeError(f"bad uid count {n}")
    uids = tuple(r.i64() for _ in range(n))
    if version == 0:
        return Intent(k.topic, k.partition, base, before, uids)
    return Intent(k.topic, k.partition, base, before, uids, r.i64(), r.i16())
