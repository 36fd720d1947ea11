"""Request and response headers (v0-v2), parsed by hand: they are tiny and on every request.

Every length here (the client id, the tagged fields of header v2) is checked against the
bytes left in the frame before it is used, so a header cannot make the broker allocate
more than the frame it arrived in.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_FIXED = struct.Struct(">hhih")


class HeaderError(Exception):
    """The header cannot be parsed: Kafka closes the connection."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the request body starts in the frame


def read_uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """An unsigned varint of at most five bytes, as Kafka reads them."""
    shift = 0
    value = 0
    while True:
        if pos >= len(buf):
            raise HeaderError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise HeaderError("varint longer than five bytes")


def skip_tagged_fields(buf: bytes | memoryview, pos: int) -> int:
    """Skip a tagged-fields section, checking every count and size against the bytes left first."""
    count, pos = read_uvarint(buf, pos)
    if count * 2 > len(buf) - pos:  # each field takes at least a tag byte and a size byte
        raise HeaderError(f"{count} tagged fields exceed the {len(buf) - pos} bytes remaining")
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        if size > len(buf) - pos:
            raise HeaderError(f"tagged field of {size} bytes exceeds the {len(buf) - pos} bytes remaining")
        pos += size
    return pos


def parse_request_header_prefix(frame: bytes) -> RequestHeader:
    """Parse the fields common to header v1 and v2 (everything but the tagged fields).

    The caller knows, from the API table, whether this version uses header v2 and
    then calls :func:`finish_flexible_header`.
    """
    if len(frame) < _FIXED.size:
        raise HeaderError(f"request header needs {_FIXED.size} bytes, frame has {len(frame)}")
    api_key, api_version, correlation_id, client_len = _FIXED.unpack_from(frame, 0)
    pos = _FIXED.size
    client_id: str | None = None
    if client_len >= 0:
        end = pos + client_len
        if end > len(frame):
            raise HeaderError("truncated client id")
        try:
            client_id = frame[pos:end].decode("utf-8")
        except UnicodeDecodeError as e:
            raise HeaderError("client id is not UTF-8") from e
        pos = end
    elif client_len != -1:
        raise HeaderError(f"invalid client id length {client_len}")
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


def finish_flexible_header(frame: bytes, header: RequestHeader) -> RequestHeader:
    pos = skip_tagged_fields(frame, header.body_offset)
    return RequestHeader(header.api_key, header.api_version, header.correlation_id, header.client_id, pos)


def encode_response_header(correlation_id: int, flexible: bool) -> bytes:
    """Response header v0 (correlation id) or v1 (plus empty tagged fields)."""
    return struct.pack(">i", correlation_id) + (b"\x00" if flexible else b"")


def encode_request_header(api_key: int, version: int, correlation_id: int, client_id: str, flexible: bool) -> bytes:
    """Request header v1 (API key and version, correlation id, client id) or v2 (plus empty tagged fields): what
    pykbroker's own clients (the admin CLI's wire client, the test harness) send."""
    cid = client_id.encode()
    return _FIXED.pack(api_key, version, correlation_id, len(cid)) + cid + (b"\x00" if flexible else b"")
