"""Delayed delivery's sans-I/O core: due times from headers, the schedule's order, the record formats."""

from __future__ import annotations

import random

import pytest

from pykbroker.coordinator.serde_primitives import SerdeError
from pykbroker.delay.schedule import Schedule, due_times
from pykbroker.delay.serde import (
    Entry,
    EntryKey,
    Intent,
    IntentKey,
    ProducerSequence,
    SequenceKey,
    decode_entry,
    decode_intent,
    decode_key,
    decode_sequence,
    entry_key,
    entry_value,
    intent_key,
    intent_value,
    sequence_key,
    sequence_value,
)
from pykbroker.protocol.records import INVALID_RECORD, InvalidRecords, Record

NOW = 1_700_000_000_000
MAX = 7 * 86_400_000


def rec(ts: int = NOW, *headers: tuple[str, bytes | None]) -> Record:
    return Record(0, ts, b"k", b"v", list(headers))


def dues(records: list[Record], default: int = 0, lat: bool = False, now: int = NOW) -> list[int | None]:
    return due_times(records, default_delay_ms=default, now_ms=now, log_append_time=lat, max_delay_ms=MAX)


def test_relative_delay_counts_from_the_record_timestamp() -> None:
    assert dues([rec(NOW - 300, ("pykbroker.delay.ms", b"1000"))]) == [NOW + 700]


def test_log_append_time_or_no_timestamp_counts_from_now() -> None:
    assert dues([rec(NOW - 300, ("pykbroker.delay.ms", b"1000"))], lat=True) == [NOW + 1000]
    assert dues([rec(-1, ("pykbroker.delay.ms", b"1000"))]) == [NOW + 1000]


def test_absolute_wins_over_relative_and_topic_default() -> None:
    r = rec(NOW, ("pykbroker.delay.ms", b"1000"), ("pykbroker.deliver.at.ms", str(NOW + 5000).encode()))
    assert dues([r], default=9000) == [NOW + 5000]


def test_topic_default_and_header_zero_override() -> None:
    assert dues([rec(), rec(NOW, ("pykbroker.delay.ms", b"0"))], default=2000) == [NOW + 2000, None]


def test_past_due_and_no_delay_are_immediate() -> None:
    r = rec(NOW, ("pykbroker.deliver.at.ms", str(NOW - 1).encode()))
    assert dues([r, rec(), rec(NOW, ("other", b"1000"))]) == [None, None, None]
    # Due exactly now is not delayed either.
    assert dues([rec(NOW, ("pykbroker.deliver.at.ms", str(NOW).encode()))]) == [None]


@pytest.mark.parametrize("raw", [b"", b"-5", b"+5", b" 5", b"5ms", b"1.5", None, b"9" * 20, "\u0661".encode()])
def test_bad_values_are_invalid_record_naming_the_header(raw: bytes | None) -> None:
    records = [rec(), rec(NOW, ("pykbroker.delay.ms", raw)), rec(NOW, ("pykbroker.deliver.at.ms", raw))]
    with pytest.raises(InvalidRecords) as e:
        dues(records)
    assert e.value.error_code == INVALID_RECORD
    assert [i for i, _ in e.value.record_errors] == [1, 2]
    assert "pykbroker.delay.ms" in e.value.record_errors[0][1]
    assert "pykbroker.deliver.at.ms" in e.value.record_errors[1][1]


def test_delay_above_the_maximum_is_refused() -> None:
    with pytest.raises(InvalidRecords) as e:
        dues([rec(NOW, ("pykbroker.delay.ms", str(MAX + 1).encode()))])
    assert "pykbroker.delay.max.ms" in e.value.record_errors[0][1]
    assert dues([rec(NOW, ("pykbroker.delay.ms", str(MAX).encode()))]) == [NOW + MAX]


def entry(due: int, uid: int, topic: str = "t", partition: int = 0) -> Entry:
    return Entry(due, uid, topic, partition, NOW, b"k", b"v", (("h", b"x"),))


def test_schedule_hands_out_due_entries_in_due_then_uid_order() -> None:
    rng = random.Random(7)
    s = Schedule()
    entries = [entry(NOW + rng.randrange(0, 50), uid) for uid in range(500)]
    for e in rng.sample(entries, len(entries)):
        s.add(e)
    assert len(s) == 500
    assert s.next_due() == min(e.due_ms for e in entries)
    out = []
    for now in range(NOW, NOW + 60, 7):
        got = s.pop_due(now, 1000)
        assert all(e.due_ms <= now for e in got)
        out.extend(got)
    assert [e.sort_key for e in out] == sorted(e.sort_key for e in entries)
    assert len(s) == 0 and s.next_due() is None


