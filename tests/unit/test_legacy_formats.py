"""The oldest protocol versions (pykbroker.protocol.legacy) and message format v0/v1 (message_format).

Layouts are checked three ways: against Kafka's schemas (field order, wire types and
nullability of each legacy version, read from the shared reference when it is present),
against hand-built byte layouts for the requests old clients send most, and by round trips.
Message sets are checked against kafka-python's own legacy encoder and decoder, an
independent implementation of the same format.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import lz4.frame
import pytest
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from pykbroker.protocol import bounds, codec, legacy
from pykbroker.protocol.fast_codec import encode_fetch_response, encode_produce_response
from pykbroker.protocol.message_format import (
    down_convert,
    encode_message_set,
    fix_lz4_header_checksum,
    is_message_set,
    lz4_legacy_frame,
    parse_message_set,
    up_convert,
    xxh32_short,
)
from pykbroker.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    MESSAGE_TOO_LARGE,
    UNSUPPORTED_COMPRESSION_TYPE,
    InvalidRecords,
    batch_crc,
    build_batch,
    decode_records,
)
from pykbroker.server.dispatcher import API_TABLE
from tests.support.hostile import random_entity, request_frame

SCHEMAS = Path(os.environ.get("PYKB_KAFKA_SCHEMAS")
               or Path(__file__).resolve().parents[3] / "shared" / "reference" / "kafka" / "message")
LEGACY_PAIRS = sorted(legacy.LAYOUTS)
_WIRE = {"int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "bool": "bool",
         "string": "string", "bytes": "bytes", "records": "records"}


# --- layouts ---------------------------------------------------------------------------------------


def _in(spec: str | None, version: int) -> bool:
    if not spec or spec == "none":
        return False
    if spec.endswith("+"):
        return version >= int(spec[:-1])
    lo, _, hi = spec.partition("-")
    return int(lo) <= version <= int(hi or lo)


def _schema_shape(fields_: list[dict[str, Any]], version: int) -> list[Any]:
    """(wire type, nullable, nested) per field of ``version``, from a Kafka schema's field list."""
    out: list[Any] = []
    for f in fields_:
        if not _in(f.get("versions"), version) or f.get("taggedVersions"):
            continue
        tp = f["type"]
        nullable = _in(f.get("nullableVersions"), version)
        if tp.startswith("[]"):
            inner = tp[2:]
            if "fields" in f:
                out.append(("array", nullable, _schema_shape(f["fields"], version)))
            else:
                out.append(("array", nullable, _WIRE[inner]))
        else:
            out.append((_WIRE[tp], nullable or tp == "records", None))
    return out


def _layout_shape(specs: tuple[legacy.Spec, ...]) -> list[Any]:
    out: list[Any] = []
    for s in specs:
        if s.array:
            out.append(("array", s.nullable, _layout_shape(s.struct) if s.struct is not None else s.kafka_type))
        else:
            out.append((s.kafka_type, s.nullable or s.kafka_type == "records", None))
    return out


def _load(name: str) -> dict[str, Any]:
    text = "\n".join(line for line in (SCHEMAS / name).read_text().splitlines() if not line.lstrip().startswith("//"))
    data = json.loads(text)
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize(("api_key", "version"), LEGACY_PAIRS)
def test_layouts_match_kafkas_schemas(api_key: int, version: int) -> None:
    """Field order, wire types and nullability of each layout against the version's schema fields."""
    if not SCHEMAS.is_dir():  # not in the repository (Kafka's files are not ours to commit)
        pytest.skip(f"Kafka's message schemas are not beside this checkout ({SCHEMAS}); CI has them")
    req_file = next(p.name for p in sorted(SCHEMAS.glob("*Request.json")) if _load(p.name)["apiKey"] == api_key)
    resp_file = req_file.replace("Request", "Response")
    req_text, resp_text = legacy.LAYOUTS[(api_key, version)]
    for file, text in ((req_file, req_text), (resp_file, resp_text)):
        schema = _load(file)
        assert _in(schema["validVersions"], version), file
        assert _layout_shape(legacy.parse_layout(text)) == _schema_shape(schema["fields"], version), file


