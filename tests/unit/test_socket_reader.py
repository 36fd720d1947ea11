"""pykbroker.server.socket_reader.PlainReader over real 127.0.0.1 sockets: reading stays on between
receives, what waits unread is bounded (the socket is paused past ``high``), and the end of the
stream raises what anyio raises."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import pytest

from pykbroker.server.socket_reader import PlainReader

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _connected() -> tuple[Any, socket.socket, Any]:
    multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    listener = multi.listeners[0]
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    client = socket.create_connection(("127.0.0.1", port))
    client.setblocking(False)
    with anyio.fail_after(10):
        server = await listener.accept()
    return listener, client, server


async def _until(predicate: Any, seconds: float = 10.0) -> None:
    with anyio.fail_after(seconds):
        while not predicate():
            await anyio.sleep(0.01)


async def test_receives_stay_readable_and_return_what_arrived() -> None:
    listener, client, server = await _connected()
    async with listener, server:
        reader = PlainReader.attach(server, high=1 << 16)
        assert reader is not None
        transport: Any = getattr(server, "_transport")  # noqa: B009
        got = b""
        for i in range(20):
            client.send(b"request-%d;" % i)
            with anyio.fail_after(10):
                while not got.endswith(b"request-%d;" % i):
                    got += await reader.receive(1 << 16)
            assert transport.is_reading()  # no pause after a receive: no epoll_ctl pair per request
        assert got == b"".join(b"request-%d;" % i for i in range(20))
        client.close()
        with anyio.fail_after(10), pytest.raises(anyio.EndOfStream):
            await reader.receive(1 << 16)


async def test_unread_bytes_are_bounded_then_all_arrive_in_order() -> None:
    listener, client, server = await _connected()
    high = 4096
    payload = bytes(range(256)) * 4096  # 1 MiB: more than the bound plus the kernel buffers
    async with listener, server:
        reader = PlainReader.attach(server, high=high)
        assert reader is not None
        transport: Any = getattr(server, "_transport")  # noqa: B009
        protocol: Any = getattr(server, "_protocol")  # noqa: B009
        sent = 0

        def pump() -> None:
            nonlocal sent
            try:
                while sent < len(payload):
                    sent += client.send(payload[sent:sent + 65536])
            except BlockingIOError:
                pass

        pump()
        await _until(lambda: not transport.is_reading())  # paused once `high` bytes wait
        await anyio.sleep(0.1)
        queued = sum(len(c) for c in protocol.read_queue)
        assert high <= queued < high + 256 * 1024  # at most one more read past the bound
        got = bytearray()
        with anyio.fail_after(30):
            while len(got) < len(payload):
                pump()
                got += await reader.receive(1 << 16)
        assert bytes(got) == payload
        client.close()


async def test_not_attached_to_non_socket_streams() -> None:
    send, receive = anyio.create_memory_object_stream[bytes](1)
    async with send, receive:
        assert PlainReader.attach(receive, high=1024) is None
