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


# A frame at least this large is gathered as a list of the chunks received and joined once, instead
# of growing one buffer: growing a buffer by ``+=`` reallocates it, and beside other growing buffers
# the heap keeps the old copies, so a connection reading 40 MiB of a large request could cost 60-80 MiB.
LARGE_FRAME = 1 << 20


class FrameDecoder:
    """Feed bytes in, take whole frames out (without their size prefix)."""

    __slots__ = ("_buf", "_max_size", "_parts", "_parts_size", "_pos", "_size")

    def __init__(self, max_size: int) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._max_size = max_size
        # A large frame being gathered: its size, its bytes received so far (their total in _parts_size).
        self._size = -1
        self._parts: list[bytes] = []
        self._parts_size = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._size >= 0:
            missing = self._size - self._parts_size
            if len(data) <= missing:
                self._parts.append(bytes(data))
                self._parts_size += len(data)
                return
            with memoryview(data) as view:
                self._parts.append(bytes(view[:missing]))
                self._parts_size += missing
                rest = bytes(view[missing:])
            self._buf += rest  # the next frame's bytes: the buffer is empty while a large frame is gathered
            return
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken as frames (a large frame being gathered counts its size prefix too)."""
        return len(self._buf) - self._pos + (4 + self._parts_size if self._size >= 0 else 0)

    def peek_size(self) -> int | None:
        """Size of the frame being read, once its four size bytes have arrived (else None).

        Raises FrameTooLarge for a size above the limit and FrameError for a negative size.
        """
        if self._size >= 0:
            return self._size
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
        if self._size >= 0:
            if self._parts_size < self._size:
                return None
            parts = self._parts
            frame = parts[0] if len(parts) == 1 else b"".join(parts)
            self._size, self._parts, self._parts_size = -1, [], 0
            return frame
        size = self.peek_size()
        if size is None:
            return None
        buf = self._buf
        pos = self._pos
        end = pos + 4 + size
        if len(buf) < end:
            if size >= LARGE_FRAME:  # gather the rest in parts (see LARGE_FRAME)
                with memoryview(buf) as view:
                    head = bytes(view[pos + 4 :])
                self._size = size
                self._parts = [head] if head else []
                self._parts_size = len(head)
                buf.clear()
                self._pos = 0
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


class BrokerConnectionError(Exception):
    """A client's connection to a broker failed or answered out of step; it is closed.  Lives with the
    framing so that every client of the broker protocol (the replica fetcher's, the SASL login's) shares it."""


class CloseConnection(Exception):
    """Kafka's answer to some bad input is to close the connection; the message is logged."""
