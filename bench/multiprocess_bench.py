#!/usr/bin/env python3
"""Produce and consume with 1 and with 2 broker processes on this host (`pykbroker serve --processes N`).

Starts a real ZooKeeper (Debian's package, as tests/cluster) and, for each process count, `pykbroker
serve --processes N` with its own chroot and data; creates a topic of ``--partitions`` partitions
(RF ``--rf``, default 1, so a partition's traffic lands on its leader only) whose leaders are spread so
each process leads its share, then:

1. produce ``--count`` records of each ``--sizes`` as fast as ``--clients`` confluent-kafka producer
   processes can (acks ``--acks``, linger.ms 5), each producing its share;
2. consume them all with ``--clients`` consumer processes, each assigned its share of the partitions
   from offset 0; every partition must give back exactly the records produced to it.

CPU is accounted for every party: the broker figure is the whole process tree of the `serve` parent
(the supervisor and its N children, /proc schedstat as in bench.py), the client figure is the sum of
the client processes' own user+system time (Python and librdkafka threads), and "other" is what the
rest of the machine used meanwhile (a noise indicator). On a machine with C cores the client and the
brokers share them, which caps what N processes can show; the table says how busy the machine was.

    flock /tmp/bench.lock .venv/bin/python bench/multiprocess_bench.py [--processes 1,2] [--sizes 100,1024]
        [--count 300000] [--count-large 100000] [--partitions 8] [--clients 2] [--repeat 1]

Exits 1 when a phase lost or duplicated records or timed out.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from benchlib.procstats import broker_usage, machine_busy, machine_facts  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tests.support.broker import free_ports  # noqa: E402
from tests.support.cluster import CLUSTER_DEFAULTS, metadata, wait_for  # noqa: E402
from tests.support.zookeeper import ZooKeeperEnsemble, zookeeper_available  # noqa: E402


def _cpu_self() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# --------------------------------------------------------------------------- client processes


def _produce_worker(bootstrap: str, topic: str, size: int, count: int, acks: str, conf: dict[str, str], go: Any,
                    out: Any) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5, "enable.idempotence": False,
                  "compression.type": "none", "broker.address.family": "v4", "log_level": 4, **conf})
    p.list_topics(topic=topic, timeout=10)  # connections and metadata outside the timed window
    payload = os.urandom(size)
    delivered = [0]
    errors: dict[str, int] = {}

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is None:
            delivered[0] += 1
        else:
            errors[err.name()] = errors.get(err.name(), 0) + 1

    go.wait(60)
    cpu0, t0 = _cpu_self(), time.monotonic()
    produce, poll = p.produce, p.poll
    sent = 0
    while sent < count and time.monotonic() - t0 < 60:
        try:
            produce(topic, payload, on_delivery=on_delivery)
        except BufferError:
            poll(0.001)
            continue
        sent += 1
        if not sent & 1023:
            poll(0)
    left = p.flush(60)
    out.put({"n": delivered[0], "errors": errors, "left": left, "t0": t0, "t1": time.monotonic(),
             "cpu": _cpu_self() - cpu0})


def _consume_worker(bootstrap: str, topic: str, expected: dict[int, int], go: Any, out: Any) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": False, "fetch.queue.backoff.ms": 1,
                  "broker.address.family": "v4", "log_level": 4})
    try:
        c.list_topics(topic=topic, timeout=10)
        go.wait(60)
        cpu0, t0 = _cpu_self(), time.monotonic()
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in expected])
        want = sum(expected.values())
        got: dict[int, int] = dict.fromkeys(expected, 0)
        total, idle_since, t_last = 0, time.monotonic(), t0
        while total < want and time.monotonic() - idle_since < 10:
            msgs = c.consume(min(10000, want - total), 0.5)
            for m in msgs:
                part = m.partition()
                if m.error() is None and part is not None:
                    got[part] += 1
                    total += 1
            if msgs:
                idle_since = t_last = time.monotonic()
        extra = sum(1 for m in c.consume(1000, 0.5) if m.error() is None)  # a duplicate would show here
        out.put({"n": total, "per_partition": got, "extra": extra, "t0": t0, "t1": t_last,
                 "cpu": _cpu_self() - cpu0})
    finally:
        c.close()


def _run_clients(pid: int, workers: list[tuple[Any, tuple[Any, ...]]]) -> dict[str, Any]:
    """Start the worker processes, let them connect, then time them together with the broker's CPU."""
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=fn, args=(*wargs, go, out), daemon=True) for fn, wargs in workers]
    for p in procs:
        p.start()
    time.sleep(2.0)  # client start-up (interpreter, librdkafka, metadata) outside the measured window
    b0, m0, w0 = broker_usage(pid), machine_busy(), time.monotonic()
    go.set()
    results = [out.get(timeout=150) for _ in procs]
    b1, m1, w1 = broker_usage(pid), machine_busy(), time.monotonic()
    for p in procs:
        p.join(10)
    t0, t1 = min(r["t0"] for r in results), max(r["t1"] for r in results)
    wall = max(t1 - t0, 1e-9)
    broker = b1.cpu_since(b0) if b0 and b1 else float("nan")
    client = sum(r["cpu"] for r in results)
    n = sum(r["n"] for r in results)
    return {"results": results, "n": n, "wall": wall, "msgs_per_s": n / wall, "broker_cpu": broker,
            # over the parent's own window (start signal to the last result), which the CPU figures span
            "client_cpu": client, "other_pct": max(0.0, 100 * ((m1 - m0) - broker - client) / (w1 - w0)),
            "machine_pct": 100 * (m1 - m0) / (w1 - w0)}


