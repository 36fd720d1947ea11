#!/usr/bin/env python3
"""Offset-commit figures: synchronous commits from many consumer groups at once, with and without
``log.flush.on.ack``.

Starts each broker of ``--brokers`` (pykbroker, pykbroker-fsync, or kafka / kafka-fsync with
``--kafka-cmd``, as bench.py does) on a free 127.0.0.1 port, creates a one-partition topic, then runs
``--groups`` confluent-kafka consumers, each in a group of its own and in a thread of its own, that commit
an ever larger offset synchronously (``commit(asynchronous=False)``, no group membership: a "simple"
consumer's commit, as Kafka allows) as fast as they can for ``--seconds``.  Each group hashes to its own
``__consumer_offsets`` partition or shares one; with ``log.flush.on.ack`` every commit is answered only
once its record is on disk.

Figures: commits a second over all groups, commit latency p50 / p99 / max, broker CPU seconds per
thousand commits, and how many commits were answered with a retriable error (NOT_COORDINATOR while an
offsets partition loads, for instance) and made again, as an application would.  Every loop is bounded
by ``--seconds``; the run exits 1 if a commit failed with an error that is not retriable.

    .venv/bin/python bench/commit_bench.py [--brokers pykbroker,pykbroker-fsync] [--groups 20]
        [--seconds 10] [--pykbroker-bin PATH] [--pykbroker-override KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.brokers import Target, add_target_args, run_each_target
from benchlib.console import err_str, fmt, pct
from benchlib.phases import create_topic
from benchlib.procstats import snap


def _committer(bootstrap: str, topic: str, group: str, seconds: float, ready: threading.Semaphore,
               start: threading.Event, latencies: list[float], errors: list[str], retried: list[str]) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "socket.nagle.disable": True})
    signalled = False
    try:
        offset, deadline = 0, None  # offset 0 is the unmeasured first commit: coordinator found, connected
        for _ in range(10_000_000):
            t0 = time.perf_counter()
            if deadline is not None and t0 >= deadline:
                break
            try:
                c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if err is not None and err.retriable() and len(retried) < 10_000:
                    retried.append(group)  # as an application does: commit again (counted, not timed)
                    time.sleep(0.01)
                    continue
                errors.append(f"{group}: {e}")
                return
            if deadline is None:
                ready.release()
                signalled = True
                start.wait(60)
                deadline = time.perf_counter() + seconds
            else:
                latencies.append(time.perf_counter() - t0)
            offset += 1
    except Exception as e:  # reported; the run exits 1
        errors.append(f"{group}: {err_str(e)}")
    finally:
        if not signalled:  # failed before its first commit: the run does not wait for it
            ready.release()
        c.close()


def run(target: Target, args: argparse.Namespace) -> dict[str, object]:
    topic = f"commits-{uuid.uuid4().hex[:8]}"
    create_topic(target, topic, 1, 60)  # returns once ListOffsets answers for the partition
    per_group: list[list[float]] = [[] for _ in range(args.groups)]
    errors: list[str] = []
    retried: list[str] = []  # groups, once per retriable error (NOT_COORDINATOR while offsets load, ...)
    ready = threading.Semaphore(0)  # one release per consumer, once its first commit is answered (or failed)
    start = threading.Event()
    run_id = uuid.uuid4().hex[:6]
    threads = [threading.Thread(target=_committer, daemon=True,
                                args=(target.bootstrap, topic, f"bench-{run_id}-{i}", args.seconds, ready, start,
                                      per_group[i], errors, retried))
               for i in range(args.groups)]
    for t in threads:
        t.start()
    waited_until = time.monotonic() + 60
    for _ in range(args.groups):  # every consumer has found its coordinator (bounded: 60 s in all)
        ready.acquire(timeout=max(0.0, waited_until - time.monotonic()))
    s0 = snap(target.pid)
    start.set()
    for t in threads:
        t.join(args.seconds + 60)
    s1 = snap(target.pid)
    lat = sorted(x for g in per_group for x in g)
    n = len(lat)
    elapsed = s1.t - s0.t
    cpu = s1.broker.cpu_since(s0.broker) if s0.broker and s1.broker else None
    return {
        "broker": target.label,
        "commits": n,
        "commits/s": n / elapsed if elapsed > 0 else 0.0,
        "p50 ms": (pct(lat, 50) or 0) * 1000,
        "p99 ms": (pct(lat, 99) or 0) * 1000,
        "max ms": (lat[-1] if lat else 0) * 1000,
        "broker CPU-s / 1,000 commits": cpu / n * 1000 if cpu is not None and n else None,
        "broker CPU %": cpu / elapsed * 100 if cpu is not None and elapsed > 0 else None,
        "errors": errors[:5],
        "retried": len(retried),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=10.0)
    add_target_args(ap, "pykbroker,pykbroker-fsync")
    args = ap.parse_args(argv)

    def measure(t: Target) -> tuple[list[str], bool]:
        r = run(t, args)
        if r.get("error") or r["errors"]:
            return [f"| {t.label} | failed: {r.get('error') or r['errors']} |"], True
        cpu_k, cpu_pct = r["broker CPU-s / 1,000 commits"], r["broker CPU %"]
        return [f"| {t.label} | {args.groups} | {r['commits/s']:,.0f} | {r['p50 ms']:.2f} | {r['p99 ms']:.2f} | "
                f"{r['max ms']:.1f} | {fmt(cpu_k, 3)} | {fmt(cpu_pct, 0)} | {r['retried']} |"], False

    return run_each_target(args, "pykbroker-commit-bench-", [
        "| broker | groups | commits/s | p50 ms | p99 ms | max ms | broker CPU-s / 1,000 commits | broker CPU % "
        "| retried |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"], measure)


if __name__ == "__main__":
    sys.exit(main())
