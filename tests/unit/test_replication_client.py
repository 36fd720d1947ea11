"""BrokerClient framing over a real loopback TCP connection: large responses arrive whole, byte for byte,
whatever the sender's write boundaries, and bytes read past one response are kept for the next."""

from __future__ import annotations

import os
import struct
from typing import Any

import anyio
import anyio.abc
import pytest
from kio.schema.errors import ErrorCode

from pykbroker.protocol import codec
from pykbroker.protocol.framing import BrokerConnectionError
from pykbroker.replication.client import RECEIVE_MAX, BrokerClient

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _fetch_response(cid: int, records: bytes) -> bytes:
    body = codec.encode_response(1, 12, {
        "throttle_time_ms": 0, "error_code": ErrorCode.none, "session_id": 0,
        "responses": [{"topic": "t", "partitions": [{
            "partition_index": 0, "error_code": ErrorCode.none, "high_watermark": 5, "last_stable_offset": 5,
            "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1, "records": records}]}],
    })
    payload = struct.pack(">i", cid) + b"\x00" + body  # response header v1: correlation id, no tagged fields
    return struct.pack(">i", len(payload)) + payload


async def _read_request(stream: anyio.abc.ByteStream, buf: bytearray) -> None:
    for _ in range(10_000):
        if len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
            del buf[: 4 + struct.unpack_from(">i", buf)[0]]
            return
        buf += await stream.receive()
    raise AssertionError("no whole request")


def _request_body() -> dict[str, Any]:
    return {"replica_id": 2, "max_wait": __import__("datetime").timedelta(milliseconds=10), "min_bytes": 1,
            "max_bytes": 1 << 24, "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [],
            "forgotten_topics_data": [], "rack_id": ""}


async def test_large_responses_split_and_joined_arrive_whole() -> None:
    big, small = os.urandom(3 * 1024 * 1024 + 17), os.urandom(1000)
    first, second = _fetch_response(1, big), _fetch_response(2, small)

    async def serve(stream: anyio.abc.SocketStream) -> None:
        buf = bytearray()
        async with stream:
            await _read_request(stream, buf)
            await stream.send(first[:3])  # cut inside the size prefix
            await anyio.sleep(0.05)
            await stream.send(first[3:100_001])
            await anyio.sleep(0.05)
            await stream.send(first[100_001:] + second)  # the next response rides on the same write
            await _read_request(stream, buf)
            await anyio.sleep(0.5)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    client = BrokerClient("127.0.0.1", port, client_id="broker-2-fetcher", timeout_s=10)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        try:
            with anyio.fail_after(20):
                r1 = await client.request(1, 12, _request_body())
                r2 = await client.request(1, 12, _request_body())
        finally:
            await client.close()
            tg.cancel_scope.cancel()
    assert r1.responses[0].partitions[0].records == big
    assert r2.responses[0].partitions[0].records == small


async def test_receives_take_what_the_transport_has() -> None:
    """The stream is asked for RECEIVE_MAX bytes, so a transport read is never split and re-queued."""
    seen: list[int] = []

    class _Stream:
        def __init__(self, data: bytes) -> None:
            self.data = data

        async def receive(self, max_bytes: int = 65536) -> bytes:
            seen.append(max_bytes)
            out, self.data = self.data[:300_000], self.data[300_000:]
            return out

    client = BrokerClient("127.0.0.1", 1, client_id="c", timeout_s=1)
    payload = os.urandom(1_000_000)
    client._stream = _Stream(struct.pack(">i", len(payload)) + payload + b"\x00\x00")  # type: ignore[assignment]
    assert await client._read_frame() == payload
    assert set(seen) == {RECEIVE_MAX} and len(seen) == 4
    assert bytes(client._buf) == b"\x00\x00"


async def test_bad_size_closes_the_connection() -> None:
    async def serve(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await _read_request(stream, bytearray())
            await stream.send(struct.pack(">i", -5) + b"xxxx")
            await anyio.sleep(0.5)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    client = BrokerClient("127.0.0.1", port, client_id="c", timeout_s=10)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        with anyio.fail_after(20), pytest.raises(BrokerConnectionError):
            await client.request(1, 12, _request_body())
        tg.cancel_scope.cancel()
    assert not client.connected
