"""The bounds pre-pass: valid requests of every advertised version pass, lying frames are refused.

A 21-byte Metadata v12 frame whose topics array claims ~4 billion entries makes kio alone
allocate tens of GB and the process abort.  These tests drive ``pykbroker.protocol.bounds`` and
``Dispatcher.parse`` directly; ``test_fuzz_frames.py`` runs the same mutations by the hundred
thousand in a memory-limited subprocess.
"""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial.errors import SerialError

from pykbroker.config import BrokerConfig
from pykbroker.protocol import bounds, codec
from pykbroker.protocol.framing import CloseConnection
from pykbroker.protocol.header import (
    HeaderError,
    finish_flexible_header,
    parse_request_header_prefix,
)
from pykbroker.security.request import RequestContext
from pykbroker.server.broker import Broker
from pykbroker.server.context import Services
from pykbroker.server.dispatcher import API_TABLE, ApiSpec, Dispatcher
from pykbroker.server.handlers import offsets, produce
from tests.support.hostile import (
    HUGE_ARRAY_FRAME,
    HUGE_LENGTHS,
    advertised_pairs,
    mutate,
    random_entity,
    random_request_frame,
    request_frame,
)

PAIRS = advertised_pairs()
# What kio's decoder may raise on a malformed body that passed the pre-pass (bad UTF-8, an invalid
# boolean, an out-of-range duration, a tag it does not know): all become CloseConnection.
KIO_DECODE_ERRORS = (SerialError, ValueError, KeyError)

parser = Dispatcher(cast(Services, None))  # parse() never touches the services


def body_offset(frame: bytes) -> int:
    header = parse_request_header_prefix(frame)
    if codec.is_flexible(header.api_key, header.api_version):
        header = finish_flexible_header(frame, header)
    return header.body_offset


def test_every_advertised_pair_is_covered() -> None:
    assert len(PAIRS) == sum(s.max_version - s.min_version + 1 for s in API_TABLE.values()) >= 170
    for api_key, version in PAIRS:
        assert callable(bounds.request_walker(api_key, version))


@pytest.mark.parametrize(("api_key", "version"), PAIRS)
def test_valid_requests_pass_and_the_walk_ends_where_kio_stops(api_key: int, version: int) -> None:
    rng = random.Random(api_key * 100 + version)
    for _ in range(15):
        frame = random_request_frame(api_key, version, rng)
        offset = body_offset(frame)
        # The walk must land exactly at the end of what kio wrote: same layout, field for field.
        assert bounds.request_walker(api_key, version)(frame, offset, len(frame)) == len(frame)
        parsed = parser.parse(frame)
        assert not isinstance(parsed, bytes)
        header, request = parsed
        assert (header.api_key, header.api_version) == (api_key, version)
        assert type(request) is codec.request_class(api_key, version)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=st.sampled_from(PAIRS), rng=st.randoms(use_true_random=False))
def test_valid_requests_pass_property(pair: tuple[int, int], rng: random.Random) -> None:
    api_key, version = pair
    entity = random_entity(codec.request_class(api_key, version), rng)
    frame = request_frame(api_key, version, codec.encode_entity(entity))
    bounds.check_request(api_key, version, frame, body_offset(frame))
    parsed = parser.parse(frame)
    assert not isinstance(parsed, bytes)
    decoded = parsed[1]
    assert codec.encode_entity(decoded) == codec.encode_entity(entity)


def test_a_four_billion_element_array_is_refused_before_decoding() -> None:
    size, = struct.unpack_from(">i", HUGE_ARRAY_FRAME)
    frame = HUGE_ARRAY_FRAME[4:]
    assert len(HUGE_ARRAY_FRAME) == 21 and size == len(frame)
    with pytest.raises(bounds.BoundsError, match=r"topics: array of 4026531840 elements"):
        bounds.check_request(3, 12, frame, body_offset(frame))
    with pytest.raises(CloseConnection, match=r"metadata v12 request before decoding: .*topics"):
        parser.parse(frame)


