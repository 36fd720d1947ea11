"""pykbroker.server.transmit: response parts (assembly, lengths) and sending them over a real
127.0.0.1 socket, with sendfile on a plain socket and the read fallback, and a stale range closing
the connection instead of sending a frame of the wrong length."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from pykbroker.protocol import fast_codec
from pykbroker.protocol.file_range import FileRange, SegmentFile
from pykbroker.server.plain_stream import PlainStream, accept
from pykbroker.server.transmit import ResponseParts, frame, transmit

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[pytest.param(("asyncio", {}), id="asyncio"),
                        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
def anyio_backend(request: Any) -> Any:
    return request.param


async def _accept(listener: Any) -> PlainStream:
    """The server end of a connection as the broker accepts it (pykbroker.server.plain_stream)."""
    return await accept(listener.extra(anyio.abc.SocketAttribute.raw_socket), 1 << 18)


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[SegmentFile, bytes]:
    data = random.Random(5).randbytes(600_000)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    return SegmentFile(os.open(path, os.O_RDWR), path.name), data


def test_bytes_only_parts_make_plain_bytes() -> None:
    out = frame([b"ab", b"", b"cd"])
    assert out == b"abcd" and isinstance(out, bytes)


def test_parts_join_adjacent_bytes_and_keep_ranges(data_file: tuple[SegmentFile, bytes]) -> None:
    f, data = data_file
    r1, r2 = FileRange(f, 0, 100_000), FileRange(f, 200_000, 70_000)
    out = frame([b"\x00\x01", b"xy", r1, b"", r2, b"z", b"w"])
    assert isinstance(out, ResponseParts)
    assert [type(p).__name__ for p in out.parts] == ["bytes", "FileRange", "FileRange", "bytes"]
    assert out.parts[0] == b"\x00\x01xy" and out.parts[3] == b"zw"
    assert len(out) == 4 + 100_000 + 70_000 + 2
    assert out.materialise() == b"\x00\x01xy" + data[:100_000] + data[200_000:270_000] + b"zw"
    assert out.ranges == [r1, r2]


def test_fetch_encoder_writes_the_range_length_before_the_range(data_file: tuple[SegmentFile, bytes]) -> None:
    f, _data = data_file
    rng = FileRange(f, 1000, 80_000)
    body = {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [{
        "topic": "t", "topic_id": None, "partitions": [{
            "partition_index": 0, "error_code": 0, "high_watermark": 5, "last_stable_offset": 5,
            "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1,
            "records": rng}]}]}
    for version in (4, 11, 12, 16):
        parts = fast_codec.fetch_response_parts(version, body)
        assert parts is not None and rng in parts
        i = parts.index(rng)
        joined = b"".join(p for p in parts[:i] if isinstance(p, bytes))
        if version >= 12:
            assert joined.endswith(bytes([0x81, 0xF1, 0x04]))  # uvarint(80_001)
        else:
            assert struct.unpack(">i", joined[-4:])[0] == 80_000
        # The same bytes as the encoder's answer with the records read in.
        assert fast_codec.encode_fetch_response(version, body) == \
            b"".join(p.read() if isinstance(p, FileRange) else p for p in parts)


async def _pair(serve: Callable[[PlainStream], Awaitable[None]]) -> bytes:
    """Run ``serve`` on the server end of a real 127.0.0.1 connection; what the client read until EOF."""
    got = bytearray()
    multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    listener = multi.listeners[0]
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        async def server() -> None:
            stream = await _accept(listener)
            async with stream:
                try:
                    await serve(stream)
                except anyio.BrokenResourceError:
                    pass

        tg.start_soon(server)
        with anyio.fail_after(20):
            async with await anyio.connect_tcp("127.0.0.1", port) as client:
                for _ in range(100_000):
                    try:
                        chunk = await client.receive(1 << 20)
                    except anyio.EndOfStream:
                        break
                    got += chunk
    return bytes(got)


async def test_zero_copy_send_uses_sendfile(data_file: tuple[SegmentFile, bytes],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    f, data = data_file
    calls: list[int] = []
    real = os.sendfile

    def counting(*args: Any) -> int:
        calls.append(args[3])
        return real(*args)

    monkeypatch.setattr(os, "sendfile", counting)
    parts = frame([b"head", FileRange(f, 10, 300_000), b"mid", FileRange(f, 400_000, 150_000), b"tail"])
    assert isinstance(parts, ResponseParts)

    async def serve(stream: PlainStream) -> None:
        await transmit(stream, parts)
        await transmit(stream, b"after")

    got = await _pair(serve)
    assert got == b"head" + data[10:300_010] + b"mid" + data[400_000:550_000] + b"tail" + b"after"
    assert calls  # the ranges went through sendfile


async def test_fallback_without_sendfile(data_file: tuple[SegmentFile, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    f, data = data_file
    monkeypatch.delattr(os, "sendfile")
    parts = frame([b"h", FileRange(f, 0, 100_000), b"t"])
    assert isinstance(parts, ResponseParts)

    async def serve(stream: PlainStream) -> None:
        await transmit(stream, parts)

    assert await _pair(serve) == b"h" + data[:100_000] + b"t"


async def test_short_file_closes_instead_of_sending(data_file: tuple[SegmentFile, bytes]) -> None:
    f, _data = data_file
    parts = frame([b"head", FileRange(f, 500_000, 100_000), b"tail"])  # the file will end 50,000 bytes short of it
    assert isinstance(parts, ResponseParts)
    os.ftruncate(f.fd, 550_000)  # behind the segment's back: only the send can notice
    errors: list[BaseException] = []

    async def serve(stream: PlainStream) -> None:
        try:
            await transmit(stream, parts, "test-peer")
        except anyio.BrokenResourceError as e:
            errors.append(e)

    got = await _pair(serve)
    assert errors
    assert len(got) < 4 + 100_000 + 4  # never the whole announced frame


async def test_truncated_range_sends_nothing(data_file: tuple[SegmentFile, bytes]) -> None:
    f, _ = data_file
    parts = frame([b"head", FileRange(f, 0, 100_000)])
    assert isinstance(parts, ResponseParts)
    f.truncated(50_000)
    errors: list[BaseException] = []

    async def serve(stream: PlainStream) -> None:
        try:
            await transmit(stream, parts, "test-peer")
        except anyio.BrokenResourceError as e:
            errors.append(e)

    assert await _pair(serve) == b""
    assert errors


async def _slow_pair(serve: Callable[[PlainStream], Awaitable[None]], *, pause_s: float = 0.0,
                     sndbuf: int | None = 8192) -> bytes:
    """As ``_pair``, with a small server send buffer and a client that waits ``pause_s`` before reading
    and then reads in small pieces, so the sender meets a full socket many times."""
    got = bytearray()
    multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    listener = multi.listeners[0]
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        async def server() -> None:
            stream = await _accept(listener)
            async with stream:
                if sndbuf is not None:
                    stream.extra(anyio.abc.SocketAttribute.raw_socket).setsockopt(socket.SOL_SOCKET,
                                                                                  socket.SO_SNDBUF, sndbuf)
                await serve(stream)

        tg.start_soon(server)
        with anyio.fail_after(30):
            async with await anyio.connect_tcp("127.0.0.1", port) as client:
                await anyio.sleep(pause_s)
                for i in range(1_000_000):
                    try:
                        chunk = await client.receive(4096)
                    except anyio.EndOfStream:
                        break
                    got += chunk
                    if i % 64 == 0:
                        await anyio.sleep(0.001)
    return bytes(got)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # counts calls to asyncio's own loop.add_writer
async def test_a_large_response_watches_the_socket_once(data_file: tuple[SegmentFile, bytes],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fetch response larger than the send buffer waits for the socket several times: the descriptor
    is registered with the event loop once for the whole response, and with a buffer that holds whole
    segments the cork is not pushed at each wait (it was two setsockopt calls a wait)."""
    f, data = data_file
    loop = asyncio.get_running_loop()
    adds: list[int] = []
    real_add = loop.add_writer

    def counting_add(fd: int, callback: Any, *args: Any) -> None:
        adds.append(fd)
        real_add(fd, callback, *args)

    monkeypatch.setattr(loop, "add_writer", counting_add)
    cork_calls: list[int] = []
    real_setsockopt = socket.socket.setsockopt

    def counting_setsockopt(self: socket.socket, level: int, opt: int, *value: Any) -> None:
        if level == socket.IPPROTO_TCP and opt == socket.TCP_CORK:
            cork_calls.append(value[0])
        real_setsockopt(self, level, opt, *value)

    monkeypatch.setattr(socket.socket, "setsockopt", counting_setsockopt)
    sends: list[int] = []
    real_sendfile = os.sendfile

    def counting_sendfile(*args: Any) -> int:
        n = real_sendfile(*args)
        sends.append(n)
        return n

    monkeypatch.setattr(os, "sendfile", counting_sendfile)
    response = frame([b"head", FileRange(f, 0, len(data)), b"tail"])
    assert isinstance(response, ResponseParts)

    async def serve(stream: PlainStream) -> None:
        stream.extra(anyio.abc.SocketAttribute.raw_socket).setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 150_000)
        await transmit(stream, response)

    got = await _slow_pair(serve, pause_s=0.05, sndbuf=None)
    assert got == b"head" + data + b"tail"
    assert len(sends) >= 2  # the socket was full at least once
    assert len(adds) == 1
    assert cork_calls == [1, 0]  # on for the response, off after it: no pushes in between


