"""Sans-I/O codec for Kafka record batches (magic v2).

Fetch treats record batches as opaque bytes: only the fixed 61-byte batch header
is parsed.  Produce checks the header here (:func:`validate_for_append`) and then
every record's framing, key and timestamp in
:mod:`~pykbroker.protocol.record_validator` (a C walk when built), as Kafka's
LogValidator does.  Full per-record decoding (:func:`decode_records`) exists for
tests, ListOffsets-by-timestamp and internal topics.

Batch layout (big-endian), offsets relative to the batch start::

     0 baseOffset            int64     <- rewritten by the broker, not in CRC
     8 batchLength           int32        (bytes after this field)
    12 partitionLeaderEpoch  int32     <- rewritten by the broker, not in CRC
    16 magic                 int8
    17 crc                   uint32       CRC-32C of bytes [21, end)
    21 attributes            int16
    23 lastOffsetDelta       int32
    27 baseTimestamp         int64
    35 maxTimestamp          int64
    43 producerId            int64
    51 producerEpoch         int16
    53 baseSequence          int32
    57 recordsCount          int32
    61 records...
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import cramjam
import crc32c as _crc32c
import lz4.frame
import zstandard

__all__ = [
    "BATCH_HEADER_SIZE",
    "COMPRESSION_GZIP",
    "COMPRESSION_LZ4",
    "COMPRESSION_NONE",
    "COMPRESSION_SNAPPY",
    "COMPRESSION_ZSTD",
    "CORRUPT_MESSAGE",
    "INVALID_RECORD",
    "INVALID_TIMESTAMP",
    "LOG_OVERHEAD",
    "MESSAGE_TOO_LARGE",
    "MIN_BATCH_LENGTH",
    "NO_TIMESTAMP",
    "RECORD_LIST_TOO_LARGE",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "BatchHeader",
    "InvalidRecords",
    "Record",
    "assign_offsets",
    "batch_crc",
    "build_batch",
    "decode_records",
    "iter_batches",
    "parse_batch_header",
    "validate_for_append",
]

# --- Kafka error codes used by record validation -------------------------------------------
CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
RECORD_LIST_TOO_LARGE = 18
INVALID_TIMESTAMP = 32
INVALID_REQUEST = 42
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87

# --- layout constants -------------------------------------------------------------------------
LOG_OVERHEAD = 12  # baseOffset + batchLength: the bytes not counted by batchLength
BATCH_HEADER_SIZE = 61  # through recordsCount
MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD  # 49
MAGIC_V2 = 2
NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4

_ATTR_COMPRESSION_MASK = 0x07
_ATTR_TIMESTAMP_TYPE = 0x08
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20
_ATTR_DELETE_HORIZON = 0x40

_OFF_BASE_OFFSET = 0
_OFF_LENGTH = 8
_OFF_LEADER_EPOCH = 12
_OFF_MAGIC = 16
_OFF_CRC = 17
_OFF_ATTRIBUTES = 21
_OFF_MAX_TIMESTAMP = 35

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordsCount
_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == BATCH_HEADER_SIZE
_HEADER_PREFIX = struct.Struct(">qiib")  # enough to size a batch and check its magic
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_U32 = struct.Struct(">I")
_H = struct.Struct(">h")

Buffer = bytes | bytearray | memoryview


class InvalidRecords(Exception):
    """A record batch failed validation; ``error_code`` is the Kafka error to return.

    ``record_errors`` are Kafka's per-record ``(batch_index, message)`` pairs (Produce v8+), set
    when individual records were refused (keys on compacted topics, timestamps).
    """

    def __init__(self, error_code: int, message: str, record_errors: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message
        self.record_errors = record_errors


@dataclass(slots=True)
class BatchHeader:
    """The fixed part of a v2 record batch, plus where it was found."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch including the 12-byte log overhead."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & _ATTR_COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & _ATTR_TIMESTAMP_TYPE else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _ATTR_CONTROL)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & _ATTR_DELETE_HORIZON)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID


