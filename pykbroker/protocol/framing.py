"""Kafka's size-delimited framing, as a sans-I/O decoder.

Every request is a big-endian int32 size followed by that many bytes.  The size
is checked against ``socket.request.max.bytes`` as soon as its four bytes have
arrived, before any of the body is buffered, so an oversized or hostile frame
cannot make the broker allocate.
"""

from __future__ import annotations

import struct

_SIZE = struct.Struct(">i")


class FrameError(Exception):
    """The stream cannot be framed any more; the connection must be closed."""


class FrameTooLarge(FrameError):
    pass


class FrameDecoder:
    """Feed bytes in, take whole frames out (without their size prefix)."""

    __slots__ = ("_buf", "_max_size", "_pos")

    def __init__(self, max_size: int) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._max_size = max_size

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def next_frame(self) -> bytes | None:
        """The next whole frame, or None when more bytes are needed.

        Raises FrameTooLarge for a size above the limit and FrameError for a negative size.
        """
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 4:
            return None
        (size,) = _SIZE.unpack_from(buf, pos)
        if size < 0:
            raise FrameError(f"negative frame size {size}")
        if size > self._max_size:
            raise FrameTooLarge(f"frame of {size} bytes exceeds socket.request.max.bytes={self._max_size}")
        end = pos + 4 + size
        if len(buf) < end:
            return None
        frame = bytes(buf[pos + 4 : end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
            if end > 1 << 20:  # compact occasionally so the buffer does not grow without bound
                del buf[:end]
                self._pos = 0
        return frame


def encode_frame(payload: bytes | bytearray) -> bytes:
    return _SIZE.pack(len(payload)) + payload
