"""Writing a response to a connection, with fetched records sent from their segment files.

A fetch response whose record sets include :class:`~pykbroker.protocol.file_range.FileRange`
parts is a :class:`ResponseParts`: encoded bytes and file ranges in order, with the frame size
already counted in the first bytes.  On a plain socket (PLAINTEXT and SASL_PLAINTEXT
listeners), once the transport's buffer is empty, the bytes are written and each range sent with
``os.sendfile`` straight to the socket, so the record bytes go from the page cache to the socket
without a copy in Python, at one system call per range; TLS listeners, and any transport where
sendfile is not available, read the ranges just before sending instead.

A range whose bytes changed since the response was built (a truncation reached into it, or the
file is shorter than the length already announced in the frame) cannot be sent: the connection
is closed with a log line, never given a frame of the wrong length or content.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Iterable
from typing import Any, cast

import anyio
from anyio.abc import ByteStream

from pykbroker.logsetup import fields
from pykbroker.protocol.file_range import FileRange, StaleRange
from pykbroker.server.plain_stream import PlainStream

__all__ = ["Part", "ResponseParts", "frame", "transmit"]

log = logging.getLogger("pykbroker.network")

Part = bytes | FileRange

_CORK = getattr(socket, "TCP_CORK", None)


class ResponseParts:
    """A response frame as bytes and file ranges, in order; adjacent bytes are joined into one part."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: Iterable[Part]) -> None:
        out: list[Part] = []
        run: list[bytes] = []
        size = 0
        for part in parts:
            size += len(part)
            if isinstance(part, FileRange):
                if run:
                    out.append(run[0] if len(run) == 1 else b"".join(run))
                    run = []
                out.append(part)
            elif part:
                run.append(part)
        if run:
            out.append(run[0] if len(run) == 1 else b"".join(run))
        self.parts = out
        self.size = size

    def __len__(self) -> int:
        return self.size

    @property
    def ranges(self) -> list[FileRange]:
        return [p for p in self.parts if isinstance(p, FileRange)]

    def check(self) -> None:
        """Raise :class:`StaleRange` if any range can no longer be sent as announced."""
        for part in self.parts:
            if isinstance(part, FileRange):
                part.check()

    def materialise(self) -> bytes:
        """The whole frame as bytes, the ranges read now (the path without sendfile)."""
        return b"".join(p.read() if isinstance(p, FileRange) else p for p in self.parts)


def frame(parts: list[Part]) -> bytes | ResponseParts:
    """A response frame from its encoded parts: plain bytes unless a record set is a file range."""
    for part in parts:
        if isinstance(part, FileRange):
            return ResponseParts(parts)
    return b"".join(cast("list[bytes]", parts))  # no FileRange among them


async def transmit(stream: ByteStream, response: bytes | ResponseParts, peer: str = "?") -> None:
    """Write one response frame to ``stream``.

    Raises :class:`anyio.BrokenResourceError` (after a log line) when a file range cannot be sent
    as its frame announced; the connection must then be closed.
    """
    if not isinstance(response, ResponseParts):
        written = write_now(stream, response)
        if written is None:
            await stream.send(response)
        elif not written:
            await stream.send(b"")  # what the kernel did not take yet: wait for it to drain
        return
    try:
        plain = _sendfile_stream(stream)
        if plain is None:
            await stream.send(response.materialise())
        else:
            await _send_zero_copy(plain, response)
    except StaleRange as e:
        log.warning("closing connection: a fetch response cannot be sent as built",
                    extra=fields(peer=peer, reason=str(e)))
        raise anyio.BrokenResourceError(str(e)) from None


def write_now(stream: ByteStream, data: bytes) -> bool | None:
    """Hand ``data`` to a plain connection at once: True if the kernel took all of it, False if some waits
    in the transport's buffer, None if not written (use ``stream.send``).

    anyio's ``send`` ends with a checkpoint (a whole event-loop pass) even when the write went straight
    to the kernel; with one small response per request that pass was a sizeable part of the broker's
    CPU per request.  Taken only when nothing written earlier still waits in the transport's buffer; a
    write the kernel did not take in full leaves the rest there, and the caller waits for it to drain
    with ``send(b"")``, as anyio's send would have.  The connection's own loop still yields at every
    receive, so one busy client does not hold the event loop.  TLS streams always answer None.
    """
    if isinstance(stream, PlainStream):
        return stream.write_nowait(data)
    return None


def _sendfile_stream(stream: ByteStream) -> PlainStream | None:
    """The plain connection (not TLS) that ranges can be ``os.sendfile``d to, where the platform has it."""
    if not hasattr(os, "sendfile") or not isinstance(stream, PlainStream):
        return None
    return stream


