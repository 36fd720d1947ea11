"""The socket edge: accept connections, frame bytes, hand frames to the dispatcher.

Each connection is served by one task that reads and dispatches its requests
strictly in order and answers them in that order (Kafka's per-connection
ordering guarantee).  A request that has done its in-order work and waits only
for an acknowledgement (acks=all, log.flush.on.ack) is parked in a task of its
own, and the connection goes on with the next requests, up to
``pykbroker.max.inflight.requests.per.connection`` unanswered requests while one
waits for the ISR (``pykbroker.max.inflight.flush.requests.per.connection`` while
they wait only for an fsync) holding at most
``pykbroker.max.inflight.bytes.per.connection`` of request bytes; responses still
leave in request order (``response_order.ResponseOrder``).  Whatever one
connection does wrong ends that connection only.

Each listener has its own accept loop, which applies Kafka's connection limits
(``connection_quotas``) and survives running out of file descriptors: EMFILE or
ENFILE on accept backs off and retries, it never ends the broker.  The bytes of
requests being read come out of a ``MemoryPool`` (``queued.max.request.bytes``),
and a request must arrive whole within ``pykbroker.request.receive.timeout.ms``
of its first byte.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import math
import resource
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import ByteStream, Listener, SocketAttribute, SocketListener, SocketStream, TaskGroup
from anyio.streams.tls import TLSAttribute, TLSStream

from pykbroker.logsetup import RateLimitedLog, fields
from pykbroker.protocol.framing import CloseConnection, FrameDecoder, FrameError
from pykbroker.security.principal_mapping import MappingError
from pykbroker.security.sasl.authenticator import State as SaslState
from pykbroker.security.session import Session
from pykbroker.security.tls import ListenerTls
from pykbroker.server.connection_quotas import ConnectionQuotas, normalise_ip
from pykbroker.server.memory_pool import MemoryPool
from pykbroker.server.parked import Parked
from pykbroker.server.plain_stream import PlainStream, accept
from pykbroker.server.response_order import ResponseOrder, Slot
from pykbroker.server.transmit import ResponseParts, transmit, write_now

log = logging.getLogger("pykbroker.network")

# A frame's answer: response bytes, None (no response: acks=0), or Parked (pykbroker/server/parked.py).
Response = bytes | ResponseParts  # ResponseParts: a fetch response with records left in their files (transmit.py)
FrameHandler = Callable[[bytes, Session], Awaitable[Response | Parked[Response | None] | None]]
RECEIVE_SIZE = 256 * 1024
ACCEPT_BACKOFF_S = 0.1
LIMIT_LOG_INTERVAL_S = 10.0
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# accept() failing for want of a resource: wait for one to free up, as Kafka's acceptor does.
_ACCEPT_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Connection:
    __slots__ = ("busy", "evicted", "ip", "last_active", "listener", "peer", "progress", "receive_scope", "session",
                 "stop_reason")

    def __init__(self, peer: str, ip: str, listener: str, security_protocol: str = "PLAINTEXT") -> None:
        self.peer = peer
        self.ip = ip
        self.listener = listener
        self.session = Session(listener=listener, security_protocol=security_protocol, peer=peer)
        self.busy = False
        self.evicted = False
        self.last_active = anyio.current_time()
        self.receive_scope: anyio.CancelScope | None = None
        # Set when a parked request completes while the reader waits on it (pykbroker/server/parked.py), then
        # replaced by a fresh one; waits start and check their condition in one step, so none is missed.
        self.progress = anyio.Event()
        # Why a task other than the reader ended the connection (a close after parked requests, a broken socket).
        self.stop_reason: str | None = None


class SocketServer:
    def __init__(
        self,
        handler: FrameHandler,
        *,
        max_request_bytes: int,
        idle_timeout_ms: int,
        send_buffer: int = -1,
        receive_buffer: int = -1,
        quotas: ConnectionQuotas | None = None,
        queued_max_request_bytes: int = -1,
        receive_timeout_ms: int = -1,
        security_protocols: dict[str, str] | None = None,
        tls: dict[str, ListenerTls] | None = None,
        max_inflight_requests: int = 1,
        max_inflight_bytes: int | None = None,
        max_inflight_local_requests: int | None = None,
        failed_authentication_delay_ms: int = 100,
    ) -> None:
        self._handler = handler
        # connection.failed.authentication.delay.ms: a failed SASL authentication's answer waits this long,
        # then the connection closes (Kafka's KIP-306).
        self._failed_auth_delay_s = max(failed_authentication_delay_ms, 0) / 1000
        # Requests of one connection read and not yet answered while earlier ones are parked
        # (pykbroker.max.inflight.requests.per.connection); 1: each is answered before the next is read.
        self._max_inflight = max(max_inflight_requests, 1)
        # ... or while they wait only for this broker's fsync
        # (pykbroker.max.inflight.flush.requests.per.connection) ...
        self._max_inflight_local = max_inflight_local_requests
        # ... and no more request bytes than this (pykbroker.max.inflight.bytes.per.connection).
        self._max_inflight_bytes = max_inflight_bytes
        # Listener name -> its server-side TLS (SSL and SASL_SSL listeners; pykbroker.security.tls).
        self._tls = tls or {}
        # Listener name -> PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL (listener.security.protocol.map).
        self._security_protocols = security_protocols or {}
        self._max_request_bytes = max_request_bytes
        self._idle_timeout_s = idle_timeout_ms / 1000 if idle_timeout_ms >= 0 else math.inf
        self._receive_timeout_s = receive_timeout_ms / 1000 if receive_timeout_ms > 0 else math.inf
        self._send_buffer = send_buffer
        self._receive_buffer = receive_buffer
        self.quotas = quotas if quotas is not None else ConnectionQuotas(listeners=())
        self.pool = MemoryPool(queued_max_request_bytes, max_request_bytes)
        self._connections: set[Connection] = set()
        self._slot_freed = anyio.Event()
        self._closing = False
        self._log_full = RateLimitedLog(log, LIMIT_LOG_INTERVAL_S)
        self._log_per_ip = RateLimitedLog(log, LIMIT_LOG_INTERVAL_S)
        self._log_rate = RateLimitedLog(log, LIMIT_LOG_INTERVAL_S)
        self._log_ip_rate = RateLimitedLog(log, LIMIT_LOG_INTERVAL_S)
        self._log_accept = RateLimitedLog(log, LIMIT_LOG_INTERVAL_S)
        self._log_pool = RateLimitedLog(log, LIMIT_LOG_INTERVAL_S)
        self._log_slow = RateLimitedLog(log, 1.0)
        self._log_lru = RateLimitedLog(log, LIMIT_LOG_INTERVAL_S)

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def connections_by_listener(self) -> Counter[str]:
        return Counter(c.listener for c in self._connections)

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

    def _tune(self, stream: PlainStream) -> None:
        sock: Any = stream.extra(SocketAttribute.raw_socket)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._send_buffer > 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
            if self._receive_buffer > 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._receive_buffer)
        except OSError:
            pass

    # --- accepting ----------------------------------------------------------------------------

    async def _wait_for_slot(self, listener_name: str) -> None:
        """Block while max.connections (broker or listener) is reached: clients wait in the backlog."""
        quotas = self.quotas
        while not quotas.slot_available(listener_name):
            own = quotas.listener_max_connections(listener_name)
            if quotas.listener_count(listener_name) >= own:
                limit = {"open": quotas.listener_count(listener_name),
                         "setting": f"listener.name.{listener_name.lower()}.max.connections", "limit": own}
            else:
                limit = {"open": quotas.total, "setting": "max.connections", "limit": quotas.max_connections}
            self._log_full.log(
                anyio.current_time(), logging.WARNING,
                "connection limit reached: not accepting new connections until one closes",
                listener=listener_name, **limit,
            )
            await self._slot_freed.wait()

    def _notify_slot_freed(self) -> None:
        self._slot_freed.set()
        self._slot_freed = anyio.Event()

    async def serve_listener(self, listener: Listener[SocketStream], listener_name: str, task_group: TaskGroup) -> None:
        """Accept connections on one listener until cancelled, starting a task for each in ``task_group``.

        A listener bound to every address is several sockets (IPv4 and IPv6), each with its own loop.
        """
        sockets = [x for x in getattr(listener, "listeners", [listener]) if isinstance(x, SocketListener)]
        if not sockets:
            raise TypeError(f"cannot accept from {listener!r}")
        async with anyio.create_task_group() as loops:
            for sock in sockets:
                loops.start_soon(self._accept_loop, sock, listener_name, task_group)

    async def _accept_loop(self, listener: SocketListener, listener_name: str, task_group: TaskGroup) -> None:
        raw: socket.socket = listener.extra(SocketAttribute.raw_socket)
        while True:
            await self._wait_for_slot(listener_name)
            try:
                # Plain sockets stay readable between receives, up to RECEIVE_SIZE unread bytes (plain_stream.py).
                stream = await accept(raw, RECEIVE_SIZE)
            except OSError as e:
                await self._accept_failed(e, listener_name)
                continue
            try:
                admitted = await self._admit(stream, listener_name)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
                raise
            if isinstance(admitted, Connection):
                task_group.start_soon(self._serve_admitted, stream, admitted)
            elif admitted is not None:  # over its address's connection_creation_rate: held, then closed
                task_group.start_soon(self._close_after, stream, admitted)

    async def _accept_failed(self, e: OSError, listener_name: str) -> None:
        now = anyio.current_time()
        if e.errno in _ACCEPT_RESOURCE_ERRORS:
            self._log_accept.log(
                now, logging.ERROR,
                "cannot accept connections: retrying until descriptors free up (raise the nofile limit or set "
                "max.connections)",
                listener=listener_name, reason=str(e.strerror or e), open=len(self._connections),
                retry_ms=int(ACCEPT_BACKOFF_S * 1000),
            )
            await anyio.sleep(ACCEPT_BACKOFF_S)
        else:  # e.g. ECONNABORTED: a client gave up before we accepted it; nothing to fix here
            self._log_accept.log(now, logging.WARNING, "accept failed", listener=listener_name, reason=str(e))
            await anyio.sleep(0.01)  # no busy loop should an error persist

    async def _close_after(self, stream: PlainStream, delay: float) -> None:
        """Kafka's throttled close: the connection is never served and closes once its throttle time is over."""
        try:
            await anyio.sleep(delay)
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    async def _admit(self, stream: PlainStream, listener_name: str) -> Connection | float | None:
        """Apply the creation rates, max.connections and the per-address limit to an accepted connection.

        None: refused and closed; a number: over its address's connection_creation_rate quota, to be
        closed after that many seconds (not counted as a connection meanwhile)."""
        try:
            address: Any = stream.extra(SocketAttribute.remote_address)
            ip, peer = normalise_ip(str(address[0])), f"{address[0]}:{address[1]}"
        except Exception:
            ip, peer = "?", "?"
        quotas = self.quotas
        now = anyio.current_time()
        delay = quotas.record_creation(listener_name, now)
        if delay > 0:
            self._log_rate.log(
                now, logging.INFO, "throttling new connections: above max.connection.creation.rate",
                listener=listener_name, delay_ms=int(delay * 1000),
            )
            await anyio.sleep(delay)
        # Another listener may have taken the last slot while this one waited in accept().
        await self._wait_for_slot(listener_name)
        ip_delay = quotas.record_ip_creation(listener_name, ip, anyio.current_time())
        if ip_delay > 0:
            self._log_ip_rate.log(
                anyio.current_time(), logging.INFO,
                "closing a new connection after a delay: the address is above its connection_creation_rate quota",
                ip=ip, listener=listener_name, delay_ms=int(ip_delay * 1000),
                quota_per_s=f"{quotas.ip_creation_rate(ip) or 0:g}",
            )
            return ip_delay
        if not quotas.try_add(listener_name, ip):
            self._log_per_ip.log(
                anyio.current_time(), logging.INFO,
                "rejected connection: the address already has its maximum of connections (max.connections.per.ip)",
                ip=ip, listener=listener_name, limit=quotas.ip_limit(ip),
            )
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            return None
        conn = Connection(peer, ip, listener_name, self._security_protocols.get(listener_name, "PLAINTEXT"))
        self._connections.add(conn)
        if quotas.over_broker_limit():
            self._close_least_recently_used(conn)
        return conn

    def _close_least_recently_used(self, newcomer: Connection) -> None:
        """Kafka: a connection on the inter-broker listener above max.connections closes the least
        recently used connection of another listener."""
        candidates = [c for c in self._connections
                      if c is not newcomer and not c.evicted and not self.quotas.protected(c.listener)]
        if not candidates:
            return
        victim = min(candidates, key=lambda c: (c.busy, c.last_active))
        victim.evicted = True
        if victim.receive_scope is not None:
            victim.receive_scope.cancel()
        self._log_lru.log(
            anyio.current_time(), logging.INFO,
            "closing the least recently used connection: max.connections exceeded by an inter-broker connection",
            peer=victim.peer, listener=victim.listener, max_connections=self.quotas.max_connections,
            inter_broker_listener=newcomer.listener,
        )

    # --- serving ------------------------------------------------------------------------------

    async def _serve_admitted(self, stream: PlainStream, conn: Connection) -> None:
        """Serve the connection's requests until it closes; parked requests run in their own tasks."""
        self._tune(stream)
        order = ResponseOrder(self._max_inflight, self._max_inflight_bytes, self._max_inflight_local)
        stream_: ByteStream = stream
        try:
            tls = self._tls.get(conn.listener)
            if tls is not None:
                wrapped = await self._tls_handshake(stream, conn, tls)
                if wrapped is None:
                    return
                stream_ = wrapped
                # anyio's TLSStream may write from inside a receive (TLS 1.3 key updates), which must not
                # meet a parked request's write: on TLS each request is answered before the next is read
                # (a long-polling fetch too).
                order = ResponseOrder(1, read_past_long_polls=False)
            async with anyio.create_task_group() as parked:
                if await self._read_requests(stream, stream_, conn, order, parked):
                    await self._drain(conn, order)
                # What is still parked belongs to a connection that is closing: nobody will read its answer.
                parked.cancel_scope.cancel()
        except Exception:
            # A bug met by one connection ends that connection, never the broker's task group.
            log.exception("closing connection after an unexpected error", extra=fields(peer=conn.peer))
        finally:
            conn.receive_scope = None
            self.pool.release(order.clear())
            self._connections.discard(conn)
            self.quotas.remove(conn.listener, conn.ip)
            self._notify_slot_freed()
            with anyio.CancelScope(shield=True):
                await stream_.aclose()

    async def _read_requests(self, stream: PlainStream, stream_: ByteStream, conn: Connection,
                             order: ResponseOrder, parked: TaskGroup) -> bool:
        """Read and process the connection's requests in order until it closes.

        A request the handler parks (it waits only for an acknowledgement) gets a task in ``parked``, and the
        next requests are read and processed meanwhile, up to ``order.max_unanswered`` unanswered ones;
        ``order`` keeps the responses in request order.  True: answer what is held before closing.
        """
        peer = conn.peer
        decoder = FrameDecoder(self._max_request_bytes)
        reserved = 0  # bytes of the frame being read, reserved from the pool
        frame_started: float | None = None  # when the first byte of the frame being read was seen
        frame_deadline = math.inf
        first_bytes = b""
        is_tls = stream_ is not stream
        clock = _clock()
        try:
            while not self._closing and not conn.evicted and conn.stop_reason is None:
                if conn.session.muted_until:  # a throttled client: read nothing more until then (KIP-219)
                    stream.pause_reading()
                    await self._stay_muted(conn)
                    continue
                if order.full:  # as many unanswered requests as allowed: wait for an answer to go out
                    await self._await_progress(conn)
                    continue
                size = decoder.peek_size()
                if size is not None and not reserved and size:
                    waited = await self._reserve(conn, size, stream)
                    if waited is None:  # shutdown or eviction while waiting
                        break
                    reserved = size
                    frame_deadline += waited  # time spent waiting for memory is not the client's
                frame = decoder.next_frame()
                if frame is not None:
                    frame_started, frame_deadline = None, math.inf
                    conn.busy = True
                    try:
                        result = await self._handler(frame, conn.session)
                    except CloseConnection as e:
                        if order.idle:  # nothing before it to answer: close now
                            raise
                        order.closing(str(e), reserved)  # close once the responses before it are out
                        reserved = 0
                        await self._write_ready(stream_, conn, order)
                        return True
                    if isinstance(result, Parked):
                        slot = order.park(reserved, replicated=result.replicated, long_poll=result.long_poll)
                        reserved = 0
                        if result.settle is not None:  # answered from a callback: no task of its own
                            result.settle(functools.partial(self._settled, stream_, conn, order, slot, parked))
                        else:
                            parked.start_soon(self._finish_parked, stream_, conn, order, slot, result)
                    else:
                        if _authentication_failed(conn.session):  # as Kafka: answer after the delay, then close
                            await anyio.sleep(self._failed_auth_delay_s)
                            order.ready(result, reserved)
                            reserved = 0
                            order.closing("failed authentication", 0)
                            await self._write_ready(stream_, conn, order)
                            return True
                        order.ready(result, reserved)
                        reserved = 0
                        await self._write_ready(stream_, conn, order)
                    conn.busy = not order.idle
                    conn.last_active = clock()
                    continue
                now = clock()
                if decoder.buffered and frame_started is None:
                    frame_started = now
                    frame_deadline = now + self._receive_timeout_s
                data = b""
                # One scope for every way a receive ends early: its deadline is the idle timeout (not while
                # requests are unanswered) or the end of the time a started request has to arrive, and
                # begin_shutdown(), an eviction or a parked request closing the connection cancel it (after
                # setting a flag, which tells them apart).
                idle_deadline = now + self._idle_timeout_s if order.idle else math.inf
                with anyio.CancelScope(deadline=min(idle_deadline, frame_deadline)) as scope:
                    conn.receive_scope = scope
                    data = await stream_.receive(RECEIVE_SIZE)
                    if is_tls and data:
                        data = await _drain_tls(stream_, data)
                conn.receive_scope = None
                if (self._closing or conn.evicted or conn.stop_reason is not None) and \
                        (scope.cancelled_caught or not data):
                    break
                if scope.cancelled_caught:
                    now = anyio.current_time()
                    if now >= frame_deadline and frame_started is not None:
                        self._log_slow.log(
                            now, logging.WARNING,
                            "closing connection: request not received within pykbroker.request.receive.timeout.ms",
                            peer=peer, timeout_ms=int(self._receive_timeout_s * 1000),
                            received_bytes=max(decoder.buffered - 4, 0), size=size if size is not None else "?",
                            elapsed_ms=int((now - frame_started) * 1000),
                        )
                    else:
                        log.info("closing idle connection",
                                 extra=fields(peer=peer, idle_ms=int(self._idle_timeout_s * 1000)))
                    break
                conn.last_active = clock()
                if not first_bytes:
                    first_bytes = data[:3]
                decoder.feed(data)
            return not conn.evicted and conn.stop_reason is None  # shutdown: finish what it holds
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            pass
        except CloseConnection as e:
            log.warning("closing connection", extra=fields(peer=peer, reason=str(e)))
        except FrameError as e:
            hint = ""
            if not is_tls and first_bytes[:2] == b"\x16\x03":
                hint = (f"the bytes are a TLS handshake: a client configured for SSL connected to listener "
                        f"{conn.listener}, which is {conn.session.security_protocol}")
            log.warning("closing connection",
                        extra=fields(peer=peer, reason=str(e), **({"hint": hint} if hint else {})))
        except Exception:
            log.exception("closing connection after an unexpected error", extra=fields(peer=peer))
        finally:
            conn.receive_scope = None
            self.pool.release(reserved)
        return False

    async def _finish_parked(self, stream_: ByteStream, conn: Connection, order: ResponseOrder, slot: Slot,
                             parked: Parked[Response | None]) -> None:
        """Wait out a parked request's acknowledgement, then write whatever responses are ready in order."""
        try:
            try:
                response = await parked.finish()
            except CloseConnection as e:
                order.fail(slot, str(e))
            else:
                order.complete(slot, response)
            await self._write_ready(stream_, conn, order)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            self._stop_reading(conn, "the connection broke")
        except Exception:  # never out of this task: it would end the connection's task group untidily
            log.exception("closing connection after an unexpected error", extra=fields(peer=conn.peer))
            self._stop_reading(conn, "unexpected error")
        finally:
            self._progressed(conn)

    def _settled(self, stream_: ByteStream, conn: Connection, order: ResponseOrder, slot: Slot, tasks: TaskGroup,
                 response: bytes | ResponseParts | None, error: BaseException | None) -> None:
        """``_finish_parked`` for a request settled by a callback (``Parked.settle``): complete its slot and
        write what is ready, in this pass of the event loop where the socket takes it at once."""
        try:
            if error is None:
                order.complete(slot, response)
            else:  # CloseConnection: close once the responses before it are written
                order.fail(slot, str(error))
            self._write_ready_now(stream_, conn, order, tasks)
        except Exception:  # never out of the callback: the fsync's other requests still need their answers
            log.exception("closing connection after an unexpected error", extra=fields(peer=conn.peer))
            self._stop_reading(conn, "unexpected error")
        finally:
            self._progressed(conn)

    def _write_ready_now(self, stream_: ByteStream, conn: Connection, order: ResponseOrder, tasks: TaskGroup) -> None:
        """``_write_ready`` without waiting: responses the socket takes whole go out now; the first one that
        must wait (a file range, a socket buffer not drained, a transport anyio has to write) and those
        after it are left to a task."""
        while (slot := order.take()) is not None:
            response = slot.response
            if slot.close_reason is None and isinstance(response, bytes):
                written = write_now(stream_, response)
                if written is not True:  # None: nothing written yet; False: written, the buffer to drain
                    tasks.start_soon(self._write_taken, stream_, conn, order, slot, written is False)
                    return
            elif slot.close_reason is None and response is not None:  # fetched records left in their files
                tasks.start_soon(self._write_taken, stream_, conn, order, slot, False)
                return
            self._written(order, slot)
            if slot.close_reason is not None:  # every response before it is written
                log.warning("closing connection", extra=fields(peer=conn.peer, reason=slot.close_reason))
                self._stop_reading(conn, slot.close_reason)
                return

    async def _write_taken(self, stream_: ByteStream, conn: Connection, order: ResponseOrder, slot: Slot,
                           drain_only: bool) -> None:
        """Finish writing a slot ``_write_ready_now`` took (``drain_only``: its bytes are in the transport's
        buffer already, wait for it to drain), then whatever is ready after it."""
        try:
            try:
                if slot.response is not None:
                    if drain_only:
                        await stream_.send(b"")
                    else:
                        await transmit(stream_, slot.response, conn.peer)
            finally:
                self._written(order, slot)
            await self._write_ready(stream_, conn, order)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError):
            self._stop_reading(conn, "the connection broke")
        except Exception:
            log.exception("closing connection after an unexpected error", extra=fields(peer=conn.peer))
            self._stop_reading(conn, "unexpected error")
        finally:
            self._progressed(conn)

    async def _write_ready(self, stream_: ByteStream, conn: Connection, order: ResponseOrder) -> None:
        """Write the responses at the head of ``order`` that are ready, unless another task is writing
        (that task writes them after its own).  A close entry ends the connection instead."""
        while (slot := order.take()) is not None:
            try:
                if slot.close_reason is not None:  # every response before it is written
                    log.warning("closing connection", extra=fields(peer=conn.peer, reason=slot.close_reason))
                    self._stop_reading(conn, slot.close_reason)
                    return
                if slot.response is not None:
                    await transmit(stream_, slot.response, conn.peer)
            finally:
                self._written(order, slot)

    async def _drain(self, conn: Connection, order: ResponseOrder) -> None:
        """Before closing (shutdown, a close queued behind parked requests): wait until what the connection
        holds is answered.  Parked produces end by their own timeouts, or at once when the broker stops."""
        while not order.idle and conn.stop_reason is None and not conn.evicted:
            if await self._await_progress(conn):
                break

    async def _await_progress(self, conn: Connection) -> bool:
        """Wait until a parked request completes; True if shutdown, eviction or a close cut it short."""
        with anyio.CancelScope() as scope:
            conn.receive_scope = scope
            await conn.progress.wait()
        conn.receive_scope = None
        return scope.cancelled_caught

    def _written(self, order: ResponseOrder, slot: Slot) -> None:
        """The slot ``order.take`` gave is written (or its write failed): the next may go, its bytes are free."""
        order.written()
        self.pool.release(slot.reserved)
        slot.reserved = 0

    @staticmethod
    def _progressed(conn: Connection) -> None:
        """A parked request completed: wake the reader if it waits for that (``_await_progress``)."""
        progress = conn.progress
        if progress.statistics().tasks_waiting:  # else nobody to wake: keep the event, unset
            progress.set()
            conn.progress = anyio.Event()

    @staticmethod
    def _stop_reading(conn: Connection, reason: str) -> None:
        """A task other than the reader ends the connection: the reader stops at its next step."""
        if conn.stop_reason is None:
            conn.stop_reason = reason
        if conn.receive_scope is not None:
            conn.receive_scope.cancel()

    async def _stay_muted(self, conn: Connection) -> None:
        """Wait out a connection's throttle time; shutdown and eviction end the wait early."""
        with anyio.CancelScope(deadline=conn.session.muted_until) as scope:
            conn.receive_scope = scope
            await anyio.sleep_forever()
        conn.receive_scope = None
        conn.session.muted_until = 0.0

    async def _tls_handshake(self, stream: PlainStream, conn: Connection, tls: ListenerTls) -> TLSStream | None:
        """Wrap a connection in TLS; None (after one log line) when the handshake fails or times out.

        On SSL listeners the client certificate (mTLS) gives the principal, mapped by
        ssl.principal.mapping.rules; without one it is User:ANONYMOUS, as in Kafka.
        """
        reason = "timed out"
        with anyio.move_on_after(TLS_HANDSHAKE_TIMEOUT_S):
            try:
                wrapped = await TLSStream.wrap(stream, server_side=True, ssl_context=tls.context,
                                               standard_compatible=False)
            except (anyio.BrokenResourceError, anyio.EndOfStream, ssl.SSLError, OSError) as e:
                cause = e.__cause__ or e.__context__ or e
                reason = getattr(cause, "reason", None) or str(cause) or type(cause).__name__
            else:
                cert = wrapped.extra(TLSAttribute.peer_certificate, None)
                if conn.session.security_protocol == "SSL":
                    try:
                        conn.session.principal = tls.principal(cert)
                    except MappingError as e:
                        log.warning("closing connection: no principal for the client certificate",
                                    extra=fields(peer=conn.peer, listener=conn.listener, reason=str(e)))
                        return None
                    if cert:
                        log.info("authenticated", extra=fields(peer=conn.peer, listener=conn.listener,
                                                               principal=str(conn.session.principal)))
                return wrapped
        log.warning("closing connection: TLS handshake failed",
                    extra=fields(peer=conn.peer, listener=conn.listener, reason=str(reason)))
        return None

    async def _reserve(self, conn: Connection, size: int, stream: PlainStream) -> float | None:
        """Reserve a frame's bytes from the pool; the seconds spent waiting, or None if interrupted."""
        if self.pool.try_reserve(size):
            return 0.0
        stream.pause_reading()  # the rest of the frame stays in the kernel until memory frees up
        started = anyio.current_time()
        self._log_pool.log(
            started, logging.WARNING,
            "request memory exhausted (queued.max.request.bytes): not reading from the peer until memory frees up",
            peer=conn.peer, queued_max_request_bytes=self.pool.size, available_bytes=self.pool.available,
            waiting_connections=self.pool.waiting + 1,
        )
        with anyio.CancelScope() as scope:
            conn.receive_scope = scope
            await self.pool.reserve(size)
        conn.receive_scope = None
        if scope.cancelled_caught:
            return None
        return anyio.current_time() - started


