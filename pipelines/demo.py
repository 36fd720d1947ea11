"""Run the windowed-counts pipeline end to end against a local pykbroker and check its output.

    .venv/bin/python -m pipelines.demo                   # a broker already on 127.0.0.1:9092 (bash scripts/run.sh)
    .venv/bin/python -m pipelines.demo --start-broker    # start a throwaway broker for the run

It creates two fresh topics, produces generated events (JSON ``{"key", "ts"}``, slightly out of order, then one
far-future event that moves the watermark past every window), runs ``pipelines.windowed_counts`` with
Trigger.AvailableNow, reads the output topic back and compares it, record for record, with counts computed here
in Python.  It prints the throughput (input rows per second through the streaming job) and exits non-zero on any
difference.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BASE_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
FLUSH_KEY = "__flush__"


@dataclass(frozen=True)
class Event:
    key: str
    ts: int  # epoch ms

    def value(self) -> bytes:
        return json.dumps({"key": self.key, "ts": self.ts}).encode()


def generate_events(n: int, keys: int = 20, step_ms: int = 10, jitter_ms: int = 5_000, seed: int = 7) -> list[Event]:
    """n events over n*step_ms of event time, each up to jitter_ms early, then one flush event a day later."""
    rng = random.Random(seed)
    events = [
        Event(f"user-{rng.randrange(keys)}", BASE_MS + i * step_ms - rng.randrange(jitter_ms + 1))
        for i in range(n)
    ]
    events.append(Event(FLUSH_KEY, BASE_MS + n * step_ms + 86_400_000))
    return events


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expected_output(events: list[Event], window_ms: int = 60_000) -> dict[str, dict[str, Any]]:
    """What the job must write: output key -> JSON value, for every window the flush event closes."""
    counts = Counter((e.key, e.ts - e.ts % window_ms) for e in events if e.key != FLUSH_KEY)
    return {
        f"{key}|{_iso(start)}": {"count": c, "key": key, "window_end": _iso(start + window_ms),
                                 "window_start": _iso(start)}
        for (key, start), c in counts.items()
    }


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()])
    for f in futures.values():
        f.result(30)


def produce_events(bootstrap: str, topic: str, events: list[Event]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    for e in events:
        while True:
            try:
                p.produce(topic, key=e.key.encode(), value=e.value())
                break
            except BufferError:
                p.poll(0.1)
        p.poll(0)
    if p.flush(60) != 0:
        raise RuntimeError("events were not all delivered")


def read_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> list[tuple[str, str]]:
    """Every (key, value) in the topic now, read by assign to the end of every partition."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-check-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        md = c.list_topics(topic, timeout=10)
        parts = list(md.topics[topic].partitions)
        c.assign([TopicPartition(topic, p, -2) for p in parts])
        out: list[tuple[str, str]] = []
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < len(parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} took over {timeout}s")
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    done.add(int(m.partition() or 0))
                    continue
                raise RuntimeError(str(err))
            out.append(((m.key() or b"").decode(), (m.value() or b"").decode()))
        return out
    finally:
        c.close()


def compare(got: list[tuple[str, str]], want: dict[str, dict[str, Any]]) -> list[str]:
    """Differences between the output topic and the expected windows (empty when they match exactly)."""
    problems = []
    seen = Counter(k for k, _ in got)
    problems += [f"duplicate output for {k} ({n} records)" for k, n in seen.items() if n > 1]
    for k, v in got:
        if k not in want:
            problems.append(f"unexpected output {k}: {v}")
        elif json.loads(v) != want[k]:
            problems.append(f"wrong output for {k}: {v}, want {json.dumps(want[k], sort_keys=True)}")
    problems += [f"missing output for {k}" for k in want if k not in seen]
    return problems


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def throwaway_broker() -> Iterator[str]:
    """A pykbroker subprocess on a free loopback port with a temporary data directory."""
    from pykbroker.cli import healthcheck

    port = _free_port()
    data = Path(tempfile.mkdtemp(prefix="pykbroker-demo-"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pykbroker", "serve", "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
         "--override", f"log.dirs={data / 'logs'}", "--override", "group.initial.rebalance.delay.ms=0"],
        stdout=subprocess.DEVNULL, stderr=(data / "broker.log").open("wb"),
    )
    bootstrap = f"127.0.0.1:{port}"
    ok = False
    try:
        deadline = time.monotonic() + 60
        while not healthcheck(bootstrap, 1.0):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not start; see {data / 'broker.log'}")
            time.sleep(0.1)
        yield bootstrap
        ok = True
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        if ok:
            shutil.rmtree(data, ignore_errors=True)


