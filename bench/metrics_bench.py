#!/usr/bin/env python3
"""What Prometheus scraping costs (scraping every second should cost under 2 % of throughput).

Starts one pykbroker with ``pykbroker.metrics.listener`` set, then alternates rounds with the
scraper off and on: a separate process fetching /metrics every ``--interval`` seconds, as
Prometheus would. Each round produces ``--count`` messages of ``--size`` bytes (confluent-kafka,
acks=1) into a fresh topic of ``--partitions`` partitions and consumes them back, through bench.py's
own phases. A consumer group commits during the run, so the lag rows are part of every scrape.
Prints produce and consume msg/s (medians over rounds) with and without scraping, the difference,
and the scrape duration and size.

    .venv/bin/python bench/metrics_bench.py [--count 1000000] [--size 100] [--partitions 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.brokers import free_port, start_broker, stop_broker, venv_bin
from benchlib.phases import Scenario, create_topic, phase_consume, phase_produce
from benchlib.procstats import proc_cpu_rss
from confluent_kafka.admin import AdminClient

import bench


def scraper(url: str, interval: float, stop: Any, out: Any) -> None:
    durations: list[float] = []
    size = 0
    failures = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                size = len(r.read())
            durations.append(time.perf_counter() - t0)
        except OSError:
            failures += 1
        stop.wait(max(0.0, interval - (time.perf_counter() - t0)))
    out.put((durations, size, failures))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    ap.add_argument("--phase-timeout", type=float, default=300)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="broker setting, e.g. pykbroker.metrics.partition.series=false")
    args = ap.parse_args()
    bench_args = bench.parse_args(["--bootstrap", "unused", "--phase-timeout", str(args.phase_timeout)])
    workdir = tempfile.mkdtemp(prefix="pykbroker-metrics-bench-")
    port, mport = free_port(), free_port()
    exe = venv_bin("pykbroker") or "pykbroker"
    cmd = [exe, "serve", "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
           "--override", f"log.dirs={workdir}/data", "--override", f"pykbroker.metrics.listener=http://127.0.0.1:{mport}"]
    for ov in args.override:
        cmd += ["--override", ov]
    target = start_broker("pykbroker", cmd, port, workdir, None)
    if target.dead:
        print("\n".join(target.notes), file=sys.stderr)
        return 1
    url = f"http://127.0.0.1:{mport}/metrics"
    figures: dict[str, dict[str, list[float]]] = {"off": {"produce": [], "consume": []},
                                                   "on": {"produce": [], "consume": []}}
    scrape_ms: list[float] = []
    scrape_bytes = 0
    per_scrape_ms: float | None = None
    scrape_body = b""
    try:
        admin = AdminClient({"bootstrap.servers": target.bootstrap})
        for r in range(args.rounds):
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                topic = f"metrics-bench-{uuid.uuid4().hex[:8]}"
                create_topic(target, topic, args.partitions, 30)
                sc = Scenario(size=args.size, acks="1", partitions=args.partitions, count=args.count)
                stop = mp.Event()
                out: Any = mp.Queue()
                proc = mp.Process(target=scraper, args=(url, args.interval, stop, out)) if mode == "on" else None
                if proc is not None:
                    proc.start()
                try:
                    p = phase_produce(target, sc, topic, bench_args)
                    c = phase_consume(target, sc, topic, p["delivered"], bench_args)
                finally:
                    if proc is not None:
                        stop.set()
                        durations, size, failures = out.get(timeout=30)
                        proc.join(10)
                        scrape_ms += [d * 1000 for d in durations]
                        scrape_bytes = max(scrape_bytes, size)
                        if failures:
                            print(f"  {failures} scrapes failed", file=sys.stderr)
                for phase, res in (("produce", p), ("consume", c)):
                    if res.get("error"):
                        print(f"round {r} {mode} {phase}: {res['error']}", file=sys.stderr)
                        return 1
                    figures[mode][phase].append(res["msgs_per_s"])
                print(f"round {r + 1} scrape {mode:>3}: produce {p['msgs_per_s']:,.0f} msg/s, "
                      f"consume {c['msgs_per_s']:,.0f} msg/s", flush=True)
                admin.delete_topics([topic], operation_timeout=30)
        # The cost of one scrape in broker CPU, measured at idle (no traffic to blur it), with a topic of
        # --partitions partitions (each partition adds its series).
        create_topic(target, f"metrics-bench-idle-{uuid.uuid4().hex[:8]}", args.partitions, 60)
        idle_scrapes = 50
        # /proc/PID/stat, not per-thread schedstat: prometheus_client serves each scrape on a new thread,
        # whose time would be lost with the thread; the process total keeps it.
        assert target.pid is not None
        c0 = proc_cpu_rss(target.pid)[0]
        for _ in range(idle_scrapes):
            with urllib.request.urlopen(url, timeout=30) as r:
                scrape_body = r.read()
        per_scrape_ms = (proc_cpu_rss(target.pid)[0] - c0) * 1000 / idle_scrapes
    finally:
        stop_broker(target)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"{args.rounds} rounds of {args.count:,} x {args.size} B, {args.partitions} partition(s), "
          f"scrape every {args.interval:g} s")
    print("| phase | no scraping (msg/s) | scraping (msg/s) | difference |")
    print("|---|---|---|---|")
    for phase in ("produce", "consume"):
        off = statistics.median(figures["off"][phase])
        on = statistics.median(figures["on"][phase])
        print(f"| {phase} | {off:,.0f} | {on:,.0f} | {100 * (on - off) / off:+.1f} % |")
    if per_scrape_ms is not None:
        print(f"broker CPU per scrape (idle, {idle_scrapes} scrapes, {len(scrape_body)/1000:.0f} kB each): "
              f"{per_scrape_ms:.2f} ms, i.e. "
              f"{per_scrape_ms / 10 / args.interval:.2f} % of one core at one scrape every {args.interval:g} s")
    if scrape_ms:
        scrape_ms.sort()
        print(f"scrapes: {len(scrape_ms)}, duration p50 {statistics.median(scrape_ms):.1f} ms, "
              f"max {scrape_ms[-1]:.1f} ms, {scrape_bytes:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