def test_schedule_limit_discard_and_readd() -> None:
    s = Schedule()
    assert s.add(entry(NOW + 10, 1)) is True  # the earliest: the timer must wake
    assert s.add(entry(NOW + 20, 2)) is False
    assert s.add(entry(NOW + 5, 3)) is True
    assert s.add(entry(NOW + 5, 3)) is False  # again: a no-op
    assert s.discard(3) is not None and s.discard(3) is None
    assert s.next_due() == NOW + 10  # the stale heap key is skipped
    assert [e.uid for e in s.pop_due(NOW + 100, 1)] == [1]
    got = s.pop_due(NOW + 100, 10)
    assert [e.uid for e in got] == [2]
    s.add_all(got)  # a failed delivery puts them back
    assert 2 in s and s.pop_due(NOW + 19, 10) == []


def test_entry_roundtrip() -> None:
    e = Entry(NOW + 5, 42, "orders", 3, NOW, None, b"\x00value", (("a", b"1"), ("b", None)))
    k = decode_key(entry_key(e))
    assert k == EntryKey(NOW + 5, 42, "orders", 3)
    assert isinstance(k, EntryKey)
    assert decode_entry(k, entry_value(e)) == e


def test_intent_and_sequence_roundtrip() -> None:
    i = Intent("orders", 3, 17, 12345, (1, 2, 3))
    k = decode_key(intent_key("orders", 3))
    assert k == IntentKey("orders", 3)
    assert isinstance(k, IntentKey)
    assert decode_intent(k, intent_value(i)) == i
    seq = ProducerSequence(1000, "orders", 3, 2, 40, 9, NOW)
    sk = decode_key(sequence_key(seq))
    assert sk == SequenceKey(1000, "orders", 3)
    assert isinstance(sk, SequenceKey)
    assert decode_sequence(sk, sequence_value(seq)) == seq


def test_keys_are_unique_per_entry_and_target() -> None:
    assert entry_key(entry(NOW, 1)) != entry_key(entry(NOW, 2))
    assert intent_key("t", 0) != intent_key("t", 1)


@pytest.mark.parametrize("data", [b"", b"\x00\x01\x00", b"\x00\x00\x07" + b"\x00" * 30, b"\x00\x00\x00\x00"])
def test_garbage_keys_raise_serde_error(data: bytes) -> None:
    with pytest.raises(SerdeError):
        decode_key(data)


def test_truncated_values_raise_serde_error() -> None:
    e = entry(NOW, 1)
    k = decode_key(entry_key(e))
    assert isinstance(k, EntryKey)
    with pytest.raises(SerdeError):
        decode_entry(k, entry_value(e)[:-3])
    with pytest.raises(SerdeError):
        decode_intent(IntentKey("t", 0), b"\x00\x00" + b"\x00" * 12 + b"\x7f\xff\xff\xff")


def test_intent_with_producer_and_version_0_values() -> None:
    k = IntentKey("orders", 3)
    i = Intent("orders", 3, 17, -1, (1, 2), producer_id=(1 << 62) + (1 << 32) + 5, producer_epoch=7)
    assert decode_intent(k, intent_value(i)) == i
    # A version 0 value (single broker, before producer ids were recorded) reads with -1: the broker's own.
    from pykbroker.coordinator.serde_primitives import Writer
    v0 = Writer().i16(0).i32(17).i64(12345).i32(2).i64(1).i64(2).done()
    assert decode_intent(k, v0) == Intent("orders", 3, 17, 12345, (1, 2), -1, -1)
    with pytest.raises(SerdeError):
        decode_intent(k, Writer().i16(9).done())


def test_schedule_discard_where_drops_one_partition_and_keeps_the_order() -> None:
    s = Schedule()
    s.add_all([entry(NOW + i, i, topic="a" if i % 2 else "b") for i in range(10)])
    assert s.discard_where(lambda e: e.topic == "a") == 5
    assert len(s) == 5 and 1 not in s
    assert [e.uid for e in s.pop_due(NOW + 100, 100)] == [0, 2, 4, 6, 8]
