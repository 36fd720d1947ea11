#!/usr/bin/env python3
"""Share groups (KIP-932) against a classic consumer on ONE partition: how fast 1, 4 and 16
confluent-kafka ShareConsumers drain a backlog together, versus one classic Consumer.

Starts pykbroker (embedded metadata, ``group.share.enable=true``) on a free 127.0.0.1 port, produces
``--records`` records of ``--size`` bytes to a one-partition topic, then for each phase starts the
consumers (a thread each, implicit acknowledgement, ``max.poll.records``) in a new group reading from
the earliest offset and measures the time from the first record to the last, the rate, duplicates and
the broker's CPU. Every wait is bounded by ``--timeout``; the run exits 1 if a phase missed a record.

With ``--ack-samples N`` it then measures the acknowledgement round trip: one ShareConsumer in explicit
acknowledgement mode takes one record per poll (``max.poll.records=1``), ACCEPTs it and times
``commit_sync()``, which sends ShareAcknowledge and returns when the broker answered (after the new state
is appended to ``__share_group_state``, and fsync'd with ``--flush-on-ack``); p50/p90/p99/max over N.
``--skip-throughput`` runs only that.

    .venv/bin/python bench/share_bench.py [--records 20000] [--size 100] [--consumers 1,4,16]
        [--max-poll-records 500] [--timeout 40] [--ack-samples 2000] [--flush-on-ack] [--skip-throughput]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib.brokers import free_port, wait_port
from benchlib.console import err_str, pct
from benchlib.procstats import snap


def _produce(bootstrap: str, topic: str, n: int, size: int) -> float:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "linger.ms": 5,
                  "batch.num.messages": 1000})
    payload = b"x" * size
    t0 = time.monotonic()
    for i in range(n):
        while True:
            try:
                p.produce(topic, key=str(i).encode(), value=payload)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(60) != 0:
        raise SystemExit("produce did not finish")
    return time.monotonic() - t0


def _set_earliest(bootstrap: str, group: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=20)


def _phase(bootstrap: str, topic: str, n: int, consumers: int, share: bool, max_poll: int, timeout: float,
           broker_pid: int | None) -> dict[str, Any]:
    from confluent_kafka import Consumer, ShareConsumer

    group = f"bench-{uuid.uuid4().hex[:8]}"
    if share:
        _set_earliest(bootstrap, group)
    seen: list[list[int]] = [[] for _ in range(consumers)]
    lock = threading.Lock()
    total = [0]
    first: list[float] = []
    done = threading.Event()
    clients: list[Any] = []
    for _ in range(consumers):
        conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "broker.address.family": "v4", "group.id": group}
        if share:
            conf["max.poll.records"] = max_poll
            c: Any = ShareConsumer(conf)
        else:
            conf.update({"auto.offset.reset": "earliest", "enable.auto.commit": False})
            c = Consumer(conf)
        c.subscribe([topic])
        clients.append(c)

    def run(i: int) -> None:
        c = clients[i]
        deadline = time.monotonic() + timeout
        while not done.is_set() and time.monotonic() < deadline:
            if share:
                msgs = [m for m in c.poll(0.2) if m.error() is None]
            else:
                msgs = [m for m in c.consume(max_poll, 0.2) if m.error() is None]
            if not msgs:
                continue
            offsets = [m.offset() for m in msgs]
            with lock:
                if not first:
                    first.append(time.monotonic())
                seen[i].extend(offsets)
                total[0] += len(offsets)
                if total[0] >= n:
                    done.set()

    s0 = snap(broker_pid)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    end = time.monotonic()
    s1 = snap(broker_pid)
    for c in clients:
        try:
            c.close()
        except Exception as e:  # report, keep the other phases
            print(f"close failed: {err_str(e)}", file=sys.stderr)
    everything = [o for v in seen for o in v]
    elapsed = end - first[0] if first else float("nan")
    cpu = None
    if s0.broker is not None and s1.broker is not None:
        cpu = s1.broker.cpu_since(s0.broker)
    return {"kind": "share" if share else "classic", "consumers": consumers, "received": len(everything),
            "distinct": len(set(everything)), "missing": n - len(set(everything)),
            "duplicates": len(everything) - len(set(everything)), "seconds": elapsed,
            "rate": len(set(everything)) / elapsed if first else 0.0,
            "busy_consumers": sum(1 for v in seen if v), "broker_cpu_s": cpu}


def _ack_round_trips(bootstrap: str, topic: str, samples: int, timeout: float) -> dict[str, Any]:
    """Time ``commit_sync()`` (one ShareAcknowledge round trip) after ACCEPTing each single-record poll."""
    from confluent_kafka import AcknowledgeType, ShareConsumer

    group = f"bench-ack-{uuid.uuid4().hex[:8]}"
    _set_earliest(bootstrap, group)
    c = ShareConsumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "group.id": group,
                       "share.acknowledgement.mode": "explicit", "max.poll.records": 1})
    c.subscribe([topic])
    warmup = min(50, samples // 10)
    rtts: list[float] = []
    failed = 0
    deadline = time.monotonic() + timeout
    try:
        while len(rtts) < samples + warmup and time.monotonic() < deadline:
            msgs = [m for m in c.poll(0.5) if m.error() is None]
            if not msgs:
                continue
            for m in msgs:
                c.acknowledge(m, AcknowledgeType.ACCEPT)
            t0 = time.perf_counter()
            result = c.commit_sync(20)
            rtts.append((time.perf_counter() - t0) * 1000)
            failed += sum(1 for e in result.values() if e is not None)
    finally:
        c.close()
    ms = rtts[warmup:]
    return {"samples": len(ms), "failed": failed, "p50": pct(ms, 50), "p90": pct(ms, 90),
            "p99": pct(ms, 99), "max": max(ms) if ms else None,
            "mean": sum(ms) / len(ms) if ms else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--consumers", default="1,4,16")
    ap.add_argument("--max-poll-records", type=int, default=500)
    ap.add_argument("--timeout", type=float, default=40.0)
    ap.add_argument("--ack-samples", type=int, default=0,
                    help="measure this many ShareAcknowledge round trips with one consumer (0: skip)")
    ap.add_argument("--flush-on-ack", action="store_true", help="run the broker with log.flush.on.ack=true")
    ap.add_argument("--skip-throughput", action="store_true", help="skip the 1/4/16 consumer drain phases")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="share-bench-")
    port = free_port()
    cmd = [sys.executable, "-m", "pykbroker", "serve", "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
           "--override", f"log.dirs={workdir}/logs", "--override", "group.share.enable=true",
           "--override", "group.initial.rebalance.delay.ms=0"]
    if args.flush_on_ack:
        cmd += ["--override", "log.flush.on.ack=true"]
    log = open(os.path.join(workdir, "broker.log"), "wb")  # noqa: SIM115 - owned by the broker process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    failed = False
    try:
        wait_port("127.0.0.1", port, 30, proc)
        bootstrap = f"127.0.0.1:{port}"
        from confluent_kafka.admin import AdminClient, NewTopic

        topic = f"share-bench-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=20)
        secs = _produce(bootstrap, topic, args.records, args.size)
        print(f"produced {args.records} x {args.size} B in {secs:.1f} s", flush=True)
        rows = []
        if not args.skip_throughput:
            rows.append(_phase(bootstrap, topic, args.records, 1, False, args.max_poll_records, args.timeout,
                               proc.pid))
            for k in [int(x) for x in args.consumers.split(",") if x]:
                rows.append(_phase(bootstrap, topic, args.records, k, True, args.max_poll_records, args.timeout,
                                   proc.pid))
        if args.ack_samples > 0:
            if args.ack_samples > args.records:
                raise SystemExit("--ack-samples needs at least as many --records")
            a = _ack_round_trips(bootstrap, topic, args.ack_samples, args.timeout)
            fsync = "on" if args.flush_on_ack else "off"
            print(f"acknowledgement round trip (commit_sync, 1 record, fsync {fsync}): {a['samples']} samples, "
                  f"mean {a['mean']:.2f} ms, p50 {a['p50']:.2f} ms, p90 {a['p90']:.2f} ms, p99 {a['p99']:.2f} ms, "
                  f"max {a['max']:.2f} ms, {a['failed']} failed" if a["samples"] else
                  "acknowledgement round trip: no samples", flush=True)
            failed |= a["samples"] < args.ack_samples or a["failed"] > 0
        if rows:
            print("| consumers | kind | records/s | seconds | missing | duplicates | consumers with records "
                  "| broker CPU s |")
            print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            cpu = f"{r['broker_cpu_s']:.1f}" if r["broker_cpu_s"] is not None else "-"
            print(f"| {r['consumers']} | {r['kind']} | {r['rate']:,.0f} | {r['seconds']:.2f} | {r['missing']} "
                  f"| {r['duplicates']} | {r['busy_consumers']} | {cpu} |")
            failed |= r["missing"] > 0
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
