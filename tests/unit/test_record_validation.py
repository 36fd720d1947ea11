"""Per-record validation of produced batches (Kafka's LogValidator), sans I/O.

Each poison batch is built byte by byte with a correct CRC, so only the
record-level checks can refuse it.  The C walk and the pure-Python walk must agree exactly,
on good batches and on hypothesis-mutated ones.
"""

from __future__ import annotations

import gzip
import random
import struct
import subprocess
import sys
import zlib

import lz4.frame
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pykbroker.protocol import record_validator as rv
from pykbroker.protocol.records import (
    _HEADER,
    _XERIAL_MAGIC,
    BATCH_HEADER_SIZE,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    LOG_OVERHEAD,
    InvalidRecords,
    _compress,
    _write_varint,
    batch_crc,
    build_batch,
    decode_records,
    parse_batch_header,
    validate_for_append,
)
from pykbroker.storage.log_config import LogConfig

NOW = 1_700_000_000_000
TP = "t-0"
LONG_MAX = (1 << 63) - 1


def _varint(v: int) -> bytes:
    out = bytearray()
    _write_varint(out, v)
    return bytes(out)


def record(
    *,
    ts_delta: int = 0,
    offset_delta: int = 0,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: bytes = b"\x00",
    attributes: int = 0,
    size_adjust: int = 0,
) -> bytes:
    """One encoded v2 record; ``headers`` is the raw header section (count varint first)."""
    body = bytearray([attributes])
    body += _varint(ts_delta) + _varint(offset_delta)
    for f in (key, value):
        body += _varint(-1) if f is None else _varint(len(f)) + f
    body += headers
    return _varint(len(body) + size_adjust) + bytes(body)


def batch(
    body: bytes,
    count: int,
    *,
    last_offset_delta: int | None = None,
    codec: int = COMPRESSION_NONE,
    compressed_body: bytes | None = None,
    base_ts: int = NOW,
    max_ts: int | None = None,
    attributes: int = 0,
    producer: tuple[int, int, int] = (-1, -1, -1),
) -> bytearray:
    """A v2 batch around ``body`` (the records region) with a correct CRC."""
    payload = body if codec == COMPRESSION_NONE else (compressed_body or _compress(codec, body))
    out = bytearray(BATCH_HEADER_SIZE)
    _HEADER.pack_into(
        out, 0, 0, BATCH_HEADER_SIZE - LOG_OVERHEAD + len(payload), -1, 2, 0, codec | attributes,
        count - 1 if last_offset_delta is None else last_offset_delta, base_ts,
        base_ts if max_ts is None else max_ts, *producer, count,
    )
    out += payload
    struct.pack_into(">I", out, 17, batch_crc(out, 0, len(out)))
    return out


def check(buf: bytearray, cfg: LogConfig | None = None, now: int = NOW) -> bytearray | None:
    """Header checks then record checks, as the produce handler runs them."""
    cfg = cfg or LogConfig()
    (header,) = validate_for_append(
        buf, max_batch_bytes=cfg.max_message_bytes, now_ms=now, timestamp_type=int(cfg.log_append_time),
        check_timestamps=False,
    )
    return rv.validate_records(
        buf, header, topic_partition=TP, now_ms=now, log_append_time=cfg.log_append_time,
        before_max_ms=cfg.timestamp_before_max_ms, after_max_ms=cfg.timestamp_after_max_ms,
        compacted=cfg.compact_enabled, compression_type=cfg.compression_type,
        max_message_bytes=cfg.max_message_bytes,
    )


def refused(buf: bytearray, cfg: LogConfig | None = None, now: int = NOW) -> InvalidRecords:
    with pytest.raises(InvalidRecords) as ei:
        check(buf, cfg, now)
    return ei.value


def both_walks(buf: bytes | bytearray, start: int, end: int, count: int) -> rv.WalkResult:
    """The walk's result, asserting the C and Python versions agree."""
    py = rv.py_walk(buf, start, end, count)
    if rv.NATIVE:
        assert rv.walk(buf, start, end, count) == py
    return py


def three() -> bytes:
    return b"".join(record(offset_delta=i, ts_delta=i, key=b"k%d" % i) for i in range(3))


# --- good batches --------------------------------------------------------------------------------