def test_every_legacy_pair_is_advertised_and_below_kio() -> None:
    for api_key, version in LEGACY_PAIRS:
        spec = API_TABLE[api_key]
        assert spec.min_version <= version < codec.kio_versions(api_key).start
        assert not codec.is_flexible(api_key, version)
    for spec in API_TABLE.values():  # every version below kio's that we advertise has a layout
        for v in range(spec.min_version, codec.kio_versions(spec.key).start):
            assert legacy.is_legacy(spec.key, v)


@pytest.mark.parametrize(("api_key", "version"), LEGACY_PAIRS)
def test_requests_and_responses_round_trip(api_key: int, version: int) -> None:
    rng = random.Random(api_key * 31 + version)
    for _ in range(20):
        for cls in (codec.request_class(api_key, version), codec.response_class(api_key, version)):
            entity = random_entity(cls, rng)
            data = codec.encode_entity(entity)
            if cls is codec.request_class(api_key, version):
                assert bounds.request_walker(api_key, version)(data, 0, len(data)) == len(data)
                assert codec.decode_request(api_key, version, data, 0) == entity
            else:
                assert codec.decode_response(api_key, version, data, 0) == entity


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def test_produce_v0_request_bytes_by_hand() -> None:
    records = b"\x01\x02\x03"
    body = (struct.pack(">hi", 1, 1500) + struct.pack(">i", 1) + _s("orders") + struct.pack(">i", 1)
            + struct.pack(">ii", 2, len(records)) + records)
    req = codec.decode_request(0, 0, body, 0)
    assert (req.acks, req.timeout.total_seconds(), req.transactional_id) == (1, 1.5, None)
    (t,) = req.topic_data
    assert t.name == "orders" and [(p.index, p.records) for p in t.partition_data] == [(2, records)]
    assert codec.encode_entity(req) == body


def test_fetch_v0_and_v3_request_bytes_by_hand() -> None:
    parts = struct.pack(">i", 1) + _s("t") + struct.pack(">i", 1) + struct.pack(">iqi", 0, 42, 1024)
    v0 = codec.decode_request(1, 0, struct.pack(">iii", -1, 500, 1) + parts, 0)
    assert (v0.max_bytes, v0.isolation_level, v0.min_bytes) == (2**31 - 1, 0, 1)  # Kafka's defaults
    assert v0.topics[0].partitions[0].fetch_offset == 42
    v3 = codec.decode_request(1, 3, struct.pack(">iiii", -1, 500, 1, 4096) + parts, 0)
    assert v3.max_bytes == 4096 and v3.max_wait.total_seconds() == 0.5


def test_response_layouts_by_hand() -> None:
    body = {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 7, "log_append_time": -1, "log_start_offset": 0}]}],
        "throttle_time": 0}
    head = struct.pack(">i", 1) + _s("t") + struct.pack(">i", 1) + struct.pack(">ihq", 0, 0, 7)
    assert codec.encode_response(0, 0, body) == head
    assert codec.encode_response(0, 1, body) == head + struct.pack(">i", 0)
    assert codec.encode_response(0, 2, body) == head + struct.pack(">q", -1) + struct.pack(">i", 0)
    lo = {"topics": [{"name": "t", "partitions": [
        {"partition_index": 3, "error_code": 0, "old_style_offsets": [9, 0]}]}]}
    assert codec.encode_response(2, 0, lo) == (struct.pack(">i", 1) + _s("t") + struct.pack(">iih", 1, 3, 0)
                                               + struct.pack(">iqq", 2, 9, 0))


