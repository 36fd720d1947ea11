"""Message format v0/v1 (magic 0 and 1): up-conversion on produce, down-conversion on fetch.

Clients from before Kafka 0.11 send Produce v0-2 with "message sets" and read them with
Fetch v0-3.  The log holds only v2 record batches, so, as Kafka's LogValidator does, a
produced message set is checked (sizes, CRC-32, magic, codecs, timestamp types) and
rebuilt as one v2 batch that then goes through the normal produce validation; a fetch
by an old version gets its batches rewritten as magic 0 (Fetch v0-1) or magic 1
(Fetch v2-3) messages, skipping control batches, as Kafka's RecordsUtil.downConvert
does.  None of this runs for modern versions.

Message layout (big-endian)::

    offset int64, message_size int32, crc uint32 (CRC-32 of the rest), magic int8,
    attributes int8 (codec in bits 0-2, v1 timestamp type in bit 3), [timestamp int64 (v1)],
    key bytes (int32 length, -1 null), value bytes

A compressed message ("wrapper") has a null key and the compressed inner message set as
value; inner offsets are absolute in v0 and relative (0..n-1) in v1, where the wrapper
carries the last inner offset.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import lz4.frame

from pykbroker.protocol.record_validator import _decompress_bounded, max_uncompressed_bytes
from pykbroker.protocol.records import (
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    MESSAGE_TOO_LARGE,
    NO_TIMESTAMP,
    TIMESTAMP_LOG_APPEND_TIME,
    UNSUPPORTED_COMPRESSION_TYPE,
    InvalidRecords,
    _compress,
    build_batch,
    decode_records,
    iter_batches,
)

__all__ = ["LegacyMessage", "down_convert", "encode_message_set", "is_message_set", "parse_message_set",
           "up_convert"]

LOG_OVERHEAD = 12  # offset + message_size
_HEAD = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes
_TS = struct.Struct(">q")
_LEN = struct.Struct(">i")
_CODEC_MASK = 0x07
_TIMESTAMP_TYPE = 0x08
# crc + magic + attributes + key length + value length (+ timestamp in v1): Kafka's RECORD_OVERHEAD_V0/V1.
_OVERHEAD = {0: 14, 1: 22}


@dataclass(slots=True)
class LegacyMessage:
    """One (inner or uncompressed) message of a v0/v1 message set."""

    offset: int
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value: bytes | None

    @property
    def codec(self) -> int:
        return self.attributes & _CODEC_MASK


def is_message_set(records: bytes | bytearray | memoryview) -> bool:
    """Whether produced records are a v0/v1 message set (the magic byte sits at 16 in both formats)."""
    return len(records) > 16 and records[16] < 2


def _corrupt(message: str) -> InvalidRecords:
    """Kafka's CorruptRecordException: sizes, CRC, magic of the message set itself."""
    return InvalidRecords(CORRUPT_MESSAGE, message)


def _invalid(message: str) -> InvalidRecords:
    """Kafka's InvalidRecordException: a well-formed message set whose contents break the rules."""
    return InvalidRecords(INVALID_RECORD, message)


def parse_message_set(buf: bytes | bytearray | memoryview, *, max_message_bytes: int | None = None) -> list[
        tuple[LegacyMessage, int]]:
    """The shallow messages of a message set with their sizes; a partial trailing message is ignored.

    Kafka's produce path ignores trailing bytes that do not make a whole message, and so do
    clients reading a fetch response.  Raises :class:`InvalidRecords` for a corrupt message.
    """
    out: list[tuple[LegacyMessage, int]] = []
    end = len(buf)
    pos = 0
    while end - pos >= LOG_OVERHEAD:
        offset, size = struct.unpack_from(">qi", buf, pos)
        if size < _OVERHEAD[0]:
            raise _corrupt(f"Record size {size} is less than the minimum record overhead ({_OVERHEAD[0]})")
        stop = pos + LOG_OVERHEAD + size
        if stop > end:
            break
        if max_message_bytes is not None and LOG_OVERHEAD + size > max_message_bytes:
            raise InvalidRecords(MESSAGE_TOO_LARGE, f"Message size {LOG_OVERHEAD + size} exceeds the maximum "
                                                    f"configured message size of {max_message_bytes}.")
        out.append((_parse_message(buf, pos, offset, stop), LOG_OVERHEAD + size))
        pos = stop
    return out


def _parse_message(buf: bytes | bytearray | memoryview, pos: int, offset: int, stop: int) -> LegacyMessage:
    _o, _s, crc, magic, attributes = _HEAD.unpack_from(buf, pos)
    if magic not in (0, 1):
        raise _corrupt(f"Invalid magic {magic} in a message set of magic 0/1 at offset {offset}")
    if stop - pos - LOG_OVERHEAD < _OVERHEAD[magic]:
        raise _corrupt(f"Record size is less than the minimum record overhead ({_OVERHEAD[magic]})")
    actual = zlib.crc32(memoryview(buf)[pos + 16:stop])
    if actual != crc:
        raise _corrupt(f"Record is corrupt (stored crc = {crc}, computed crc = {actual})")
    p = pos + 18
    timestamp = NO_TIMESTAMP
    if magic == 1:
        (timestamp,) = _TS.unpack_from(buf, p)
        p += 8
    key, p = _read_bytes(buf, p, stop)
    value, p = _read_bytes(buf, p, stop)
    if p != stop:
        raise _corrupt(f"Record at offset {offset} has {stop - p} bytes after its value")
    return LegacyMessage(offset, magic, attributes, timestamp, key, value)