@dataclass(slots=True)
class Record:
    """One decoded record; ``offset``/``timestamp`` are absolute."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


# --- header codec ----------------------------------------------------------------------------


def parse_batch_header(buf: Buffer, position: int) -> BatchHeader:
    """Parse the 61-byte header at ``position``; raises :class:`InvalidRecords` if unusable.

    Only the header is checked (length sanity and magic); the CRC is not verified here.
    """
    if position < 0 or len(buf) - position < BATCH_HEADER_SIZE:
        raise InvalidRecords(CORRUPT_MESSAGE, f"truncated record batch header at position {position}")
    fields = _HEADER.unpack_from(buf, position)
    batch_length = fields[1]
    magic = fields[3]
    if magic != MAGIC_V2:
        raise InvalidRecords(INVALID_RECORD, f"unsupported record batch magic {magic} (only v2)")
    if batch_length < MIN_BATCH_LENGTH:
        raise InvalidRecords(
            CORRUPT_MESSAGE, f"record batch length {batch_length} is smaller than the minimum overhead"
        )
    return BatchHeader(position, *fields)


def batch_crc(buf: Buffer, position: int, size: int) -> int:
    """CRC-32C of a batch's attributes..end, the span covered by its ``crc`` field."""
    with memoryview(buf) as view:
        return int(_crc32c.crc32c(view[position + _OFF_ATTRIBUTES : position + size]))


def iter_batches(buf: Buffer, start: int = 0, *, verify_crc: bool = False) -> Iterator[BatchHeader]:
    """Yield the headers of the whole batches in ``buf`` from ``start``.

    Stops silently at an incomplete trailing batch (callers compare the last batch's end
    with ``len(buf)``), but raises :class:`InvalidRecords` for a complete-looking batch that
    is invalid (bad length/magic, or CRC when ``verify_crc``).
    """
    end = len(buf)
    pos = start
    while end - pos >= LOG_OVERHEAD:
        batch_length = _I.unpack_from(buf, pos + _OFF_LENGTH)[0]
        if batch_length < MIN_BATCH_LENGTH:
            raise InvalidRecords(CORRUPT_MESSAGE, f"record batch length {batch_length} at position {pos} is too small")
        size = LOG_OVERHEAD + batch_length
        if end - pos < size:
            return
        header = parse_batch_header(buf, pos)
        if verify_crc:
            actual = batch_crc(buf, pos, size)
            if actual != header.crc:
                raise InvalidRecords(
                    CORRUPT_MESSAGE,
                    f"record batch at position {pos} is corrupt (stored crc {header.crc}, computed {actual})",
                )
        yield header
        pos += size


# --- produce-side validation -----------------------------------------------------------------