def test_describe_configs_v0_says_is_default() -> None:
    body = {"throttle_time": 0, "results": [{"error_code": 0, "error_message": None, "resource_type": 2,
                                             "resource_name": "t", "configs": [
        {"name": "a", "value": "1", "read_only": False, "config_source": 5, "is_sensitive": False},
        {"name": "b", "value": "2", "read_only": False, "config_source": 1, "is_sensitive": False}]}]}
    resp = codec.decode_response(32, 0, codec.encode_response(32, 0, body), 0)
    assert [(c.name, c.is_default) for c in resp.results[0].configs] == [("a", True), ("b", False)]


def test_a_lying_old_frame_is_refused_before_decoding() -> None:
    body = struct.pack(">hi", 1, 1000) + b"\x7f\xff\xff\xff"  # Produce v0 claiming 2^31-1 topics
    frame = request_frame(0, 0, body)
    with pytest.raises(bounds.BoundsError, match="array of 2147483647 elements"):
        bounds.check_request(0, 0, frame, len(frame) - len(body))


# --- message format v0/v1 --------------------------------------------------------------------------

NOW = int(time.time() * 1000)


def _kafka_python_set(magic: int, codec_id: int, records: list[tuple[int, bytes | None, bytes | None]]) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec_id, batch_size=1 << 20)
    for i, (ts, k, v) in enumerate(records):
        builder.append(i, timestamp=ts if magic else None, key=k, value=v)
    return bytes(builder.build())


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec_id", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4])
def test_up_convert_kafka_pythons_message_sets(magic: int, codec_id: int) -> None:
    records = [(NOW - 5, b"k0", b"v0"), (NOW, None, b"v1"), (NOW + 3, b"k2", None)]
    if magic == 0 and codec_id == COMPRESSION_LZ4:  # kafka-python needs xxhash for Kafka 0.8's LZ4 framing
        data = encode_message_set([(i, -1, k, v) for i, (_ts, k, v) in enumerate(records)], magic=0,
                                  codec=COMPRESSION_LZ4)
    else:
        data = _kafka_python_set(magic, codec_id, records)
    assert is_message_set(data)
    batch = up_convert(data, topic_partition="t-0", compression_type="producer", max_message_bytes=1 << 20)
    got = decode_records(batch)
    assert [(r.offset, r.key, r.value) for r in got] == [(i, k, v) for i, (_ts, k, v) in enumerate(records)]
    assert [r.timestamp for r in got] == ([ts for ts, _k, _v in records] if magic else [-1, -1, -1])
    assert batch[21 + 1] & 0x07 == codec_id  # the producer's codec is kept (compression.type=producer)


def test_up_convert_recompresses_only_when_asked() -> None:
    data = _kafka_python_set(1, COMPRESSION_GZIP, [(NOW, b"k", b"v")])
    batch = up_convert(data, topic_partition="t-0", compression_type="lz4", max_message_bytes=1 << 20)
    assert batch[22] & 0x07 == COMPRESSION_NONE  # left to the produce path's recompression


def _flip_crc(data: bytes) -> bytes:
    buf = bytearray(data)
    buf[12] ^= 0xFF
    return bytes(buf)


@pytest.mark.parametrize(("mutate", "error", "match"), [
    (_flip_crc, CORRUPT_MESSAGE, "Record is corrupt"),
    (lambda d: d[:8] + struct.pack(">i", 5) + d[12:], CORRUPT_MESSAGE, "minimum record overhead"),
    (lambda d: d[:16] + b"\x07" + d[17:], CORRUPT_MESSAGE, "Invalid magic"),
])
def test_up_convert_refuses_corrupt_messages(mutate: Any, error: int, match: str) -> None:
    data = mutate(_kafka_python_set(1, COMPRESSION_NONE, [(NOW, b"k", b"v")]))
    with pytest.raises(InvalidRecords, match=match) as info:
        up_convert(data, topic_partition="t-0", compression_type="producer", max_message_bytes=1 << 20)
    assert info.value.error_code == error


