"""Writing a response to a connection, with fetched records sent from their segment files.

A fetch response whose record sets include :class:`~pykbroker.storage.file_range.FileRange`
parts is a :class:`ResponseParts`: encoded bytes and file ranges in order, with the frame size
already counted in the first bytes.  On a plain socket (PLAINTEXT and SASL_PLAINTEXT
listeners) the bytes go through the transport and each range through ``loop.sendfile``, so the
record bytes go from the page cache to the socket without a copy in Python; TLS listeners, and
any transport where sendfile is not available, read the ranges just before sending instead.

A range whose bytes changed since the response was built (a truncation reached into it, or the
file is shorter than the length already announced in the frame) cannot be sent: the connection
is closed with a log line, never given a frame of the wrong length or content.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Iterable
from typing import Any, cast

import anyio
from anyio.abc import ByteStream

from pykbroker.storage.file_range import FileRange, StaleRange

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
        await stream.send(response)
        return
    try:
        transport = _sendfile_transport(stream)
        if transport is None:
            await stream.send(response.materialise())
        else:
            await _send_zero_copy(stream, transport, response)
    except StaleRange as e:
        log.warning("closing connection peer=%s: a fetch response cannot be sent as built: %s", peer, e)
        raise anyio.BrokenResourceError(str(e)) from None


def _sendfile_transport(stream: ByteStream) -> asyncio.Transport | None:
    """The asyncio socket transport under a plain (non-TLS) anyio stream, when os.sendfile exists."""
    if not hasattr(os, "sendfile"):
        return None
    transport = getattr(stream, "_transport", None)  # anyio's asyncio SocketStream; a TLSStream has none
    if not isinstance(transport, asyncio.Transport) or transport.get_extra_info("sslcontext") is not None:
        return None
    return transport


async def _send_zero_copy(stream: ByteStream, transport: asyncio.Transport, response: ResponseParts) -> None:
    """Bytes through the transport, ranges with ``loop.sendfile`` (which first waits for the
    transport's buffer to drain, so the order on the wire is the parts' order)."""
    response.check()  # before the first byte: a stale range closes the connection with nothing sent
    loop = asyncio.get_running_loop()
    sock: Any = transport.get_extra_info("socket")
    parts = response.parts
    cork = _CORK is not None and sock is not None and len(parts) > 1
    if cork:  # the small parts between ranges leave with the file data, not as packets of their own
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, _CORK, 1)
    native = True
    try:
        last = len(parts) - 1
        for i, part in enumerate(parts):
            if isinstance(part, FileRange):
                if native:
                    try:
                        file: Any = part.file  # a file object enough for sendfile: it has fileno()
                        sent = await loop.sendfile(transport, file, part.position, part.length, fallback=False)
                    except asyncio.SendfileNotAvailableError:  # raised before any byte of the range went out
                        native = False
                    except RuntimeError as e:  # the transport is closing
                        raise anyio.BrokenResourceError(str(e)) from None
                    else:
                        if sent != part.length:
                            part.check()
                            raise StaleRange(f"{part.file.name} ended after {sent} of the {part.length} bytes at "
                                             f"{part.position} a fetch response announced")
                        continue
                data = part.read()
                if i == last:
                    await stream.send(data)
                else:
                    transport.write(data)
            elif i == last:
                await stream.send(part)  # waits while the transport's buffer is over its high-water mark
            else:
                transport.write(part)
    except OSError as e:
        raise anyio.BrokenResourceError(str(e)) from e
    finally:
        if cork:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, _CORK, 0)
