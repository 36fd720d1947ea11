#!/usr/bin/env python3
"""Broker CPU per request on the acknowledgement path, over real sockets and without a client library.

The e2e phase of bench.py at 5,000 msg/s is, for the broker, about 550 Produce and 550 Fetch requests a
second: librdkafka sends a batch every linger.ms and the consumer's long-poll fetch returns as soon as one
arrives.  Its CPU per request is what decides how close the broker comes to its share of the CPU beside
busy processes (docs/performance.md, "Sharing the CPU"), but librdkafka's batching varies with the
broker's own speed, so the request count drifts between runs.  Here the requests are fixed: one thread
sends Produce v10 requests of one ``--batch``-record batch each, paced at ``--rate`` a second and waiting
for each answer, and another long-polls Fetch v16 (max_wait 500 ms) from the high watermark, as a consumer
at the tail does.

Each round starts a fresh broker (``pykbroker serve``, one partition, ``log.flush.on.ack`` as
``--flush``), warms up for a second, then reads the CPU time of all the broker's threads
(per-thread ``schedstat``, nanoseconds, as bench.py reads it) over ``--seconds``.  Several ``--pykbroker-bin`` are run
in turn, round after round, so that a slow spell of the host hits them alike; the table gives every round
and the median per binary.  Exits 1 if a request fails.

``--loop-profile`` runs this tree's broker under bench/loop_profile.py instead and prints, per round, its
event loop's CPU per asyncio handle (what each pass of the loop resumed and what it cost).

    .venv/bin/python bench/ack_cpu.py [--pykbroker-bin PATH ...] [--rounds 4] [--rate 550] [--seconds 10]
        [--size 1024] [--batch 10] [--flush true] [--loop-profile] [--pykbroker-override KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.brokers import free_port, start_broker, stop_broker
from benchlib.procstats import snap

from pykbroker.protocol import codec
from pykbroker.protocol.records import build_batch


def _frame(api_key: int, version: int, body: dict[str, Any], correlation_id: int) -> bytes:
    client = b"ack-cpu"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client)) + client
    if codec.is_flexible(api_key, version):
        header += b"\x00"
    payload = header + codec.encode_entity(codec.build(codec.request_class(api_key, version), body))
    return struct.pack(">i", len(payload)) + payload


def _call(s: socket.socket, api_key: int, version: int, body: dict[str, Any], correlation_id: int) -> Any:
    s.sendall(_frame(api_key, version, body, correlation_id))
    # read(n) returns n bytes, or fewer only at the end of the stream; one request is in flight per
    # connection, so nothing past this response can sit in this reader's buffer.
    reader = s.makefile("rb")
    head = reader.read(4)
    payload = reader.read(struct.unpack(">i", head)[0]) if len(head) == 4 else b""
    if not payload:
        raise EOFError("the broker closed the connection")
    return codec.decode_response(api_key, version, payload, 5 if codec.is_flexible(api_key, version) else 4)


def _connect(port: int, deadline: float) -> socket.socket:
    for _ in range(1000):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    raise TimeoutError("the broker did not listen")


def one_round(binary: str, args: argparse.Namespace) -> dict[str, float]:
    workdir = tempfile.mkdtemp(prefix="ack-cpu-")
    port = free_port()
    profile_out = os.path.join(workdir, "loop-profile.txt")
    launcher = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "loop_profile.py")] \
        if args.loop_profile else [binary]
    cmd = [*launcher, "serve", "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
           "--override", f"log.dirs={workdir}/data", "--override", f"log.flush.on.ack={args.flush}"]
    for o in args.pykbroker_override:
        cmd += ["--override", o]
    broker = start_broker("pykbroker", cmd, port, workdir, {**os.environ, "LOOP_PROFILE_OUT": profile_out})
    stop = threading.Event()
    counts = {"produce": 0, "fetch": 0}
    failures: list[str] = []
    try:
        if broker.dead or broker.pid is None:
            raise RuntimeError("; ".join(broker.notes) or "the broker did not start")
        pid = broker.pid
        admin = _connect(port, time.monotonic() + 30)
        created = _call(admin, 19, 4, {"topics": [{"name": "ack-cpu", "num_partitions": 1, "replication_factor": 1}],
                                       "timeout": 30000}, 1)
        if created.topics[0].error_code != 0:
            raise RuntimeError(f"CreateTopics failed: {created.topics[0].error_code}")
        meta = _call(admin, 3, 12, {"topics": [{"name": "ack-cpu"}], "allow_auto_topic_creation": False,
                                    "include_topic_authorized_operations": False}, 2)
        topic_id = meta.topics[0].topic_id
        admin.close()
        value = os.urandom(args.size)

        def produce() -> None:
            s = _connect(port, time.monotonic() + 10)
            period, due = 1.0 / args.rate, time.monotonic()
            for cid in range(10, 10_000_000):
                if stop.is_set():
                    break
                batch = bytes(build_batch([(None, value, [])] * args.batch, timestamp_ms=int(time.time() * 1000)))
                r = _call(s, 0, 10, {"acks": 1, "timeout": 30000, "topic_data": [
                    {"name": "ack-cpu", "partition_data": [{"index": 0, "records": batch}]}]}, cid)
                code = r.responses[0].partition_responses[0].error_code
                if code != 0:
                    failures.append(f"produce error {code}")
                    break
                counts["produce"] += 1
                due += period
                time.sleep(max(0.0, due - time.monotonic()))
            s.close()

        def fetch() -> None:
            s = _connect(port, time.monotonic() + 10)
            offset = 0
            for cid in range(10, 10_000_000):
                if stop.is_set():
                    break
                r = _call(s, 1, 16, {"replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": 52428800,
                                     "isolation_level": 0, "session_id": 0, "session_epoch": -1,
                                     "topics": [{"topic_id": topic_id, "partitions": [
                                         {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1048576,
                                          "current_leader_epoch": -1, "log_start_offset": -1}]}],
                                     "forgotten_topics_data": [], "rack_id": ""}, cid)
                part = r.responses[0].partitions[0]
                if part.error_code != 0:
                    failures.append(f"fetch error {part.error_code}")
                    break
                offset = part.high_watermark
                counts["fetch"] += 1
            s.close()

        threads = [threading.Thread(target=produce, daemon=True), threading.Thread(target=fetch, daemon=True)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # warm-up
        if args.loop_profile:
            os.kill(pid, signal.SIGUSR2)
        s0, p0, f0 = snap(pid), counts["produce"], counts["fetch"]
        time.sleep(args.seconds)
        s1, p1, f1 = snap(pid), counts["produce"], counts["fetch"]
        profile = ""
        if args.loop_profile:
            os.kill(pid, signal.SIGUSR1)
            for _ in range(100):  # the broker writes it from its signal handler
                time.sleep(0.05)
                if os.path.exists(profile_out):
                    time.sleep(0.05)
                    with open(profile_out) as f:
                        profile = f.read()
                    break
        stop.set()
        for t in threads:
            t.join(timeout=5)
        if failures:
            raise RuntimeError("; ".join(failures))
        requests = (p1 - p0) + (f1 - f0)
        if requests <= 0:
            raise RuntimeError("no request was answered")
        if s0.broker is None or s1.broker is None:
            raise RuntimeError("the broker's CPU could not be read")
        elapsed, cpu = s1.t - s0.t, s1.broker.cpu_since(s0.broker)
        return {"produce_per_s": (p1 - p0) / elapsed, "fetch_per_s": (f1 - f0) / elapsed,
                "cpu_pct": 100 * cpu / elapsed, "us_per_request": cpu * 1e6 / requests,
                "produced": p1 - p0, "profile": profile}
    finally:
        stop.set()
        stop_broker(broker)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_bin = os.path.join(os.path.dirname(sys.executable), "pykbroker")
    ap.add_argument("--pykbroker-bin", action="append", default=[], help="a pykbroker executable (repeatable)")
    ap.add_argument("--pykbroker-override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rate", type=float, default=550.0, help="Produce requests a second")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured time per round")
    ap.add_argument("--size", type=int, default=1024, help="record value bytes")
    ap.add_argument("--batch", type=int, default=10, help="records per Produce request")
    ap.add_argument("--flush", choices=("true", "false"), default="true", help="log.flush.on.ack")
    ap.add_argument("--loop-profile", action="store_true",
                    help="run this tree's broker under bench/loop_profile.py and print its event loop's CPU per handle")
    args = ap.parse_args()
    binaries = args.pykbroker_bin or [default_bin]
    print(f"Produce v10 ({args.batch} x {args.size} B, acks=1) at {args.rate:g}/s and a tail Fetch v16 long poll, "
          f"log.flush.on.ack={args.flush}, {args.seconds:g} s per round\n")
    print("| round | pykbroker | Produce/s | Fetch/s | broker CPU % | broker CPU µs per request |")
    print("|---|---|---:|---:|---:|---:|")
    per_bin: dict[str, list[float]] = {b: [] for b in binaries}
    profiles: list[str] = []
    for r in range(1, args.rounds + 1):
        for b in binaries:
            res = one_round(b, args)
            per_bin[b].append(res["us_per_request"])
            print(f"| {r} | {b} | {res['produce_per_s']:.0f} | {res['fetch_per_s']:.0f} | {res['cpu_pct']:.1f} | "
                  f"{res['us_per_request']:.0f} |", flush=True)
            if res["profile"]:
                profiles.append(f"round {r}, {res['produced']:.0f} Produce requests and their fetches:\n"
                                f"{res['profile']}")
    print("\n| pykbroker | median µs per request | rounds |")
    print("|---|---:|---|")
    for b, values in per_bin.items():
        print(f"| {b} | {statistics.median(values):.0f} | {', '.join(f'{v:.0f}' for v in values)} |")
    for text in profiles:
        print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
