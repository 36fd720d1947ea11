"""ProducerStateManager: Kafka's idempotence / transaction rules on batch headers (sans I/O)."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.protocol.records import BatchHeader, InvalidRecords, build_batch, parse_batch_header
from pykbroker.storage.producer_state import (
    INT32_MAX,
    NUM_BATCHES_TO_RETAIN,
    BatchMetadata,
    EndTxnMarker,
    ProducerStateError,
    ProducerStateManager,
    end_txn_marker_record,
    parse_end_txn_marker,
)

PID = 1000
T0 = 1_700_000_000_000


def header(
    *,
    pid: int = PID,
    epoch: int = 0,
    seq: int = 0,
    count: int = 1,
    offset: int = 0,
    ts: int = T0,
    txn: bool = False,
    control: bool = False,
) -> BatchHeader:
    return BatchHeader(
        position=0,
        base_offset=offset,
        batch_length=100,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=(0x10 if txn else 0) | (0x20 if control else 0),
        last_offset_delta=count - 1,
        base_timestamp=ts,
        max_timestamp=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=-1 if control else seq,
        records_count=count,
    )


COMMIT = EndTxnMarker(1, 0)
ABORT = EndTxnMarker(0, 0)


def append(m: ProducerStateManager, h: BatchHeader, marker: EndTxnMarker | None = None) -> BatchMetadata | None:
    """Check then update at the map end offset, as the log does."""
    dup = m.check(h, "coordinator" if h.is_control else "client", marker)
    if dup is None:
        h.base_offset = m.map_end_offset
        m.update(h, marker)
    return dup


def error_of(
    m: ProducerStateManager, h: BatchHeader, origin: str = "client", marker: EndTxnMarker | None = None
) -> int:
    with pytest.raises(ProducerStateError) as info:
        m.check(h, origin, marker)  # type: ignore[arg-type]
    return info.value.error_code


def test_unknown_producer_accepted_with_any_sequence() -> None:
    m = ProducerStateManager()
    assert m.check(header(seq=42, epoch=3)) is None
    append(m, header(seq=42, epoch=3, count=2))
    assert m.producers[PID].last_seq == 43
    assert m.map_end_offset == 2


def test_each_of_the_last_five_batches_is_a_duplicate() -> None:
    m = ProducerStateManager()
    for i in range(7):
        append(m, header(seq=i * 2, count=2))  # offsets 2i, 2i+1
    assert len(m.producers[PID].batches) == NUM_BATCHES_TO_RETAIN
    for i in range(2, 7):
        dup = m.check(header(seq=i * 2, count=2))
        assert dup is not None
        assert (dup.first_offset, dup.last_offset) == (i * 2, i * 2 + 1)
    # older than the retained five: no longer recognised, and out of order
    assert error_of(m, header(seq=2, count=2)) == ErrorCode.out_of_order_sequence_number
    # same first sequence but another range is not a duplicate
    assert error_of(m, header(seq=12, count=1)) == ErrorCode.out_of_order_sequence_number
    assert m.check(header(seq=14)) is None  # the next one is fine


def test_out_of_order_sequence() -> None:
    m = ProducerStateManager()
    append(m, header(seq=0, count=3))
    assert error_of(m, header(seq=4)) == ErrorCode.out_of_order_sequence_number  # gap
    assert error_of(m, header(seq=1)) == ErrorCode.out_of_order_sequence_number  # overlap
    assert m.check(header(seq=3)) is None


def test_fenced_epoch() -> None:
    m = ProducerStateManager()
    append(m, header(epoch=5, seq=0))
    assert error_of(m, header(epoch=4, seq=1)) == ErrorCode.invalid_producer_epoch
    assert error_of(m, header(epoch=4, seq=0, control=True), "coordinator", COMMIT) == ErrorCode.invalid_producer_epoch
    # replication is trusted
    assert m.check(header(epoch=4, seq=1), "replication") is None


def test_new_epoch_must_start_at_sequence_zero() -> None:
    m = ProducerStateManager()
    append(m, header(epoch=0, seq=0, count=5))
    assert error_of(m, header(epoch=1, seq=5)) == ErrorCode.out_of_order_sequence_number
    assert m.check(header(epoch=1, seq=0)) is None
    append(m, header(epoch=1, seq=0))
    assert m.producers[PID].epoch == 1
    assert [b.first_seq for b in m.producers[PID].batches] == [0]  # the old epoch's batches are forgotten


def test_coordinator_appends_skip_sequence_checks() -> None:
    m = ProducerStateManager()
    append(m, header(seq=0))
    assert m.check(header(seq=77), "coordinator") is None
    assert m.check(header(seq=0), "coordinator") is None  # no duplicate detection either


def test_sequence_wraps_at_int32_max() -> None:
    m = ProducerStateManager()
    append(m, header(seq=INT32_MAX - 1, count=2))  # INT32_MAX-1, INT32_MAX
    assert m.producers[PID].last_seq == INT32_MAX
    assert m.check(header(seq=0, count=3)) is None
    append(m, header(seq=0, count=3))
    # a batch spanning the wrap
    m2 = ProducerStateManager()
    append(m2, header(seq=INT32_MAX - 1, count=4))  # ..., INT32_MAX, 0, 1
    assert m2.producers[PID].last_seq == 1
    dup = m2.check(header(seq=INT32_MAX - 1, count=4))
    assert dup is not None and dup.last_seq == 1
    assert m2.check(header(seq=2)) is None


def test_transaction_lifecycle_and_first_unstable_offset() -> None:
    m = ProducerStateManager()
    append(m, header(pid=1, seq=0, count=2, txn=True))  # offsets 0-1
    append(m, header(pid=2, seq=0, txn=True))  # offset 2
    append(m, header(pid=1, seq=2, txn=True))  # 3: same txn
    assert m.first_unstable_offset() == 0
    assert m.ongoing_transactions() == {1: 0, 2: 2}
    # a non-transactional write while the producer's transaction is open
    assert error_of(m, header(pid=1, seq=3)) == ErrorCode.invalid_txn_state
    h = header(pid=1, epoch=0, control=True)
    assert m.check(h, "coordinator", COMMIT) is None
    h.base_offset = m.map_end_offset
    completed = m.update(h, COMMIT)
    assert completed is not None and (completed.first_offset, completed.last_offset, completed.is_aborted) == (
        0,
        4,
        False,
    )
    assert m.first_unstable_offset() == 2
    h = header(pid=2, control=True, offset=5)
    completed = m.update(h, ABORT)
    assert completed is not None and completed.is_aborted and completed.first_offset == 2
    assert m.last_stable_offset(completed) == 6
    assert m.first_unstable_offset() is None
    # sequences continue across transactions of the same epoch
    assert error_of(m, header(pid=1, seq=0, txn=True)) == ErrorCode.out_of_order_sequence_number
    assert m.check(header(pid=1, seq=3, txn=True)) is None
    # a marker without an open transaction completes nothing
    assert m.update(header(pid=1, control=True, offset=6), COMMIT) is None


def test_marker_with_new_epoch_resets_sequences() -> None:
    m = ProducerStateManager()
    append(m, header(seq=0, count=3, txn=True))
    append(m, header(epoch=1, control=True), ABORT)  # the coordinator bumped the epoch while aborting
    assert m.first_unstable_offset() is None
    assert error_of(m, header(epoch=1, seq=3, txn=True)) == ErrorCode.out_of_order_sequence_number
    assert m.check(header(epoch=1, seq=0, txn=True)) is None


def test_coordinator_epoch_fencing() -> None:
    m = ProducerStateManager()
    append(m, header(seq=0, txn=True))
    append(m, header(control=True), EndTxnMarker(1, 7))
    assert m.producers[PID].coordinator_epoch == 7
    code = error_of(m, header(control=True), "coordinator", EndTxnMarker(1, 6))
    assert code == ErrorCode.transaction_coordinator_fenced
    assert m.check(header(control=True), "coordinator", EndTxnMarker(0, 7)) is None


def test_check_all_chains_batches_of_one_append() -> None:
    m = ProducerStateManager()
    append(m, header(seq=0))
    hs = [header(seq=1, count=2), header(seq=3), header(pid=7, seq=9)]
    assert m.check_all(hs) is None
    with pytest.raises(ProducerStateError):
        m.check_all([header(seq=1), header(seq=3)])
    dup = m.check_all([header(pid=7, seq=0), header(seq=0)])
    assert dup is not None and dup.first_offset == 0
    assert m.check_all([header(seq=5)], "replication") is None


def test_snapshot_round_trip() -> None:
    m = ProducerStateManager()
    for i in range(6):
        append(m, header(pid=1, seq=i, ts=T0 + i))
    append(m, header(pid=2, epoch=3, seq=0, count=4, txn=True))
    append(m, header(pid=3, seq=0, txn=True))
    append(m, header(pid=3, control=True), EndTxnMarker(0, 4))
    restored = ProducerStateManager.from_snapshot(m.snapshot())
    assert restored.map_end_offset == m.map_end_offset
    assert restored.producers == m.producers
    assert restored.first_unstable_offset() == m.first_unstable_offset() == 6
    for i in range(1, 6):
        assert restored.check(header(pid=1, seq=i)) is not None
    assert restored.producers[3].coordinator_epoch == 4
    for bad in (b"", b"\x00\x01garbage", b'{"version": 9}', b'{"version": 1, "producers": []}'):
        with pytest.raises(ValueError):
            ProducerStateManager.from_snapshot(bad)


def test_expiry() -> None:
    m = ProducerStateManager()
    append(m, header(pid=1, seq=0, ts=T0))
    append(m, header(pid=2, seq=0, ts=T0 + 500))
    append(m, header(pid=3, seq=0, ts=T0, txn=True))  # open transaction: never expires
    assert m.remove_expired(T0 + 999, 1000) == []
    assert m.remove_expired(T0 + 1000, 1000) == [1]
    assert set(m.producers) == {2, 3}
    assert m.remove_expired(T0 + 10_000, 1000) == [2]
    assert m.first_unstable_offset() == 2
    # an expired producer is unknown again: any sequence is accepted
    assert m.check(header(pid=1, seq=99)) is None


def test_marker_codec() -> None:
    key, value, headers = end_txn_marker_record(False, 5)
    batch = build_batch(
        [(key, value, headers)],
        timestamp_ms=T0,
        producer_id=PID,
        producer_epoch=0,
        is_control=True,
        is_transactional=True,
    )
    assert parse_batch_header(batch, 0).is_control
    assert parse_end_txn_marker(batch) == EndTxnMarker(0, 5)
    key, value, _ = end_txn_marker_record(True, 9)
    marker = parse_end_txn_marker(build_batch([(key, value, [])], timestamp_ms=T0, is_control=True))
    assert marker is not None and marker.is_commit and marker.coordinator_epoch == 9
    with pytest.raises(InvalidRecords):
        parse_end_txn_marker(build_batch([(b"\x00\x00\x00\x02", value, [])], timestamp_ms=T0, is_control=True))
    with pytest.raises(InvalidRecords):
        parse_end_txn_marker(build_batch([(None, value, [])], timestamp_ms=T0, is_control=True))