def _read_bytes(buf: bytes | bytearray | memoryview, pos: int, stop: int) -> tuple[bytes | None, int]:
    if pos + 4 > stop:
        raise _corrupt("Record is truncated inside a length")
    (n,) = _LEN.unpack_from(buf, pos)
    pos += 4
    if n == -1:
        return None, pos
    if n < 0 or pos + n > stop:
        raise _corrupt(f"Record has an invalid key or value length {n}")
    return bytes(buf[pos:pos + n]), pos + n


def _inner_messages(wrapper: LegacyMessage, limit: int, topic_partition: str) -> list[LegacyMessage]:
    """The messages inside a compressed wrapper (Kafka's deep iteration, with its checks)."""
    codec = wrapper.codec
    if codec == COMPRESSION_ZSTD:  # message format v0/v1 cannot carry zstd
        raise _invalid(f"Invalid wrapper compressionType found in legacy deep record iterator {wrapper.magic}")
    if codec > COMPRESSION_ZSTD:
        raise _corrupt(f"Unknown compression type id {codec}")
    if wrapper.value is None:
        raise _invalid(f"Found invalid compressed record set with null value (magic = {wrapper.magic})")
    value = wrapper.value
    if codec == COMPRESSION_LZ4 and wrapper.magic == 0:
        value = fix_lz4_header_checksum(value)
    data = _decompress_bounded(codec, memoryview(value), limit, topic_partition)
    inner = [m for m, _size in parse_message_set(data)]
    if not inner:
        raise _invalid("Found invalid compressed record set with no inner records")
    for index, m in enumerate(inner):
        if m.magic != wrapper.magic:
            raise _invalid(f"Compressed message magic {m.magic} does not match wrapper magic {wrapper.magic}")
        if m.codec != COMPRESSION_NONE:
            message = "Compressed outer record should not have an inner record with a compression attribute set"
            raise InvalidRecords(INVALID_RECORD, message, [(index, message)])
    return inner


# --- produce: up-conversion ----------------------------------------------------------------------


def up_convert(
    records: bytes | bytearray | memoryview,
    *,
    topic_partition: str,
    compression_type: str,
    max_message_bytes: int,
) -> bytes:
    """One v2 batch (offsets from 0, no producer id) holding every message of a v0/v1 message set.

    Timestamps are kept (magic 0 has none: -1); the batch is compressed with the last
    wrapper's codec when the topic keeps the producer's (``compression.type=producer``),
    else left to the normal produce path to recompress, as Kafka's LogValidator does.
    """
    shallow = parse_message_set(records, max_message_bytes=max_message_bytes)
    if not shallow:
        raise _corrupt("Produce request holds no complete message")
    limit = max_uncompressed_bytes(max_message_bytes)
    flat: list[LegacyMessage] = []
    source_codec = COMPRESSION_NONE
    errors: list[tuple[int, str]] = []
    for m, _size in shallow:
        if m.magic == 1 and m.attributes & _TIMESTAMP_TYPE:
            errors.append((len(flat), f"Invalid timestamp type in message at offset {m.offset}. Producer should "
                                      "not set timestamp type to LogAppendTime."))
        if m.codec == COMPRESSION_NONE:
            flat.append(m)
        else:
            source_codec = m.codec
            flat.extend(_inner_messages(m, limit, topic_partition))
    if errors:
        raise InvalidRecords(INVALID_TIMESTAMP, "One or more records have been rejected due to invalid timestamp",
                             errors)
    codec = source_codec if compression_type == "producer" else COMPRESSION_NONE
    return build_batch(
        [(m.key, m.value, ()) for m in flat],
        timestamp_ms=NO_TIMESTAMP,
        timestamps=[m.timestamp for m in flat],
        compression=codec,
    )


# --- fetch: down-conversion ----------------------------------------------------------------------


def _message(offset: int, magic: int, attributes: int, timestamp: int, key: bytes | None,
             value: bytes | None) -> bytes:
    body = bytearray(struct.pack(">bb", magic, attributes))
    if magic == 1:
        body += _TS.pack(timestamp)
    for part in (key, value):
        if part is None:
            body += _LEN.pack(-1)
        else:
            body += _LEN.pack(len(part))
            body += part
    return struct.pack(">qiI", offset, len(body) + 4, zlib.crc32(body)) + bytes(body)


