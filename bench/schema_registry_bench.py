"""What the built-in schema registry costs: registrations and lookups per second with their latencies, on one
broker (pykbroker.testing.Broker) with ``pykbroker.schema.registry.listener`` on, and what a steady lookup load
does to a producer on the same broker's Kafka listener. Prints Markdown tables.

    .venv/bin/python bench/schema_registry_bench.py --schemas 2000 --lookups 20000 --threads 4

Phases:
1. register ``--schemas`` distinct Avro schemas, one subject each (``POST /subjects/{s}/versions``), from
   ``--threads`` clients with keep-alive connections;
2. evolve one subject through ``--versions`` versions under BACKWARD_TRANSITIVE (each version adds an optional
   field, so each registration checks every earlier version);
3. look up ``--lookups`` times each: a schema by id (``GET /schemas/ids/{id}``, what a deserializer asks once
   per id it has not cached), and a subject's schema (``POST /subjects/{s}``, what a serializer asks with
   ``auto.register.schemas=false``);
4. produce ``--messages`` 100 B records (acks=1) alone, then again while other threads look up schemas at
   ``--lookup-rate`` per second from another process (serializers cache ids, so a real load is a trickle); the
   produce rate and the broker's CPU per million messages side by side.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pykbroker.testing import Broker
from pykbroker.testing.broker import free_port

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


def avro_record(name: str, optional_fields: int = 0) -> str:
    fields = [{"name": "id", "type": "long"}, {"name": "payload", "type": "string"}]
    fields += [{"name": f"extra{i}", "type": ["null", "string"], "default": None} for i in range(optional_fields)]
    return json.dumps({"type": "record", "name": name, "namespace": "bench", "fields": fields})


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else float("nan")


def broker_cpu_s(pid: int) -> float:
    """CPU seconds of the broker process (utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_threads(threads: int, count: int, call: Callable[[httpx.Client, int], None],
                base_url: str) -> tuple[float, list[float]]:
    """``count`` calls spread over ``threads`` clients; (wall seconds, each call's latency in seconds)."""
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(first: int) -> None:
        mine: list[float] = []
        with httpx.Client(base_url=base_url, timeout=30, headers={"Content-Type": CONTENT_TYPE}) as client:
            for i in range(first, count, threads):
                t0 = time.perf_counter()
                try:
                    call(client, i)
                except BaseException as e:  # reported after the phase
                    errors.append(e)
                    return
                mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} calls failed, the first: {errors[0]!r}")
    return wall, latencies


def row(name: str, wall: float, latencies: list[float]) -> str:
    n = len(latencies)
    return (f"| {name} | {n:,} | {n / wall:,.0f} | {percentile(latencies, 0.5) * 1000:.2f} | "
            f"{percentile(latencies, 0.99) * 1000:.2f} |")


def expect(response: httpx.Response, what: str) -> httpx.Response:
    if response.status_code != 200:
        raise RuntimeError(f"{what}: HTTP {response.status_code} {response.text[:200]}")
    return response