def _authentication_failed(session: Session) -> bool:
    """The connection's SASL authentication (or re-authentication) failed in the request just handled."""
    auth = session.authenticator
    return auth is not None and auth.state is SaslState.FAILED


async def _drain_tls(stream: Any, data: bytes) -> bytes:
    """More of what TLS has already received: one TLS receive gives at most one record (16 KiB), so a
    large request would otherwise take a loop turn (and a pause and resume of the socket) per record.
    Takes only bytes already read from the socket (decrypted or still in the read buffer): never waits."""
    ssl_object = getattr(stream, "_ssl_object", None)
    read_bio = getattr(stream, "_read_bio", None)
    if ssl_object is None or read_bio is None:
        return data
    parts = [data]
    size = len(data)
    for _ in range(1024):  # bounded: at most RECEIVE_SIZE bytes, and each turn takes a record
        if size >= RECEIVE_SIZE or not (ssl_object.pending() or read_bio.pending):
            break
        more = await stream.receive(RECEIVE_SIZE - size)
        if not more:
            break
        parts.append(more)
        size += len(more)
    return b"".join(parts) if len(parts) > 1 else data


def _clock() -> Callable[[], float]:
    """``anyio.current_time`` without its per-call backend lookup: on asyncio it is the loop's clock."""
    try:
        return asyncio.get_running_loop().time
    except RuntimeError:  # another anyio backend
        return anyio.current_time


def raise_nofile_limit() -> None:
    """Raise the soft RLIMIT_NOFILE to the hard limit: every connection and log segment is a descriptor,
    and distributions start services with a soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or (hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft > hard):
        log.info("file descriptor limit (nofile) %(soft_limit)s",
                 {"soft_limit": 'unlimited' if soft == resource.RLIM_INFINITY else soft})
        return
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as e:
        log.warning("could not raise the file descriptor limit (nofile) from %(soft_limit)d to %(target)d: %(error)s",
                    {"soft_limit": soft, "target": target, "error": e})
        return
    log.info("raised the file descriptor limit (nofile) from %(soft_limit)d to %(target)d",
             {"soft_limit": soft, "target": target})