def run_demo(spark: Any, bootstrap: str, n: int, keys: int = 20, partitions: int = 3,
             max_offsets_per_trigger: int | None = None, checkpoint_dir: Path | None = None,
             log: Any = print) -> tuple[float, list[str]]:
    """Produce, run the job, check.  Returns (rows per second through the job, differences)."""
    from pipelines.windowed_counts import JobConfig, run_available_now

    run = uuid.uuid4().hex[:8]
    events_topic, counts_topic = f"events-{run}", f"counts-{run}"
    create_topics(bootstrap, {events_topic: partitions, counts_topic: partitions})
    events = generate_events(n, keys)
    t0 = time.monotonic()
    produce_events(bootstrap, events_topic, events)
    log(f"produced {len(events)} events to {events_topic} in {time.monotonic() - t0:.1f}s")

    own_ckpt = checkpoint_dir is None
    ckpt = checkpoint_dir or Path(tempfile.mkdtemp(prefix="windowed-counts-ckpt-"))
    try:
        cfg = JobConfig(bootstrap=bootstrap, input_topic=events_topic, output_topic=counts_topic,
                        checkpoint=str(ckpt), max_offsets_per_trigger=max_offsets_per_trigger)
        stats = run_available_now(spark, cfg)
    finally:
        if own_ckpt:
            shutil.rmtree(ckpt, ignore_errors=True)
    log(f"windowed_counts: {stats.input_rows} rows in {stats.batches} micro-batches, {stats.seconds:.1f}s "
        f"= {stats.rows_per_second:.0f} rows/s ({stats.rows_per_batch_second:.0f} rows/s inside the batches, "
        f"{stats.batch_seconds:.1f}s)")
    want = expected_output(events)
    got = read_topic(bootstrap, counts_topic)
    problems = compare(got, want)
    log(f"{counts_topic}: {len(got)} window counts, {len(want)} expected, "
        f"{'all match' if not problems else f'{len(problems)} differences'}")
    return stats.rows_per_second, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--start-broker", action="store_true", help="run a throwaway pykbroker for the demo")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--max-offsets-per-trigger", type=int, default=None)
    args = ap.parse_args(argv)

    from pipelines.spark_env import ConnectorUnavailable, connector_conf, local_session
    from pykbroker.cli import healthcheck

    try:
        connector = connector_conf()
    except ConnectorUnavailable as e:
        print(f"cannot run the demo: {e}", file=sys.stderr)
        return 2

    def go(bootstrap: str) -> int:
        if not healthcheck(bootstrap, 2.0):
            print(f"no broker answers on {bootstrap}: start one (bash scripts/run.sh) or pass --start-broker",
                  file=sys.stderr)
            return 2
        print(f"Spark Kafka connector: {connector.source}")
        spark = local_session("windowed-counts-demo", connector)
        try:
            _, problems = run_demo(spark, bootstrap, args.events, args.keys, args.partitions,
                                   args.max_offsets_per_trigger)
        finally:
            spark.stop()
        for p in problems[:20]:
            print(p, file=sys.stderr)
        return 1 if problems else 0

    if args.start_broker:
        with throwaway_broker() as bootstrap:
            return go(bootstrap)
    return go(args.bootstrap)


if __name__ == "__main__":
    sys.exit(main())