def produce(bootstrap: str, topic: str, messages: int) -> float:
    """msg/s of one producer sending ``messages`` 100 B records as fast as it can."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1, "enable.idempotence": False})
    payload = b"x" * 100
    t0 = time.perf_counter()
    for _ in range(messages):
        while True:
            try:
                p.produce(topic, payload)
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError("the producer did not deliver everything in 120 s")
    rate = messages / (time.perf_counter() - t0)
    del p  # its connections close now, not after the broker has stopped
    return rate


def trickle(url: str, ids: list[int], rate: float, stop: Any, count: Any) -> None:
    """GET /schemas/ids/{id} at ``rate`` a second until ``stop`` is set (run in a process of its own)."""
    interval = 1 / rate
    with httpx.Client(base_url=url, timeout=30) as client:
        next_at = time.perf_counter()
        i = 0
        while not stop.is_set():
            expect(client.get(f"/schemas/ids/{ids[i % len(ids)]}"), "GET /schemas/ids")
            i += 1
            with count.get_lock():
                count.value += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.perf_counter()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schemas", type=int, default=2000, help="distinct schemas registered, one subject each")
    ap.add_argument("--versions", type=int, default=50, help="versions of the evolved subject")
    ap.add_argument("--lookups", type=int, default=20000, help="lookups of each kind")
    ap.add_argument("--threads", type=int, default=4, help="concurrent HTTP clients")
    ap.add_argument("--messages", type=int, default=1_000_000, help="records of each produce run")
    ap.add_argument("--lookup-rate", type=float, default=500, help="lookups per second beside the producer")
    args = ap.parse_args()

    url = f"http://127.0.0.1:{free_port()}"
    with Broker({"pykbroker.schema.registry.listener": url, "num.partitions": "1"}, start_timeout=120) as broker:
        print(f"pykbroker {broker.bootstrap_servers}, registry {url}; {platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs, Python {platform.python_version()}\n")
        ids: list[int] = []
        ids_lock = threading.Lock()

        def register(client: httpx.Client, i: int) -> None:
            body = {"schema": avro_record(f"R{i}")}
            r = expect(client.post(f"/subjects/bench-{i}-value/versions", json=body), "register")
            with ids_lock:
                ids.append(int(r.json()["id"]))

        def evolve(client: httpx.Client, i: int) -> None:
            body = {"schema": avro_record("Evolving", optional_fields=i)}
            expect(client.post("/subjects/evolving-value/versions", json=body), "evolve")

        def by_id(client: httpx.Client, i: int) -> None:
            expect(client.get(f"/schemas/ids/{ids[i % len(ids)]}"), "GET /schemas/ids")

        def lookup(client: httpx.Client, i: int) -> None:
            n = i % args.schemas
            expect(client.post(f"/subjects/bench-{n}-value", json={"schema": avro_record(f"R{n}")}), "lookup")

        with httpx.Client(base_url=url, timeout=30, headers={"Content-Type": CONTENT_TYPE}) as client:
            expect(client.put("/config/evolving-value", json={"compatibility": "BACKWARD_TRANSITIVE"}), "config")

        print("| operation | calls | per second | p50 ms | p99 ms |")
        print("|---|---:|---:|---:|---:|")
        wall, lat = run_threads(args.threads, args.schemas, register, url)
        print(row(f"register (new schema, new subject; {args.threads} clients)", wall, lat))
        wall, lat = run_threads(1, args.versions, evolve, url)
        print(row(f"register a new version, BACKWARD_TRANSITIVE over up to {args.versions - 1} versions "
                  "(1 client)", wall, lat))
        wall, lat = run_threads(args.threads, args.lookups, by_id, url)
        print(row(f"GET /schemas/ids/{{id}} ({args.threads} clients)", wall, lat))
        wall, lat = run_threads(args.threads, args.lookups, lookup, url)
        print(row(f"POST /subjects/{{s}} lookup ({args.threads} clients)", wall, lat))

        topic = "registry-bench"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            f.result(60)
        produce(broker.bootstrap_servers, topic, min(args.messages, 100_000))  # warm-up

        ids_for_lookups = list(ids)
        print(f"\n| producer, {args.messages:,} × 100 B, acks=1 | msg/s | broker CPU-s/M | lookups/s beside it |")
        print("|---|---:|---:|---:|")
        for label, with_lookups in (("alone", False), (f"beside {args.lookup_rate:g} lookups/s", True),
                                    ("alone, again", False)):
            # The lookups come from another process: in this one they would take the producer's GIL.
            stop, count = multiprocessing.Event(), multiprocessing.Value("q", 0)
            load = multiprocessing.Process(target=trickle, args=(url, ids_for_lookups, args.lookup_rate, stop, count))
            if with_lookups:
                load.start()
            cpu0, t0 = broker_cpu_s(broker.pid), time.perf_counter()
            rate = produce(broker.bootstrap_servers, topic, args.messages)
            cpu, wall = broker_cpu_s(broker.pid) - cpu0, time.perf_counter() - t0
            stop.set()
            if with_lookups:
                load.join(30)
            print(f"| {label} | {rate:,.0f} | {cpu / args.messages * 1e6:.2f} | {count.value / wall:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