def test_native_walk_is_built() -> None:
    # The install (pip install -e .) compiles it; the pure-Python walk is only a fallback.
    assert rv.NATIVE


def test_good_batch_is_kept_as_sent() -> None:
    buf = bytearray(build_batch([(b"k", b"v", [("h", b"x")]), (None, b"w", [])], timestamp_ms=NOW))
    before = bytes(buf)
    assert check(buf) is None
    assert bytes(buf) == before
    err, lo, hi, first, null_keys, flags = both_walks(buf, 61, len(buf), 2)
    assert (err, lo, hi, first, null_keys, flags) == (None, 0, 0, 0, 1, 3)


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_compressed_good_batch_is_kept_as_sent(codec: int) -> None:
    buf = bytearray(build_batch([(b"k", b"v" * 100, [])] * 50, timestamp_ms=NOW, compression=codec))
    before = bytes(buf)
    assert check(buf) is None
    assert bytes(buf) == before


# --- poison batches ------------------------------------------------------------------------------


def test_record_length_that_lies_with_recomputed_crc() -> None:
    body = record(size_adjust=+1) + record(offset_delta=1)
    e = refused(batch(body, 2))
    assert e.error_code == INVALID_RECORD
    assert e.message == "Invalid record size: expected to read 9 bytes in record payload, but instead read 8"
    assert not e.record_errors
    e = refused(batch(record(size_adjust=+50), 1))
    assert e.message == (
        "Invalid record size: expected 58 bytes in record payload, but instead the buffer has only 8 remaining bytes."
    )


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_garbage_compressed_payload(codec: int) -> None:
    garbage = bytes(range(7, 250)) * 3
    e = refused(batch(record(), 1, codec=codec, compressed_body=garbage))
    assert e.error_code == CORRUPT_MESSAGE
    assert "cannot be decompressed" in e.message


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_truncated_compressed_payload(codec: int) -> None:
    good = _compress(codec, b"".join(record(offset_delta=i, value=bytes(range(256)) * 40) for i in range(20)))
    e = refused(batch(b"", 20, codec=codec, compressed_body=good[: len(good) // 2]))
    assert e.error_code in (CORRUPT_MESSAGE, INVALID_RECORD)


def test_record_count_claiming_2_31_minus_1_records_with_one_record() -> None:
    count = (1 << 31) - 1
    e = refused(batch(record(), count, last_offset_delta=count - 1))
    assert e.error_code == INVALID_RECORD
    assert e.message == "Incorrect declared batch size, premature EOF reached"


def test_more_records_than_declared_is_trailing_bytes() -> None:
    e = refused(batch(record() + record(offset_delta=1), 1))
    assert e.error_code == INVALID_RECORD
    assert e.message == "Incorrect declared batch size, records still remaining in file"
    e = refused(batch(record() + b"\x00\x00", 1))
    assert e.message == "Incorrect declared batch size, records still remaining in file"


def test_bad_offset_deltas_uncompressed_are_kept_as_kafka_does() -> None:
    # Kafka's assignOffsetsNonCompressed never reads the inner offset deltas; neither do we.
    body = record(offset_delta=5) + record(offset_delta=5) + record(offset_delta=0)
    buf = batch(body, 3)
    assert check(buf) is None
    assert both_walks(buf, 61, len(buf), 3)[5] & rv.FLAG_OFFSETS_IN_ORDER == 0


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_bad_offset_deltas_compressed_are_renumbered(codec: int) -> None:
    # Kafka rebuilds a compressed batch whose inner offsets are not 0..n-1 ("older clients").
    body = record(offset_delta=7, value=b"a") + record(offset_delta=7, value=b"b") + record(offset_delta=1, value=b"c")
    out = check(batch(body, 3, codec=codec, producer=(42, 3, 10)))
    assert out is not None
    h = parse_batch_header(out, 0)
    assert (h.compression, h.producer_id, h.producer_epoch, h.base_sequence) == (codec, 42, 3, 10)
    assert [(r.offset, r.value) for r in decode_records(out)] == [(0, b"a"), (1, b"b"), (2, b"c")]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        # a 6-byte varint as the offset delta
        (b"\x00\x00\x80\x80\x80\x80\x80\x01\x00\x00\x00", "Found invalid record structure"),
        # an 11-byte varlong as the timestamp delta
        (b"\x00" + b"\x80" * 10 + b"\x01\x00\x00\x00\x00", "Found invalid record structure"),
        # the record ends inside the timestamp varint
        (b"\x00\x80", "Found invalid record structure"),
    ],
)
def test_bad_varints(raw: bytes, message: str) -> None:
    body = _varint(len(raw)) + raw
    e = refused(batch(body, 1))
    assert (e.error_code, e.message) == (INVALID_RECORD, message)


def test_header_counts_that_overrun() -> None:
    e = refused(batch(record(headers=_varint(1000)), 1))
    assert e.message == "Found invalid number of record headers. 1000 is larger than the remaining size of the buffer"
    e = refused(batch(record(headers=_varint(-2)), 1))
    assert e.message == "Found invalid number of record headers -2"
    e = refused(batch(record(headers=_varint(1) + _varint(-1)), 1))
    assert e.message == "Invalid negative header key size -1"
    e = refused(batch(record(headers=_varint(1) + _varint(40) + b"h"), 1))
    assert e.message == "Found invalid record structure"
    raw = b"\x00\x00\x00" + _varint(90) + b"k"  # a key length past the end of the batch
    e = refused(batch(_varint(len(raw)) + raw, 1))
    assert (e.error_code, e.message) == (INVALID_RECORD, "Found invalid record structure")


def test_key_and_value_lengths_past_the_record() -> None:
    # value length runs past its record but stays in the batch: the size check catches it
    rec = bytearray(record(value=b"v"))
    second = record(offset_delta=1)
    rec[6] = 2 * 2  # value length 2 (zig-zag 4) instead of 1
    e = refused(batch(bytes(rec) + second, 2))
    # the header count is then read from the next record's bytes, and the headers overrun the batch
    assert (e.error_code, e.message) == (INVALID_RECORD, "Found invalid record structure")
    # a header value running into the next record but not past the batch: the size check
    rec = bytearray(record(headers=_varint(1) + _varint(1) + b"h" + _varint(0)))
    rec[-1] = 3 * 2
    e = refused(batch(bytes(rec) + second, 2))
    assert e.message == "Invalid record size: expected to read 11 bytes in record payload, but instead read 14"


# --- timestamps ----------------------------------------------------------------------------------


def test_every_record_timestamp_is_checked_not_only_the_batch_bounds() -> None:
    cfg = LogConfig(message_timestamp_before_max_ms=60_000, message_timestamp_after_max_ms=60_000)
    # base and max are in range; the middle record is an hour old
    body = record(ts_delta=0) + record(offset_delta=1, ts_delta=-3_600_000) + record(offset_delta=2, ts_delta=10)
    e = refused(batch(body, 3, max_ts=NOW + 10), cfg)
    assert e.error_code == INVALID_TIMESTAMP
    assert e.message == "One or more records have been rejected due to invalid timestamp"
    assert e.record_errors == [
        (1, f"Timestamp {NOW - 3_600_000} of message with offset 1 is out of range. "
            f"The timestamp should be within [{NOW - 60_000}, {NOW + 60_000}]")
    ]
    future = record(ts_delta=0) + record(offset_delta=1, ts_delta=120_000)
    assert [i for i, _ in refused(batch(future, 2), cfg).record_errors] == [1]
    assert check(batch(body, 3, max_ts=NOW + 10)) is None  # default bounds: anything goes


def test_difference_max_ms_applies_when_before_and_after_are_unset() -> None:
    cfg = LogConfig(message_timestamp_difference_max_ms=1000)
    assert (cfg.timestamp_before_max_ms, cfg.timestamp_after_max_ms) == (1000, 1000)
    e = refused(batch(record(), 1, base_ts=NOW - 5000), cfg)
    assert e.error_code == INVALID_TIMESTAMP
    cfg = LogConfig(message_timestamp_difference_max_ms=1000, message_timestamp_before_max_ms=10_000)
    assert check(batch(record(), 1, base_ts=NOW - 5000), cfg) is None


def test_no_timestamp_records_are_not_range_checked() -> None:
    cfg = LogConfig(message_timestamp_before_max_ms=1000)
    assert check(batch(record(), 1, base_ts=-1, max_ts=-1), cfg) is None


def test_log_append_time_from_a_producer() -> None:
    lat = LogConfig(message_timestamp_type="LogAppendTime")
    e = refused(batch(record() + record(offset_delta=1), 2, attributes=0x08), lat)
    assert e.error_code == INVALID_TIMESTAMP
    assert [i for i, _ in e.record_errors] == [0, 1]
    assert e.record_errors[0][1] == (
        f"Invalid timestamp type in message DefaultRecord(offset=0, timestamp={NOW}, key=1 bytes, value=1 bytes). "
        "Producer should not set timestamp type to LogAppendTime."
    )
    # CreateTime topic: only a LogAppendTime batch without a timestamp is refused
    assert refused(batch(record(), 1, attributes=0x08, max_ts=-1)).error_code == INVALID_TIMESTAMP


def test_lying_max_timestamp_is_corrected_as_kafka_does() -> None:
    buf = batch(record(ts_delta=0) + record(offset_delta=1, ts_delta=25), 2, max_ts=NOW + 999)
    assert check(buf) is None
    h = parse_batch_header(buf, 0)
    assert h.max_timestamp == NOW + 25
    assert batch_crc(buf, 0, len(buf)) == h.crc


# --- compacted topics ----------------------------------------------------------------------------


def test_keyless_records_on_a_compacted_topic() -> None:
    cfg = LogConfig(cleanup_policy="compact,delete")
    body = record(key=b"a") + record(offset_delta=1, key=None) + record(offset_delta=2, key=None)
    e = refused(batch(body, 3), cfg)
    assert e.error_code == INVALID_RECORD
    msg = f"Compacted topic cannot accept message without key in topic partition {TP}."
    assert e.record_errors == [(1, msg), (2, msg)]
    assert e.message == (
        "One or more records have been rejected due to 2 record errors in total, and only showing the first "
        f"three errors at most: [RecordError(batchIndex=1, message='{msg}'), "
        f"RecordError(batchIndex=2, message='{msg}')]"
    )
    assert check(batch(body, 3)) is None  # delete policy: keys are optional
    keyed = bytearray(build_batch([(b"a", b"1", []), (b"b", None, [])], timestamp_ms=NOW, compression=COMPRESSION_LZ4))
    assert check(keyed, cfg) is None


# --- recompression -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "topic", "target"),
    [
        (COMPRESSION_NONE, "zstd", COMPRESSION_ZSTD),
        (COMPRESSION_NONE, "gzip", COMPRESSION_GZIP),
        (COMPRESSION_LZ4, "snappy", COMPRESSION_SNAPPY),
        (COMPRESSION_GZIP, "uncompressed", COMPRESSION_NONE),
        (COMPRESSION_ZSTD, "lz4", COMPRESSION_LZ4),
    ],
)
def test_recompression_when_topic_codec_differs(source: int, topic: str, target: int) -> None:
    recs = [(b"k%d" % i, b"v" * i, [("h", b"%d" % i)]) for i in range(30)]
    stamps = [NOW + i for i in range(30)]
    buf = bytearray(build_batch(recs, timestamp_ms=NOW, timestamps=stamps, compression=source,
                                producer_id=7, producer_epoch=2, base_sequence=100, is_transactional=True))
    out = check(buf, LogConfig(compression_type=topic))
    assert out is not None
    h = parse_batch_header(out, 0)
    assert (h.compression, h.producer_id, h.producer_epoch, h.base_sequence) == (target, 7, 2, 100)
    assert h.is_transactional and h.records_count == 30 and h.last_offset_delta == 29
    assert (h.base_timestamp, h.max_timestamp) == (NOW, NOW + 29)
    assert batch_crc(out, 0, len(out)) == h.crc
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_records(out)]
    assert got == [(i, NOW + i, k, v, hs) for i, (k, v, hs) in enumerate(recs)]