def _message(magic: int, attributes: int, key: bytes | None, value: bytes | None, ts: int = NOW,
             offset: int = 0) -> bytes:
    body = struct.pack(">bb", magic, attributes) + (struct.pack(">q", ts) if magic else b"")
    for part in (key, value):
        body += struct.pack(">i", -1) if part is None else struct.pack(">i", len(part)) + part
    return struct.pack(">qiI", offset, len(body) + 4, zlib.crc32(body)) + body


def test_message_layout_by_hand_matches_encoder() -> None:
    assert encode_message_set([(5, NOW, b"k", b"v")], magic=1) == _message(1, 0, b"k", b"v", NOW, 5)
    assert encode_message_set([(5, NOW, None, b"v")], magic=0) == _message(0, 0, None, b"v", offset=5)


def test_up_convert_checks_like_kafkas_log_validator() -> None:
    def convert(data: bytes, max_bytes: int = 1 << 20) -> bytes:
        return up_convert(data, topic_partition="t-0", compression_type="producer", max_message_bytes=max_bytes)

    with pytest.raises(InvalidRecords) as info:  # producers may not claim LogAppendTime
        convert(_message(1, 0x08, b"k", b"v"))
    assert info.value.error_code == INVALID_TIMESTAMP and info.value.record_errors[0][0] == 0
    # Kafka's InvalidRecordException cases: INVALID_RECORD.
    for bad, match in [
        (_message(1, COMPRESSION_ZSTD, None, b"x"), "Invalid wrapper compressionType"),  # zstd needs magic 2
        (_message(1, COMPRESSION_GZIP, None, None), "null value"),
        (_message(1, COMPRESSION_GZIP, None, gzip.compress(b"")), "no inner records"),
        (_message(1, COMPRESSION_GZIP, None, gzip.compress(_message(0, 0, b"k", b"v"))), "does not match wrapper"),
        (_message(1, COMPRESSION_GZIP, None, gzip.compress(_message(1, 0, b"k", b"v")
                                                          + _message(1, COMPRESSION_GZIP, None, b"x"))),
         "inner record with a compression attribute"),
    ]:
        with pytest.raises(InvalidRecords, match=match) as info:
            convert(bad)
        assert info.value.error_code == INVALID_RECORD
    assert info.value.record_errors == [(1, info.value.message)]
    with pytest.raises(InvalidRecords) as info:
        convert(_message(1, 0, b"k", b"v" * 100), max_bytes=50)
    assert info.value.error_code == MESSAGE_TOO_LARGE
    whole = _message(1, 0, b"k", b"v")
    partial = whole + _message(1, 0, b"k2", b"v2")[:20]  # a cut message at the end is ignored, as Kafka does
    assert len(decode_records(convert(partial))) == 1
    with pytest.raises(InvalidRecords, match="no complete message"):
        convert(whole[:20])


def _v2(records: list[tuple[bytes | None, bytes | None]], *, base: int, compression: int = COMPRESSION_NONE,
        control: bool = False, headers: bool = False) -> bytes:
    buf = bytearray(build_batch([(k, v, [("h", b"x")] if headers else []) for k, v in records],
                                timestamp_ms=NOW, timestamps=[NOW + i for i in range(len(records))],
                                compression=compression, is_control=control))
    struct.pack_into(">q", buf, 0, base)
    return bytes(buf)


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("compression", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY])
def test_down_convert_reads_back_with_kafka_python(magic: int, compression: int) -> None:
    log = (_v2([(b"a", b"1"), (None, b"2")], base=10, compression=compression, headers=True)
           + _v2([(None, b"")], base=12, control=True)
           + _v2([(b"c", None)], base=13, compression=compression))
    out = down_convert(log, magic, fetch_offset=11)
    got = []
    mr = MemoryRecords(out)
    while mr.has_next():
        b = mr.next_batch()
        assert isinstance(b, LegacyRecordBatch) and b.magic == magic
        got += [(r.offset, r.timestamp, r.key, r.value) for r in b]
    ts = (lambda t: t) if magic else (lambda t: None)
    # Uncompressed batches lose records below the fetch offset; a compressed one is kept whole.
    first = [(10, ts(NOW), b"a", b"1")] if compression else []
    assert got == [*first, (11, ts(NOW + 1), None, b"2"), (13, ts(NOW), b"c", None)]