# --------------------------------------------------------------------------- brokers


def _port_run(n: int) -> int:
    """A free loopback port followed by n - 1 free ones (the helper the tests use: chosen below the
    kernel's ephemeral range, so no outgoing connection takes one before the brokers bind them)."""
    return free_ports(n)


class Host:
    """`pykbroker serve --processes N` as a subprocess."""

    def __init__(self, workdir: Path, zk: ZooKeeperEnsemble, processes: int, overrides: list[str]) -> None:
        self.processes = processes
        self.port = _port_run(processes)
        self.metrics_port = _port_run(processes)  # each process's Prometheus endpoint: requests served
        self.dir = workdir / f"p{processes}-{uuid.uuid4().hex[:6]}"
        self.dir.mkdir(parents=True)
        settings = {**CLUSTER_DEFAULTS, "zookeeper.connect": f"{zk.connect}/{self.dir.name}", "broker.id": "1",
                    "listeners": f"PLAINTEXT://127.0.0.1:{self.port}", "log.dirs": str(self.dir / "data"),
                    "offsets.topic.replication.factor": "1", "transaction.state.log.replication.factor": "1",
                    "pykbroker.metrics.listener": f"http://127.0.0.1:{self.metrics_port}"}
        args = [sys.executable, "-m", "pykbroker", "serve", "--processes", str(processes), "--log-level", "WARNING"]
        for k, v in settings.items():
            args += ["--override", f"{k}={v}"]
        for item in overrides:
            args += ["--override", item]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
        self.log_path = self.dir / "serve.log"
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, env=env)
        ids = list(range(1, processes + 1))

        def registered() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                md = metadata(self.bootstrap.split(",")[0], [])
            except (OSError, ConnectionError):
                return False
            return sorted(b.node_id for b in md.brokers) == ids and md.controller_id in ids
        wait_for(registered, timeout=60, what=f"{processes} brokers registered")

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + i}" for i in range(self.processes))

    def requests(self, api: str) -> int:
        """Requests of one API (Produce, Fetch) the brokers have answered, summed over the processes."""
        total = 0.0
        prefix = f'kafka_network_requestmetrics_requests_total{{request="{api}"'
        for i in range(self.processes):
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port + i}/metrics", timeout=10) as r:
                total += sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                             if line.startswith(prefix))
        return int(total)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                return -9
        return int(self.proc.returncode)