def _frame_with_topics_count(api_key: int, version: int, encoded_count: bytes) -> bytes:
    """A default request whose (empty) first array gets this count instead: what a lying client sends."""
    body = codec.encode_entity(codec.build(codec.request_class(api_key, version), {}))
    at = _first_array_offset(api_key, version)
    width = 1 if codec.is_flexible(api_key, version) else 4
    assert body[at:at + width] in (b"\x01", b"\x00", b"\x00" * 4, b"\xff" * 4)  # empty or null
    return request_frame(api_key, version, body[:at] + encoded_count + body[at + width:])


def _first_array_offset(api_key: int, version: int) -> int:
    # Only for the requests below: the fields before their first array, with default values.
    return {(3, 12): 0, (3, 0): 0, (0, 3): 2 + 2 + 4, (0, 9): 1 + 2 + 4, (2, 1): 4, (2, 6): 4 + 1,
            (0, 10): 1 + 2 + 4, (0, 11): 1 + 2 + 4, (2, 7): 4 + 1, (2, 8): 4 + 1}[(api_key, version)]


@pytest.mark.parametrize(("api_key", "version", "count", "nullable"), [
    (3, 12, b"\xff\xff\xff\xff\x0f", True),   # compact, ~4 billion
    (3, 0, b"\x7f\xff\xff\xff", False),       # int32, 2^31-1 (Metadata v0 topics are not nullable)
    (0, 3, b"\x10\x00\x00\x00", False),       # Produce v3 topic_data, 268 million
    (0, 9, b"\x80\x80\x80\x80\x08", False),   # Produce v9, compact
    (2, 1, b"\x00\x10\x00\x00", False),       # ListOffsets v1
    (2, 6, b"\x81\x80\x04", False),           # ListOffsets v6, compact
])
def test_huge_array_counts_are_refused(api_key: int, version: int, count: bytes, nullable: bool) -> None:
    frame = _frame_with_topics_count(api_key, version, count)
    with pytest.raises(bounds.BoundsError, match=r"array of \d+ elements .* exceeds the \d+ bytes remaining"):
        bounds.check_request(api_key, version, frame, body_offset(frame))
    null = b"\x00" if codec.is_flexible(api_key, version) else b"\xff\xff\xff\xff"
    frame = _frame_with_topics_count(api_key, version, null)
    if nullable:
        bounds.check_request(api_key, version, frame, body_offset(frame))
    else:
        with pytest.raises(bounds.BoundsError, match="not nullable"):
            bounds.check_request(api_key, version, frame, body_offset(frame))


@pytest.mark.parametrize(("api_key", "version"), [(0, 9), (0, 10), (0, 11), (2, 6), (2, 7), (2, 8)])
def test_null_topics_close_the_connection_as_kafka_does(api_key: int, version: int) -> None:
    """Produce and ListOffsets topics are not nullable: Kafka fails to parse such a request."""
    frame = _frame_with_topics_count(api_key, version, b"\x00")  # a null compact array
    with pytest.raises(CloseConnection, match="not nullable"):
        parser.parse(frame)


def test_huge_strings_and_bytes_are_refused() -> None:
    # Produce v3: transactional_id (int16 string) then acks, timeout, topic_data.
    frame = request_frame(0, 3, b"\x7f\xff" + b"x" * 10)
    with pytest.raises(bounds.BoundsError, match="transactional_id: length 32767 exceeds"):
        bounds.check_request(0, 3, frame, body_offset(frame))
    # Produce v9 with a records field claiming 2 GiB.
    body = (b"\x00" + struct.pack(">hi", -1, 1000) + b"\x02" + b"\x02t" + b"\x02" + struct.pack(">i", 0)
            + b"\xff\xff\xff\xff\x07")
    frame = request_frame(0, 9, body)
    with pytest.raises(bounds.BoundsError, match="records: length 2147483646 exceeds"):
        bounds.check_request(0, 9, frame, body_offset(frame))


