"""The socket edge reads on behind parked requests: up to pykbroker.max.inflight.flush.requests.per.connection
while they wait only for this broker's fsync, up to pykbroker.max.inflight.requests.per.connection once one
waits for the ISR.  A real SocketServer on 127.0.0.1 with a handler that parks every request until released,
so what is bounded is the edge's reading, not a disk's speed."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import anyio
import anyio.abc
import pytest

from pykbroker.protocol.framing import CloseConnection
from pykbroker.security.session import Session
from pykbroker.server.network import Response, SocketServer
from pykbroker.server.parked import Parked, Settled

pytestmark = pytest.mark.anyio

SENT = 40


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio"),
                        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
def anyio_backend(request: Any) -> Any:
    """The edge on asyncio's own loop and on uvloop (pykbroker.event.loop)."""
    return request.param


def _frame(cid: int) -> bytes:
    payload = struct.pack(">hhi", 0, 9, cid) + b"\x00\x00"  # produce v9 header shape; the handler only counts
    return struct.pack(">i", len(payload)) + payload


async def _read_responses(stream: anyio.abc.ByteStream, n: int) -> list[int]:
    buf = bytearray()
    cids: list[int] = []
    with anyio.fail_after(10):
        for _ in range(10_000):
            while len(buf) >= 8 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                size = struct.unpack_from(">i", buf)[0]
                cids.append(struct.unpack_from(">i", buf, 4)[0])
                del buf[: 4 + size]
            if len(cids) >= n:
                return cids
            buf += await stream.receive()
    raise AssertionError(f"only {len(cids)} of {n} responses")


async def _processed_while_parked(replicated_from: int | None, local_bound: int | None) -> tuple[int, list[int]]:
    """Send SENT requests at once; every one parks until released (those from ``replicated_from`` on wait
    for replicas).  How many the server processed before the first answer, and the answers' order."""
    seen: list[int] = []
    release = anyio.Event()

    async def handler(frame: bytes, session: Session) -> Parked[Response | None]:
        cid = struct.unpack_from(">i", frame, 4)[0]
        seen.append(cid)

        async def finish() -> Response | None:
            await release.wait()
            return struct.pack(">ii", 4, cid)

        replicated = replicated_from is not None and len(seen) > replicated_from
        return Parked(finish, replicated=replicated)

    server = SocketServer(handler, max_request_bytes=1 << 20, idle_timeout_ms=-1, max_inflight_requests=5,
                          max_inflight_bytes=4 << 20, max_inflight_local_requests=local_bound)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve_listener, listener, "PLAINTEXT", tg)
        async with await anyio.connect_tcp("127.0.0.1", port) as client:
            await client.send(b"".join(_frame(i) for i in range(SENT)))
            last, steady = -1, 0
            with anyio.fail_after(10):
                while steady < 20:  # the count stayed put for 20 x 10 ms: the server stopped reading
                    await anyio.sleep(0.01)
                    steady = steady + 1 if len(seen) == last else 0
                    last = len(seen)
            processed = len(seen)
            release.set()
            order = await _read_responses(client, SENT)
        tg.cancel_scope.cancel()
    return processed, order


async def test_requests_waiting_only_for_an_fsync_read_on_to_the_local_bound() -> None:
    processed, order = await _processed_while_parked(None, 32)
    assert processed == 32
    assert order == list(range(SENT))


async def test_a_request_waiting_for_replicas_brings_back_the_replication_bound() -> None:
    processed, order = await _processed_while_parked(None, None)  # no local bound given: the one bound (TLS)
    assert processed == 5
    assert order == list(range(SENT))
    processed, order = await _processed_while_parked(2, 32)  # the third request on wait for the ISR
    assert processed == 5
    assert order == list(range(SENT))


async def _serve_one(handler: object, body: object) -> object:
    """Run ``body(client)`` against a SocketServer with ``handler`` on a free 127.0.0.1 port."""
    server = SocketServer(handler, max_request_bytes=1 << 20, idle_timeout_ms=-1, max_inflight_requests=5,  # type: ignore[arg-type]
                          max_inflight_bytes=4 << 20, max_inflight_local_requests=32)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve_listener, listener, "PLAINTEXT", tg)
        async with await anyio.connect_tcp("127.0.0.1", port) as client:
            result = await body(client)  # type: ignore[operator]
        tg.cancel_scope.cancel()
    return result


async def _until(condition: object) -> None:
    with anyio.fail_after(10):
        for _ in range(1000):
            if condition():  # type: ignore[operator]
                return
            await anyio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_requests_settled_by_a_callback_are_answered_in_order_and_without_a_task() -> None:
    """Even requests settle through ``Parked.settle`` (as a produce waiting only for its fsync does), odd ones
    through a task; the callbacks run in reverse order before any task finishes, yet the answers keep the
    request order, and no settled request's ``finish`` ever ran."""
    n = 10
    by_task: list[int] = []
    callbacks: list[tuple[int, Settled[Response | None]]] = []
    release = anyio.Event()

    async def handler(frame: bytes, session: Session) -> Parked[Response | None]:
        cid = struct.unpack_from(">i", frame, 4)[0]

        async def finish() -> Response | None:
            by_task.append(cid)
            await release.wait()
            return struct.pack(">ii", 4, cid)

        if cid % 2:
            return Parked(finish, replicated=False)
        return Parked(finish, replicated=False, settle=lambda done: callbacks.append((cid, done)))

    async def body(client: anyio.abc.ByteStream) -> list[int]:
        await client.send(b"".join(_frame(i) for i in range(n)))
        await _until(lambda: len(callbacks) == n // 2 and len(by_task) == n // 2)
        for cid, done in reversed(callbacks):
            done(struct.pack(">ii", 4, cid), None)
        await anyio.sleep(0.05)
        release.set()
        return await _read_responses(client, n)

    order = await _serve_one(handler, body)
    assert order == list(range(n))
    assert sorted(by_task) == [i for i in range(n) if i % 2]


async def test_a_settled_close_answers_the_requests_before_it_then_closes() -> None:
    """A callback that settles with CloseConnection (fault injection, an internal error): the responses of
    the requests before it go out, then the connection closes."""
    async def handler(frame: bytes, session: Session) -> Parked[Response | None]:
        cid = struct.unpack_from(">i", frame, 4)[0]

        def settle(done: Settled[Response | None]) -> None:
            if cid == 3:
                asyncio.get_running_loop().call_later(0.05, done, None, CloseConnection("fault injection"))
            else:
                asyncio.get_running_loop().call_soon(done, struct.pack(">ii", 4, cid), None)

        async def finish() -> Response | None:
            raise AssertionError("a settled request has no task")

        return Parked(finish, replicated=False, settle=settle)

    async def body(client: anyio.abc.ByteStream) -> tuple[list[int], bytes]:
        await client.send(b"".join(_frame(i) for i in range(6)))
        answered = await _read_responses(client, 3)
        rest = b""
        with anyio.fail_after(10):
            for _ in range(100):
                try:
                    rest += await client.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
        return answered, rest

    answered, rest = await _serve_one(handler, body)  # type: ignore[misc]
    assert answered == [0, 1, 2]
    assert rest == b""  # nothing after the close: not the answers of 4 and 5
