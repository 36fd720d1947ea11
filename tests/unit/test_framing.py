"""Framing and request headers, driven without sockets."""

from __future__ import annotations

import struct
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pykbroker.protocol import framing
from pykbroker.protocol.framing import FrameDecoder, FrameError, FrameTooLarge, encode_frame
from pykbroker.protocol.header import (
    HeaderError,
    encode_response_header,
    finish_flexible_header,
    parse_request_header_prefix,
)


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(min_value=1, max_value=64))
def test_frames_survive_any_chunking(payloads: list[bytes], chunk: int) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    dec = FrameDecoder(max_size=1000)
    out = []
    for i in range(0, len(stream), chunk):
        dec.feed(stream[i : i + chunk])
        while (f := dec.next_frame()) is not None:
            out.append(f)
    assert out == payloads
    assert dec.buffered == 0


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(min_value=1, max_value=64),
       st.integers(min_value=0, max_value=40))
def test_large_frames_gathered_in_parts_survive_any_chunking(payloads: list[bytes], chunk: int,
                                                             large: int) -> None:
    """Frames at least LARGE_FRAME long are gathered as parts; with the bound lowered, any chunking of a
    stream mixing both kinds gives the same frames, and ``buffered`` counts what has not been taken."""
    stream = b"".join(encode_frame(p) for p in payloads)
    dec = FrameDecoder(max_size=1000)
    out = []
    taken = 0
    with mock.patch.object(framing, "LARGE_FRAME", large):
        for i in range(0, len(stream), chunk):
            dec.feed(stream[i : i + chunk])
            while (f := dec.next_frame()) is not None:
                out.append(f)
                taken += 4 + len(f)
            assert dec.buffered == min(i + chunk, len(stream)) - taken
    assert out == payloads
    assert dec.buffered == 0


def test_large_frame_is_held_as_the_chunks_received() -> None:
    """A large request is kept as its received chunks, not in a buffer grown (and copied) by each one."""
    size = 3 * framing.LARGE_FRAME
    chunk = bytes(range(256)) * 1024
    dec = FrameDecoder(max_size=size)
    dec.feed(struct.pack(">i", size) + chunk)
    assert dec.peek_size() == size and dec.next_frame() is None
    for _ in range(size // len(chunk) - 2):
        dec.feed(chunk)
        assert dec.next_frame() is None
    assert len(dec._buf) == 0 and dec.buffered == 4 + size - len(chunk)
    dec.feed(chunk + struct.pack(">i", 2) + b"ab")
    assert dec.next_frame() == chunk * (size // len(chunk))
    assert dec.next_frame() == b"ab" and dec.next_frame() is None and dec.buffered == 0


def test_oversized_frame_rejected_before_body_arrives() -> None:
    dec = FrameDecoder(max_size=100)
    dec.feed(struct.pack(">i", 101))
    with pytest.raises(FrameTooLarge):
        dec.next_frame()


def test_negative_size_rejected() -> None:
    dec = FrameDecoder(max_size=100)
    dec.feed(struct.pack(">i", -5))
    with pytest.raises(FrameError):
        dec.next_frame()


def test_partial_frame_waits() -> None:
    dec = FrameDecoder(max_size=100)
    dec.feed(struct.pack(">i", 10) + b"abc")
    assert dec.next_frame() is None
    dec.feed(b"defghij")
    assert dec.next_frame() == b"abcdefghij"


def _header(api_key: int, version: int, corr: int, client: str | None, tagged: bytes = b"") -> bytes:
    cid = struct.pack(">h", -1) if client is None else struct.pack(">h", len(client.encode())) + client.encode()
    return struct.pack(">hhi", api_key, version, corr) + cid + tagged


@given(
    st.integers(min_value=0, max_value=80),
    st.integers(min_value=0, max_value=20),
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
    st.one_of(st.none(), st.text(max_size=30)),
)
def test_header_roundtrip(api_key: int, version: int, corr: int, client: str | None) -> None:
    frame = _header(api_key, version, corr, client) + b"BODY"
    h = parse_request_header_prefix(frame)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (api_key, version, corr, client)
    assert frame[h.body_offset :] == b"BODY"


def test_flexible_header_skips_tagged_fields() -> None:
    tagged = bytes([2, 0, 3, 1, 2, 3, 5, 0])  # two tagged fields: tag 0 (3 bytes), tag 5 (empty)
    frame = _header(3, 12, 7, "c", tagged) + b"X"
    h = finish_flexible_header(frame, parse_request_header_prefix(frame))
    assert frame[h.body_offset :] == b"X"


@given(st.binary(max_size=12))
def test_short_garbage_header_raises(data: bytes) -> None:
    try:
        h = parse_request_header_prefix(data)
    except HeaderError:
        return
    assert h.body_offset <= len(data)


def test_response_header() -> None:
    assert encode_response_header(5, False) == b"\x00\x00\x00\x05"
    assert encode_response_header(5, True) == b"\x00\x00\x00\x05\x00"
