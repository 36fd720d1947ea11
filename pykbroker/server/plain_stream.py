"""A plain TCP connection as an anyio byte stream, on an asyncio protocol of our own.

The broker owns the protocol of every connection it accepts, instead of reaching into anyio's
``SocketStream`` (its transport, its protocol's read queue and write event), for three reasons:

- **Fewer passes of the event loop.** Reading stays on between receives, and what waits unread is
  bounded instead: once ``high`` bytes are queued the transport stops reading and TCP flow control
  holds the sender back until the connection's task takes them.  anyio's receive resumes reading
  before each wait and pauses it after (two ``epoll_ctl`` calls and a loop pass per request).
- **Writes without a pass.** :meth:`PlainStream.write_nowait` hands a response to the transport at
  once; only a write the kernel did not take whole waits (:meth:`PlainStream.drain`).
- **Any asyncio event loop.** It uses only the public transport and protocol interfaces, so the
  same code runs on uvloop (``pykbroker.event.loop``), whose transports are not
  ``asyncio.Transport`` subclasses and call the ``data_received`` they saw at connection time.

TLS listeners wrap a ``PlainStream`` in anyio's ``TLSStream``, like any other byte stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import SocketStream

__all__ = ["ConnectionProtocol", "PlainStream", "accept"]


class ConnectionProtocol(asyncio.Protocol):
    """Received bytes queued up to a bound, the end of the stream, and write flow control."""

    __slots__ = ("chunks", "closed", "drain_waiters", "eof", "error", "high", "lost", "queued", "read_waiter",
                 "transport", "writable")

    def __init__(self, high: int) -> None:
        self.high = high
        self.chunks: deque[bytes] = deque()
        self.queued = 0
        self.transport: Any = None
        self.eof = False  # the peer shut down its side
        self.lost = False  # the transport is closed
        self.closed = False  # we closed it (aclose)
        self.error: BaseException | None = None
        self.writable = True  # nothing waits in the transport's buffer
        self.read_waiter: asyncio.Future[None] | None = None
        self.drain_waiters: list[asyncio.Future[None]] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        # Writing "pauses" as soon as anything is buffered, so that drain() waits until the kernel took it all.
        transport.set_write_buffer_limits(high=0, low=0)

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.queued += len(data)
        if self.queued >= self.high:
            self.transport.pause_reading()  # read no more until the connection's task takes what is here
        self.wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        self.wake_reader()
        return True  # keep the transport: what is being written may still go out

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if exc is not None and self.error is None:
            self.error = exc
        self.writable = True
        self.wake_reader()
        self.wake_drainers()

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        self.wake_drainers()

    def wake_reader(self) -> None:
        waiter = self.read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def wake_drainers(self) -> None:
        waiters, self.drain_waiters = self.drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class PlainStream(SocketStream):
    """An accepted TCP connection: anyio's ``SocketStream`` interface over a :class:`ConnectionProtocol`."""

    def __init__(self, transport: Any, protocol: ConnectionProtocol) -> None:
        self.transport = transport
        self.protocol = protocol

    @property
    def _raw_socket(self) -> socket.socket:
        sock: socket.socket = self.transport.get_extra_info("socket")
        return sock

    async def receive(self, max_bytes: int = 65536) -> bytes:
        """What has arrived (at least one byte, at most ``max_bytes``), waiting for it if need be.

        Raises ``EndOfStream`` when the peer has gone and nothing is left, ``BrokenResourceError`` if the
        connection failed, ``ClosedResourceError`` after :meth:`aclose`."""
        protocol = self.protocol
        if protocol.chunks:
            await anyio.lowlevel.checkpoint()  # one turn of the loop per receive, as anyio's receive takes
        else:
            self._check_readable()
            transport = self.transport
            if not transport.is_reading():
                transport.resume_reading()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            protocol.read_waiter = waiter
            try:
                await waiter
            finally:
                protocol.read_waiter = None
            if not protocol.chunks:  # woken by the end of the stream
                self._check_readable()
                raise anyio.EndOfStream
        return self._take(max_bytes)

    def _check_readable(self) -> None:
        protocol = self.protocol
        if protocol.closed:
            raise anyio.ClosedResourceError
        if protocol.error is not None:
            raise anyio.BrokenResourceError from protocol.error
        if protocol.eof or protocol.lost:
            raise anyio.EndOfStream

    def _take(self, max_bytes: int) -> bytes:
        protocol = self.protocol
        chunks = protocol.chunks
        if protocol.queued <= max_bytes:
            data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
        else:  # TLS reads 64 KiB at a time: leave the rest queued
            parts: list[bytes] = []
            size = 0
            while size < max_bytes:
                chunk = chunks.popleft()
                room = max_bytes - size
                if len(chunk) > room:
                    chunks.appendleft(chunk[room:])
                    chunk = chunk[:room]
                parts.append(chunk)
                size += len(chunk)
            data = b"".join(parts)
        protocol.queued -= len(data)
        return data

    def pause_reading(self) -> None:
        """Leave further bytes in the kernel until the next receive that has to wait (a muted connection,
        one waiting for request memory): TCP flow control then holds the sender back."""
        if self.transport.is_reading():
            self.transport.pause_reading()

    def write_nowait(self, data: bytes) -> bool | None:
        """Hand ``data`` to the transport at once: True if the kernel took all of it, False if some waits
        in the transport's buffer (:meth:`drain` waits for it), None if not written because an earlier
        write is still buffered or the connection is closing (use :meth:`send`)."""
        protocol = self.protocol
        if not protocol.writable or protocol.lost or protocol.closed or self.transport.is_closing():
            return None
        self.transport.write(data)
        return protocol.writable

    async def drain(self) -> None:
        """Until the transport has handed everything written through it to the kernel."""
        protocol = self.protocol
        for _ in range(1 << 30):  # each turn is a resume_writing or the connection's end
            if protocol.closed:
                raise anyio.ClosedResourceError
            if protocol.lost:
                raise anyio.BrokenResourceError from protocol.error
            if protocol.writable:
                return
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            protocol.drain_waiters.append(waiter)
            await waiter

    async def send(self, item: bytes) -> None:
        protocol = self.protocol
        await anyio.lowlevel.checkpoint_if_cancelled()
        if not protocol.writable:
            await self.drain()
        if protocol.closed:
            raise anyio.ClosedResourceError
        if protocol.lost or self.transport.is_closing():
            raise anyio.BrokenResourceError from protocol.error
        if item:
            self.transport.write(item)
        if not protocol.writable:
            await self.drain()
        else:
            await anyio.lowlevel.cancel_shielded_checkpoint()

    async def send_eof(self) -> None:
        try:
            self.transport.write_eof()
        except OSError:
            pass

    async def aclose(self) -> None:
        """Close at once, discarding anything not yet handed to the kernel (as anyio's socket streams do):
        a peer that stopped reading cannot hold the descriptor open."""
        protocol = self.protocol
        protocol.closed = True
        self.transport.abort()
        protocol.wake_reader()
        protocol.wake_drainers()
        await anyio.lowlevel.checkpoint()


async def accept(listener: socket.socket, high: int) -> PlainStream:
    """Accept one connection on a listening socket (its ``OSError`` as ``accept()`` raises it: EMFILE
    and the like, for the caller to back off from) as a :class:`PlainStream`."""
    loop = asyncio.get_running_loop()
    try:
        client, _ = await loop.sock_accept(listener)
    except asyncio.CancelledError:
        # The reader sock_accept registered is not removed on cancellation (bpo-41317); a loop that has
        # no reader for it (or no add/remove_reader at all) has nothing to remove.
        with contextlib.suppress(ValueError, NotImplementedError):
            loop.remove_reader(listener)
        raise
    try:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        protocol = ConnectionProtocol(high)
        transport, _ = await loop.connect_accepted_socket(lambda: protocol, client)
    except BaseException:
        client.close()
        raise
    return PlainStream(transport, protocol)