def encode_message_set(
    messages: Iterable[tuple[int, int, bytes | None, bytes | None]],
    *,
    magic: int,
    codec: int = COMPRESSION_NONE,
    log_append_time: bool = False,
) -> bytes:
    """``(offset, timestamp, key, value)`` as a v0/v1 message set; compressed ones in one wrapper.

    Inner offsets of a compressed v1 set are relative, the wrapper carries the last absolute
    offset and the largest timestamp, as Kafka's MemoryRecordsBuilder writes them.
    """
    items = list(messages)
    ts_attr = _TIMESTAMP_TYPE if (magic == 1 and log_append_time) else 0
    if codec == COMPRESSION_NONE:
        return b"".join(_message(o, magic, ts_attr, ts, k, v) for o, ts, k, v in items)
    base = items[0][0]
    inner = b"".join(_message(o - base if magic == 1 else o, magic, ts_attr, ts, k, v) for o, ts, k, v in items)
    wrapper_ts = max(ts for _o, ts, _k, _v in items)
    value = lz4_legacy_frame(inner, magic) if codec == COMPRESSION_LZ4 else _compress(codec, inner)
    return _message(items[-1][0], magic, ts_attr | codec, wrapper_ts, None, value)


def down_convert(records: bytes | bytearray | memoryview, magic: int, fetch_offset: int) -> bytes:
    """v2 batches as a magic 0 or 1 message set (Kafka's RecordsUtil.downConvert).

    Control batches are dropped; headers are dropped (v0/v1 have none); records of an
    uncompressed batch below ``fetch_offset`` are skipped, a compressed batch is kept whole
    (the client skips them).  Raises :class:`InvalidRecords` with UNSUPPORTED_COMPRESSION_TYPE
    for zstd, which old formats cannot carry.
    """
    out: list[bytes] = []
    for header in iter_batches(records):
        if header.is_control:
            continue
        if header.compression == COMPRESSION_ZSTD:
            raise InvalidRecords(UNSUPPORTED_COMPRESSION_TYPE,
                                 "Down-conversion of zstandard-compressed batches is not supported")
        batch = bytes(memoryview(records)[header.position:header.position + header.size])
        recs = decode_records(batch)
        compressed = header.compression != COMPRESSION_NONE
        if not compressed:
            recs = [r for r in recs if r.offset >= fetch_offset]
        if not recs:
            continue
        lat = header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
        out.append(encode_message_set(
            ((r.offset, r.timestamp if magic == 1 else NO_TIMESTAMP, r.key, r.value) for r in recs),
            magic=magic, codec=header.compression, log_append_time=lat,
        ))
    return b"".join(out)


def first_message_size(message_set: bytes) -> int:
    """Bytes of the first message of a message set (0 when empty)."""
    if len(message_set) < LOG_OVERHEAD:
        return 0
    return LOG_OVERHEAD + _LEN.unpack_from(message_set, 8)[0]


# --- LZ4 as Kafka 0.8-0.10 framed it ---------------------------------------------------------------
#
# Message format v0's LZ4 (Kafka 0.8/0.9) computed the frame's header checksum over the 4-byte
# magic number as well as the frame descriptor (KAFKA-3160); v1 fixed it.  Old readers also do not
# expect the optional content-size field.  So magic 0 frames are read after correcting that byte,
# and written with it wrong, as those clients expect.

_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32_short(data: bytes) -> int:
    """XXH32 with seed 0 of fewer than 16 bytes (an LZ4 frame header is at most 15)."""
    if len(data) >= 16:
        raise ValueError("xxh32_short handles fewer than 16 bytes")
    h = (_P5 + len(data)) & _M32
    pos = 0
    while pos + 4 <= len(data):
        (word,) = struct.unpack_from("<I", data, pos)
        h = (_rotl((h + word * _P3) & _M32, 17) * _P4) & _M32
        pos += 4
    for b in data[pos:]:
        h = (_rotl((h + b * _P5) & _M32, 11) * _P1) & _M32
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    return h ^ (h >> 16)


def _lz4_header_end(frame: bytes) -> int | None:
    """Index of the header-checksum byte of an LZ4 frame, or None if it is not one."""
    if len(frame) < 7 or frame[:4] != _LZ4_MAGIC:
        return None
    flg = frame[4]
    end = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    return end if end < len(frame) else None


def fix_lz4_header_checksum(frame: bytes) -> bytes:
    """A magic 0 LZ4 frame with its header checksum computed the standard way (descriptor only)."""
    end = _lz4_header_end(frame)
    if end is None:
        return frame
    return frame[:end] + bytes([(xxh32_short(frame[4:end]) >> 8) & 0xFF]) + frame[end + 1:]


def lz4_legacy_frame(data: bytes, magic: int) -> bytes:
    """LZ4 for message format v0/v1: independent 64 KB blocks, no content size; magic 0's checksum."""
    frame = bytearray(lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
                                         content_checksum=False, store_size=False))
    if magic == 0:
        frame[6] = (xxh32_short(bytes(frame[0:6])) >> 8) & 0xFF
    return bytes(frame)