async def test_many_small_ranges_arrive_in_order(data_file: tuple[SegmentFile, bytes],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer of thousands of partitions gets thousands of short ranges between short headers:
    each goes out with its own sendfile call, in order, however often the socket is full."""
    f, data = data_file
    rnd = random.Random(7)
    parts: list[Any] = []
    expected = bytearray()
    for i in range(3_000):
        head = struct.pack(">i", i)
        position, length = rnd.randrange(0, 590_000), rnd.randrange(1, 5_000)
        parts += [head, FileRange(f, position, length)]
        expected += head + data[position:position + length]
    calls: list[int] = []
    real = os.sendfile

    def counting(*args: Any) -> int:
        calls.append(args[3])
        return real(*args)

    monkeypatch.setattr(os, "sendfile", counting)
    response = frame(parts)
    assert isinstance(response, ResponseParts)

    async def serve(stream: PlainStream) -> None:
        await transmit(stream, response)
        await transmit(stream, b"after")

    assert await _slow_pair(serve) == bytes(expected) + b"after"
    assert len(calls) >= 3_000


async def test_bytes_queued_in_the_transport_leave_before_the_ranges(data_file: tuple[SegmentFile, bytes]) -> None:
    """A response written through the transport may still sit in its buffer when the next one, with
    ranges, is sent past it: the ranges wait until that buffer is empty."""
    f, data = data_file
    big = random.Random(3).randbytes(3_000_000)
    response = frame([b"head", FileRange(f, 0, 200_000), b"tail"])
    assert isinstance(response, ResponseParts)
    queued: list[int] = []

    async def serve(stream: PlainStream) -> None:
        transport = stream.transport
        transport.write(big)  # as a response the edge wrote without waiting for it to drain
        queued.append(transport.get_write_buffer_size())
        await transmit(stream, response)

    got = await _slow_pair(serve, pause_s=0.2)
    assert got == big + b"head" + data[:200_000] + b"tail"
    assert queued and queued[0] > 0  # the case under test happened: bytes were still queued


async def test_sendfile_refused_sends_the_bytes(data_file: tuple[SegmentFile, bytes],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    f, data = data_file

    def refused(*args: Any) -> int:
        raise OSError(errno.EINVAL, "sendfile not supported here")

    monkeypatch.setattr(os, "sendfile", refused)
    response = frame([b"h", FileRange(f, 5, 100_000), b"m", FileRange(f, 200_000, 30_000), b"t"])
    assert isinstance(response, ResponseParts)

    async def serve(stream: PlainStream) -> None:
        await transmit(stream, response)

    assert await _pair(serve) == b"h" + data[5:100_005] + b"m" + data[200_000:230_000] + b"t"


async def test_plain_bytes_leave_without_anyio_send_and_large_ones_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes responses go straight to the transport; one larger than the socket buffers still arrives
    whole and in order after later ones, because transmit waits for the transport to drain."""
    sends: list[int] = []
    big = random.Random(7).randbytes(8 << 20)  # far more than loopback socket buffers take at once

    async def serve(stream: PlainStream) -> None:
        original = stream.send

        async def counting_send(item: bytes) -> None:
            sends.append(len(item))
            await original(item)

        monkeypatch.setattr(stream, "send", counting_send)
        await transmit(stream, b"small-1")
        assert sends == []  # written straight to the transport
        await transmit(stream, big)
        transport = stream.transport
        assert transport.get_write_buffer_size() == 0  # drained before transmit returned
        await transmit(stream, b"small-2")

    got = await _pair(serve)
    assert got == b"small-1" + big + b"small-2"
    assert sends and all(n == 0 for n in sends)  # only the drain wait (send(b"")) went through anyio