def test_tagged_fields_are_bounded() -> None:
    # Fetch v12 with default fields, then a tagged-fields section claiming a huge count or size.
    body = codec.encode_entity(codec.build(codec.request_class(1, 12), {}))
    assert body.endswith(b"\x00")
    for section, message in [
        (b"\xff\xff\xff\xff\x0f", "tagged fields exceed"),
        (b"\x01\x05\xff\xff\xff\x7f", "tagged field 5 of 268435455 bytes exceeds"),
        (b"\x01\x00\x03\x05abcd", "cluster_id: length 4 exceeds the 2 bytes"),  # a string of 4 in 3 bytes
        (b"\x01\x00\x03\x02az", "tagged field 0 does not fill its 3 bytes"),  # a string of 1 in 3 bytes
    ]:
        frame = request_frame(1, 12, body[:-1] + section)
        with pytest.raises(bounds.BoundsError, match=message):
            bounds.check_request(1, 12, frame, body_offset(frame))
    # A tag kio knows (cluster_id) filling exactly its size, and an unknown one, are walked over.
    frame = request_frame(1, 12, body[:-1] + b"\x01\x00\x03\x03ab")
    assert bounds.request_walker(1, 12)(frame, body_offset(frame), len(frame)) == len(frame)


def test_overlong_varints_are_refused() -> None:
    frame = request_frame(3, 12, b"\x80\x80\x80\x80\x80\x01")
    with pytest.raises(bounds.BoundsError, match="longer than five bytes"):
        bounds.check_request(3, 12, frame, body_offset(frame))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=st.sampled_from(PAIRS), rng=st.randoms(use_true_random=False))
def test_mutated_frames_raise_only_expected_errors(pair: tuple[int, int], rng: random.Random) -> None:
    frame = mutate(random_request_frame(*pair, rng), rng)
    try:
        header = parse_request_header_prefix(frame)
        if (header.api_key, header.api_version) not in PAIRS:
            return
        if codec.is_flexible(header.api_key, header.api_version):
            header = finish_flexible_header(frame, header)
        bounds.check_request(header.api_key, header.api_version, frame, header.body_offset)
    except (HeaderError, bounds.BoundsError):
        return
    try:
        codec.decode_request(header.api_key, header.api_version, frame, header.body_offset)
    except KIO_DECODE_ERRORS:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair=st.sampled_from(PAIRS), rng=st.randoms(use_true_random=False), window=st.sampled_from(HUGE_LENGTHS),
       at=st.integers(min_value=0, max_value=400))
def test_every_length_replaced_by_a_huge_value_is_refused_or_harmless(
    pair: tuple[int, int], rng: random.Random, window: bytes, at: int
) -> None:
    frame = random_request_frame(*pair, rng)
    offset = body_offset(frame)
    at = offset + at % max(len(frame) - offset, 1)
    hostile = frame[:at] + window + frame[at + len(window):]
    try:
        parser.parse(hostile)
    except CloseConnection as e:
        assert "MemoryError" not in str(e)


def test_truncation_at_every_byte_is_refused_or_decoded() -> None:
    rng = random.Random(7)
    for api_key, version in [(0, 9), (1, 12), (3, 12), (2, 8), (19, 7), (8, 9)]:
        frame = random_request_frame(api_key, version, rng)
        offset = body_offset(frame)
        for cut in range(offset, len(frame)):
            try:
                bounds.check_request(api_key, version, frame[:cut], offset)
            except bounds.BoundsError:
                continue
            raise AssertionError(f"api {api_key} v{version} cut at {cut} of {len(frame)} passed the pre-pass")


# --- the request header ----------------------------------------------------------------------------


@pytest.mark.parametrize(("frame", "message"), [
    (struct.pack(">hhih", 3, 12, 1, 30000) + b"abc", "truncated client id"),
    (struct.pack(">hhih", 3, 12, 1, -2), "invalid client id length"),
    (struct.pack(">hhih", 3, 12, 1, 1) + b"x" + b"\xff\xff\xff\xff\x0f", "tagged fields exceed"),
    (struct.pack(">hhih", 3, 12, 1, 1) + b"x" + b"\x01\x00\xff\xff\xff\x7f", "268435455 bytes exceeds"),
    (struct.pack(">hhih", 3, 12, 1, 1) + b"x" + b"\x80\x80\x80\x80\x80\x01", "longer than five bytes"),
])
def test_header_lengths_are_bounded(frame: bytes, message: str) -> None:
    with pytest.raises(HeaderError, match=message):
        finish_flexible_header(frame, parse_request_header_prefix(frame))
    with pytest.raises(CloseConnection, match="malformed request header"):
        parser.parse(frame)


# --- handlers never iterate a null topics array ----------------------------------------------------


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0"}))
    b.startup()
    try:
        yield b
    finally:
        b.log_manager.shutdown()


