#!/usr/bin/env python3
"""Delayed delivery lateness: N records scheduled over a window, how late each one reaches a consumer.

Starts a pykbroker subprocess (``pykbroker.delay.enable=true``) on a free 127.0.0.1 port with a temporary
data directory, produces ``--records`` records with confluent-kafka, each carrying a
``pykbroker.deliver.at.ms`` header spread uniformly (in random order) over ``--window`` seconds starting
``--lead`` seconds after the produce began, then consumes the target topic and prints, per record,
lateness = arrival at the consumer - due time: p50, p99, max, how many came early, duplicates, missing,
plus the broker's CPU seconds and peak RSS. Everything is bounded by the window plus ``--grace``.

    .venv/bin/python bench/delay_bench.py --records 100000 --window 60
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broker_cpu_rss(pid: int) -> tuple[float, int]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) * 1024
    return cpu, rss


def pct(values: list[int], q: float) -> int:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--window", type=float, default=60.0, help="seconds over which the due times are spread")
    ap.add_argument("--lead", type=float, default=10.0, help="seconds from the start to the first due time")
    ap.add_argument("--grace", type=float, default=30.0, help="seconds after the last due time before giving up")
    ap.add_argument("--size", type=int, default=100, help="value bytes")
    ap.add_argument("--partitions", type=int, default=1)
    args = ap.parse_args()

    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="delay-bench-"))
    cmd = [sys.executable, "-m", "pykbroker", "serve", "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
           "--override", f"log.dirs={data / 'logs'}", "--override", "pykbroker.delay.enable=true"]
    logf = open(data / "broker.log", "wb")  # noqa: SIM115 - owned by the process
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
    bootstrap = f"127.0.0.1:{port}"
    try:
        for _ in range(600):  # until the listener is open (bounded: 60 s)
            if proc.poll() is not None:
                raise RuntimeError("broker exited; see its log")
            with socket.socket() as s, contextlib.suppress(OSError):
                s.connect(("127.0.0.1", port))
                break
            time.sleep(0.1)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for _ in range(300):
            try:
                fs = admin.create_topics([NewTopic("delayed", num_partitions=args.partitions, replication_factor=1)],
                                         request_timeout=5)
                fs["delayed"].result(timeout=10)
                break
            except Exception:
                if proc.poll() is not None:
                    raise RuntimeError("broker exited; see " + str(data / "broker.log")) from None
                time.sleep(0.1)
        cpu0, _ = broker_cpu_rss(proc.pid)
        start = now_ms()
        first_due = start + int(args.lead * 1000)
        span = int(args.window * 1000)
        due = [first_due + (i * span) // args.records for i in range(args.records)]
        order = list(range(args.records))
        random.Random(1).shuffle(order)  # produced in random due order: the broker must sort them
        value = b"x" * args.size
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
        for i in order:
            for _ in range(1000):
                try:
                    p.produce("delayed", key=str(i).encode(), value=value, partition=i % args.partitions,
                              headers=[("pykbroker.deliver.at.ms", str(due[i]).encode())])
                    break
                except BufferError:
                    p.poll(0.05)
        p.flush(60)
        produced_s = (now_ms() - start) / 1000
        if now_ms() > first_due:
            print(f"warning: producing took {produced_s:.1f} s, past the first due time; raise --lead")
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50})
        c.assign([TopicPartition("delayed", i, 0) for i in range(args.partitions)])
        seen: dict[int, int] = {}
        dups = 0
        late: list[int] = []
        deadline = time.monotonic() + args.lead + args.window + args.grace
        while len(seen) < args.records and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.05):
                if m.error():
                    continue
                at = now_ms()
                k = int(m.key())
                if k in seen:
                    dups += 1
                    continue
                seen[k] = at
                late.append(at - due[k])
        c.close()
        cpu1, peak_rss = broker_cpu_rss(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        logf.close()
        shutil.rmtree(data, ignore_errors=True)
    early = sum(1 for x in late if x < 0)
    print(f"records={args.records} window={args.window:.0f}s partitions={args.partitions} value={args.size}B "
          f"produce={produced_s:.1f}s")
    print(f"delivered={len(seen)} missing={args.records - len(seen)} duplicates={dups} early={early}")
    if late:
        print(f"lateness ms: p50={pct(late, 0.5)} p99={pct(late, 0.99)} max={max(late)} "
              f"mean={statistics.fmean(late):.1f}")
    print(f"broker cpu={cpu1 - cpu0:.1f}s peak_rss={peak_rss / 2**20:.0f}MiB")
    return 0 if len(seen) == args.records and not dups and not early else 1


if __name__ == "__main__":
    sys.exit(main())
