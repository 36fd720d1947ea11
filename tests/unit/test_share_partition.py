"""The share-partition state machine (pykbroker.coordinator.share.partition), driven with a fake clock."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.share import serde
from pykbroker.coordinator.share.partition import (
    AckType,
    ArchiveReason,
    LogBatch,
    RecordState,
    ShareLimits,
    SharePartition,
    StateBatch,
)


def sp(start: int = 0, lock: int = 1000, limit: int = 3, locks: int = 100) -> SharePartition:
    return SharePartition(start, ShareLimits(lock_duration_ms=lock, delivery_count_limit=limit,
                                             max_record_locks=locks))


def test_acquire_distinct_records_per_member() -> None:
    p = sp()
    got_a, _ = p.acquire("a", [LogBatch(0, 4)], 3, now=0)
    assert got_a == [(0, 2, 1)]
    got_b, _ = p.acquire("b", [LogBatch(0, 4)], 10, now=0)
    assert got_b == [(3, 4, 1)]
    got_c, _ = p.acquire("c", [LogBatch(0, 4)], 10, now=0)
    assert got_c == []
    assert p.end_offset == 5 and p.start_offset == 0


def test_accept_moves_start_offset() -> None:
    p = sp()
    p.acquire("a", [LogBatch(0, 4)], 10, now=0)
    assert p.acknowledge("a", 0, 2, [AckType.ACCEPT], now=1) == (ErrorCode.none, [])
    assert p.start_offset == 3
    assert p.acknowledge("a", 3, 4, [1, 1], now=1)[0] == ErrorCode.none
    assert p.start_offset == 5 and not p.records


def test_ack_by_other_member_or_twice_is_invalid_record_state() -> None:
    p = sp()
    p.acquire("a", [LogBatch(0, 1)], 10, now=0)
    assert p.acknowledge("b", 0, 0, [1], now=0)[0] == ErrorCode.invalid_record_state
    assert p.acknowledge("a", 0, 0, [1], now=0)[0] == ErrorCode.none
    assert p.acknowledge("a", 0, 0, [1], now=0)[0] == ErrorCode.invalid_record_state
    # All or nothing: offset 1 is still acquired, offset 2 never was.
    assert p.acknowledge("a", 1, 2, [1], now=0)[0] == ErrorCode.invalid_record_state
    assert p.records[1].state == RecordState.ACQUIRED
    assert p.acknowledge("a", 1, 1, [9], now=0)[0] == ErrorCode.invalid_request
    assert p.acknowledge("a", 1, 1, [1, 1], now=0)[0] == ErrorCode.invalid_request


def test_release_redelivers_with_growing_count_then_archives() -> None:
    p = sp(limit=3)
    for expected in (1, 2, 3):
        got, _ = p.acquire("a", [LogBatch(0, 0)], 10, now=0)
        assert got == [(0, 0, expected)]
        code, archived = p.acknowledge("a", 0, 0, [AckType.RELEASE], now=0)
        assert code == ErrorCode.none
    assert archived == [serde_archived(0, 3, ArchiveReason.DELIVERY_COUNT_EXCEEDED)]
    assert p.start_offset == 1
    assert p.acquire("a", [LogBatch(0, 0)], 10, now=0)[0] == []


def serde_archived(off: int, count: int, reason: ArchiveReason):  # type: ignore[no-untyped-def]
    from pykbroker.coordinator.share.partition import Archived
    return Archived(off, count, reason)


def test_lock_expiry_releases_and_counts() -> None:
    p = sp(lock=1000, limit=2)
    p.acquire("a", [LogBatch(0, 1)], 10, now=0)
    assert p.next_deadline() == 1000
    assert p.expire_locks(999) == (False, [])
    changed, archived = p.expire_locks(1000)
    assert changed and archived == []
    assert p.fetch_offset() == 0 and p.has_available()
    got, _ = p.acquire("b", [LogBatch(0, 1)], 10, now=1000)
    assert got == [(0, 1, 2)]
    changed, archived = p.expire_locks(2000)
    assert [a.reason for a in archived] == [ArchiveReason.DELIVERY_COUNT_EXCEEDED] * 2
    assert p.start_offset == 2


def test_renew_extends_lock() -> None:
    p = sp(lock=1000)
    p.acquire("a", [LogBatch(0, 0)], 10, now=0)
    assert p.acknowledge("a", 0, 0, [AckType.RENEW], now=900)[0] == ErrorCode.none
    assert p.expire_locks(1500) == (False, [])
    assert p.records[0].state == RecordState.ACQUIRED


def test_reject_archives_for_dead_letter() -> None:
    p = sp()
    p.acquire("a", [LogBatch(0, 2)], 10, now=0)
    code, archived = p.acknowledge("a", 0, 2, [1, 3, 1], now=0)
    assert code == ErrorCode.none
    assert archived == [serde_archived(1, 1, ArchiveReason.REJECTED)]
    assert p.start_offset == 3


def test_max_record_locks_bounds_in_flight() -> None:
    p = sp(locks=3)
    got, _ = p.acquire("a", [LogBatch(0, 9)], 100, now=0)
    assert got == [(0, 2, 1)]
    p.acknowledge("a", 0, 0, [1], now=0)
    got, _ = p.acquire("b", [LogBatch(0, 9)], 100, now=0)
    assert got == [(3, 3, 1)]


def test_non_deliverable_batches_and_holes_are_archived() -> None:
    p = sp(start=5)
    got, archived = p.acquire("a", [LogBatch(5, 6, deliverable=False), LogBatch(9, 10)], 10, now=0)
    assert got == [(9, 10, 1)]
    assert [a.offset for a in archived] == [5, 6, 7, 8]
    assert all(a.reason == ArchiveReason.GAP for a in archived)
    assert p.start_offset == 9


def test_member_leaving_releases_its_records() -> None:
    p = sp()
    p.acquire("a", [LogBatch(0, 1)], 10, now=0)
    p.acquire("b", [LogBatch(2, 2)], 10, now=0)
    assert p.release_member("a") == []
    assert p.acquired_by("a") == [] and p.acquired_by("b") == [2]
    assert p.fetch_offset() == 0


def test_move_start_forgets_below() -> None:
    p = sp()
    p.acquire("a", [LogBatch(0, 4)], 10, now=0)
    p.move_start(3)
    assert sorted(p.records) == [3, 4] and p.start_offset == 3


def test_state_batches_roundtrip_through_serde() -> None:
    p = sp(limit=5)
    p.acquire("a", [LogBatch(10, 15)], 10, now=0)
    p.acknowledge("a", 11, 11, [1], now=0)
    p.acknowledge("a", 12, 12, [2], now=0)
    p.acknowledge("a", 13, 13, [3], now=0)
    batches = p.state_batches()
    assert batches == [StateBatch(10, 10, RecordState.AVAILABLE, 1), StateBatch(11, 11, RecordState.ACKNOWLEDGED, 1),
                       StateBatch(12, 12, RecordState.AVAILABLE, 1), StateBatch(13, 13, RecordState.ARCHIVED, 1),
                       StateBatch(14, 15, RecordState.AVAILABLE, 1)]
    key = serde.StateKey("g", uuid.uuid4(), 3)
    assert serde.decode_key(serde.encode_key(key)) == key
    snap = serde.Snapshot(p.state_epoch, 0, p.start_offset, tuple(batches), 123)
    back = serde.decode_value(serde.encode_value(snap))
    assert back == snap
    q = SharePartition.restore(back.start_offset, back.batches, p.limits)
    assert q.start_offset == 10 and q.end_offset == 16
    got, _ = q.acquire("b", [LogBatch(10, 15)], 10, now=0)
    assert got == [(10, 10, 2), (12, 12, 2), (14, 15, 2)]  # nothing acknowledged is redelivered


def test_serde_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        serde.decode_value(b"\x00\x00\x00")
    with pytest.raises(ValueError):
        serde.decode_value(b"\x00\x07" + b"\x00" * 40)


def test_acknowledge_bounds_work_to_the_in_flight_window() -> None:
    p = sp()
    p.acquire("a", [LogBatch(0, 3)], 10, now=0)
    p.acknowledge("a", 0, 1, [AckType.ACCEPT], now=0)
    # A range claiming billions of offsets is answered at once, not walked.
    assert p.acknowledge("a", 2, 2**62, [1], now=0)[0] == ErrorCode.invalid_record_state
    assert p.acknowledge("a", -(2**62), 2, [1], now=0)[0] == ErrorCode.invalid_record_state
    # Finished offsets may only be named as gaps.
    assert p.acknowledge("a", -(2**62), 2, [AckType.GAP], now=0)[0] == ErrorCode.none
    assert p.start_offset == 3
    assert p.acknowledge("a", 0, 3, [1, 0, 0, 1], now=0)[0] == ErrorCode.invalid_record_state
    assert p.acknowledge("a", 1, 3, [0, 0, 1], now=0)[0] == ErrorCode.none
    assert p.start_offset == 4


def test_random_operations_keep_the_invariants() -> None:
    """Seeded random acquire/acknowledge/expire/leave sequences over three members: no record is held by
    two members, nothing acknowledged comes back, the start offset only grows, delivery counts stay within
    the limit, and a snapshot restores everything but the locks."""
    import random

    for seed in range(40):
        rnd = random.Random(seed)
        p = sp(lock=100, limit=3, locks=25)
        log_end = 0
        now = 0
        accepted: set[int] = set()
        finished_start = 0
        for _ in range(300):
            now += rnd.randint(0, 40)
            op = rnd.random()
            member = rnd.choice("abc")
            if op < 0.15:
                log_end += rnd.randint(1, 8)
            elif op < 0.5:
                got, _ = p.acquire(member, [LogBatch(o, min(o + 3, log_end - 1)) for o in range(0, log_end, 4)],
                                   rnd.randint(1, 10), now)
                for first, last, count in got:
                    assert 1 <= count <= 3
                    for off in range(first, last + 1):
                        assert off not in accepted, f"seed {seed}: acknowledged offset {off} delivered again"
            elif op < 0.85:
                held = p.acquired_by(member)
                if held:
                    off = rnd.choice(held)
                    kind = rnd.choice([AckType.ACCEPT, AckType.RELEASE, AckType.REJECT, AckType.RENEW])
                    code, archived = p.acknowledge(member, off, off, [kind], now)
                    assert code == ErrorCode.none
                    if kind == AckType.ACCEPT:
                        accepted.add(off)
                    for a in archived:
                        assert a.reason in (ArchiveReason.REJECTED, ArchiveReason.DELIVERY_COUNT_EXCEEDED)
            elif op < 0.95:
                p.expire_locks(now)
            else:
                p.release_member(member)
            owners = {}
            for off, r in p.iter_in_flight():
                assert p.start_offset <= off < p.end_offset
                assert r.delivery_count <= 3
                if r.state == RecordState.ACQUIRED:
                    assert off not in owners
                    owners[off] = r.member
            assert p.start_offset >= finished_start
            finished_start = p.start_offset
            if p.start_offset < p.end_offset:
                assert p.records.get(p.start_offset) is None or \
                    p.records[p.start_offset].state not in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)
        q = SharePartition.restore(p.start_offset, p.state_batches(), p.limits)
        assert q.start_offset == p.start_offset
        for off, r in p.iter_in_flight():
            restored = q.records.get(off)
            assert restored is not None and restored.delivery_count == r.delivery_count
            expected = RecordState.AVAILABLE if r.state == RecordState.ACQUIRED else r.state
            assert restored.state == expected