def _ctx(api_key: int, version: int) -> RequestContext:
    frame = request_frame(api_key, version, b"")
    return RequestContext(parse_request_header_prefix(frame))


def test_handlers_given_null_topics_answer_empty(broker: Broker) -> None:
    """Belt and braces: the pre-pass refuses these, but a handler must not raise TypeError either."""
    req: Any = codec.build(codec.request_class(0, 9), {"acks": 1, "timeout": 1000, "topic_data": None})
    assert req.topic_data is None
    produced = anyio.run(produce.handle_produce, broker.services, _ctx(0, 9), req)
    assert produced is not None and produced["responses"] == []
    req = codec.build(codec.request_class(2, 6), {"replica_id": -1, "topics": None})
    assert req.topics is None
    assert anyio.run(offsets.handle_list_offsets, broker.services, _ctx(2, 6), req)["topics"] == []


def test_metadata_v10_v11_null_topic_name_is_invalid_request(broker: Broker) -> None:
    """Topic ids are answered from v12 on; before, Kafka fails the request per topic and names it ""."""
    for version in (10, 11):
        topic_id = uuid.uuid4()
        frame = request_frame(3, version, codec.encode_entity(codec.build(codec.request_class(3, version), {
            "topics": [{"topic_id": topic_id, "name": None}], "allow_auto_topic_creation": True})))
        out = anyio.run(broker.dispatcher.handle, frame)
        assert out is not None
        resp = codec.decode_response(3, version, out[4:], 5)
        assert [(t.error_code, t.name, t.topic_id) for t in resp.topics] == [(ErrorCode.invalid_request, "", topic_id)]


def test_a_response_that_cannot_be_encoded_closes_only_the_connection(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_list_groups(svc: Services, ctx: RequestContext, req: Any) -> dict[str, Any]:
        return {"error_code": 0, "groups": [{"group_id": None, "protocol_type": "consumer"}]}

    monkeypatch.setitem(API_TABLE, 16, ApiSpec(16, 0, 5, broken_list_groups))
    frame = request_frame(16, 3, codec.encode_entity(codec.build(codec.request_class(16, 3), {})))
    with pytest.raises(CloseConnection, match="internal error while encoding the response"):
        anyio.run(broker.dispatcher.handle, frame)


def _metadata_v12_frame(body: bytes) -> bytes:
    """Request header v2 (api 3, version 12, correlation 7, client id "t", no tags) and ``body``."""
    return struct.pack(">hhih", 3, 12, 7, 1) + b"t" + b"\x00" + body


def test_unknown_tagged_fields_are_skipped_as_kafka_does() -> None:
    # Metadata v12: topics [ {topic_id, name "a", tags: unknown 42} ], auto-create, no ops, tags: unknown 99.
    topic = uuid.UUID(int=5).bytes + b"\x02a" + b"\x01" + b"\x2a\x03xyz"
    body = b"\x02" + topic + b"\x01\x00" + b"\x01" + b"\x63\x02\xaa\xbb"
    frame = _metadata_v12_frame(body)
    with pytest.raises(KeyError, match="Unknown tagged field"):  # what kio alone does with it
        codec.decode_request(3, 12, frame, body_offset(frame))
    cleaned = bounds.check_request(3, 12, frame, body_offset(frame))
    assert cleaned == _metadata_v12_frame(b"\x02" + uuid.UUID(int=5).bytes + b"\x02a\x00" + b"\x01\x00\x00")
    parsed = parser.parse(frame)
    assert not isinstance(parsed, bytes)
    request = parsed[1]
    assert [t.name for t in request.topics] == ["a"] and request.allow_auto_topic_creation
    plain = _metadata_v12_frame(b"\x01\x01\x00\x00")  # nothing to strip: the very same object back
    assert bounds.check_request(3, 12, plain, body_offset(plain)) is plain


def test_a_truncated_unknown_tagged_field_is_still_refused() -> None:
    frame = _metadata_v12_frame(b"\x01\x01\x00" + b"\x01" + b"\x63\x05\xaa")
    with pytest.raises(bounds.BoundsError, match="tagged field 99 of 5 bytes exceeds"):
        bounds.check_request(3, 12, frame, body_offset(frame))
