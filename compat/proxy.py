"""A recording TCP proxy: forwards bytes unchanged and notes (client id, API key, version) of each request.

When the suite starts pykbroker itself, the broker listens on one port and advertises the proxy's
port, so every connection any client makes (bootstrap, the leader, the group coordinator) passes
through here.  Each distinct (client_id, api_key, api_version) triple is appended to the record file
as a JSON line the first time it is seen.  tests/test_protocol_coverage.py compares the union of
those triples with what the broker advertises in ApiVersions.

With ``--trace FILE`` it also writes one JSON line per request and per response frame (connection
number, time, client id, API key and version, correlation id, size): the exact sequence on each
connection, e.g. to see what a group member last sent to its coordinator before it was expired.

Run: python -m compat.proxy --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT --record FILE [--trace FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import struct
import time
from pathlib import Path


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: set[tuple[str, int, int]] = set()
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the proxy

    def note(self, client_id: str, key: int, version: int) -> None:
        t = (client_id, key, version)
        if t not in self.seen:
            self.seen.add(t)
            self.file.write(json.dumps({"client_id": client_id, "api_key": key, "api_version": version}) + "\n")


class Tracer:
    """Every frame both ways, as JSON lines (``--trace``); responses are matched by correlation id."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the proxy
        self.connections = 0

    def write(self, **event: object) -> None:
        self.file.write(json.dumps({"t": round(time.time(), 6), **event}) + "\n")


def parse_request_prefix(frame: bytes) -> tuple[int, int, str]:
    """api_key, api_version and client_id of a request frame (size prefix removed).

    Request header v1 and v2 both start: int16 key, int16 version, int32 correlation id, a
    nullable int16-length client id (v2 keeps the non-compact string and adds tagged fields after).
    """
    key, version, _corr = struct.unpack_from(">hhi", frame, 0)
    client_id = ""
    if len(frame) >= 10:
        (n,) = struct.unpack_from(">h", frame, 8)
        if n > 0:
            client_id = frame[10 : 10 + n].decode("utf-8", "replace")
    return key, version, client_id


async def _pump_requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rec: Recorder,
                         tracer: Tracer | None = None, conn: int = 0) -> None:
    while True:
        head = await reader.readexactly(4)
        (size,) = struct.unpack(">i", head)
        if size < 0 or size > 200 * 1024 * 1024:
            raise ValueError(f"implausible frame size {size}")
        frame = await reader.readexactly(size)
        if size >= 8:
            key, version, client_id = parse_request_prefix(frame)
            rec.note(client_id, key, version)
            if tracer is not None:
                (corr,) = struct.unpack_from(">i", frame, 4)
                tracer.write(conn=conn, dir="request", client_id=client_id, api_key=key, api_version=version,
                             correlation_id=corr, size=size)
        writer.write(head + frame)
        await writer.drain()


async def _pump_bytes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        data = await reader.read(256 * 1024)
        if not data:
            return
        writer.write(data)
        await writer.drain()


async def _pump_responses(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tracer: Tracer,
                          conn: int) -> None:
    while True:
        try:
            head = await reader.readexactly(4)
        except asyncio.IncompleteReadError:
            return
        (size,) = struct.unpack(">i", head)
        frame = await reader.readexactly(size)
        corr = struct.unpack_from(">i", frame, 0)[0] if size >= 4 else None
        tracer.write(conn=conn, dir="response", correlation_id=corr, size=size)
        writer.write(head + frame)
        await writer.drain()


async def _serve(listen: tuple[str, int], upstream: tuple[str, int], rec: Recorder,
                 tracer: Tracer | None = None) -> None:
    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            u_reader, u_writer = await asyncio.open_connection(*upstream)
        except OSError:
            c_writer.close()
            return
        conn = 0
        if tracer is not None:
            tracer.connections += 1
            conn = tracer.connections
            tracer.write(conn=conn, dir="open", peer=str(c_writer.get_extra_info("peername")))
        tasks = [
            asyncio.create_task(_pump_requests(c_reader, u_writer, rec, tracer, conn)),
            asyncio.create_task(_pump_bytes(u_reader, c_writer) if tracer is None
                                else _pump_responses(u_reader, c_writer, tracer, conn)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if tracer is not None:
                tracer.write(conn=conn, dir="close")
            for t in tasks:
                t.cancel()
            for w in (c_writer, u_writer):
                with contextlib.suppress(Exception):
                    w.close()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t

    server = await asyncio.start_server(handle, *listen, limit=1 << 20)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--record", required=True, type=Path)
    p.add_argument("--trace", type=Path, default=None, help="also write every frame, both ways, as JSON lines")
    a = p.parse_args()

    def hp(s: str) -> tuple[str, int]:
        h, _, port = s.rpartition(":")
        return h, int(port)

    asyncio.run(_serve(hp(a.listen), hp(a.upstream), Recorder(a.record), Tracer(a.trace) if a.trace else None))


if __name__ == "__main__":
    main()
