"""The socket edge reads on behind parked requests: up to pykbroker.max.inflight.flush.requests.per.connection
while they wait only for this broker's fsync, up to pykbroker.max.inflight.requests.per.connection once one
waits for the ISR.  A real SocketServer on 127.0.0.1 with a handler that parks every request until released,
so what is bounded is the edge's reading, not a disk's speed."""

from __future__ import annotations

import struct

import anyio
import anyio.abc
import pytest

from pykbroker.security.session import Session
from pykbroker.server.network import Response, SocketServer
from pykbroker.server.parked import Parked

pytestmark = pytest.mark.anyio

SENT = 40


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
