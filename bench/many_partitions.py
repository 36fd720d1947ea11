"""Consume speed and broker CPU at many partitions, against a broker that is already running.

bench.py's scenarios create their topic inside the measured run; at 10,000 partitions that alone can
take longer than a shared machine's benchmark slot.  Here each step is its own short run, so each can
be taken under ``flock /tmp/bench.lock`` on its own:

    many_partitions.py create  --topic t --partitions 10000 --step 3500   # CreateTopics, then CreatePartitions
    many_partitions.py produce --topic t --partitions 10000 --count 200000 --size 1024
    many_partitions.py consume --topic t --partitions 10000 --count 200000 --pid PID
    many_partitions.py idle    --topic t --partitions 10000 --offset 20 --seconds 10 --pid PID

``compare`` starts each broker of ``--brokers`` itself (as bench.py does: pykbroker, or Apache Kafka with
``--kafka-cmd``; ``KAFKA_HEAP_OPTS`` reaches Kafka's start script) and on each, for every size of ``--sizes``:
a fresh topic of ``--partitions`` partitions, ``--rounds`` produces into it (the first one cold), then
``--rounds`` consumes of all of it, each from offset 0 with a new group. It prints one table row per step:
msg/s and the broker's CPU seconds per million messages (its whole process tree). Each size's topic stays
until the broker stops, so partitions × sizes must fit the brokers' open-file limit (each holds a descriptor
per partition at least); at 10,000 partitions on a machine limited to 20,000, run one size at a time::

    many_partitions.py compare --brokers pykbroker,kafka --kafka-cmd SCRIPT --partitions 10000 \
        --sizes 100,1024 --count 500000 --rounds 2

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
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.brokers import Target, add_target_args, run_each_target  # bench/ is this script's directory
from benchlib.console import err_str, fmt  # bench/ is this script's directory
from benchlib.phases import wait_partitions_online  # bench/ is this script's directory
from benchlib.procstats import Usage, broker_usage  # bench/ is this script's directory


@dataclass
class Step:
    """What one produce or consume step did: messages done of those asked, seconds, broker CPU seconds."""

    done: int
    asked: int
    seconds: float
    cpu: float | None

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_million(self) -> float | None:
        return None if self.cpu is None else self.cpu / max(self.done, 1) * 1e6


def _broker_usage(pid: int) -> Usage | None:
    """The broker's process tree (a start script's JVM child included), None without a pid."""
    return broker_usage(pid) if pid else None


def _cpu_between(before: Usage | None, after: Usage | None) -> float | None:
    """Broker CPU seconds between two snapshots (per-thread nanoseconds where it can)."""
    return None if before is None or after is None else after.cpu_since(before)


def make_topic(bootstrap: str, topic: str, partitions: int, step: int, timeout: float) -> tuple[float, float | None]:
    """Create ``topic`` (CreateTopics, then CreatePartitions ``step`` at a time); seconds until the last
    request was answered, and until every log answered ListOffsets (None if not within ``timeout``)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    count = min(step, partitions)
    t0 = time.monotonic()
    for f in admin.create_topics([NewTopic(topic, count, 1)], request_timeout=85, operation_timeout=85).values():
        f.result(timeout=88)
    while count < partitions:
        count = min(count + step, partitions)
        for f in admin.create_partitions([NewPartitions(topic, count)], request_timeout=85,
                                         operation_timeout=85).values():
            f.result(timeout=88)
    created = time.monotonic() - t0
    online = wait_partitions_online(admin, topic, count, timeout)  # logs opened, not only leaders known
    return created, (time.monotonic() - t0 if online else None)


def create(a: argparse.Namespace) -> None:
    created, online = make_topic(a.bootstrap, a.topic, a.partitions, a.step, a.timeout)
    if online is None:
        print(f"{a.topic}: {a.partitions} partitions in {created:.1f} s, not every log online after {a.timeout} s")
        sys.exit(1)
    print(f"{a.topic}: {a.partitions} partitions in {created:.1f} s, every log online after {online:.1f} s")


