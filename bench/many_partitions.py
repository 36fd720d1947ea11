"""Consume speed and broker CPU at many partitions, against a broker that is already running.

bench.py's scenarios create their topic inside the measured run; at 10,000 partitions that alone can
take longer than a shared machine's benchmark slot.  Here each step is its own short run, so each can
be taken under ``flock /tmp/bench.lock`` on its own:

    many_partitions.py create  --topic t --partitions 10000 --step 3500   # CreateTopics, then CreatePartitions
    many_partitions.py produce --topic t --partitions 10000 --count 200000 --size 1024
    many_partitions.py consume --topic t --partitions 10000 --count 200000 --pid PID
    many_partitions.py idle    --topic t --partitions 10000 --offset 20 --seconds 10 --pid PID

``consume`` assigns every partition at offset 0 (not OFFSET_BEGINNING: librdkafka then sends one
ListOffsets per partition, and at 10,000 partitions it was seen to leave some of them unsent, so the
consumer stalls short of the end) and reports msg/s from assign() to the last message and the broker's
CPU seconds (utime+stime of ``--pid``) per million messages.  ``idle`` reports the broker CPU a caught-up
consumer of every partition costs while it long-polls.  confluent-kafka is the only dependency.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from bench import wait_partitions_online  # bench/ is this script's directory


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def create(a: argparse.Namespace) -> None:
    admin = AdminClient({"bootstrap.servers": a.bootstrap})
    count = min(a.step, a.partitions)
    t0 = time.monotonic()
    for f in admin.create_topics([NewTopic(a.topic, count, 1)], request_timeout=85, operation_timeout=85).values():
        f.result(timeout=88)
    while count < a.partitions:
        count = min(count + a.step, a.partitions)
        for f in admin.create_partitions([NewPartitions(a.topic, count)], request_timeout=85,
                                         operation_timeout=85).values():
            f.result(timeout=88)
    created = time.monotonic() - t0
    online = wait_partitions_online(admin, a.topic, count, a.timeout)  # logs opened, not only leaders known
    print(f"{a.topic}: {count} partitions in {created:.1f} s, every log online after {time.monotonic() - t0:.1f} s")
    if not online:
        sys.exit(1)


def produce(a: argparse.Namespace) -> None:
    p = Producer({"bootstrap.servers": a.bootstrap, "linger.ms": 5, "acks": 1,
                  "queue.buffering.max.messages": 1_000_000})
    payload = b"x" * a.size
    t0 = time.monotonic()
    for i in range(a.count):
        for _ in range(10_000):
            try:
                p.produce(a.topic, payload, partition=i % a.partitions)
                break
            except BufferError:
                p.poll(0.01)
        if i % 10_000 == 0:
            p.poll(0)
    left = p.flush(60)
    print(f"produced {a.count - left}/{a.count} x {a.size} B in {time.monotonic() - t0:.1f} s")
    if left:
        sys.exit(1)


def _consumer(a: argparse.Namespace) -> Consumer:
    c = Consumer({"bootstrap.servers": a.bootstrap, "group.id": f"many-{time.time_ns()}",
                  "enable.auto.commit": False, "fetch.queue.backoff.ms": 1})
    c.list_topics(topic=a.topic, timeout=10)
    return c


def consume(a: argparse.Namespace) -> None:
    c = _consumer(a)
    try:
        cpu0, t0 = _cpu_s(a.pid), time.perf_counter()
        c.assign([TopicPartition(a.topic, p, 0) for p in range(a.partitions)])
        got, last = 0, time.monotonic()
        deadline = last + a.timeout
        while got < a.count and time.monotonic() < deadline and time.monotonic() - last < 10:
            msgs = c.consume(min(10_000, a.count - got), 0.5)
            n = sum(1 for m in msgs if m.error() is None)
            if n:
                got, last = got + n, time.monotonic()
        elapsed, cpu = time.perf_counter() - t0, _cpu_s(a.pid) - cpu0
    finally:
        c.close()
    print(f"consumed {got}/{a.count} in {elapsed:.2f} s: {got / elapsed:,.0f} msg/s, broker CPU {cpu:.2f} s = "
          f"{cpu / max(got, 1) * 1e6:.2f} CPU-s/M; load {os.getloadavg()[0]:.2f}")
    if got < a.count:
        sys.exit(1)


def idle(a: argparse.Namespace) -> None:
    c = _consumer(a)
    try:
        c.assign([TopicPartition(a.topic, p, a.offset) for p in range(a.partitions)])
        warm = time.monotonic() + 2
        while time.monotonic() < warm:
            c.consume(1000, 0.2)
        cpu0, t0 = _cpu_s(a.pid), time.monotonic()
        while time.monotonic() < t0 + a.seconds:
            c.consume(1000, 0.2)
        cpu = _cpu_s(a.pid) - cpu0
    finally:
        c.close()
    print(f"idle consumer of {a.partitions} partitions: broker CPU {100 * cpu / a.seconds:.1f} % of a core; "
          f"load {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["create", "produce", "consume", "idle"])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--step", type=int, default=3500, help="create: partitions added per request")
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--pid", type=int, default=0, help="consume/idle: the broker's pid, for its CPU time")
    ap.add_argument("--offset", type=int, default=0, help="idle: every partition's log end offset")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="consume: hard limit in seconds; create: longest wait for every log to be online")
    a = ap.parse_args()
    if a.command in ("consume", "idle") and not a.pid:
        ap.error("--pid is required")
    {"create": create, "produce": produce, "consume": consume, "idle": idle}[a.command](a)


if __name__ == "__main__":
    main()
