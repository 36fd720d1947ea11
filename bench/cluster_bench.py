#!/usr/bin/env python3
"""Cluster-mode figures: controller failover, creating partitions, metadata at scale.

Starts a real ZooKeeper (Debian's package) and three pykbroker brokers as subprocesses on free
127.0.0.1 ports (the same harness as tests/cluster), then measures:

1. controller failover: kill -9 of the controller broker -> a new /controller znode, and -> the
   next successful leadership change (every partition the dead broker led has a live leader in a
   surviving broker's Metadata); also with SIGTERM (controlled shutdown, which resigns at once);
2. time to create 1,000 partitions (one CreateTopics, RF 1 and RF 3) until every broker's Metadata
   shows a leader for each;
3. Metadata latency with 10,000 partitions in the cluster (all topics, and one topic), p50/p99 over
   repeated raw Metadata v12 requests on one connection.

    .venv/bin/python bench/cluster_bench.py [--session-timeout-ms 6000] [--partitions 10000] [--repeat 3]

Every wait is bounded; prints a Markdown table (median and max over ``--repeat`` failover rounds, each
on a fresh cluster).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kazoo.client import KazooClient  # noqa: E402

from pykbroker.metadata import zk_layout  # noqa: E402
from tests.support.cluster import Cluster, metadata, read_frame, request_frame, wait_for  # noqa: E402


def create_topic(bootstrap: str, name: str, partitions: int, rf: int, timeout: float = 120.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name, partitions, rf)], request_timeout=timeout, operation_timeout=timeout)
    for f in fs.values():
        f.result(timeout=timeout)


def all_led(cluster: Cluster, topic: str, partitions: int, exclude: tuple[int, ...] = ()) -> bool:
    for i in cluster.running():
        try:
            md = metadata(cluster.broker(i).bootstrap, [topic], timeout=30)
        except OSError:
            return False
        parts = [p for t in md.topics for p in t.partitions]
        if len(parts) != partitions or any(p.leader_id < 0 or p.leader_id in exclude for p in parts):
            return False
    return True


def controller_znode(zk: KazooClient) -> int | None:
    try:
        data, _ = zk.get(zk_layout.CONTROLLER)
    except Exception:  # absent while nobody is controller
        return None
    return zk_layout.decode_controller(data)


def bench_failover(base: Path, session_ms: int, how: str) -> dict[str, float]:
    with Cluster(base, 3, overrides={"zookeeper.session.timeout.ms": str(session_ms)}) as cluster:
        topic = f"fo-{uuid.uuid4().hex[:6]}"
        create_topic(cluster.broker(1).bootstrap, topic, 30, 3)
        wait_for(partial(all_led, cluster, topic, 30), timeout=60, what="leaders")
        zk = KazooClient(hosts=cluster.zk.connect)
        zk.start(10)
        try:
            old = wait_for(lambda: controller_znode(zk), timeout=30, what="a controller")
            t0 = time.monotonic()
            if how == "kill -9":
                cluster.kill(old)
            else:
                cluster.broker(old).proc.send_signal(15)  # type: ignore[union-attr]
            new = wait_for(lambda: (c := controller_znode(zk)) not in (None, old) and c, timeout=120,
                           interval=0.01, what="a new controller")
            t_controller = time.monotonic() - t0
            wait_for(partial(all_led, cluster, topic, 30, exclude=(old,)), timeout=120, interval=0.02,
                     what="leaders moved")
            t_leaders = time.monotonic() - t0
            assert new != old
        finally:
            zk.stop()
            zk.close()
        return {"new controller s": t_controller, "leaders moved s": t_leaders}


def bench_create(base: Path, partitions: int) -> dict[str, float]:
    out = {}
    with Cluster(base, 3) as cluster:
        for rf in (1, 3):
            topic = f"cr{rf}-{uuid.uuid4().hex[:6]}"
            t0 = time.monotonic()
            create_topic(cluster.broker(1).bootstrap, topic, partitions, rf)
            t_ack = time.monotonic() - t0
            wait_for(partial(all_led, cluster, topic, partitions), timeout=300, interval=0.05,
                     what="leaders everywhere")
            out[f"RF {rf}: CreateTopics answered s"] = t_ack
            out[f"RF {rf}: led on every broker s"] = time.monotonic() - t0
    return out




def metadata_latency(bootstrap: str, topics: list[str] | None, rounds: int) -> tuple[float, float, int]:
    host, port = bootstrap.rsplit(":", 1)
    times = []
    size = 0
    body = {"topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
    with socket.create_connection((host, int(port)), timeout=60) as s:
        for i in range(rounds):
            t0 = time.perf_counter()
            s.sendall(request_frame(3, 12, body, i + 1, client_id="bench"))
            size = len(read_frame(s))
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, percentile(times, 99) * 1000, size


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 50 samples is the largest)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def bench_metadata(base: Path, total: int, rf: int, rounds: int) -> dict[str, float]:
    out: dict[str, float] = {}
    per_topic = min(1000, total)
    with Cluster(base, 3) as cluster:
        topics = [f"md{i}-{uuid.uuid4().hex[:4]}" for i in range(max(1, total // per_topic))]
        total = per_topic * len(topics)
        t0 = time.monotonic()
        for t in topics:
            create_topic(cluster.broker(1).bootstrap, t, per_topic, rf)
        for t in topics:
            wait_for(partial(all_led, cluster, t, per_topic), timeout=600, what="leaders")
        out[f"create {total} partitions (RF {rf}, {len(topics)} topics of {per_topic}) s"] = time.monotonic() - t0
        p50, p99, size = metadata_latency(cluster.broker(2).bootstrap, None, rounds)
        out[f"Metadata v12 all topics ({total} partitions RF {rf}, {size / 1e6:.2f} MB) p50 ms"] = p50
        out[f"Metadata v12 all topics ({total} partitions RF {rf}) p99 ms"] = p99
        p50, p99, _ = metadata_latency(cluster.broker(2).bootstrap, [topics[0]], rounds * 4)
        out[f"Metadata v12 one topic ({per_topic} partitions) p50 ms"] = p50
        out[f"Metadata v12 one topic ({per_topic} partitions) p99 ms"] = p99
        p50, p99, _ = metadata_latency(cluster.broker(2).bootstrap, [], rounds * 4)
        out["Metadata v12 no topics (brokers + controller only) p50 ms"] = p50
        out["Metadata v12 no topics p99 ms"] = p99
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--session-timeout-ms", type=int, default=6000, help="zookeeper.session.timeout.ms")
    ap.add_argument("--repeat", type=int, default=3, help="failover rounds per signal (a fresh cluster each)")
    ap.add_argument("--partitions", type=int, default=10000, help="total partitions for the Metadata figures")
    ap.add_argument("--metadata-rf", type=int, default=1, help="replication factor of the Metadata topics")
    ap.add_argument("--metadata-rounds", type=int, default=50, help="Metadata requests for all topics "
                    "(4x as many for one topic / none)")
    ap.add_argument("--create-partitions", type=int, default=1000)
    ap.add_argument("--only", default="failover,create,metadata")
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="pykb-cluster-bench-") as tmp:
        base = Path(tmp)
        if "failover" in only:
            for how in ("kill -9", "SIGTERM"):
                runs: dict[str, list[float]] = {}
                for rnd in range(args.repeat):
                    r = bench_failover(base / f"fo-{how[:4]}-{rnd}", args.session_timeout_ms, how)
                    for k, v in r.items():
                        runs.setdefault(k, []).append(v)
                    print(f"controller failover {how} round {rnd}: {r}", file=sys.stderr, flush=True)
                for k, vs in runs.items():
                    rows.append((f"controller failover ({how}, session {args.session_timeout_ms} ms): {k}, "
                                 f"median / max of {len(vs)}", f"{statistics.median(vs):.3f} / {max(vs):.3f}"))
        if "create" in only:
            rows += [(f"create {args.create_partitions} partitions, {k}", f"{v:.3f}")
                     for k, v in bench_create(base / "create", args.create_partitions).items()]
        if "metadata" in only:
            rows += [(k, f"{v:.3f}") for k, v in
                     bench_metadata(base / "md", args.partitions, args.metadata_rf, args.metadata_rounds).items()]
    lines = [f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
             f"Python {platform.python_version()}", "", "| measurement | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    print("\n" + "\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