def produce_step(bootstrap: str, topic: str, partitions: int, count: int, size: int, pid: int) -> Step:
    """``count`` messages of ``size`` bytes, acks=1, round-robin over the partitions, until all are acknowledged."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1,
                  "queue.buffering.max.messages": 1_000_000})
    p.list_topics(topic=topic, timeout=10)
    payload = b"x" * size
    u0, t0 = _broker_usage(pid), time.perf_counter()
    for i in range(count):
        for _ in range(10_000):
            try:
                p.produce(topic, payload, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.01)
        if i % 10_000 == 0:
            p.poll(0)
    left = p.flush(120)
    elapsed = time.perf_counter() - t0
    return Step(count - left, count, elapsed, _cpu_between(u0, _broker_usage(pid)))


def produce(a: argparse.Namespace) -> None:
    r = produce_step(a.bootstrap, a.topic, a.partitions, a.count, a.size, a.pid)
    cpu = "" if r.cpu_per_million is None else f", broker CPU {r.cpu:.2f} s = {r.cpu_per_million:.2f} CPU-s/M"
    print(f"produced {r.done}/{a.count} x {a.size} B in {r.seconds:.1f} s: {r.rate:,.0f} msg/s{cpu}")
    if r.done < a.count:
        sys.exit(1)


def _consumer(bootstrap: str, topic: str) -> Consumer:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"many-{time.time_ns()}",
                  "enable.auto.commit": False, "fetch.queue.backoff.ms": 1})
    c.list_topics(topic=topic, timeout=10)
    return c


def consume_step(bootstrap: str, topic: str, partitions: int, count: int, pid: int, timeout: float) -> Step:
    """Every partition from offset 0 until ``count`` messages arrived, ``timeout`` passed or 10 s went by
    without a message."""
    c = _consumer(bootstrap, topic)
    try:
        u0, t0 = _broker_usage(pid), time.perf_counter()
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got, last = 0, time.monotonic()
        deadline = last + timeout
        while got < count and time.monotonic() < deadline and time.monotonic() - last < 10:
            msgs = c.consume(min(10_000, count - got), 0.5)
            n = sum(1 for m in msgs if m.error() is None)
            if n:
                got, last = got + n, time.monotonic()
        elapsed, u1 = time.perf_counter() - t0, _broker_usage(pid)
    finally:
        c.close()
    return Step(got, count, elapsed, _cpu_between(u0, u1))


def consume(a: argparse.Namespace) -> None:
    r = consume_step(a.bootstrap, a.topic, a.partitions, a.count, a.pid, a.timeout)
    print(f"consumed {r.done}/{a.count} in {r.seconds:.2f} s: {r.rate:,.0f} msg/s, broker CPU {r.cpu or 0:.2f} s = "
          f"{r.cpu_per_million or 0:.2f} CPU-s/M; load {os.getloadavg()[0]:.2f}")
    if r.done < a.count:
        sys.exit(1)


def idle(a: argparse.Namespace) -> None:
    c = _consumer(a.bootstrap, a.topic)
    try:
        c.assign([TopicPartition(a.topic, p, a.offset) for p in range(a.partitions)])
        warm = time.monotonic() + 2
        while time.monotonic() < warm:
            c.consume(1000, 0.2)
        u0, t0 = _broker_usage(a.pid), time.monotonic()
        while time.monotonic() < t0 + a.seconds:
            c.consume(1000, 0.2)
        cpu = _cpu_between(u0, _broker_usage(a.pid)) or 0.0
    finally:
        c.close()
    print(f"idle consumer of {a.partitions} partitions: broker CPU {100 * cpu / a.seconds:.1f} % of a core; "
          f"load {os.getloadavg()[0]:.2f}")


def compare(a: argparse.Namespace) -> int:
    """Each broker of ``--brokers`` started in turn; on each, per size, a fresh topic, the produce rounds,
    then the consume rounds. A step that fell short is a failure (exit code 1), and its row says so."""

    def measure(t: Target) -> tuple[list[str], bool]:
        rows: list[str] = []
        bad = False
        pid = t.pid or 0
        for size in a.sizes:
            topic = f"many-{size}"
            try:
                created, online = make_topic(t.bootstrap, topic, a.partitions, a.step, a.timeout)
            except Exception as e:  # a broker that refused the topic: say so and go on with the next broker
                return [*rows, f"| {t.label} | {size} B | create | failed: {err_str(e)} | | |"], True
            if online is None:
                return [*rows, f"| {t.label} | {size} B | create | not every log online after {a.timeout:.0f} s "
                               f"| | |"], True
            rows.append(f"| {t.label} | {size} B | create {a.partitions:,} partitions | answered {created:.1f} s, "
                        f"every log online {online:.1f} s | | |")
            steps: list[tuple[str, Step]] = []
            for r in range(1, a.rounds + 1):
                steps.append((f"produce {r}", produce_step(t.bootstrap, topic, a.partitions, a.count, size, pid)))
            for r in range(1, a.rounds + 1):
                steps.append((f"consume {r}", consume_step(t.bootstrap, topic, a.partitions, a.count * a.rounds,
                                                           pid, a.timeout)))
            for name, st in steps:
                short = "" if st.done >= st.asked else f" (only {st.done:,} of {st.asked:,})"
                bad = bad or bool(short)
                rows.append(f"| {t.label} | {size} B | {name} | {st.rate:,.0f} msg/s{short} | {st.seconds:.2f} s | "
                            f"{fmt(st.cpu_per_million, 2)} |")
            print(f"{t.label} {size} B done, load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
        return rows, bad

    return run_each_target(a, "pykbroker-many-partitions-", [
        f"partitions {a.partitions:,}, {a.count:,} messages per produce, acks=1, linger.ms=5; "
        f"each consume reads all {a.count * a.rounds:,} from offset 0",
        "| broker | size | step | result | seconds | broker CPU-s/M |",
        "|---|---|---|---:|---:|---:|"], measure)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["create", "produce", "consume", "idle", "compare"])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--topic", help="create/produce/consume/idle: the topic")
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--step", type=int, default=3500, help="create: partitions added per request")
    ap.add_argument("--count", type=int, default=200_000, help="messages per produce (compare: per round)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=[100, 1024],
                    help="compare: message sizes, a fresh topic each")
    ap.add_argument("--rounds", type=int, default=2, help="compare: produce rounds, then as many consumes")
    ap.add_argument("--pid", type=int, default=0,
                    help="produce/consume/idle: the broker's pid, for its CPU time (required by consume/idle)")
    ap.add_argument("--offset", type=int, default=0, help="idle: every partition's log end offset")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="consume: hard limit in seconds; create: longest wait for every log to be online")
    add_target_args(ap, "pykbroker")
    a = ap.parse_args()
    if a.command == "compare":
        return compare(a)
    if not a.topic:
        ap.error("--topic is required")
    if a.command in ("consume", "idle") and not a.pid:
        ap.error("--pid is required")
    {"create": create, "produce": produce, "consume": consume, "idle": idle}[a.command](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
