"""The socket edge: accept connections, frame bytes, hand frames to the dispatcher.

Each connection is served by one task that reads, dispatches and answers its
requests strictly in order (Kafka's per-connection ordering guarantee: the
next request is not processed before the previous one is answered).  Whatever
one connection does wrong ends that connection only.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import SocketAttribute, SocketStream

from pykbroker.protocol.framing import FrameDecoder, FrameError
from pykbroker.server.context import CloseConnection

log = logging.getLogger("pykbroker.network")

FrameHandler = Callable[[bytes, str, str], Awaitable[bytes | None]]
RECEIVE_SIZE = 256 * 1024


class Connection:
    __slots__ = ("busy", "peer", "receive_scope")

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.busy = False
        self.receive_scope: anyio.CancelScope | None = None


class SocketServer:
    def __init__(
        self,
        handler: FrameHandler,
        *,
        max_request_bytes: int,
        idle_timeout_ms: int,
        send_buffer: int = -1,
        receive_buffer: int = -1,
    ) -> None:
        self._handler = handler
        self._max_request_bytes = max_request_bytes
        self._idle_timeout_s = idle_timeout_ms / 1000 if idle_timeout_ms >= 0 else float("inf")
        self._send_buffer = send_buffer
        self._receive_buffer = receive_buffer
        self._connections: set[Connection] = set()
        self._closing = False

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def begin_shutdown(self) -> None:
        """Stop reading new requests; connections finish what they hold and close."""
        self._closing = True
        for conn in list(self._connections):
            if conn.receive_scope is not None:
                conn.receive_scope.cancel()

    async def wait_drained(self, timeout_s: float) -> None:
        with anyio.move_on_after(timeout_s):
            while self._connections:
                await anyio.sleep(0.01)

    def _tune(self, stream: SocketStream) -> None:
        sock: Any = stream.extra(SocketAttribute.raw_socket)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._send_buffer > 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
            if self._receive_buffer > 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._receive_buffer)
        except OSError:
            pass

    async def serve_connection(self, stream: SocketStream, listener_name: str) -> None:
        try:
            address: Any = stream.extra(SocketAttribute.remote_address)
            peer = f"{address[0]}:{address[1]}"
        except Exception:
            peer = "?"
        self._tune(stream)
        conn = Connection(peer)
        self._connections.add(conn)
        decoder = FrameDecoder(self._max_request_bytes)
        try:
            while not self._closing:
                data = b""
                # One scope for both ways a receive ends early: its deadline is the idle timeout,
                # and begin_shutdown() cancels it (after setting _closing, which tells them apart).
                with anyio.CancelScope(deadline=anyio.current_time() + self._idle_timeout_s) as scope:
                    conn.receive_scope = scope
                    data = await stream.receive(RECEIVE_SIZE)
                conn.receive_scope = None
                if self._closing and (scope.cancelled_caught or not data):
                    break
                if scope.cancelled_caught:
                    log.info("closing idle connection peer=%s idle_ms=%d", peer, int(self._idle_timeout_s * 1000))
                    break
                decoder.feed(data)
                while (frame := decoder.next_frame()) is not None:
                    conn.busy = True
                    response = await self._handler(frame, listener_name, peer)
                    if response is not None:
                        await stream.send(response)
                    conn.busy = False
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            pass
        except CloseConnection as e:
            log.warning("closing connection peer=%s reason=%r", peer, str(e))
        except FrameError as e:
            log.warning("closing connection peer=%s reason=%r", peer, str(e))
        finally:
            self._connections.discard(conn)
            with anyio.CancelScope(shield=True):
                await stream.aclose()
