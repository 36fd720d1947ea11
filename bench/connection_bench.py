#!/usr/bin/env python3
"""What a client connection costs the broker: opening one, and a request that does no work.

Two phases against each broker of ``--brokers`` (pykbroker, or kafka with ``--kafka-cmd``, as bench.py
starts them), from one client thread on raw sockets so that the client's own cost stays small:

- ``connect``: for ``--seconds``, open a TCP connection, send ApiVersions v3 (flexible, naming the client
  software, as librdkafka and the Java client open every connection), read the answer, close. Short-lived
  clients (kcat, scripts, health checks, PHP-style producers) pay this on every run.
- ``round trip``: on one connection, ApiVersions v3 again and again, one at a time: the per-request cost
  of the network edge, framing, dispatch and encoding with no handler work behind it.

Figures: operations a second, p50 / p99 of one operation, broker CPU microseconds per operation.
Every loop is bounded by ``--seconds``.

    .venv/bin/python bench/connection_bench.py [--brokers pykbroker] [--seconds 5] [--pykbroker-bin PATH]
        [--kafka-cmd SCRIPT]
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.brokers import Target, add_target_args, run_each_target
from benchlib.console import err_str, fmt, pct
from benchlib.procstats import Snap, snap

_SOFTWARE = (b"connection-bench", b"1.0")


def api_versions_v3(correlation_id: int) -> bytes:
    """A framed ApiVersions v3 request (request header v2, compact strings, empty tagged fields)."""
    client_id = b"connection-bench"
    header = struct.pack(">hhih", 18, 3, correlation_id, len(client_id)) + client_id + b"\x00"
    body = b"".join(bytes([len(s) + 1]) + s for s in _SOFTWARE) + b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body


def _read_response(sock: socket.socket, correlation_id: int) -> None:
    """One response frame; checks its correlation id and ApiVersions' error code (0)."""
    head = _recv_exact(sock, 4)
    (size,) = struct.unpack(">i", head)
    body = _recv_exact(sock, size)
    corr, error = struct.unpack_from(">ih", body)
    if corr != correlation_id or error != 0:
        raise RuntimeError(f"unexpected ApiVersions answer: correlation id {corr}, error {error}")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:  # bounded by the socket timeout: each recv returns data, or raises
        chunk = sock.recv(n - got)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _timed(op: Callable[[int], None], seconds: float, limit: int = 10_000_000) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    for i in range(limit):
        t0 = time.perf_counter()
        if t0 >= deadline:
            break
        op(i)
        latencies.append(time.perf_counter() - t0)
    return latencies


def run(target: Target, seconds: float) -> list[dict[str, object]]:
    host, port = target.bootstrap.rsplit(":", 1)
    address = (host, int(port))

    def connect_once(i: int) -> None:
        with socket.create_connection(address, timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(api_versions_v3(i))
            _read_response(s, i)

    rows = []
    for _ in range(200):  # warm-up, unmeasured: imports, first connections
        connect_once(0)
    s0 = snap(target.pid)
    lat = _timed(connect_once, seconds)
    s1 = snap(target.pid)
    rows.append(_row(target, "connect + ApiVersions + close", lat, s0, s1))

    with socket.create_connection(address, timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def round_trip(i: int) -> None:
            s.sendall(api_versions_v3(i))
            _read_response(s, i)

        _timed(round_trip, 0.5)
        s0 = snap(target.pid)
        lat = _timed(round_trip, seconds)
        s1 = snap(target.pid)
    rows.append(_row(target, "ApiVersions round trip", lat, s0, s1))
    return rows


def _row(target: Target, phase: str, lat: list[float], s0: Snap, s1: Snap) -> dict[str, object]:
    lat = sorted(lat)
    elapsed = s1.t - s0.t
    cpu = s1.broker.cpu_since(s0.broker) if s0.broker and s1.broker else None
    n = len(lat)
    return {
        "broker": target.label, "phase": phase, "n": n,
        "ops/s": n / elapsed if elapsed > 0 else 0.0,
        "p50 ms": (pct(lat, 50) or 0) * 1000, "p99 ms": (pct(lat, 99) or 0) * 1000,
        "broker CPU us/op": cpu / n * 1e6 if cpu is not None and n else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    add_target_args(ap, "pykbroker")
    args = ap.parse_args(argv)

    def measure(t: Target) -> tuple[list[str], bool]:
        try:
            rows = run(t, args.seconds)
        except (OSError, RuntimeError) as e:
            return [f"| {t.label} | failed: {err_str(e)} |"], True
        return [f"| {r['broker']} | {r['phase']} | {r['ops/s']:,.0f} | {r['p50 ms']:.3f} | {r['p99 ms']:.3f} | "
                f"{fmt(r['broker CPU us/op'], 1)} |" for r in rows], False

    return run_each_target(args, "pykbroker-connection-bench-", [
        "| broker | phase | ops/s | p50 ms | p99 ms | broker CPU µs / op |",
        "|---|---|---:|---:|---:|---:|"], measure)


if __name__ == "__main__":
    sys.exit(main())
