"""Record batch header codec, validation and offset assignment."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pykbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    MESSAGE_TOO_LARGE,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    UNSUPPORTED_COMPRESSION_TYPE,
    InvalidRecords,
    assign_offsets,
    build_batch,
    decode_records,
    iter_batches,
    parse_batch_header,
    validate_for_append,
)

NOW = 1_700_000_000_000


def _fix_crc(buf: bytearray, pos: int = 0) -> None:
    length = struct.unpack_from(">i", buf, pos + 8)[0]
    struct.pack_into(">I", buf, pos + 17, crc32c.crc32c(bytes(buf[pos + 21 : pos + 12 + length])))


def _patch(batch: bytes, offset: int, fmt: str, value: int, *, fix_crc: bool = True) -> bytearray:
    buf = bytearray(batch)
    struct.pack_into(fmt, buf, offset, value)
    if fix_crc:
        _fix_crc(buf)
    return buf


def _validate(buf: bytes | bytearray, **kw: object) -> list:  # type: ignore[type-arg]
    args: dict[str, object] = {
        "max_batch_bytes": 1_000_000,
        "now_ms": NOW,
        "timestamp_type": TIMESTAMP_CREATE_TIME,
    }
    args.update(kw)
    return validate_for_append(buf, **args)  # type: ignore[arg-type]


def _error(buf: bytes | bytearray, **kw: object) -> int:
    with pytest.raises(InvalidRecords) as info:
        _validate(buf, **kw)
    return info.value.error_code


# --- roundtrip ---------------------------------------------------------------------------------

record_st = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=200),
    st.lists(st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=20)), max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record_st, min_size=1, max_size=8),
    base_offset=st.integers(0, 2**62),
    ts_base=st.integers(0, 2**40),
    ts_deltas=st.lists(st.integers(-(2**20), 2**20), min_size=8, max_size=8),
    producer_id=st.integers(-1, 2**62),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
    is_transactional=st.booleans(),
    compression=st.sampled_from([0, 1, 2, 3, 4]),
    leader_epoch=st.integers(-1, 2**31 - 1),
)
def test_build_parse_decode_roundtrip(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    base_offset: int,
    ts_base: int,
    ts_deltas: list[int],
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    is_transactional: bool,
    compression: int,
    leader_epoch: int,
) -> None:
    timestamps = [max(0, ts_base + d) for d in ts_deltas[: len(records)]]
    data = build_batch(
        records,
        base_offset=base_offset,
        timestamp_ms=timestamps[0],
        timestamps=timestamps,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=is_transactional,
        compression=compression,
        partition_leader_epoch=leader_epoch,
    )
    h = parse_batch_header(data, 0)
    assert h.position == 0
    assert h.size == len(data)
    assert h.base_offset == base_offset
    assert h.magic == 2
    assert h.partition_leader_epoch == leader_epoch
    assert h.records_count == len(records)
    assert h.last_offset_delta == len(records) - 1
    assert h.last_offset == base_offset + len(records) - 1
    assert h.next_offset == base_offset + len(records)
    assert h.base_timestamp == timestamps[0]
    assert h.max_timestamp == max(timestamps)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (producer_id, producer_epoch, base_sequence)
    assert h.compression == compression
    assert h.is_transactional == is_transactional
    assert not h.is_control
    assert h.timestamp_type == TIMESTAMP_CREATE_TIME
    assert [x.base_offset for x in iter_batches(data, verify_crc=True)] == [base_offset]
    decoded = decode_records(data)
    assert [(r.key, r.value, r.headers) for r in decoded] == [(k, v, list(hs)) for k, v, hs in records]
    assert [r.offset for r in decoded] == list(range(base_offset, base_offset + len(records)))
    assert [r.timestamp for r in decoded] == timestamps


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=0, max_size=120), st.integers(0, 130))
def test_parse_garbage_never_crashes(buf: bytes, pos: int) -> None:
    try:
        h = parse_batch_header(buf, pos)
    except InvalidRecords as exc:
        assert exc.error_code in (CORRUPT_MESSAGE, INVALID_RECORD)
    else:
        assert h.magic == 2 and h.batch_length >= 49
    try:
        for h in iter_batches(buf, verify_crc=True):
            assert h.position + h.size <= len(buf)
    except InvalidRecords:
        pass


def test_raw_snappy_is_accepted() -> None:
    import cramjam

    plain = build_batch([(b"k", b"v" * 100, [])], timestamp_ms=NOW)
    body = bytes(cramjam.snappy.compress_raw(plain[BATCH_HEADER_SIZE:]))
    buf = bytearray(plain[:BATCH_HEADER_SIZE] + body)
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">h", buf, 21, 2)
    _fix_crc(buf)
    assert decode_records(buf)[0].value == b"v" * 100


def test_iter_batches_stops_at_partial_tail() -> None:
    a = build_batch([(None, b"a", [])], timestamp_ms=NOW)
    b = build_batch([(None, b"b", [])], timestamp_ms=NOW, base_offset=1)
    blob = a + b
    for cut in range(len(a), len(blob)):
        assert [h.base_offset for h in iter_batches(blob[:cut])] == [0]
    assert [h.position for h in iter_batches(blob)] == [0, len(a)]
    assert [h.base_offset for h in iter_batches(blob, len(a))] == [1]


def test_iter_batches_verify_crc_detects_flip() -> None:
    data = bytearray(build_batch([(b"k", b"value", [])], timestamp_ms=NOW))
    data[-1] ^= 0xFF
    assert len(list(iter_batches(data))) == 1
    with pytest.raises(InvalidRecords) as info:
        list(iter_batches(data, verify_crc=True))
    assert info.value.error_code == CORRUPT_MESSAGE


# --- validation ----------------------------------------------------------------------------------


def _batch(**kw: object) -> bytes:
    args: dict[str, object] = {"timestamp_ms": NOW}
    args.update(kw)
    return build_batch([(b"k", b"v", []), (b"k2", b"v2", [])], **args)  # type: ignore[arg-type]


def test_validate_ok() -> None:
    hs = _validate(_batch())
    assert len(hs) == 1 and hs[0].records_count == 2


@pytest.mark.parametrize("compression", [1, 2, 3, 4])
def test_validate_compressed_ok(compression: int) -> None:
    assert _validate(_batch(compression=compression))[0].compression == compression


def test_validate_empty() -> None:
    assert _error(b"") == INVALID_RECORD


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_validate_old_magic(magic: int) -> None:
    assert _error(_patch(_batch(), 16, ">b", magic, fix_crc=False)) == INVALID_RECORD


def test_validate_trailing_partial_batch() -> None:
    good = _batch()
    assert _error(good + good[:30]) == CORRUPT_MESSAGE
    assert _error(good + good[:5]) == CORRUPT_MESSAGE
    assert _error(good[:-1]) == CORRUPT_MESSAGE


def test_validate_batch_length_too_small() -> None:
    assert _error(_patch(_batch(), 8, ">i", 20, fix_crc=False)) == CORRUPT_MESSAGE


def test_validate_bad_crc() -> None:
    buf = bytearray(_batch())
    buf[-1] ^= 1
    assert _error(buf) == CORRUPT_MESSAGE


def test_validate_too_large() -> None:
    b = _batch()
    assert _error(b, max_batch_bytes=len(b) - 1) == MESSAGE_TOO_LARGE
    assert _validate(b, max_batch_bytes=len(b))


def test_validate_size_checked_before_crc() -> None:
    buf = bytearray(_batch())
    buf[-1] ^= 1
    assert _error(buf, max_batch_bytes=10) == MESSAGE_TOO_LARGE


def test_validate_nonzero_base_offset() -> None:
    assert _error(_batch(base_offset=5)) == INVALID_RECORD
    assert _validate(_batch(base_offset=5), from_client=False)


@pytest.mark.parametrize(("delta", "count"), [(5, 2), (1, 3), (-1, 0), (0, 0)])
def test_validate_count_mismatch(delta: int, count: int) -> None:
    buf = _patch(_batch(), 23, ">i", delta)
    buf = _patch(bytes(buf), 57, ">i", count)
    assert _error(buf) == INVALID_RECORD


def test_validate_control_batch_from_client() -> None:
    assert _error(_batch(is_control=True)) == INVALID_RECORD
    assert _validate(_batch(is_control=True), from_client=False)


def test_validate_producer_id_without_sequence() -> None:
    assert _error(_batch(producer_id=7, producer_epoch=0, base_sequence=-1)) == INVALID_RECORD
    assert _validate(_batch(producer_id=7, producer_epoch=0, base_sequence=0))


def test_validate_multiple_batches() -> None:
    a = _batch()
    assert _error(a + a) == INVALID_RECORD
    assert len(_validate(a + a, allow_multiple_batches=True)) == 2


def test_validate_timestamps() -> None:
    old = _batch(timestamp_ms=NOW - 10_000)
    assert _error(old, max_timestamp_diff_ms=5_000) == INVALID_TIMESTAMP
    assert _validate(old, max_timestamp_diff_ms=20_000)
    future = _batch(timestamp_ms=NOW + 10_000)
    assert _error(future, max_timestamp_after_ms=1_000) == INVALID_TIMESTAMP
    assert _validate(future, max_timestamp_before_ms=1_000)
    # Not checked for LogAppendTime topics, nor for records without timestamps.
    assert _validate(old, max_timestamp_diff_ms=1, timestamp_type=TIMESTAMP_LOG_APPEND_TIME)
    assert _validate(_batch(timestamp_ms=-1), max_timestamp_diff_ms=1)


def test_validate_client_sets_log_append_time() -> None:
    buf = _patch(_batch(), 21, ">h", 0x08)
    assert _error(buf, timestamp_type=TIMESTAMP_LOG_APPEND_TIME) == INVALID_TIMESTAMP


def test_validate_unknown_compression() -> None:
    assert _error(_patch(_batch(), 21, ">h", 6)) == UNSUPPORTED_COMPRESSION_TYPE
    assert _error(_batch(compression=4), allow_zstd=False) == UNSUPPORTED_COMPRESSION_TYPE


# --- offset assignment ---------------------------------------------------------------------------


def test_assign_offsets_create_time() -> None:
    a = _batch()
    buf = bytearray(a + a)
    hs = _validate(buf, allow_multiple_batches=True)
    nxt = assign_offsets(buf, hs, 100, partition_leader_epoch=7)
    assert nxt == 104
    parsed = list(iter_batches(buf, verify_crc=True))
    assert [h.base_offset for h in parsed] == [100, 102] == [h.base_offset for h in hs]
    assert all(h.partition_leader_epoch == 7 and h.timestamp_type == 0 for h in parsed)
    assert [r.offset for r in decode_records(buf[parsed[1].position :])] == [102, 103]


@pytest.mark.parametrize("compression", [0, 1, 4])
def test_assign_offsets_log_append_time_rewrites_crc(compression: int) -> None:
    buf = bytearray(_batch(timestamp_ms=NOW - 5, compression=compression))
    hs = _validate(buf, timestamp_type=TIMESTAMP_LOG_APPEND_TIME)
    assert assign_offsets(buf, hs, 42, log_append_time_ms=NOW) == 44
    (h,) = list(iter_batches(buf, verify_crc=True))
    assert h == hs[0]
    assert h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    assert h.max_timestamp == NOW
    assert h.base_timestamp == NOW - 5  # Kafka keeps baseTimestamp
    assert [(r.offset, r.timestamp) for r in decode_records(buf)] == [(42, NOW), (43, NOW)]
