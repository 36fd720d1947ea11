#!/usr/bin/env python3
"""Fan-out figures: many consumer groups, many consumers and many producer connections on
one broker.

Starts pykbroker (embedded metadata), or Apache Kafka with ``--kafka-cmd``, on a free 127.0.0.1 port,
creates one topic with as many partitions as a group has consumers, and then runs, all at once:

1. ``--idle-producers`` idle producer connections: aiokafka producers in one asyncio process,
   started (connected, metadata fetched) and then sending nothing;
2. ``--groups`` consumer groups of ``--consumers`` confluent-kafka consumers each (one process per
   group, a thread per consumer), subscribed to the topic;
3. ``--active-producers`` confluent-kafka producers (acks=1, linger.ms=5) that together send
   ``--rate`` messages a second for ``--seconds``, each payload carrying its send time.

Figures: how long until every consumer of every group had its partitions (the groups' joins), the
rate each group received, end-to-end latency (send -> a consumer's poll) p50/p99/max over every
group, and the broker's CPU. Every wait is bounded; the run exits 1 if a group missed a message.

    .venv/bin/python bench/fanout_bench.py [--groups 10] [--consumers 10] [--idle-producers 1000]
        [--active-producers 100] [--rate 5000] [--seconds 10] [--size 100]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import queue as _queue
import shutil
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.brokers import free_port, kafka_command, start_broker, stop_broker, venv_bin
from benchlib.phases import create_topic
from benchlib.procstats import snap

HEADER = 16  # send time (ns, monotonic) + producer index, big-endian


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q / 100))]


# -- idle producers (one asyncio process) -----------------------------------------------------------

def _idle_producers(bootstrap: str, topic: str, n: int, ready: Any, stop: Any) -> None:
    from aiokafka import AIOKafkaProducer

    async def main() -> None:
        producers = []
        for i in range(n):
            p = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id=f"idle-{i}", request_timeout_ms=60000)
            await p.start()
            await p.partitions_for(topic)  # metadata for the topic, as a producer about to send would
            producers.append(p)
        ready.put(("idle", len(producers)))
        while not stop.is_set():
            await asyncio.sleep(0.2)
        await asyncio.gather(*(p.stop() for p in producers), return_exceptions=True)

    asyncio.run(main())


# -- one consumer group (one process, a thread per consumer) ----------------------------------------

def _group(bootstrap: str, topic: str, group: str, consumers: int, ready: Any, stop: Any, out: Any) -> None:
    from confluent_kafka import Consumer

    assigned = [0] * consumers  # partitions each consumer holds now
    lat: list[list[int]] = [[] for _ in range(consumers)]
    counts = [0] * consumers

    def run(i: int) -> None:
        def on_assign(c: Any, parts: list[Any]) -> None:
            assigned[i] = len(parts)

        def on_revoke(c: Any, parts: list[Any]) -> None:
            assigned[i] = 0

        c = Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "group.id": group,
                      "auto.offset.reset": "earliest", "enable.auto.commit": True,
                      "session.timeout.ms": 45000, "fetch.wait.max.ms": 100})
        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        mono = time.monotonic_ns
        try:
            while not stop.is_set():
                m = c.poll(0.1)
                if m is None or m.error() is not None:
                    continue
                now = mono()
                v = m.value()
                lat[i].append(now - int.from_bytes(v[:8], "big"))
                counts[i] += 1
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(consumers)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    # Settled: one partition each (the topic has as many partitions as the group has consumers).
    while any(n != 1 for n in assigned) and not stop.is_set() and time.monotonic() - t0 < 120:
        time.sleep(0.05)
    ready.put(("group", group, all(n == 1 for n in assigned), time.monotonic() - t0))
    for t in threads:
        t.join(timeout=30)
    out.put((group, sum(counts), [x for part in lat for x in part]))


# -- the run -----------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    workdir = tempfile.mkdtemp(prefix="pykbroker-fanout-")
    port = free_port()
    if args.kafka_cmd:  # the same load against Apache Kafka (bench.py's kafka_command for the contract)
        cmd, env = kafka_command(args.kafka_cmd, port, os.path.join(workdir, "data"),
                                   ["group.initial.rebalance.delay.ms=0"])
        target = start_broker("kafka", cmd, port, workdir, env)
    else:
        cmd = [venv_bin("pykbroker") or "pykbroker", "serve", "--override",
               f"listeners=PLAINTEXT://127.0.0.1:{port}", "--override", f"log.dirs={workdir}/data",
               "--override", "group.initial.rebalance.delay.ms=0"]
        target = start_broker("pykbroker", cmd, port, workdir, None)
    if target.dead:
        print("\n".join(target.notes))
        return 1
    ctx = mp.get_context("spawn")
    ready, out, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs: list[Any] = []
    rc = 0
    try:
        topic = f"fanout-{uuid.uuid4().hex[:8]}"
        create_topic(target, topic, args.consumers, 60)
        t_start = time.monotonic()
        if args.idle_producers:
            procs.append(ctx.Process(target=_idle_producers, args=(target.bootstrap, topic, args.idle_producers,
                                                                    ready, stop), daemon=True))
        groups = [f"fanout-g{i}" for i in range(args.groups)]
        for g in groups:
            procs.append(ctx.Process(target=_group, args=(target.bootstrap, topic, g, args.consumers, ready, stop, out),
                                     daemon=True))
        for p in procs:
            p.start()
        joins: dict[str, float] = {}
        idle_up = 0
        deadline = time.monotonic() + args.setup_timeout
        while (len(joins) < len(groups) or (args.idle_producers and not idle_up)) and time.monotonic() < deadline:
            try:
                msg = ready.get(timeout=1)
            except _queue.Empty:
                continue
            if msg[0] == "idle":
                idle_up = msg[1]
            else:
                _, g, ok, took = msg
                if not ok:
                    raise RuntimeError(f"group {g} did not get every consumer an assignment")
                joins[g] = took
        if len(joins) < len(groups) or (args.idle_producers and not idle_up):
            raise RuntimeError(f"setup not done in {args.setup_timeout}s: {len(joins)} groups joined, "
                               f"{idle_up} idle producers up")
        setup_s = time.monotonic() - t_start
        time.sleep(1.0)  # let the last assignments start fetching at the log end

        from confluent_kafka import Producer

        producers = [Producer({"bootstrap.servers": target.bootstrap, "broker.address.family": "v4", "acks": "1",
                               "linger.ms": 5, "client.id": f"active-{i}"}) for i in range(args.active_producers)]
        for p in producers:
            p.list_topics(topic=topic, timeout=10)
        filler = os.urandom(max(0, args.size - HEADER))
        errors = [0]

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors[0] += 1

        s0 = snap(target.pid)
        sent = 0
        start = time.monotonic()
        end = start + args.seconds
        mono = time.monotonic_ns
        while True:
            now = time.monotonic()
            if now >= end:
                break
            due = int((now - start) * args.rate)
            while sent < due:
                i = sent % len(producers)
                try:
                    producers[i].produce(topic, mono().to_bytes(8, "big") + i.to_bytes(8, "big") + filler,
                                         on_delivery=on_delivery)
                except BufferError:
                    break
                sent += 1
            for p in producers:
                p.poll(0)
            time.sleep(0.001)
        for p in producers:
            p.flush(30)
        elapsed = time.monotonic() - start
        s1 = snap(target.pid)
        time.sleep(args.drain)
        stop.set()
        results = {}
        for _ in groups:
            g, n, lat = out.get(timeout=120)
            results[g] = (n, lat)
        all_lat = [x / 1e6 for _, lat in results.values() for x in lat]
        broker_cpu = s1.broker.cpu_since(s0.broker) if s1.broker and s0.broker else None

        print(f"## Fan-out: {args.groups} groups x {args.consumers} consumers, {args.active_producers} active and "
              f"{args.idle_producers} idle producers\n")
        print(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
              f"one {target.label}, {args.size} B messages, {args.rate:,} msg/s for {args.seconds} s\n")
        print("| figure | value |\n|---|---|")
        print(f"| idle producer connections up | {idle_up} |")
        print(f"| setup (idle producers connected, every group joined) s | {setup_s:.1f} |")
        print(f"| slowest group join s | {max(joins.values()):.2f} |")
        print(f"| sent msg/s (achieved) | {sent / elapsed:,.0f} |")
        print(f"| delivery errors | {errors[0]} |")
        worst = min(n for n, _ in results.values())
        print(f"| received per group, min of {len(groups)} (of {sent:,} sent) | {worst:,} |")
        print(f"| consumed msg/s, all groups | {sum(n for n, _ in results.values()) / elapsed:,.0f} |")
        print(f"| e2e p50 / p99 / max ms | {_pct(all_lat, 50) or 0:.1f} / {_pct(all_lat, 99) or 0:.1f} / "
              f"{max(all_lat, default=0):.1f} |")
        if broker_cpu is not None:
            print(f"| broker CPU % during the produce window | {100 * broker_cpu / elapsed:.0f} |")
        if worst < sent - errors[0]:
            print(f"\nA group received {worst} of {sent - errors[0]} delivered messages.")
            rc = 1
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        stop_broker(target)
        shutil.rmtree(workdir, ignore_errors=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--consumers", type=int, default=10, help="consumers per group (= the topic's partitions)")
    ap.add_argument("--idle-producers", type=int, default=1000)
    ap.add_argument("--active-producers", type=int, default=100)
    ap.add_argument("--rate", type=int, default=5000, help="messages a second, all active producers together")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--drain", type=float, default=3.0, help="seconds the consumers get after the last send")
    ap.add_argument("--setup-timeout", type=float, default=300)
    ap.add_argument("--kafka-cmd", default=os.environ.get("PYKBROKER_BENCH_KAFKA_CMD"),
                    help="run against Apache Kafka started by this script instead (bench.py --kafka-cmd)")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