def test_down_convert_refuses_zstd_and_round_trips() -> None:
    with pytest.raises(InvalidRecords) as info:
        down_convert(_v2([(b"k", b"v")], base=0, compression=COMPRESSION_ZSTD), 1, 0)
    assert info.value.error_code == UNSUPPORTED_COMPRESSION_TYPE
    v2 = _v2([(b"k", b"v"), (b"k2", b"v2")], base=0, compression=COMPRESSION_GZIP)
    back = up_convert(down_convert(v2, 1, 0), topic_partition="t-0", compression_type="producer",
                      max_message_bytes=1 << 20)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in decode_records(back)] == \
        [(r.offset, r.timestamp, r.key, r.value) for r in decode_records(v2)]
    assert [m.offset for m, _ in parse_message_set(down_convert(v2, 1, 0))] == [1]  # the wrapper: last offset


def test_message_format_v0_lz4_has_kafka_0_8s_header_checksum() -> None:
    for store_size in (True, False):  # our xxh32 gives the header checksum lz4 itself writes
        frame = lz4.frame.compress(b"payload" * 9, store_size=store_size)
        end = 6 + (8 if frame[4] & 0x08 else 0)
        assert frame[end] == (xxh32_short(frame[4:end]) >> 8) & 0xFF
    data = b"old kafka" * 50
    v1 = lz4_legacy_frame(data, 1)
    assert lz4.frame.decompress(v1) == data and not v1[4] & 0x08  # standard, without content size
    v0 = lz4_legacy_frame(data, 0)
    with pytest.raises(RuntimeError, match="headerChecksum"):  # over magic + descriptor, as Kafka 0.8 did
        lz4.frame.decompress(v0)
    assert v0[6] == (xxh32_short(v0[0:6]) >> 8) & 0xFF
    assert lz4.frame.decompress(fix_lz4_header_checksum(v0)) == data


@pytest.mark.parametrize("compression", [COMPRESSION_NONE, COMPRESSION_GZIP])
def test_down_convert_keeps_log_append_time(compression: int) -> None:
    buf = bytearray(_v2([(b"a", b"1"), (b"b", b"2")], base=0, compression=compression))
    struct.pack_into(">h", buf, 21, struct.unpack_from(">h", buf, 21)[0] | 0x08)  # LogAppendTime
    struct.pack_into(">q", buf, 35, NOW + 999)  # the broker's append time, in maxTimestamp
    struct.pack_into(">I", buf, 17, batch_crc(buf, 0, len(buf)))
    mr = MemoryRecords(down_convert(bytes(buf), 1, 0))
    got = []
    while mr.has_next():
        b = mr.next_batch()
        assert b.timestamp_type == 1
        got += [(r.offset, r.timestamp, r.timestamp_type) for r in b]
    assert got == [(0, NOW + 999, 1), (1, NOW + 999, 1)]


def test_fast_encoders_leave_old_versions_to_the_legacy_layouts() -> None:
    produce = {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 1, "log_append_time": -1}]}], "throttle_time": 0}
    fetch = {"throttle_time": 0, "responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "error_code": 0, "high_watermark": 1, "records": b""}]}]}
    for version in range(3):
        assert encode_produce_response(version, produce) is None
    for version in range(4):
        assert encode_fetch_response(version, fetch) is None
        assert codec.decode_response(1, version, codec.encode_response(1, version, fetch), 0).responses[0].topic == "t"
