"""Per-record validation of produced batches, equal to Kafka's ``LogValidator``.

:func:`~pykbroker.protocol.records.validate_for_append` checks what a batch header can tell
(magic, lengths, CRC, count against the last offset delta, size).  This module then reads
every record, as Kafka's broker does before it acknowledges a produce, so that a batch a
consumer could not read is refused instead of stored:

* framing (``DefaultRecord``'s reader): each record's length varint against the bytes it
  covers, varints of at most 5 (10 for the timestamp) bytes, key/value/header lengths inside
  the batch, header counts, the declared record count against the records present, no
  trailing bytes -> INVALID_RECORD, no ``record_errors`` (Kafka throws from its iterator);
* per record (``validateRecord``): a key on compacted topics, CreateTime timestamps within
  ``message.timestamp.before/after.max.ms``, no LogAppendTime from producers -> INVALID_RECORD
  or INVALID_TIMESTAMP with one ``record_errors`` entry per bad record and Kafka's summary as
  the error message;
* compressed batches are decompressed (bounded: a "zip bomb" is refused, not inflated) and
  their records checked the same way; undecodable payloads are CORRUPT_MESSAGE;
* the batch is kept as sent (only maxTimestamp corrected, as Kafka's ``setMaxTimestamp``)
  unless Kafka would rebuild it: the topic's ``compression.type`` names another codec than
  the producer's, or a compressed batch's offset deltas are not 0..n-1.  A rebuilt batch
  keeps the producer id, epoch, base sequence and transactional flag.

The framing walk runs in C (``pykbroker._native.recordwalk``) when built; :func:`py_walk` is
the identical pure-Python version, used without the extension and by the tests as the
reference the C code must agree with.
"""

from __future__ import annotations

import importlib
import logging
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import cramjam
import lz4.frame
import zstandard

from pykbroker.protocol.records import (
    _ATTR_COMPRESSION_MASK,
    _ATTR_CONTROL,
    _ATTR_DELETE_HORIZON,
    _ATTR_TIMESTAMP_TYPE,
    _ATTR_TRANSACTIONAL,
    _HEADER,
    _OFF_ATTRIBUTES,
    _OFF_CRC,
    _OFF_MAX_TIMESTAMP,
    _XERIAL_HEADER,
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
    MAGIC_V2,
    MESSAGE_TOO_LARGE,
    NO_TIMESTAMP,
    BatchHeader,
    InvalidRecords,
    _compress,
    _write_varint,
    batch_crc,
    parse_batch_header,
)

__all__ = [
    "CODECS",
    "FLAG_ATTRIBUTES_ZERO",
    "FLAG_OFFSETS_IN_ORDER",
    "NATIVE",
    "max_uncompressed_bytes",
    "py_walk",
    "validate_records",
    "walk",
]

log = logging.getLogger("pykbroker.records")

FLAG_OFFSETS_IN_ORDER = 1
FLAG_ATTRIBUTES_ZERO = 2

# (error, min_ts_delta, max_ts_delta, first_ts_delta, null_keys, flags)
WalkResult = tuple[str | None, int, int, int, int, int]

# compression.type values -> codec id (``producer`` keeps the producer's codec).
CODECS: dict[str, int] = {
    "uncompressed": COMPRESSION_NONE,
    "none": COMPRESSION_NONE,
    "gzip": COMPRESSION_GZIP,
    "snappy": COMPRESSION_SNAPPY,
    "lz4": COMPRESSION_LZ4,
    "zstd": COMPRESSION_ZSTD,
}
_CODEC_NAMES = {COMPRESSION_NONE: "none", COMPRESSION_GZIP: "gzip", COMPRESSION_SNAPPY: "snappy",
                COMPRESSION_LZ4: "lz4", COMPRESSION_ZSTD: "zstd"}

# Decompressed records may exceed the compressed batch (that is the point), but not without
# bound: at least this much, else this many times max.message.bytes.
_MIN_UNCOMPRESSED_LIMIT = 64 * 1024 * 1024
_UNCOMPRESSED_LIMIT_FACTOR = 16

_LONG_MIN = -(1 << 63)
_LONG_MAX = (1 << 63) - 1
_SAFE_TS = 1 << 62  # below this magnitude, timestamp arithmetic cannot wrap like Java's longs

_STRUCTURE = "Found invalid record structure"
_PREMATURE_EOF = "Incorrect declared batch size, premature EOF reached"
_REMAINING = "Incorrect declared batch size, records still remaining in file"


