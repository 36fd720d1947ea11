"""pykbroker.server.plain_stream over real 127.0.0.1 sockets, on asyncio's own loop and on uvloop: reading
stays on between receives, what waits unread is bounded (the socket is paused past ``high``), writes go
out without a loop pass and wait only when the kernel did not take them, and the end of the stream
raises what anyio raises."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import pytest

from pykbroker.server.plain_stream import PlainStream, accept

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio"),
                        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
def anyio_backend(request: Any) -> Any:
    return request.param


async def _connected(high: int = 1 << 16) -> tuple[Any, socket.socket, PlainStream]:
    multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    listener = multi.listeners[0]
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    client = socket.create_connection(("127.0.0.1", port))
    client.setblocking(False)
    with anyio.fail_after(10):
        server = await accept(listener.extra(anyio.abc.SocketAttribute.raw_socket), high)
    return listener, client, server


async def _until(predicate: Any, seconds: float = 10.0) -> None:
    with anyio.fail_after(seconds):
        while not predicate():
            await anyio.sleep(0.01)


async def test_receives_stay_readable_and_return_what_arrived() -> None:
    listener, client, server = await _connected()
    async with listener, server:
        assert server.extra(anyio.abc.SocketAttribute.remote_address) == client.getsockname()
        got = b""
        for i in range(20):
            client.send(b"request-%d;" % i)
            with anyio.fail_after(10):
                while not got.endswith(b"request-%d;" % i):
                    got += await server.receive(1 << 16)
            assert server.transport.is_reading()  # no pause after a receive: no epoll_ctl pair per request
        assert got == b"".join(b"request-%d;" % i for i in range(20))
        client.close()
        with anyio.fail_after(10), pytest.raises(anyio.EndOfStream):
            await server.receive(1 << 16)


async def test_unread_bytes_are_bounded_then_all_arrive_in_order() -> None:
    high = 4096
    listener, client, server = await _connected(high)
    payload = bytes(range(256)) * 4096  # 1 MiB: more than the bound plus the kernel buffers
    async with listener, server:
        sent = 0

        def pump() -> None:
            nonlocal sent
            try:
                while sent < len(payload):
                    sent += client.send(payload[sent:sent + 65536])
            except BlockingIOError:
                pass

        pump()
        await _until(lambda: not server.transport.is_reading())  # paused once `high` bytes wait
        await anyio.sleep(0.1)
        assert high <= server.protocol.queued < high + 256 * 1024  # at most one more read past the bound
        got = bytearray()
        with anyio.fail_after(30):
            while len(got) < len(payload):
                pump()
                got += await server.receive(1 << 16)
        assert bytes(got) == payload
        client.close()


async def test_receive_gives_at_most_max_bytes_and_keeps_the_rest_in_order() -> None:
    listener, client, server = await _connected()
    async with listener, server:
        client.send(b"0123456789" * 10)
        await _until(lambda: server.protocol.queued == 100)
        parts = [await server.receive(7) for _ in range(14)]
        assert all(len(p) == 7 for p in parts)
        assert b"".join(parts) + await server.receive(100) == b"0123456789" * 10
        assert server.protocol.queued == 0
        client.close()


async def test_writes_wait_only_when_the_kernel_did_not_take_them() -> None:
    listener, client, server = await _connected()
    async with listener, server:
        assert server.write_nowait(b"small") is True  # straight to the kernel, nothing buffered
        big = b"x" * (16 << 20)  # more than the kernel's buffers while the client reads nothing
        assert server.write_nowait(big) is False
        assert server.write_nowait(b"after") is None  # an earlier write still waits: use send()
        received = 0

        def read_some() -> None:
            nonlocal received
            try:
                while chunk := client.recv(1 << 20):
                    received += len(chunk)
            except BlockingIOError:
                pass

        async with anyio.create_task_group() as tg:
            done = anyio.Event()

            async def drain() -> None:
                await server.drain()
                done.set()

            tg.start_soon(drain)
            await anyio.sleep(0.1)
            assert not done.is_set()
            with anyio.fail_after(30):
                while not done.is_set():
                    read_some()
                    await anyio.sleep(0.001)
        assert server.write_nowait(b"end") is True
        with anyio.fail_after(10):
            while received < 5 + len(big) + 3:
                read_some()
                await anyio.sleep(0.001)
        assert received == 5 + len(big) + 3
        client.close()


async def test_a_drain_ends_with_the_connection() -> None:
    listener, client, server = await _connected()
    async with listener:
        assert server.write_nowait(b"x" * (16 << 20)) is False
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        client.close()  # a reset, with the response unread
        with anyio.fail_after(10), pytest.raises(anyio.BrokenResourceError):
            await server.drain()
        with pytest.raises(anyio.BrokenResourceError):
            await server.send(b"more")
        await server.aclose()


async def test_closed_stream_refuses_and_wakes_its_reader() -> None:
    listener, client, server = await _connected()
    async with listener:
        failure: list[BaseException] = []

        async def read() -> None:
            try:
                await server.receive()
            except BaseException as e:
                failure.append(e)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.sleep(0.05)
            await server.aclose()
        assert len(failure) == 1 and isinstance(failure[0], (anyio.ClosedResourceError, anyio.EndOfStream))
        with pytest.raises(anyio.ClosedResourceError):
            await server.receive()
        with pytest.raises(anyio.ClosedResourceError):
            await server.send(b"x")
        assert server.write_nowait(b"x") is None
        client.close()


async def test_cancelled_receive_leaves_the_stream_usable() -> None:
    listener, client, server = await _connected()
    async with listener, server:
        with anyio.move_on_after(0.05):
            await server.receive()
        client.send(b"after")
        with anyio.fail_after(10):
            assert await server.receive() == b"after"
        client.close()
