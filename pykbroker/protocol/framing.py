"""Kafka's size-delimited framing, as a sans-I/O decoder.

Every request is a big-endian int32 size followed by that many bytes.  The size
is checked against ``socket.request.max.bytes`` as soon as its four bytes have
arrived, before any of the body is buffered, so an oversized or hostile frame
cannot make the broker allocate.  ``peek_size`` tells the connection the size of the frame
it is reading, so that it can reserve that much from the request memory pool before
reading the body; the decoder holds only the bytes that have arrived.
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

    def peek_size(self) -> int | None:
        """Size of the frame being read, once its four size bytes have arrived (else None).

        Raises FrameTooLarge for a size above the limit and FrameError for a negative size.
        """
        if len(self._buf) - self._pos < 4:
            return None
        (size,) = _SIZE.unpack_from(self._buf, self._pos)
        if size < 0:
            raise FrameError(f"negative frame size {size}")
        if size > self._max_size:
            raise FrameTooLarge(f"frame of {size} bytes exceeds socket.request.max.bytes={self._max_size}")
        return int(size)

    def next_frame(self) -> bytes | None:
        """The next whole frame, or None when more bytes are needed.

        Raises FrameTooLarge for a size above the limit and FrameError for a negative size.
        """
        size = self.peek_size()
        if size is None:
            return None
        buf = self._buf
        pos = self._pos
        end = pos + 4 + size
        if len(buf) < end:
            return None
        with memoryview(buf) as view:  # one copy of the frame, not a slice and then a copy
            frame = bytes(view[pos + 4 : end])
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