def max_uncompressed_bytes(max_message_bytes: int) -> int:
    """How large a compressed batch's records may become when decompressed."""
    return max(_MIN_UNCOMPRESSED_LIMIT, _UNCOMPRESSED_LIMIT_FACTOR * max_message_bytes)


# --- the framing walk (pure Python; pykbroker/_native/recordwalk.c is the same in C) -------


class _Eof(Exception):
    pass


class _Bad(Exception):
    pass


def _zigzag(buf: bytes | bytearray | memoryview, pos: int, end: int, max_shift: int, mask: int) -> tuple[int, int]:
    """Kafka's ByteUtils.readVarint/readVarlong: bounded length, bits past the width dropped, zig-zag decoded."""
    value = 0
    shift = 0
    while True:
        if pos >= end:
            raise _Eof
        b = buf[pos]
        pos += 1
        if not b & 0x80:
            value |= b << shift
            break
        value |= (b & 0x7F) << shift
        shift += 7
        if shift > max_shift:
            raise _Bad
    value &= mask
    return (value >> 1) ^ -(value & 1), pos


def _varint(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    """At most 5 bytes (a 32-bit varint)."""
    return _zigzag(buf, pos, end, 28, 0xFFFFFFFF)


def _varlong(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    """At most 10 bytes (a 64-bit varlong)."""
    return _zigzag(buf, pos, end, 63, 0xFFFFFFFFFFFFFFFF)


def _failed(message: str) -> WalkResult:
    return (message, 0, 0, 0, 0, 0)


def py_walk(buf: bytes | bytearray | memoryview, start: int, end: int, count: int) -> WalkResult:
    """Walk ``count`` records in ``buf[start:end]``: Kafka's framing checks, and the facts validation needs.

    Returns ``(error, min_ts_delta, max_ts_delta, first_ts_delta, null_keys, flags)``; ``error``
    is None or the INVALID_RECORD message of the first framing error (the rest are then 0).
    """
    if start < 0 or end > len(buf) or start > end:
        raise ValueError("records region out of the buffer's bounds")
    pos = start
    min_d = _LONG_MAX
    max_d = _LONG_MIN
    first_d = 0
    null_keys = 0
    in_order = True
    attrs_zero = True
    try:
        for i in range(count):
            try:
                size, pos = _varint(buf, pos, end)
            except _Eof:
                return _failed(_PREMATURE_EOF)
            if end - pos < size:
                return _failed(
                    f"Invalid record size: expected {size} bytes in record payload, but instead the buffer has "
                    f"only {end - pos} remaining bytes."
                )
            rec_start = pos
            if pos >= end:
                raise _Bad
            attributes = buf[pos]
            pos += 1
            ts_delta, pos = _varlong(buf, pos, end)
            offset_delta, pos = _varint(buf, pos, end)
            key_len, pos = _varint(buf, pos, end)
            if key_len >= 0:
                if key_len > end - pos:
                    raise _Bad
                pos += key_len
            value_len, pos = _varint(buf, pos, end)
            if value_len >= 0:
                if value_len > end - pos:
                    raise _Bad
                pos += value_len
            n_headers, pos = _varint(buf, pos, end)
            if n_headers < 0:
                return _failed(f"Found invalid number of record headers {n_headers}")
            if n_headers > end - pos:
                return _failed(
                    f"Found invalid number of record headers. {n_headers} is larger than the remaining size of "
                    f"the buffer"
                )
            for _ in range(n_headers):
                hkey_len, pos = _varint(buf, pos, end)
                if hkey_len < 0:
                    return _failed(f"Invalid negative header key size {hkey_len}")
                if hkey_len > end - pos:
                    raise _Bad
                pos += hkey_len
                hvalue_len, pos = _varint(buf, pos, end)
                if hvalue_len >= 0:
                    if hvalue_len > end - pos:
                        raise _Bad
                    pos += hvalue_len
            if pos - rec_start != size:
                return _failed(
                    f"Invalid record size: expected to read {size} bytes in record payload, but instead read "
                    f"{pos - rec_start}"
                )
            if i == 0:
                first_d = ts_delta
            if ts_delta < min_d:
                min_d = ts_delta
            if ts_delta > max_d:
                max_d = ts_delta
            if key_len < 0:
                null_keys += 1
            if offset_delta != i:
                in_order = False
            if attributes != 0:
                attrs_zero = False
    except (_Eof, _Bad):
        return _failed(_STRUCTURE)
    if pos != end:
        return _failed(_REMAINING)
    if count <= 0:
        min_d = max_d = 0
    flags = (FLAG_OFFSETS_IN_ORDER if in_order else 0) | (FLAG_ATTRIBUTES_ZERO if attrs_zero else 0)
    return (None, min_d, max_d, first_d, null_keys, flags)


_native_walk: Callable[[bytes | bytearray | memoryview, int, int, int], WalkResult] | None
try:
    _native_walk = importlib.import_module("pykbroker._native.recordwalk").walk
except ImportError:  # not built (no C compiler at install time)
    _native_walk = None
    log.warning(
        "the native record walk (pykbroker._native.recordwalk) is not built, so produce requests are "
        "validated in pure Python, which is slower; reinstall with a C compiler and the Python headers "
        "(pip install -e .) to build it"
    )

NATIVE = _native_walk is not None
walk: Callable[[bytes | bytearray | memoryview, int, int, int], WalkResult] = _native_walk or py_walk


# --- per-record details (error and rebuild paths only) ----------------------------------------


@dataclass(slots=True)
class _Rec:
    offset_delta: int
    ts_delta: int
    key: bytes | None
    value: bytes | None
    headers: bytes  # the header count varint and the headers, as sent


def _records(buf: bytes | bytearray | memoryview, start: int, end: int, count: int) -> list[_Rec]:
    """Decode records whose framing :func:`walk` has already accepted."""
    out: list[_Rec] = []
    pos = start
    for _ in range(count):
        size, pos = _varint(buf, pos, end)
        rec_end = pos + size
        pos += 1
        ts_delta, pos = _varlong(buf, pos, end)
        offset_delta, pos = _varint(buf, pos, end)
        key_len, pos = _varint(buf, pos, end)
        key = None
        if key_len >= 0:
            key = bytes(buf[pos : pos + key_len])
            pos += key_len
        value_len, pos = _varint(buf, pos, end)
        value = None
        if value_len >= 0:
            value = bytes(buf[pos : pos + value_len])
            pos += value_len
        out.append(_Rec(offset_delta, ts_delta, key, value, bytes(buf[pos:rec_end])))
        pos = rec_end
    return out


def _wrap(v: int) -> int:
    """Java long arithmetic."""
    return ((v + (1 << 63)) & 0xFFFFFFFFFFFFFFFF) - (1 << 63)


def _record_timestamp(header: BatchHeader, ts_delta: int) -> int:
    if header.timestamp_type:  # LogAppendTime batch: every record reads the batch's maxTimestamp
        return header.max_timestamp
    return _wrap(header.base_timestamp + ts_delta)


def _record_str(offset: int, timestamp: int, rec: _Rec) -> str:
    """Kafka's DefaultRecord.toString, which its messages embed."""
    key = 0 if rec.key is None else len(rec.key)
    value = 0 if rec.value is None else len(rec.value)
    return f"DefaultRecord(offset={offset}, timestamp={timestamp}, key={key} bytes, value={value} bytes)"


def _record_errors(
    header: BatchHeader,
    recs: list[_Rec],
    *,
    topic_partition: str,
    now_ms: int,
    log_append_time: bool,
    before_ms: int,
    after_ms: int,
    compacted: bool,
) -> InvalidRecords | None:
    """LogValidator.validateRecord for every record, and processRecordErrors' summary."""
    errors: list[tuple[int, str]] = []
    any_timestamp = False
    batch_lat = bool(header.timestamp_type)
    for index, rec in enumerate(recs):
        offset = header.base_offset + rec.offset_delta
        ts = _record_timestamp(header, rec.ts_delta)
        if compacted and rec.key is None:
            errors.append(
                (index, f"Compacted topic cannot accept message without key in topic partition {topic_partition}.")
            )
            continue
        if not log_append_time and ts != NO_TIMESTAMP:
            diff = _wrap(now_ms - ts)
            if diff > before_ms or _wrap(-diff) > after_ms:
                any_timestamp = True
                errors.append(
                    (
                        index,
                        f"Timestamp {ts} of message with offset {offset} is out of range. The timestamp should be "
                        f"within [{_wrap(now_ms - before_ms)}, {_wrap(now_ms + after_ms)}]",
                    )
                )
        elif batch_lat:
            any_timestamp = True
            errors.append(
                (
                    index,
                    f"Invalid timestamp type in message {_record_str(offset, ts, rec)}. Producer should not set "
                    f"timestamp type to LogAppendTime.",
                )
            )
    if not errors:
        return None
    if any_timestamp:
        return InvalidRecords(
            INVALID_TIMESTAMP, "One or more records have been rejected due to invalid timestamp", errors
        )
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
    return InvalidRecords(
        INVALID_RECORD,
        f"One or more records have been rejected due to {len(errors)} record errors in total, and only showing "
        f"the first three errors at most: [{shown}]",
        errors,
    )


# --- bounded decompression --------------------------------------------------------------------


def _too_large(topic_partition: str, limit: int) -> InvalidRecords:
    return InvalidRecords(
        INVALID_RECORD,
        f"The compressed record batch in topic partition {topic_partition} decompresses to more than {limit} bytes",
    )


def _snappy_length(block: bytes | memoryview) -> int:
    """The uncompressed length a raw snappy block declares (its leading varint)."""
    value = 0
    for i in range(min(5, len(block))):
        b = block[i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return value
    raise ValueError("bad snappy length preamble")


_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_BLOCK_MAX = {4: 1 << 16, 5: 1 << 18, 6: 1 << 20, 7: 1 << 22}


def _lz4_bound(data: memoryview) -> int | None:
    """Most bytes one LZ4 frame can inflate to: its block count times the block maximum.

    Read from the block headers alone; None when ``data`` is not exactly one well-formed frame
    (then the careful, piecewise path decides).
    """
    n = len(data)
    if n < 7 or data[:4] != _LZ4_MAGIC:
        return None
    flg = data[4]
    block_max = _LZ4_BLOCK_MAX.get((data[5] >> 4) & 7)
    if block_max is None:
        return None
    pos = 7 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    block_checksum = 4 if flg & 0x10 else 0
    blocks = 0
    while True:
        if pos + 4 > n:
            return None
        size = int.from_bytes(data[pos : pos + 4], "little") & 0x7FFFFFFF
        pos += 4
        if size == 0:
            break
        pos += size + block_checksum
        blocks += 1
    if pos + (4 if flg & 0x04 else 0) != n:
        return None
    return blocks * block_max


def _decompress_bounded(codec: int, data: memoryview, limit: int, topic_partition: str) -> bytes | bytearray:
    """Decompress a batch's records, refusing output beyond ``limit`` before producing it."""
    try:
        if codec == COMPRESSION_GZIP:
            out = bytearray()
            rest: bytes | memoryview = data
            while True:
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                out += d.decompress(rest, limit + 1 - len(out))
                if len(out) > limit or d.unconsumed_tail:
                    raise _too_large(topic_partition, limit)
                if not d.eof:
                    raise ValueError("truncated gzip stream")
                rest = d.unused_data
                if not rest.startswith(b"\x1f\x8b"):  # like Java's GZIPInputStream: another member, or done
                    return out
        if codec == COMPRESSION_SNAPPY:
            raw = bytes(data)
            if raw.startswith(_XERIAL_MAGIC):
                out = bytearray()
                pos = _XERIAL_HEADER.size
                while pos < len(raw):
                    if len(raw) - pos < 4:
                        raise ValueError("truncated snappy block length")
                    (n,) = struct.unpack_from(">i", raw, pos)
                    pos += 4
                    if n < 0 or n > len(raw) - pos:
                        raise ValueError("truncated snappy block")
                    block = raw[pos : pos + n]
                    if len(out) + _snappy_length(block) > limit:
                        raise _too_large(topic_partition, limit)
                    out += bytes(cramjam.snappy.decompress_raw(block))
                    pos += n
                return out
            if _snappy_length(raw) > limit:
                raise _too_large(topic_partition, limit)
            return bytes(cramjam.snappy.decompress_raw(raw))
        if codec == COMPRESSION_LZ4:
            bound = _lz4_bound(data)
            if bound is not None and bound <= limit:  # the usual case: one call, no copies
                return lz4.frame.decompress(data)
            # Fed in pieces (max_length is ten times slower): 16 KiB of input inflates to a few MiB at most.
            dec = lz4.frame.LZ4FrameDecompressor()
            out = bytearray()
            for i in range(0, len(data), 16384):
                out += dec.decompress(data[i : i + 16384])
                if len(out) > limit:
                    raise _too_large(topic_partition, limit)
                if dec.eof:
                    break
            if not dec.eof:
                raise ValueError("truncated lz4 frame")
            return out
        if codec == COMPRESSION_ZSTD:
            raw = bytes(data)
            size = zstandard.frame_content_size(raw)
            if size >= 0:  # declared in the frame header (librdkafka and the Java client write it)
                if size > limit:
                    raise _too_large(topic_partition, limit)
                return bytes(zstandard.ZstdDecompressor().decompress(raw))
            # Unknown size: feed small pieces so one piece cannot inflate far past the limit.
            zobj = zstandard.ZstdDecompressor().decompressobj()
            out = bytearray()
            for i in range(0, len(raw), 1024):
                out += zobj.decompress(raw[i : i + 1024])
                if len(out) > limit:
                    raise _too_large(topic_partition, limit)
                if zobj.eof:
                    break
            if not zobj.eof:
                raise ValueError("truncated zstd frame")
            return out
    except InvalidRecords:
        raise
    except (OSError, EOFError, ValueError, RuntimeError, struct.error, zlib.error, zstandard.ZstdError,
            cramjam.DecompressionError) as exc:
        raise InvalidRecords(
            CORRUPT_MESSAGE,
            f"The {_CODEC_NAMES.get(codec, codec)}-compressed record batch in topic partition {topic_partition} "
            f"cannot be decompressed: {exc}",
        ) from exc
    raise InvalidRecords(INVALID_RECORD, f"unknown compression type id {codec}")


# --- the validator ------------------------------------------------------------------------------


def _set_max_timestamp(buf: bytearray, header: BatchHeader, timestamp_type: int, max_timestamp: int) -> None:
    """Kafka's DefaultRecordBatch.setMaxTimestamp: rewrite type and maxTimestamp (and the CRC) if they differ."""
    if header.timestamp_type == timestamp_type and header.max_timestamp == max_timestamp:
        return
    attributes = header.attributes & (
        _ATTR_COMPRESSION_MASK | _ATTR_TRANSACTIONAL | _ATTR_CONTROL | _ATTR_DELETE_HORIZON
    )
    if timestamp_type:
        attributes |= _ATTR_TIMESTAMP_TYPE
    pos = header.position
    struct.pack_into(">h", buf, pos + _OFF_ATTRIBUTES, attributes)
    struct.pack_into(">q", buf, pos + _OFF_MAX_TIMESTAMP, max_timestamp)
    crc = batch_crc(buf, pos, header.size)
    struct.pack_into(">I", buf, pos + _OFF_CRC, crc)
    header.attributes = attributes
    header.max_timestamp = max_timestamp
    header.crc = crc


def _rebuild(
    header: BatchHeader,
    data: bytes | bytearray | memoryview,
    start: int,
    end: int,
    canonical: bool,
    max_ts_delta: int,
    target: int,
    log_append_time: bool,
    now_ms: int,
) -> bytearray:
    """A new batch with the records at offsets 0..n-1 in codec ``target`` (Kafka's buildRecordsAndAssignOffsets)."""
    count = header.records_count
    if canonical:  # offsets 0..n-1, attributes 0, first timestamp delta 0: the records re-encode to themselves
        body: bytes | bytearray = bytes(data[start:end])
        recs = None
    else:
        recs = _records(data, start, end, count)
    if recs is None:
        base_ts = header.base_timestamp
        timestamps_max = max(NO_TIMESTAMP, header.base_timestamp + max_ts_delta)
    else:
        stamps = [_record_timestamp(header, r.ts_delta) for r in recs]
        base_ts = stamps[0]
        timestamps_max = max(NO_TIMESTAMP, *stamps)
        body = bytearray()
        rec = bytearray()
        for i, (r, ts) in enumerate(zip(recs, stamps, strict=True)):
            rec.clear()
            rec.append(0)
            _write_varint(rec, _wrap(ts - base_ts))
            _write_varint(rec, i)
            for field in (r.key, r.value):
                if field is None:
                    _write_varint(rec, -1)
                else:
                    _write_varint(rec, len(field))
                    rec += field
            rec += r.headers
            _write_varint(body, len(rec))
            body += rec
    payload = bytes(body) if target == COMPRESSION_NONE else _compress(target, bytes(body))
    attributes = target | (header.attributes & _ATTR_TRANSACTIONAL)
    if log_append_time:
        attributes |= _ATTR_TIMESTAMP_TYPE
        timestamps_max = now_ms
    out = bytearray(BATCH_HEADER_SIZE)
    _HEADER.pack_into(
        out, 0, 0, BATCH_HEADER_SIZE - LOG_OVERHEAD + len(payload), -1, MAGIC_V2, 0, attributes, count - 1,
        base_ts, timestamps_max, header.producer_id, header.producer_epoch, header.base_sequence, count,
    )
    out += payload
    struct.pack_into(">I", out, _OFF_CRC, batch_crc(out, 0, len(out)))
    return out


def validate_records(
    buf: bytearray,
    header: BatchHeader,
    *,
    topic_partition: str,
    now_ms: int,
    log_append_time: bool,
    before_max_ms: int = _LONG_MAX,
    after_max_ms: int = _LONG_MAX,
    compacted: bool = False,
    compression_type: str = "producer",
    max_message_bytes: int = 1048588,
) -> bytearray | None:
    """Validate every record of one header-validated client batch in ``buf``; Kafka's LogValidator.

    Returns None when the batch is stored as sent (its maxTimestamp may have been corrected
    in place, as Kafka does), or a new single-batch buffer when Kafka would rebuild the batch
    (recompression, or a compressed batch's offsets out of order).  Raises
    :class:`InvalidRecords`, with ``record_errors`` for per-record errors.
    """
    codec = header.compression
    target = codec if compression_type == "producer" else CODECS[compression_type]
    count = header.records_count
    start = header.position + BATCH_HEADER_SIZE
    end = header.position + header.size
    data: bytes | bytearray
    if codec == COMPRESSION_NONE:
        data = buf
    else:
        with memoryview(buf) as view:
            data = _decompress_bounded(
                codec, view[start:end], max_uncompressed_bytes(max_message_bytes), topic_partition
            )
        start, end = 0, len(data)
    error, min_d, max_d, first_d, null_keys, flags = walk(data, start, end, count)
    if error is not None:
        raise InvalidRecords(INVALID_RECORD, error)

    batch_lat = bool(header.timestamp_type)
    exact = -_SAFE_TS < header.base_timestamp < _SAFE_TS and min_d > -_SAFE_TS and max_d < _SAFE_TS
    lo = header.base_timestamp + min_d
    hi = header.base_timestamp + max_d
    suspect = compacted and null_keys > 0
    if log_append_time:
        suspect = suspect or batch_lat
    elif batch_lat:
        ts = header.max_timestamp
        suspect = suspect or ts == NO_TIMESTAMP or now_ms - ts > before_max_ms or ts - now_ms > after_max_ms
    else:
        suspect = suspect or not exact or now_ms - lo > before_max_ms or hi - now_ms > after_max_ms
    if suspect:
        failure = _record_errors(
            header,
            _records(data, start, end, count),
            topic_partition=topic_partition,
            now_ms=now_ms,
            log_append_time=log_append_time,
            before_ms=before_max_ms,
            after_ms=after_max_ms,
            compacted=compacted,
        )
        if failure is not None:
            raise failure

    in_order = bool(flags & FLAG_OFFSETS_IN_ORDER)
    if (codec == COMPRESSION_NONE and target == COMPRESSION_NONE) or (codec == target and in_order):
        if not log_append_time:  # LogAppendTime's rewrite is assign_offsets' job
            if batch_lat:
                max_ts = max(NO_TIMESTAMP, header.max_timestamp)
            elif exact:
                max_ts = max(NO_TIMESTAMP, hi)
            else:
                max_ts = max(NO_TIMESTAMP, *(_wrap(header.base_timestamp + r.ts_delta)
                                             for r in _records(data, start, end, count)))
            _set_max_timestamp(buf, header, 0, max_ts)
        return None

    canonical = in_order and bool(flags & FLAG_ATTRIBUTES_ZERO) and first_d == 0 and not batch_lat and exact
    out = _rebuild(header, data, start, end, canonical, max_d, target, log_append_time, now_ms)
    if len(out) > max_message_bytes:
        raise InvalidRecords(
            MESSAGE_TOO_LARGE,
            f"The record batch size in the append to {topic_partition} is {len(out)} bytes which exceeds the "
            f"maximum configured value of {max_message_bytes}.",
        )
    parse_batch_header(out, 0)
    return out