async def _send_zero_copy(stream: PlainStream, response: ResponseParts) -> None:
    """Bytes and ranges written straight to the socket, in order, once the transport's buffer is empty.

    A response of a consumer with thousands of partitions carries thousands of ranges: each costs one
    ``os.sendfile`` call here (plus a write for the bytes before it), where ``loop.sendfile`` took a
    drain wait, an fstat and several loop iterations per range.  The writes go through a duplicate
    of the socket's descriptor, so that waiting for it to become writable does not touch the
    transport's own registration; nothing else writes to the connection meanwhile (one writer per
    connection, and the transport's buffer is empty when we start).
    """
    response.check()  # before the first byte: a stale range closes the connection with nothing sent
    sock: Any = stream.transport.get_extra_info("socket")
    if sock is None:
        await stream.send(response.materialise())
        return
    await stream.drain()  # until the transport has handed every byte written through it to the kernel
    parts = response.parts
    cork = _CORK is not None and len(parts) > 1
    fd = os.dup(sock.fileno())
    writer = _DirectWriter(fd, sock if cork else None)
    try:
        if cork:  # the small parts between ranges leave with the file data, not as packets of their own
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, _CORK, 1)
        for part in parts:
            if isinstance(part, FileRange):
                await writer.send_range(part)
            else:
                await writer.send_bytes(part)
    except OSError as e:
        raise anyio.BrokenResourceError(str(e)) from e
    finally:
        writer.close()
        if cork:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, _CORK, 0)


class _DirectWriter:
    """Non-blocking writes and sendfile calls on one socket descriptor, waiting for it when full.

    A 1 MiB fetch response through Kafka's default 100 KB send buffer waits for the socket about ten
    times.  The descriptor is watched from the first wait to the end of the response (not added and
    removed around each wait: two epoll_ctl calls and a loop handle each time), and the cork is
    pushed before a wait only where the send buffer cannot hold whole segments (see ``_writable``).
    """

    __slots__ = ("_corked", "_fd", "_loop", "_sendfile", "_waiter", "_watching")

    def __init__(self, fd: int, corked: Any) -> None:
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._sendfile = True
        self._watching = False
        self._waiter: asyncio.Future[None] | None = None
        # The socket while TCP_CORK is on; at the first wait, None unless its send buffer is small
        # enough for the cork to hold back all it has room for (a segment of the loopback's 64 KiB
        # MSS in a 48 KiB buffer, say).
        self._corked = corked

    def close(self) -> None:
        if self._watching:
            self._loop.remove_writer(self._fd)
        os.close(self._fd)

    def _ready(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _writable(self) -> None:
        if self._corked is not None and not self._watching and not _cork_can_stall(self._corked):
            self._corked = None  # decided once per response, at its first wait
        if self._corked is not None:
            # Push out what the cork holds: with a send buffer smaller than a segment, corked data
            # would otherwise wait for the cork's 200 ms timer before making room.
            with contextlib.suppress(OSError):
                self._corked.setsockopt(socket.IPPROTO_TCP, _CORK, 0)
                self._corked.setsockopt(socket.IPPROTO_TCP, _CORK, 1)
        self._waiter = self._loop.create_future()
        if not self._watching:
            self._loop.add_writer(self._fd, self._ready)
            self._watching = True
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def send_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._fd, view)
            except (BlockingIOError, InterruptedError):
                n = 0
            if n < len(view):
                view = view[n:]
                await self._writable()
            else:
                return

    async def send_range(self, part: FileRange) -> None:
        if not self._sendfile:
            await self.send_bytes(part.read())
            return
        position, left = part.position, part.length
        while left:
            try:
                n = os.sendfile(self._fd, part.file.fd, position, left)
            except (BlockingIOError, InterruptedError):
                await self._writable()
                continue
            except OSError as e:
                if left == part.length and e.errno in _NO_SENDFILE:  # nothing of the range went out yet
                    self._sendfile = False
                    await self.send_bytes(part.read())
                    return
                raise
            if n == 0:  # end of file before the end of the range
                part.check()
                raise StaleRange(f"{part.file.name} ended after {part.length - left} of the {part.length} bytes "
                                 f"at {part.position} a fetch response announced")
            position += n
            left -= n
            if left:
                await self._writable()


def _cork_can_stall(sock: Any) -> bool:
    """Whether a corked partial segment could fill this socket's send buffer (so that waiting for room
    needs the cork pushed first): the buffer holds less than two segments of the connection's MSS."""
    try:
        sndbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        mss = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    except OSError:
        return True
    return sndbuf < 2 * mss


# sendfile refusing this file or socket (not a byte of it sent): send the range's bytes instead.
_NO_SENDFILE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})
