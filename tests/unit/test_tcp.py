"""The HTTP services' listening sockets: every accepted connection has Nagle's algorithm off."""

from __future__ import annotations

import asyncio
import socket

import pytest

from pykbroker import tcp


def test_accepted_connections_have_nagle_off() -> None:
    """asyncio sets TCP_NODELAY only on sockets whose protocol says TCP; the listener must say so, or each
    keep-alive response written as headers then body waits for the client's delayed acknowledgement."""
    accepted: list[int] = []

    async def main() -> None:
        sock = tcp.listen("127.0.0.1", 0, "test")
        got = asyncio.Event()

        def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
            got.set()

        server = await asyncio.start_server(connected, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            await asyncio.wait_for(got.wait(), 10)
            writer.close()

    asyncio.run(main())
    assert accepted == [1]


def test_a_taken_port_names_the_setting() -> None:
    with tcp.listen("127.0.0.1", 0, "first") as taken, pytest.raises(OSError, match="cannot listen on my.setting"):
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        tcp.listen("127.0.0.1", taken.getsockname()[1], "my.setting")