def test_same_codec_or_producer_is_not_recompressed() -> None:
    buf = bytearray(build_batch([(b"k", b"v", [])] * 5, timestamp_ms=NOW, compression=COMPRESSION_LZ4))
    assert check(buf, LogConfig(compression_type="lz4")) is None
    assert check(buf, LogConfig(compression_type="producer")) is None
    plain = bytearray(build_batch([(b"k", b"v", [])] * 5, timestamp_ms=NOW))
    assert check(plain, LogConfig(compression_type="uncompressed")) is None


def test_rebuild_of_non_canonical_records_keeps_their_contents() -> None:
    # attributes set and a base timestamp that is not the first record's: records are re-encoded
    body = record(attributes=0x40, ts_delta=5, key=b"a") + record(offset_delta=1, ts_delta=2, key=b"b")
    out = check(batch(body, 2, max_ts=NOW + 5), LogConfig(compression_type="zstd"))
    assert out is not None
    assert [(r.offset, r.timestamp, r.key) for r in decode_records(out)] == [(0, NOW + 5, b"a"), (1, NOW + 2, b"b")]
    assert parse_batch_header(out, 0).base_timestamp == NOW + 5


def test_rebuilt_batch_over_max_message_bytes() -> None:
    # incompressible values stored uncompressed by the producer, then gzip adds its framing
    value = random.Random(1).randbytes(2000)
    buf = bytearray(build_batch([(b"k", value, [])], timestamp_ms=NOW))
    cfg = LogConfig(compression_type="gzip", max_message_bytes=len(buf))
    assert refused(buf, cfg).error_code == 10  # MESSAGE_TOO_LARGE


