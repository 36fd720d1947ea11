"""Receiving requests from a plain socket without pausing and resuming it around every receive.

anyio's asyncio ``SocketStream.receive`` resumes reading the socket before it waits and pauses it again
after: two ``epoll_ctl`` system calls and a few hundred lines of Python per request, which at ~1,000
small requests a second were a noticeable part of the broker's CPU per request.  A ``PlainReader``
leaves reading on and bounds what it buffers instead, as asyncio's own streams do: once ``high`` bytes
wait unread, the transport stops reading and TCP flow control holds the sender back until the
connection's task takes them.  TLS connections keep anyio's receive (the TLS layer reads on its own).
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import anyio.lowlevel


class PlainReader:
    """Reads a plain (non-TLS) anyio asyncio ``SocketStream`` through its protocol's read queue."""

    __slots__ = ("_protocol", "_queued", "_stream", "_transport", "high")

    def __init__(self, stream: Any, transport: asyncio.Transport, protocol: Any, high: int) -> None:
        self._stream = stream
        self._transport = transport
        self._protocol = protocol
        self.high = high
        self._queued = sum(len(chunk) for chunk in protocol.read_queue)
        original = protocol.data_received

        def data_received(data: bytes) -> None:
            original(data)
            self._queued += len(data)
            if self._queued >= self.high:
                transport.pause_reading()  # read no more until the connection's task takes what is here

        protocol.data_received = data_received

    @classmethod
    def attach(cls, stream: Any, high: int) -> PlainReader | None:
        """A reader for ``stream`` if it is anyio's asyncio socket stream (the shape it relies on), else None."""
        transport = getattr(stream, "_transport", None)
        protocol = getattr(stream, "_protocol", None)
        if not isinstance(transport, asyncio.Transport) or transport.get_extra_info("sslcontext") is not None:
            return None
        if not all(hasattr(protocol, name) for name in ("read_queue", "read_event", "is_at_eof", "exception")):
            return None
        return cls(stream, transport, protocol, high)

    async def receive(self, max_bytes: int) -> bytes:
        """Everything received so far (at least one byte), waiting for it if need be.

        Raises what anyio's receive raises at the end of the stream (EndOfStream, BrokenResourceError,
        ClosedResourceError): once nothing is queued and the peer has gone, that receive answers."""
        protocol = self._protocol
        queue = protocol.read_queue
        transport = self._transport
        if queue:
            await anyio.lowlevel.checkpoint()  # one turn of the loop per receive, as anyio's receive takes
        elif protocol.is_at_eof or protocol.exception is not None or transport.is_closing():
            return bytes(await self._stream.receive(max_bytes))
        else:
            if not transport.is_reading():
                transport.resume_reading()
            await protocol.read_event.wait()
            if not queue:  # woken by the end of the stream
                return bytes(await self._stream.receive(max_bytes))
        data: bytes = queue.popleft() if len(queue) == 1 else b"".join(queue)
        queue.clear()
        protocol.read_event.clear()
        self._queued = 0
        return data

    def pause(self) -> None:
        """Stop reading the socket until the next receive (a muted connection, one waiting for memory)."""
        self._transport.pause_reading()