def validate_for_append(
    buf: Buffer,
    *,
    max_batch_bytes: int,
    now_ms: int,
    timestamp_type: int,
    max_timestamp_diff_ms: int | None = None,
    max_timestamp_before_ms: int | None = None,
    max_timestamp_after_ms: int | None = None,
    from_client: bool = True,
    allow_multiple_batches: bool = False,
    allow_zstd: bool = True,
    check_timestamps: bool = True,
) -> list[BatchHeader]:
    """Validate a Produce request's ``records`` blob the way a Kafka broker would.

    Header-level only: the per-record checks Kafka also performs (record count vs. actual
    records, per-record timestamps, keys on compacted topics) are
    :func:`~pykbroker.protocol.record_validator.validate_records`' job. Error precedence follows Kafka:
    ``ProduceRequest.validateRecords`` -> ``UnifiedLog.analyzeAndValidateRecords`` ->
    ``LogValidator``.

    ``max_timestamp_diff_ms`` is the legacy symmetric bound; ``max_timestamp_before_ms`` /
    ``max_timestamp_after_ms`` are KIP-937's one-sided bounds. ``from_client=False`` is for
    internal writers (e.g. transaction markers) that may write control batches.
    ``allow_zstd=False`` is for Produce requests older than v7.  The produce path passes
    ``check_timestamps=False`` and checks every record's timestamp instead
    (:mod:`~pykbroker.protocol.record_validator`).
    """
    size = len(buf)
    if size == 0:
        raise InvalidRecords(INVALID_RECORD, "produce request contains no record batch")
    batches: list[BatchHeader] = []
    pos = 0
    while pos < size:
        if size - pos < LOG_OVERHEAD:
            raise InvalidRecords(CORRUPT_MESSAGE, f"trailing partial record batch at position {pos}")
        batch_length = _I.unpack_from(buf, pos + _OFF_LENGTH)[0]
        if size - pos >= _HEADER_PREFIX.size:
            magic = buf[pos + _OFF_MAGIC]
            if magic != MAGIC_V2:
                raise InvalidRecords(
                    INVALID_RECORD, f"record batches must use magic v2, got magic {magic} at position {pos}"
                )
        if batch_length < MIN_BATCH_LENGTH:
            raise InvalidRecords(CORRUPT_MESSAGE, f"record batch length {batch_length} at position {pos} is too small")
        if size - pos < LOG_OVERHEAD + batch_length:
            raise InvalidRecords(CORRUPT_MESSAGE, f"trailing partial record batch at position {pos}")
        header = parse_batch_header(buf, pos)
        if batches and not allow_multiple_batches:
            raise InvalidRecords(INVALID_RECORD, "produce requests may contain only one record batch per partition")
        batches.append(header)
        pos += header.size

    for header in batches:
        if header.compression > COMPRESSION_ZSTD:
            raise InvalidRecords(UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression type id {header.compression}")
        if header.compression == COMPRESSION_ZSTD and not allow_zstd:
            raise InvalidRecords(
                UNSUPPORTED_COMPRESSION_TYPE, "produce requests older than v7 may not use zstd compression"
            )
        if from_client and header.base_offset != 0:
            raise InvalidRecords(
                INVALID_RECORD, f"the base offset of a produced record batch must be 0, not {header.base_offset}"
            )
        if header.size > max_batch_bytes:
            raise InvalidRecords(
                MESSAGE_TOO_LARGE,
                f"record batch size {header.size} exceeds the maximum configured value {max_batch_bytes}",
            )
        actual = batch_crc(buf, header.position, header.size)
        if actual != header.crc:
            raise InvalidRecords(
                CORRUPT_MESSAGE, f"record batch is corrupt (stored crc {header.crc}, computed {actual})"
            )
        _validate_batch(header, from_client)
        if not check_timestamps:
            continue
        _validate_timestamps(
            header,
            now_ms=now_ms,
            timestamp_type=timestamp_type,
            before_ms=_min_opt(max_timestamp_diff_ms, max_timestamp_before_ms),
            after_ms=_min_opt(max_timestamp_diff_ms, max_timestamp_after_ms),
        )
    return batches


def _min_opt(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _validate_batch(header: BatchHeader, from_client: bool) -> None:
    """Mirror of LogValidator.validateBatch for v2 batches."""
    if not from_client:
        return
    count_from_offsets = header.last_offset_delta + 1
    if count_from_offsets <= 0:
        raise InvalidRecords(INVALID_RECORD, f"record batch has an invalid offset delta {header.last_offset_delta}")
    if header.records_count <= 0:
        raise InvalidRecords(INVALID_RECORD, f"invalid reported record count {header.records_count}")
    if count_from_offsets != header.records_count:
        raise InvalidRecords(
            INVALID_RECORD,
            f"inconsistent record batch: last offset delta {header.last_offset_delta} "
            f"but {header.records_count} records",
        )
    if header.is_control:
        raise InvalidRecords(INVALID_RECORD, "clients are not allowed to write control records")
    if header.has_producer_id and header.base_sequence < 0:
        raise InvalidRecords(
            INVALID_RECORD,
            f"invalid sequence number {header.base_sequence} for producer id {header.producer_id}",
        )


def _validate_timestamps(
    header: BatchHeader, *, now_ms: int, timestamp_type: int, before_ms: int | None, after_ms: int | None
) -> None:
    """Header-level version of LogValidator.validateTimestamp.

    Kafka checks every record; with opaque records we check the batch's base and max
    timestamps, which bound all records of batches written by well-behaved producers.
    """
    if timestamp_type == TIMESTAMP_CREATE_TIME:
        for ts in (header.base_timestamp, header.max_timestamp):
            if ts == NO_TIMESTAMP:
                continue
            if (before_ms is not None and now_ms - ts > before_ms) or (after_ms is not None and ts - now_ms > after_ms):
                low = "-inf" if before_ms is None else str(now_ms - before_ms)
                high = "+inf" if after_ms is None else str(now_ms + after_ms)
                raise InvalidRecords(
                    INVALID_TIMESTAMP, f"timestamp {ts} is out of range; it should be within [{low}, {high}]"
                )
        if header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME and header.max_timestamp == NO_TIMESTAMP:
            raise InvalidRecords(INVALID_TIMESTAMP, "producer should not set timestamp type to LogAppendTime")
    elif header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
        raise InvalidRecords(INVALID_TIMESTAMP, "producer should not set timestamp type to LogAppendTime")


def assign_offsets(
    buf: bytearray,
    batches: list[BatchHeader],
    base_offset: int,
    *,
    log_append_time_ms: int | None = None,
    partition_leader_epoch: int | None = None,
) -> int:
    """Rewrite validated batches in place for appending at ``base_offset``; return the next offset.

    baseOffset and partitionLeaderEpoch sit outside the CRC so they are patched for free.
    With LogAppendTime, like Kafka's ``setMaxTimestamp``, only the timestamp-type bit and
    maxTimestamp change (baseTimestamp is kept; readers take maxTimestamp as every
    record's timestamp) and the CRC is recomputed.
    """
    offset = base_offset
    for header in batches:
        pos = header.position
        _Q.pack_into(buf, pos + _OFF_BASE_OFFSET, offset)
        header.base_offset = offset
        if partition_leader_epoch is not None:
            _I.pack_into(buf, pos + _OFF_LEADER_EPOCH, partition_leader_epoch)
            header.partition_leader_epoch = partition_leader_epoch
        if log_append_time_ms is not None and (
            header.timestamp_type != TIMESTAMP_LOG_APPEND_TIME or header.max_timestamp != log_append_time_ms
        ):
            attributes = header.attributes | _ATTR_TIMESTAMP_TYPE
            _H.pack_into(buf, pos + _OFF_ATTRIBUTES, attributes)
            _Q.pack_into(buf, pos + _OFF_MAX_TIMESTAMP, log_append_time_ms)
            crc = batch_crc(buf, pos, header.size)
            _U32.pack_into(buf, pos + _OFF_CRC, crc)
            header.attributes = attributes
            header.max_timestamp = log_append_time_ms
            header.crc = crc
        offset = header.next_offset
    return offset


# --- varints -----------------------------------------------------------------------------------


def _write_varint(out: bytearray, value: int) -> None:
    """Zig-zag varint (protobuf ``sint64`` encoding) as used by v2 records."""
    v = (value << 1) ^ (value >> 63)
    v &= 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _read_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise InvalidRecords(CORRUPT_MESSAGE, "truncated varint in record")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise InvalidRecords(CORRUPT_MESSAGE, "varint too long in record")
    return (result >> 1) ^ -(result & 1), pos


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(data))
        out += data


def _read_bytes(buf: Buffer, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint(buf, pos)
    if length < 0:
        return None, pos
    if pos + length > end:
        raise InvalidRecords(CORRUPT_MESSAGE, "record field extends past the end of the record")
    return bytes(buf[pos : pos + length]), pos + length


# --- compression -------------------------------------------------------------------------------

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_BLOCK = 32 * 1024


def _compress(codec: int, data: bytes) -> bytes:
    """Compress a records section the way the Java producer does."""
    if codec == COMPRESSION_GZIP:
        return gzip.compress(data)
    if codec == COMPRESSION_SNAPPY:
        # Java clients use xerial snappy-java framing; brokers accept it and raw snappy.
        out = bytearray(_XERIAL_HEADER.pack(_XERIAL_MAGIC, 1, 1))
        for i in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[i : i + _XERIAL_BLOCK]))
            out += _I.pack(len(block))
            out += block
        return bytes(out)
    if codec == COMPRESSION_LZ4:
        return bytes(
            lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False, content_checksum=False)
        )
    if codec == COMPRESSION_ZSTD:
        return bytes(zstandard.ZstdCompressor().compress(data))
    raise InvalidRecords(UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression type id {codec}")


def _decompress(codec: int, data: bytes) -> bytes:
    try:
        if codec == COMPRESSION_GZIP:
            return gzip.decompress(data)
        if codec == COMPRESSION_SNAPPY:
            if data.startswith(_XERIAL_MAGIC):
                out = bytearray()
                pos = _XERIAL_HEADER.size
                while pos < len(data):
                    (n,) = _I.unpack_from(data, pos)
                    pos += 4
                    out += bytes(cramjam.snappy.decompress_raw(data[pos : pos + n]))
                    pos += n
                return bytes(out)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec == COMPRESSION_LZ4:
            return bytes(lz4.frame.decompress(data))
        if codec == COMPRESSION_ZSTD:
            with zstandard.ZstdDecompressor().stream_reader(data) as reader:
                return bytes(reader.read())
    except InvalidRecords:
        raise
    except (OSError, EOFError, ValueError, RuntimeError, struct.error, zlib.error, zstandard.ZstdError) as exc:
        raise InvalidRecords(CORRUPT_MESSAGE, f"failed to decompress record batch: {exc}") from exc
    raise InvalidRecords(UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression type id {codec}")


# --- whole-batch encode / decode ---------------------------------------------------------------

RecordTuple = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]


def build_batch(
    records: Sequence[RecordTuple],
    *,
    base_offset: int = 0,
    timestamp_ms: int,
    timestamps: Sequence[int] | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    compression: int = COMPRESSION_NONE,
    partition_leader_epoch: int = -1,
) -> bytes:
    """Encode ``(key, value, headers)`` records as one v2 batch (for tests and internal topics).

    Every record gets ``timestamp_ms`` unless per-record ``timestamps`` are given.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    if timestamps is not None and len(timestamps) != len(records):
        raise ValueError("timestamps must match records one to one")
    ts_list = list(timestamps) if timestamps is not None else [timestamp_ms] * len(records)
    base_ts = ts_list[0]
    body = bytearray()
    rec = bytearray()
    for delta, ((key, value, headers), ts) in enumerate(zip(records, ts_list, strict=True)):
        rec.clear()
        rec.append(0)  # record attributes
        _write_varint(rec, ts - base_ts)
        _write_varint(rec, delta)
        _write_bytes(rec, key)
        _write_bytes(rec, value)
        _write_varint(rec, len(headers))
        for hkey, hvalue in headers:
            _write_bytes(rec, hkey.encode())
            _write_bytes(rec, hvalue)
        _write_varint(body, len(rec))
        body += rec
    payload = bytes(body) if compression == COMPRESSION_NONE else _compress(compression, bytes(body))
    attributes = compression & _ATTR_COMPRESSION_MASK
    if is_transactional:
        attributes |= _ATTR_TRANSACTIONAL
    if is_control:
        attributes |= _ATTR_CONTROL
    out = bytearray(BATCH_HEADER_SIZE)
    _HEADER.pack_into(
        out,
        0,
        base_offset,
        BATCH_HEADER_SIZE - LOG_OVERHEAD + len(payload),
        partition_leader_epoch,
        MAGIC_V2,
        0,
        attributes,
        len(records) - 1,
        base_ts,
        max(ts_list),
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    out += payload
    _U32.pack_into(out, _OFF_CRC, batch_crc(out, 0, len(out)))
    return bytes(out)


def decode_records(batch: Buffer) -> list[Record]:
    """Decompress and decode every record of one batch (not for produce/fetch hot paths)."""
    header = parse_batch_header(batch, 0)
    if len(batch) < header.size:
        raise InvalidRecords(CORRUPT_MESSAGE, "record batch is truncated")
    with memoryview(batch) as view:
        raw = bytes(view[BATCH_HEADER_SIZE : header.size])
    data = raw if header.compression == COMPRESSION_NONE else _decompress(header.compression, raw)
    log_append = header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    out: list[Record] = []
    pos = 0
    end = len(data)
    for _ in range(header.records_count):
        length, pos = _read_varint(data, pos)
        rec_end = pos + length
        if length < 0 or rec_end > end:
            raise InvalidRecords(CORRUPT_MESSAGE, "record length extends past the end of the batch")
        pos += 1  # record attributes (unused)
        ts_delta, pos = _read_varint(data, pos)
        offset_delta, pos = _read_varint(data, pos)
        key, pos = _read_bytes(data, pos, rec_end)
        value, pos = _read_bytes(data, pos, rec_end)
        n_headers, pos = _read_varint(data, pos)
        if n_headers < 0:
            raise InvalidRecords(CORRUPT_MESSAGE, "negative record header count")
        headers: list[tuple[str, bytes | None]] = []
        for _h in range(n_headers):
            hkey, pos = _read_bytes(data, pos, rec_end)
            if hkey is None:
                raise InvalidRecords(CORRUPT_MESSAGE, "null record header key")
            hvalue, pos = _read_bytes(data, pos, rec_end)
            try:
                headers.append((hkey.decode(), hvalue))
            except UnicodeDecodeError as exc:
                raise InvalidRecords(CORRUPT_MESSAGE, "record header key is not UTF-8") from exc
        if pos != rec_end:
            raise InvalidRecords(CORRUPT_MESSAGE, "record length does not match its contents")
        timestamp = header.max_timestamp if log_append else header.base_timestamp + ts_delta
        out.append(Record(header.base_offset + offset_delta, timestamp, key, value, headers))
    if pos != end:
        raise InvalidRecords(CORRUPT_MESSAGE, "record batch has trailing bytes after its records")
    return out
