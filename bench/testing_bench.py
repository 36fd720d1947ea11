"""How long pykbroker's test harness (pykbroker.testing, docs/testing.md) makes a test session wait: a broker's
start (until it answers Metadata) and stop (SIGTERM until it exited and its directory is gone), a per-test topic's
create and delete, and optionally the three-broker cluster with ZooKeeper; and the CPU time the processes used
from start to exit (steadier than wall time on a shared machine). Prints a Markdown table.

    .venv/bin/python bench/testing_bench.py --runs 5 [--cluster-runs 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pykbroker.testing import Broker
from pykbroker.testing.cluster import Cluster, ZooKeeperUnavailable


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def children_cpu() -> float:
    """User and system CPU seconds of the child processes that have exited (and been waited for) so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def row(what: str, samples: list[float]) -> str:
    return (f"| {what} | {len(samples)} | {statistics.median(samples):.2f} | {min(samples):.2f} | "
            f"{max(samples):.2f} |")


def bench_broker(runs: int, topics: int) -> list[str]:
    start, stop, create, delete, cpu = [], [], [], [], []
    for _ in range(runs):
        cpu_before = children_cpu()
        broker = Broker()
        start.append(timed(broker.start))
        try:
            for _ in range(topics):
                t0 = time.perf_counter()
                name = broker.create_topic(partitions=1)
                t1 = time.perf_counter()
                broker.delete_topic(name)
                create.append(t1 - t0)
                delete.append(time.perf_counter() - t1)
        finally:
            stop.append(timed(broker.stop))
        cpu.append(children_cpu() - cpu_before)
        if broker.base_dir is not None or broker.running():
            raise SystemExit("the broker was not stopped and removed")
    return [row("broker start (pykbroker_broker setup)", start), row("broker stop (pykbroker_broker teardown)", stop),
            row("topic create (pykbroker_topic setup)", create), row("topic delete (pykbroker_topic teardown)", delete),
            row(f"broker process CPU, start to exit ({topics} topics), user+sys", cpu)]


def bench_cluster(runs: int) -> list[str]:
    start, stop, cpu = [], [], []
    for _ in range(runs):
        cpu_before = children_cpu()
        cluster = Cluster(3)
        try:
            start.append(timed(cluster.start))
        except ZooKeeperUnavailable as e:
            return [f"(cluster not measured: {e})"]
        stop.append(timed(cluster.stop))
        cpu.append(children_cpu() - cpu_before)
    return [row("3 brokers + ZooKeeper start (pykbroker_cluster setup)", start),
            row("3 brokers + ZooKeeper stop (pykbroker_cluster teardown)", stop),
            row("3 brokers + ZooKeeper CPU, start to exit, user+sys", cpu)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="broker starts and stops")
    parser.add_argument("--topics", type=int, default=5, help="topics created and deleted per broker")
    parser.add_argument("--cluster-runs", type=int, default=0, help="cluster starts and stops (0: none)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    lines = bench_broker(args.runs, args.topics)
    if args.cluster_runs:
        lines += bench_cluster(args.cluster_runs)
    load_after = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}; "
          f"1-min load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print()
    print("| what | runs | median s | min s | max s |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
