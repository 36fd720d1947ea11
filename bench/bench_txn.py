#!/usr/bin/env python3
"""Produce throughput: plain vs idempotent vs transactional (commit every 100 / 1,000 messages).

``bench_txn.py`` starts pykbroker on a free 127.0.0.1 port with a fresh data directory (or uses
``--bootstrap``), then for each mode creates a topic and produces N messages with
confluent-kafka (acks=all, linger.ms=5), reporting msg/s and MB/s.  Transactional modes
begin a transaction, produce ``--commit-every`` messages and commit, until N are sent; the
time includes every commit.  Every phase has a time limit; traffic stays on loopback.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.broker import BrokerProcess


def create_topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-txn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def run_mode(
    bootstrap: str, mode: str, n: int, size: int, partitions: int, commit_every: int, limit_s: float
) -> dict[str, Any]:
    topic = create_topic(bootstrap, partitions)
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "acks": "all",
        "enable.idempotence": mode != "plain",
        "queue.buffering.max.messages": 1_000_000,
    }
    if mode == "transactional":
        conf["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    p = Producer(conf)
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    payload = b"x" * size
    started = time.perf_counter()
    deadline = started + limit_s
    if mode == "transactional":
        p.init_transactions(30)
    sent = 0
    commits = 0
    while sent < n and time.perf_counter() < deadline:
        chunk = min(commit_every if mode == "transactional" else 10_000, n - sent)
        if mode == "transactional":
            p.begin_transaction()
        for i in range(chunk):
            while True:
                try:
                    p.produce(topic, payload, partition=(sent + i) % partitions, on_delivery=on_delivery)
                    break
                except BufferError:
                    p.poll(0.01)
        p.poll(0)
        sent += chunk
        if mode == "transactional":
            p.commit_transaction(60)
            commits += 1
    remaining = p.flush(max(1.0, deadline - time.perf_counter()))
    elapsed = time.perf_counter() - started
    return {
        "mode": mode if mode != "transactional" else f"transactional/{commit_every}",
        "messages": sent,
        "seconds": round(elapsed, 2),
        "msg_per_s": round(sent / elapsed),
        "mb_per_s": round(sent * size / elapsed / 1e6, 2),
        "commits": commits,
        "errors": len(errors) + remaining,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", help="an already running broker (default: start pykbroker)")
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--limit", type=float, default=120.0, help="time limit per phase, seconds")
    args = ap.parse_args()

    broker: BrokerProcess | None = None
    tmp = tempfile.TemporaryDirectory(prefix="bench-txn-")
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = BrokerProcess(
            Path(tmp.name) / "broker",
            overrides={"transaction.state.log.num.partitions": "4", "offsets.topic.num.partitions": "4"},
        )
        broker.start()
        bootstrap = broker.bootstrap
    try:
        rows = [
            run_mode(bootstrap, "plain", args.messages, args.size, args.partitions, 0, args.limit),
            run_mode(bootstrap, "idempotent", args.messages, args.size, args.partitions, 0, args.limit),
        ]
        for every in (100, 1000):
            rows.append(
                run_mode(bootstrap, "transactional", args.messages, args.size, args.partitions, every, args.limit)
            )
    finally:
        if broker is not None:
            broker.stop()
        tmp.cleanup()
    print(f"\n{args.messages} messages x {args.size} B, {args.partitions} partitions, acks=all, linger.ms=5\n")
    print("| mode | messages | seconds | msg/s | MB/s | commits | errors |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['messages']} | {r['seconds']} | {r['msg_per_s']} | {r['mb_per_s']} | "
            f"{r['commits']} | {r['errors']} |"
        )


if __name__ == "__main__":
    main()