def _topic(host: Host, partitions: int, rf: int, config: dict[str, str]) -> tuple[str, dict[int, int]]:
    name = f"mp-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": host.bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, rf, config=config)], operation_timeout=30).values():
        f.result(30)

    def led() -> dict[int, int] | None:
        md = metadata(host.bootstrap.split(",")[0], [name])
        view = {p.partition_index: p.leader_id for t in md.topics for p in t.partitions}
        return view if len(view) == partitions and all(v > 0 for v in view.values()) else None
    return name, wait_for(led, timeout=30, what=f"leaders of {name}")


def _wait_settled(pid: int, timeout: float = 30.0) -> None:
    """Until the brokers are done becoming leaders of a new topic (its log files, leader-epoch
    checkpoints): less than 15 % of a core over half a second, bounded."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.5) + 1):
        u0 = broker_usage(pid)
        time.sleep(0.5)
        u1 = broker_usage(pid)
        if u0 is None or u1 is None or u1.cpu_since(u0) < 0.075 or time.monotonic() > deadline:
            return


def _split(items: list[int], k: int) -> list[list[int]]:
    return [items[i::k] for i in range(k) if items[i::k]]


def run_case(host: Host, size: int, args: argparse.Namespace) -> dict[str, Any]:
    topic, leaders = _topic(host, args.partitions, args.rf, args.topic_config)
    _wait_settled(host.proc.pid)
    count = args.count if size < 1024 else args.count_large
    per_client = [count // args.clients + (1 if i < count % args.clients else 0) for i in range(args.clients)]
    requests0 = host.requests("Produce")
    prod = _run_clients(host.proc.pid, [
        (_produce_worker, (host.bootstrap, topic, size, n, args.acks, args.producer_conf)) for n in per_client])
    prod["requests"] = host.requests("Produce") - requests0
    # What each partition holds now (its high watermark): consumers must return exactly that.
    probe = Consumer({"bootstrap.servers": host.bootstrap, "group.id": "mp-bench-probe"})
    try:
        hw = {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(args.partitions)}
    finally:
        probe.close()
    groups = _split(sorted(hw), args.clients)
    requests0 = host.requests("Fetch")
    cons = _run_clients(host.proc.pid, [
        (_consume_worker, (host.bootstrap, topic, {p: hw[p] for p in g})) for g in groups])
    cons["requests"] = host.requests("Fetch") - requests0
    problems = []
    if prod["n"] != count:
        problems.append(f"produced {prod['n']} of {count}: "
                        f"{[r['errors'] for r in prod['results'] if r['errors']]}")
    if sum(hw.values()) != prod["n"]:
        problems.append(f"partitions hold {sum(hw.values())} records, {prod['n']} acknowledged")
    got = {p: c for r in cons["results"] for p, c in r["per_partition"].items()}
    if got != hw or any(r["extra"] for r in cons["results"]):
        problems.append(f"consumed {sum(got.values())} (+{sum(r['extra'] for r in cons['results'])} extra) "
                        f"of {sum(hw.values())}")
    led_by = {b: sum(1 for v in leaders.values() if v == b) for b in sorted(set(leaders.values()))}
    return {"processes": host.processes, "size": size, "produce": prod, "consume": cons, "leaders": led_by,
            "problems": problems}


# --------------------------------------------------------------------------- report


def _med(rows: list[dict[str, Any]], phase: str, key: str) -> float:
    return statistics.median(r[phase][key] for r in rows)


def report(results: list[dict[str, Any]], args: argparse.Namespace, load: str) -> str:
    facts = machine_facts()
    out = [f"### Produce and consume with 1 vs N broker processes (`serve --processes N`), "
           f"{args.count:,} records (< 1 KiB; {args.count_large:,} of 1 KiB+), {args.partitions} partitions "
           f"RF {args.rf}, acks={args.acks}, producer {args.producer_conf or 'defaults'} + linger.ms 5, "
           f"topic {args.topic_config or 'defaults'}, "
           f"{args.clients} client process(es)", "",
           f"machine: {facts.get('cpu', '?')}, {facts['nproc']} cores; {facts.get('confluent-kafka', '')}; "
           f"load before: {load}; medians of {args.repeat}", "",
           "| processes | size | leaders per broker | produce msg/s | requests | broker CPU s | client CPU s | "
           "other % | consume msg/s | fetches | broker CPU s | client CPU s | other % |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["processes"], r["size"]) for r in results}, key=lambda k: (k[1], k[0]))
    base: dict[int, tuple[float, float]] = {}
    for procs, size in keys:
        rows = [r for r in results if (r["processes"], r["size"]) == (procs, size)]
        pm, cm = _med(rows, "produce", "msgs_per_s"), _med(rows, "consume", "msgs_per_s")
        base.setdefault(size, (pm, cm))
        leaders = "/".join(str(v) for v in rows[0]["leaders"].values())
        out.append(
            f"| {procs} | {size} B | {leaders} | {pm:,.0f} ({pm / base[size][0]:.2f}x) | "
            f"{_med(rows, 'produce', 'requests'):,.0f} | {_med(rows, 'produce', 'broker_cpu'):.2f} | "
            f"{_med(rows, 'produce', 'client_cpu'):.2f} | "
            f"{_med(rows, 'produce', 'other_pct'):.0f} | {cm:,.0f} ({cm / base[size][1]:.2f}x) | "
            f"{_med(rows, 'consume', 'requests'):,.0f} | "
            f"{_med(rows, 'consume', 'broker_cpu'):.2f} | {_med(rows, 'consume', 'client_cpu'):.2f} | "
            f"{_med(rows, 'consume', 'other_pct'):.0f} |")
    problems = [f"- {r['processes']} process(es), {r['size']} B: {p}" for r in results for p in r["problems"]]
    if problems:
        out += ["", "FAILURES:", *problems]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", default="1,2", help="process counts to compare (comma list)")
    ap.add_argument("--sizes", default="100,1024", help="record sizes in bytes (comma list)")
    ap.add_argument("--count", type=int, default=300_000, help="records per produce phase, below 1 KiB")
    ap.add_argument("--count-large", type=int, default=100_000, help="records per produce phase, 1 KiB and more")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--rf", type=int, default=1, help="replication factor of the topic")
    ap.add_argument("--acks", default="1")
    ap.add_argument("--clients", type=int, default=2, help="producer (then consumer) processes")
    ap.add_argument("--repeat", type=int, default=1, help="rounds, alternating process counts; medians shown")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="broker setting")
    ap.add_argument("--producer-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="librdkafka producer setting (e.g. sticky.partitioning.linger.ms=0: every record to a "
                         "random partition, so requests carry many small batches)")
    ap.add_argument("--topic-config", action="append", default=[], metavar="KEY=VALUE",
                    help="topic setting (e.g. compression.type=zstd: the brokers recompress what they are sent, "
                         "CPU spent by the brokers and not by the clients)")
    ap.add_argument("--keep-dir", action="store_true", help="keep the data and the brokers' logs")
    args = ap.parse_args(argv)
    args.producer_conf = dict(item.split("=", 1) for item in args.producer_conf)
    args.topic_config = dict(item.split("=", 1) for item in args.topic_config)
    if not zookeeper_available():
        print("needs ZooKeeper (Debian package zookeeper): run scripts/install.sh --test", file=sys.stderr)
        return 2
    counts = [int(x) for x in args.processes.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    results: list[dict[str, Any]] = []
    tmp = tempfile.mkdtemp(prefix="pykbroker-mp-bench-")
    try:
        zk = ZooKeeperEnsemble(Path(tmp) / "zk").start()
        try:
            for _ in range(args.repeat):
                for n in counts:
                    host = Host(Path(tmp), zk, n, args.override)
                    try:
                        for size in sizes:
                            results.append(run_case(host, size, args))
                            r = results[-1]
                            print(f"[{time.strftime('%H:%M:%S')}] {n} process(es) {size} B: produce "
                                  f"{r['produce']['msgs_per_s']:,.0f}/s consume {r['consume']['msgs_per_s']:,.0f}/s"
                                  f"{' ' + '; '.join(r['problems']) if r['problems'] else ''}", file=sys.stderr)
                    finally:
                        status = host.stop()
                        if status != 0 and results:
                            results[-1]["problems"].append(f"serve --processes {n} exited {status}")
        finally:
            zk.kill()
    finally:
        if args.keep_dir:
            print(f"data and logs in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(report(results, args, load))
    return 1 if any(r["problems"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
