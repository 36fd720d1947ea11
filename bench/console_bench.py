"""How long the web console's pages take with many partitions: a broker (pykbroker.testing.Broker) with the
console on, one topic of ``--partitions`` partitions (10,000 by default) with a record in each of the first
``--filled`` and a consumer group that committed them, then each page fetched ``--runs`` times over HTTP (as a
browser does, without rendering). Prints a Markdown table of wall times and the rows each page rendered.

    .venv/bin/python bench/console_bench.py --partitions 10000 --runs 5
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pykbroker.testing import Broker
from pykbroker.testing.broker import free_port

TOPIC, GROUP = "wide", "wide-readers"


def fetch(url: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read().decode()
    return time.perf_counter() - t0, body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--filled", type=int, default=300, help="partitions that get a record and a committed offset")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    port = free_port()
    console = f"http://127.0.0.1:{port}"
    settings = {"pykbroker.console.listener": console, "num.partitions": "1"}
    with Broker(settings, start_timeout=120) as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        t0 = time.perf_counter()
        for f in admin.create_topics([NewTopic(TOPIC, args.partitions, 1)], operation_timeout=600,
                                     request_timeout=600).values():
            f.result(900)
        created = time.perf_counter() - t0
        filled = min(args.filled, args.partitions)
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
        for i in range(filled):
            p.produce(TOPIC, b"record-%d" % i, partition=i)
        assert p.flush(300) == 0
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(TOPIC, i, 1) for i in range(filled)], asynchronous=False)
        c.close()
        pages = {"overview": "/", "topics": "/topics", "topic (first page)": f"/topics/{TOPIC}",
                 "topic (last page)": f"/topics/{TOPIC}?page={(args.partitions + 99) // 100}",
                 "messages": f"/topics/{TOPIC}/messages?partition={filled - 1}&offset=0",
                 "groups": "/groups", "group": f"/groups/{GROUP}", "broker configs": "/brokers"}
        print(f"{args.partitions} partitions, {filled} with a record and a committed offset; topic created in "
              f"{created:.0f} s; {platform.processor() or platform.machine()}, Python {platform.python_version()}\n")
        print("| page | runs | median s | max s | table rows rendered |")
        print("|---|---:|---:|---:|---:|")
        for name, path in pages.items():
            times, body = [], ""
            for _ in range(args.runs):
                took, body = fetch(console + path)
                times.append(took)
            rows = len(re.findall(r"<tr[ >]", body)) - len(re.findall(r"<thead>", body))
            print(f"| {name} | {len(times)} | {statistics.median(times):.3f} | {max(times):.3f} | {rows} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