# --- zip bombs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_decompression_is_bounded(codec: int) -> None:
    body = record(value=b"\x00" * 200_000)
    data = memoryview(_compress(codec, body))
    assert rv._decompress_bounded(codec, data, len(body), TP) == body
    with pytest.raises(InvalidRecords) as ei:
        rv._decompress_bounded(codec, data, 100_000, TP)
    assert ei.value.error_code == INVALID_RECORD
    assert "decompresses to more than 100000 bytes" in ei.value.message


def test_zstd_bomb_without_content_size_is_refused_without_inflating() -> None:
    limit = rv.max_uncompressed_bytes(LogConfig().max_message_bytes)
    cobj = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    chunk = b"\x00" * (1 << 20)
    bomb = b"".join(cobj.compress(chunk) for _ in range(limit // len(chunk) + 8)) + cobj.flush()
    assert len(bomb) < 100_000
    e = refused(batch(b"", 1, codec=COMPRESSION_ZSTD, compressed_body=bomb))
    assert e.error_code == INVALID_RECORD


def test_gzip_bomb_is_refused() -> None:
    limit = rv.max_uncompressed_bytes(LogConfig().max_message_bytes)
    cobj = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\x00" * (1 << 20)
    bomb = b"".join(cobj.compress(chunk) for _ in range(limit // len(chunk) + 8)) + cobj.flush()
    e = refused(batch(b"", 1, codec=COMPRESSION_GZIP, compressed_body=bomb))
    assert e.error_code == INVALID_RECORD
    assert len(gzip.compress(b"\x00" * 1000)) < len(bomb) < limit // 100


def test_snappy_and_lz4_declared_sizes_are_checked_before_inflating() -> None:
    # a raw snappy block whose preamble claims 1 GiB
    claim = bytes([0x80, 0x80, 0x80, 0x80, 0x04]) + b"\x00" * 8
    with pytest.raises(InvalidRecords) as ei:
        rv._decompress_bounded(COMPRESSION_SNAPPY, memoryview(claim), 1 << 20, TP)
    assert ei.value.error_code == INVALID_RECORD
    xerial = _XERIAL_MAGIC + struct.pack(">ii", 1, 1) + struct.pack(">i", len(claim)) + claim
    with pytest.raises(InvalidRecords):
        rv._decompress_bounded(COMPRESSION_SNAPPY, memoryview(xerial), 1 << 20, TP)
    lz = lz4.frame.compress(b"\x00" * (4 << 20))
    with pytest.raises(InvalidRecords) as ei:
        rv._decompress_bounded(COMPRESSION_LZ4, memoryview(lz), 1 << 20, TP)
    assert ei.value.error_code == INVALID_RECORD


# --- C and Python agree --------------------------------------------------------------------------

_record_st = st.builds(
    record,
    ts_delta=st.integers(-(1 << 40), 1 << 40),
    offset_delta=st.integers(-3, 40),
    key=st.none() | st.binary(max_size=20),
    value=st.none() | st.binary(max_size=40),
    headers=st.sampled_from([b"\x00", _varint(1) + _varint(1) + b"h" + _varint(-1),
                             _varint(2) + _varint(1) + b"a" + _varint(1) + b"x" + _varint(0) + _varint(0)]),
    attributes=st.sampled_from([0, 0, 1]),
    size_adjust=st.sampled_from([0, 0, 0, 0, 1, -1]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    recs=st.lists(_record_st, min_size=0, max_size=8),
    count_adjust=st.integers(-2, 2),
    mutations=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 5),
    extra=st.binary(max_size=6),
)
def test_c_and_python_walks_agree(
    recs: list[bytes], count_adjust: int, mutations: list[tuple[int, int]], cut: int, extra: bytes
) -> None:
    body = bytearray(b"".join(recs))
    for pos, val in mutations:
        if body:
            body[pos % len(body)] = val
    data = bytes(body[: max(0, len(body) - cut)]) + extra
    prefix = b"\xff" * 3
    buf = prefix + data
    count = len(recs) + count_adjust
    py = rv.py_walk(buf, len(prefix), len(buf), count)
    if rv.NATIVE:
        assert rv.walk(buf, len(prefix), len(buf), count) == py
        assert rv.walk(bytearray(buf), len(prefix), len(buf), count) == py
        assert rv.walk(memoryview(buf), len(prefix), len(buf), count) == py


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64), count=st.integers(-1, 5))
def test_c_and_python_walks_agree_on_random_bytes(data: bytes, count: int) -> None:
    py = rv.py_walk(data, 0, len(data), count)
    if rv.NATIVE:
        assert rv.walk(data, 0, len(data), count) == py


def test_walk_rejects_out_of_bounds_regions() -> None:
    for fn in (rv.py_walk, rv.walk):
        with pytest.raises(ValueError):
            fn(b"abc", 0, 4, 1)
        with pytest.raises(ValueError):
            fn(b"abc", 2, 1, 1)


# --- without the extension -----------------------------------------------------------------------


def test_pure_python_fallback_gives_the_same_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    poison = [
        batch(record(size_adjust=1) + record(offset_delta=1), 2),
        batch(record(), (1 << 31) - 1),
        batch(record(headers=_varint(1000)), 1),
        batch(record() + b"\x00", 1),
    ]
    native = [refused(bytearray(b)).message for b in poison]
    good = bytearray(build_batch([(b"k", b"v", [])] * 3, timestamp_ms=NOW, compression=COMPRESSION_LZ4))
    monkeypatch.setattr(rv, "walk", rv.py_walk)
    assert [refused(bytearray(b)).message for b in poison] == native
    assert check(good) is None
    assert check(bytearray(good), LogConfig(compression_type="zstd")) is not None


def test_missing_extension_is_logged_once_at_import() -> None:
    code = (
        "import sys; sys.modules['pykbroker._native.recordwalk'] = None; "
        "import pykbroker.protocol.record_validator as rv; "
        "import pykbroker.server.handlers.produce; print(rv.NATIVE, rv.walk is rv.py_walk)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "True"]
    assert out.stderr.count("native record walk") == 1


_CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]


@settings(max_examples=150, deadline=None)
@given(
    recs=st.lists(
        st.tuples(st.none() | st.binary(max_size=12), st.none() | st.binary(max_size=60),
                  st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=5)), max_size=2)),
        min_size=1, max_size=12),
    deltas=st.lists(st.integers(-100_000, 100_000), min_size=12, max_size=12),
    source=st.sampled_from(_CODECS),
    topic=st.sampled_from(["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"]),
)
def test_good_batches_pass_and_keep_their_records(
    recs: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    deltas: list[int], source: int, topic: str,
) -> None:
    stamps = [NOW + d for d in deltas[: len(recs)]]
    buf = bytearray(build_batch(recs, timestamp_ms=NOW, timestamps=stamps, compression=source,
                                producer_id=5, producer_epoch=1, base_sequence=0))
    out = check(buf, LogConfig(compression_type=topic))
    target = source if topic == "producer" else rv.CODECS[topic]
    assert (out is None) == (source == target)
    stored = buf if out is None else out
    h = parse_batch_header(stored, 0)
    assert h.compression == target and h.max_timestamp == max(stamps)
    assert batch_crc(stored, 0, len(stored)) == h.crc
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_records(stored)]
    assert got == [(i, ts, k, v, list(hs)) for i, ((k, v, hs), ts) in enumerate(zip(recs, stamps, strict=True))]
