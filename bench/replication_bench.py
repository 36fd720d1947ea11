#!/usr/bin/env python3
"""Replication figures on a 3-broker ZooKeeper cluster started on this machine.

Starts a real ZooKeeper and three pykbroker brokers as subprocesses on free 127.0.0.1 ports (the
harness of tests/cluster) and measures, with confluent-kafka (librdkafka):

1. failover: a steady idempotent acks=all producer (``--failover-rate`` msg/s) on an RF 3 topic with
   min.insync.replicas=2; kill -9 (and SIGTERM) of the partition leader, which is not the controller;
   figures: kill -> first acknowledgement of a message sent after the kill, and the longest gap
   between two acknowledgements. Every acknowledged message is then read back (nothing lost, no
   duplicate). The killed broker is restarted and rejoins the ISR before the next round;
2. produce throughput, RF 3 against RF 1 on the same cluster, acks=1 and acks=all, 100 B and 1 KiB
   (bench.py's produce phase: linger.ms=5, no idempotence, no compression); the leader is broker 1
   in every case; CPU is the sum over the three broker processes;
3. replication lag under that load: each follower's log end offset (LEO) behind the leader's,
   read from the replicas' active segment files on disk every ``--lag-interval-ms`` (the last
   complete batch's base offset + last offset delta + 1; followers are read before the leader, so
   a sample can only overstate the lag); p50/p99/max, in messages;
4. end-to-end latency at a fixed rate (default 5,000 msg/s, 100 B), RF 3 acks=all against RF 1
   (bench.py's e2e phase: a consumer in a separate process, send time in the payload).

    .venv/bin/python bench/replication_bench.py [--only failover,throughput,e2e] [--count-small N] ...

``--steady-page-cache[=FREE_GIB]`` first fills the machine's free memory with a clean ballast file (down to
about FREE_GIB of MemFree), so that the brokers' writes reuse reclaimed page cache as on a long-running host
instead of touching fresh guest memory (see bench/page_cache.py); ``--probe-mib`` reports what a MiB written
costs in the state the phases run in. Each throughput phase reports MemFree at its start and end.

Every wait is bounded; prints a Markdown table (medians over ``--repeat`` rounds where it applies).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import platform
import signal
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import page_cache  # noqa: E402
from benchlib.brokers import Target  # noqa: E402
from benchlib.console import log, pct  # noqa: E402
from benchlib.phases import Scenario, phase_e2e, phase_produce  # noqa: E402
from benchlib.procstats import Usage, broker_usage  # noqa: E402
from confluent_kafka import KafkaError, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

import bench  # noqa: E402
from tests.support.cluster import Cluster, wait_for  # noqa: E402

# Record batch v2 header: baseOffset i64, batchLength i32, ..., lastOffsetDelta i32 at byte 23.
_BATCH_PREFIX = 12
_LAST_OFFSET_DELTA_AT = 23


# --------------------------------------------------------------------------- cluster helpers


def create_topic(cluster: Cluster, name: str, assignment: list[list[int]], config: dict[str, str],
                 timeout: float = 60.0) -> None:
    """CreateTopics with an explicit assignment (first replica = preferred leader), then wait for leaders."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    fs = admin.create_topics([NewTopic(name, len(assignment), replica_assignment=assignment, config=config)],
                             request_timeout=timeout, operation_timeout=timeout)
    for f in fs.values():
        f.result(timeout=timeout)
    want = {i: a[0] for i, a in enumerate(assignment)}
    wait_for(lambda: cluster.wait_leaders(name, len(assignment), timeout=timeout) == want, timeout=timeout,
             what=f"{name} led by its preferred replicas")


def delete_topic(cluster: Cluster, name: str, timeout: float = 60.0) -> None:
    """Drop a finished phase's topic so that its files neither fill the disk nor wait for write-back."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for f in admin.delete_topics([name], request_timeout=timeout, operation_timeout=timeout).values():
        f.result(timeout=timeout)


def full_isr(cluster: Cluster, topic: str, replicas: list[int]) -> bool:
    try:
        states = cluster.partition_states(topic)
    except (OSError, ConnectionError):
        return False
    return all(isr == sorted(replicas) for _l, _e, isr in states.values())


def warm_up(cluster: Cluster, topic: str, partitions: int) -> None:
    """One acks=all record per partition, acknowledged: the followers fetch the new partitions from now on.

    A follower adds a new partition to its fetch only when its parked fetch returns (up to
    replica.fetch.wait.max.ms), which would otherwise land in the timed window of a short phase.
    """
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
    for part in range(partitions):
        p.produce(topic, b"warm-up", partition=part)
    assert p.flush(60) == 0, f"warm-up records to {topic} not acknowledged"


def assignment_for(partitions: int, rf: int, leader: int = 1) -> list[list[int]]:
    """Every partition led by ``leader``, the followers the other brokers in order."""
    others = [b for b in (1, 2, 3) if b != leader]
    return [[leader, *others[: rf - 1]] for _ in range(partitions)]


# --------------------------------------------------------------------------- replication lag


class SegmentTail:
    """The log end offset of one replica, from its newest ``.log`` file, read incrementally."""

    def __init__(self, log_dir: Path) -> None:
        self.dir = log_dir
        self.path: Path | None = None
        self.pos = 0
        self.leo = 0

    def read(self) -> int:
        try:
            newest = max(self.dir.glob("*.log"), default=None)
        except OSError:
            return self.leo
        if newest is None:
            return self.leo
        if newest != self.path:  # rolled (or first look): scan the new segment from its start
            self.path, self.pos = newest, 0
        try:
            with open(newest, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.pos:  # truncated (divergence): rescan
                    self.pos = 0
                for _ in range(1_000_000):
                    if self.pos + _BATCH_PREFIX > size:
                        break
                    f.seek(self.pos)
                    head = f.read(_LAST_OFFSET_DELTA_AT + 4)
                    if len(head) < _LAST_OFFSET_DELTA_AT + 4:
                        break
                    base, length = struct.unpack_from(">qi", head)
                    end = self.pos + _BATCH_PREFIX + length
                    if length <= 0 or end > size:  # a batch still being written
                        break
                    (delta,) = struct.unpack_from(">i", head, _LAST_OFFSET_DELTA_AT)
                    self.leo = base + delta + 1
                    self.pos = end
        except FileNotFoundError:
            self.path = None
        return self.leo


class LagSampler(threading.Thread):
    """Samples follower LEO lag (messages) of every partition of a topic until stopped."""

    def __init__(self, cluster: Cluster, topic: str, assignment: list[list[int]], interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.parts: list[tuple[list[SegmentTail], SegmentTail]] = []
        for p, replicas in enumerate(assignment):
            tails = {b: SegmentTail(cluster.broker(b).data_dir / "logs" / f"{topic}-{p}") for b in replicas}
            self.parts.append(([tails[b] for b in replicas[1:]], tails[replicas[0]]))
        self.lags: list[float] = []
        self._halt = threading.Event()

    def run(self) -> None:
        for _ in range(10_000_000):
            if self._halt.wait(self.interval):
                break
            for followers, leader in self.parts:
                f_leos = [f.read() for f in followers]  # followers first: the lag is never understated
                leo = leader.read()
                self.lags += [max(0, leo - f) for f in f_leos]

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def summary(self) -> dict[str, int]:
        if not self.lags:
            return {}
        return {"lag_samples": len(self.lags), "lag_p50": int(pct(self.lags, 50) or 0),
                "lag_p99": int(pct(self.lags, 99) or 0), "lag_max": int(max(self.lags))}


# --------------------------------------------------------------------------- throughput + lag


def cluster_usage(cluster: Cluster) -> dict[int, Usage | None]:
    return {i: broker_usage(b.proc.pid if b.proc else None) for i, b in cluster.brokers.items()}


def cpu_between(before: dict[int, Usage | None], after: dict[int, Usage | None]) -> float:
    return sum(a.cpu_since(b) for i, a in after.items() if a is not None and (b := before.get(i)) is not None)


def bench_throughput(cluster: Cluster, args: argparse.Namespace, bargs: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    target = Target("pykbroker-cluster", cluster.bootstrap, None)
    for rnd, size in itertools.product(range(args.throughput_rounds), args.sizes):
        count = args.count_small if size < 1024 else args.count_large
        for rf in (1, 3):
            for acks in args.acks:
                topic = f"tp{rf}-{acks}-{size}-{uuid.uuid4().hex[:6]}"
                assignment = assignment_for(args.partitions, rf)
                create_topic(cluster, topic, assignment, {"min.insync.replicas": str(min(rf, 2))})
                if rf > 1:
                    wait_for(partial(full_isr, cluster, topic, assignment[0]), timeout=60, what="full ISR")
                warm_up(cluster, topic, args.partitions)
                # Write back what earlier phases left dirty, so this phase's appends do not compete with it.
                os.sync()
                if args.ballast is not None:  # the previous phase's deleted topic freed memory
                    log(args.ballast.top_up(args.ballast_max_seconds / 4))
                sampler = LagSampler(cluster, topic, assignment, args.lag_interval_ms / 1000) if rf > 1 else None
                free0 = page_cache.mem_free_gib()
                u0 = cluster_usage(cluster)
                if sampler:
                    sampler.start()
                sc = Scenario(size, acks, args.partitions, count)
                try:
                    r = phase_produce(target, sc, topic, bargs)
                finally:
                    if sampler:
                        sampler.stop()
                cpu = cpu_between(u0, cluster_usage(cluster))
                free1 = page_cache.mem_free_gib()
                row = {"round": rnd, "size": size, "rf": rf, "acks": acks, **r, "brokers_cpu_s_per_m":
                       cpu / r["delivered"] * 1e6 if r.get("delivered") else None,
                       "mem_free_gib": (free0, free1)}
                if sampler:
                    row.update(sampler.summary())
                out.append(row)
                delete_topic(cluster, topic)
                log(f"throughput size={size} rf={rf} acks={acks}: {r.get('msgs_per_s') or 0:,.0f} msg/s, "
                          f"MemFree {free0:.2f} -> {free1:.2f} GiB"
                          f"{' ERROR ' + r['error'] if r.get('error') else ''}")
    return out


# --------------------------------------------------------------------------- failover


class Acker:
    """A steady idempotent acks=all producer that records, per message, its send and acknowledgement times."""

    def __init__(self, bootstrap: str, topic: str, rate: int, max_seconds: float) -> None:
        self.topic = topic
        self.rate = rate
        self.max_seconds = max_seconds
        self.sent_at: dict[bytes, float] = {}
        self.acks: list[tuple[float, bytes]] = []  # (ack time, value), in acknowledgement order
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._producer = Producer({
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 1,
            "message.timeout.ms": 120000, "request.timeout.ms": 10000, "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 200, "topic.metadata.refresh.interval.ms": 1000,
        })
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{err.name()}: {err.str()}")
        else:
            self.acks.append((time.monotonic(), msg.value()))

    def _run(self) -> None:
        start = time.monotonic()
        sent = 0
        for _ in range(int(self.max_seconds * self.rate) + 1):
            if self._stop.is_set() or time.monotonic() - start > self.max_seconds:
                break
            value = f"f{sent:09d}".encode()
            try:
                self._producer.produce(self.topic, value, on_delivery=self._delivered)
                self.sent_at[value] = time.monotonic()
                sent += 1
            except BufferError:
                pass
            self._producer.poll(0)
            time.sleep(max(0.0, start + sent / self.rate - time.monotonic()))

    def acked_at_least(self, n: int) -> bool:
        return len(self.acks) >= n

    def acked_sent_after(self, t: float) -> bool:
        """Whether a message sent after ``t`` has been acknowledged (looks at the latest acks only)."""
        return any(self.sent_at.get(v, 0.0) > t for _ta, v in self.acks[-200:])

    def start(self) -> Acker:
        self._thread.start()
        return self

    def stop(self, flush_timeout: float = 120.0) -> int:
        self._stop.set()
        self._thread.join(30)
        return int(self._producer.flush(flush_timeout))


def bench_failover(cluster: Cluster, args: argparse.Namespace) -> list[dict[str, Any]]:
    from tests.cluster.steady import read_all

    rows = []
    controller = cluster.controller_id()
    victim = next(b for b in (1, 2, 3) if b != controller)
    assignment = [[victim, *[b for b in (1, 2, 3) if b != victim]]]
    for how in args.failover_signals:
        for rnd in range(args.repeat):
            topic = f"fo-{how}-{rnd}-{uuid.uuid4().hex[:6]}"
            create_topic(cluster, topic, assignment, {"min.insync.replicas": "2"})
            wait_for(partial(full_isr, cluster, topic, [1, 2, 3]), timeout=60, what="full ISR")
            acker = Acker(cluster.bootstrap, topic, args.failover_rate, max_seconds=180).start()
            wait_for(partial(acker.acked_at_least, args.failover_rate), timeout=30, what="steady acks")
            t_kill = time.monotonic()
            if how == "kill":
                cluster.kill(victim)
            else:
                proc = cluster.broker(victim).proc
                assert proc is not None
                proc.send_signal(signal.SIGTERM)
            wait_for(partial(acker.acked_sent_after, t_kill),
                     timeout=120, interval=0.01, what="an acknowledgement of a message sent after the kill")
            time.sleep(1.0)  # a little steady state after the failover for the gap figure
            unacked = acker.stop()
            after_kill = [ta for ta, v in acker.acks if acker.sent_at[v] > t_kill]
            times = [ta for ta, _v in acker.acks]
            gap = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
            seen = read_all(cluster.any_bootstrap(exclude=(victim,)), topic, 1)
            lost = [v for _t, v in acker.acks if v not in seen]
            dupes = [v for v, where in seen.items() if len(where) > 1]
            row = {"how": how, "first_ack_after_kill_s": min(after_kill) - t_kill, "max_ack_gap_s": gap,
                   "acked": len(acker.acks), "lost": len(lost), "duplicates": len(dupes), "unacked": unacked,
                   "errors": len(acker.errors)}
            rows.append(row)
            log(f"failover {how} round {rnd}: {row}")
            if how != "kill":
                cluster.broker(victim).proc.wait(60)  # type: ignore[union-attr]
            cluster.broker(victim).start(60)
            cluster.wait_registered([1, 2, 3], timeout=60)
            wait_for(partial(full_isr, cluster, topic, [1, 2, 3]), timeout=90, what="the victim back in the ISR")
    return rows


# --------------------------------------------------------------------------- e2e


def bench_e2e(cluster: Cluster, args: argparse.Namespace, bargs: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    target = Target("pykbroker-cluster", cluster.bootstrap, None)
    for rf in (1, 3):
        topic = f"e2e{rf}-{uuid.uuid4().hex[:6]}"
        assignment = assignment_for(args.partitions, rf)
        create_topic(cluster, topic, assignment, {"min.insync.replicas": str(min(rf, 2))})
        if rf > 1:
            wait_for(partial(full_isr, cluster, topic, assignment[0]), timeout=60, what="full ISR")
        warm_up(cluster, topic, args.partitions)
        sc = Scenario(args.e2e_size, "all", args.partitions, 0)
        sampler = LagSampler(cluster, topic, assignment, args.lag_interval_ms / 1000) if rf > 1 else None
        if sampler:
            sampler.start()
        try:
            r = phase_e2e(target, sc, topic, bargs)
        finally:
            if sampler:
                sampler.stop()
        out.append({"rf": rf, **r, **(sampler.summary() if sampler else {})})
        log(f"e2e rf={rf}: p99 {r.get('e2e_p99_ms')} ms{' ERROR ' + r['error'] if r.get('error') else ''}")
    return out


# --------------------------------------------------------------------------- report


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _lag(r: dict[str, Any]) -> str:
    return "–" if "lag_p50" not in r else f"{r['lag_p50']:,} / {r['lag_p99']:,} / {r['lag_max']:,}"


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def _rf1_of(tp: list[dict[str, Any]], r: dict[str, Any]) -> dict[str, Any] | None:
    """The RF 1 row of the same round, size and acks (its baseline: the machine's load drifts between rounds)."""
    return next((b for b in tp if b["size"] == r["size"] and b["rf"] == 1 and b["acks"] == r["acks"]
                 and b["round"] == r["round"]), None)


def _round_medians(tp: list[dict[str, Any]]) -> list[str]:
    """Per size and acks: median RF 3 / RF 1 ratio and broker CPU over the rounds, with each round's ratio."""
    lines = []
    for size, acks in dict.fromkeys((r["size"], r["acks"]) for r in tp):
        rf3 = [r for r in tp if r["size"] == size and r["acks"] == acks and r["rf"] == 3]
        ratios = [r["msgs_per_s"] / b["msgs_per_s"] for r in rf3
                  if (b := _rf1_of(tp, r)) and r.get("msgs_per_s") and b.get("msgs_per_s")]
        cpu = {rf: _median([r for r in tp if r["size"] == size and r["acks"] == acks and r["rf"] == rf],
                           "brokers_cpu_s_per_m") for rf in (1, 3)}
        med = statistics.median(ratios) if ratios else None
        lines.append(f"- {size} B acks={acks}: RF 3 / RF 1 median {_f(med, 2)}"
                     f" (rounds: {', '.join(f'{x:.2f}' for x in ratios)}); brokers CPU-s / M msgs median RF 1 "
                     f"{_f(cpu[1])}, RF 3 {_f(cpu[3])}")
    return [*lines, ""]


def report(fo: list[dict[str, Any]], tp: list[dict[str, Any]], e2e: list[dict[str, Any]],
           args: argparse.Namespace, memory: list[str] | None = None) -> str:
    lines = [f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python "
             f"{platform.python_version()}; zookeeper.session.timeout.ms={args.session_timeout_ms}, "
             f"replica.lag.time.max.ms={args.replica_lag_ms}", ""]
    if memory:
        lines += [f"- {m}" for m in memory] + [""]
    if fo:
        lines += ["### Leader failover (RF 3, min.insync.replicas=2, idempotent acks=all producer at "
                  f"{args.failover_rate} msg/s; the leader is not the controller)", "",
                  "| signal | rounds | kill -> first ack of a message sent after it, s (median / max) | "
                  "longest gap between acks, s (median) | acked | lost | duplicates |", "|---|---|---|---|---|---|---|"]
        for how in args.failover_signals:
            rows = [r for r in fo if r["how"] == how]
            if rows:
                lines.append(f"| {'kill -9' if how == 'kill' else 'SIGTERM'} | {len(rows)} | "
                             f"{_f(_median(rows, 'first_ack_after_kill_s'), 3)} / "
                             f"{_f(max(r['first_ack_after_kill_s'] for r in rows), 3)} | "
                             f"{_f(_median(rows, 'max_ack_gap_s'), 3)} | {sum(r['acked'] for r in rows):,} | "
                             f"{sum(r['lost'] for r in rows)} | {sum(r['duplicates'] for r in rows)} |")
        lines.append("")
    if tp:
        lines += [f"### Produce throughput ({args.partitions} partition(s), leader broker 1, linger.ms=5, "
                  "no idempotence; lag = follower LEO behind the leader's, from the segment files)", "",
                  "| size | RF | acks | msg/s | MB/s | vs RF 1 same acks | ack p50 ms | ack p99 ms | "
                  "brokers CPU-s / M msgs | lag p50 / p99 / max (msgs) | MemFree GiB start -> end | round | error |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in tp:
            base = _rf1_of(tp, r)
            ratio = (r["msgs_per_s"] / base["msgs_per_s"]) if base and base.get("msgs_per_s") and r.get(
                "msgs_per_s") else None
            lag = _lag(r)
            free0, free1 = r["mem_free_gib"]
            lines.append(f"| {r['size']} B | {r['rf']} | {r['acks']} | {_f(r.get('msgs_per_s'), 0)} | "
                         f"{_f(r.get('mb_per_s'))} | {_f(ratio, 2)} | {_f(r.get('lat_p50_ms'))} | "
                         f"{_f(r.get('lat_p99_ms'))} | {_f(r.get('brokers_cpu_s_per_m'))} | {lag} | "
                         f"{free0:.2f} -> {free1:.2f} | {r['round'] + 1} | {r.get('error') or ''} |")
        lines.append("")
        if args.throughput_rounds > 1:
            lines += _round_medians(tp)
    if e2e:
        lines += [f"### End-to-end at {args.e2e_rate} msg/s, {args.e2e_size} B, acks=all "
                  f"({args.e2e_seconds} s measured)", "",
                  "| RF | achieved msg/s | e2e p50 ms | e2e p99 ms | e2e max ms | ack p50 ms | ack p99 ms | "
                  "lag p50 / p99 / max (msgs) | error |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in e2e:
            lines.append(f"| {r['rf']} | {_f(r.get('achieved_rate'), 0)} | {_f(r.get('e2e_p50_ms'))} | "
                         f"{_f(r.get('e2e_p99_ms'))} | {_f(r.get('e2e_max_ms'))} | {_f(r.get('ack_p50_ms'))} | "
                         f"{_f(r.get('ack_p99_ms'))} | {_lag(r)} | {r.get('error') or ''} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="failover,throughput,e2e")
    ap.add_argument("--session-timeout-ms", type=int, default=6000, help="zookeeper.session.timeout.ms")
    ap.add_argument("--replica-lag-ms", type=int, default=10000, help="replica.lag.time.max.ms")
    ap.add_argument("--repeat", type=int, default=3, help="failover rounds per signal")
    ap.add_argument("--failover-signals", default="kill,term", help="kill (-9) and/or term (SIGTERM)")
    ap.add_argument("--failover-rate", type=int, default=200, help="msg/s of the failover producer")
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--acks", default="1,all")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--throughput-rounds", type=int, default=1,
                    help="repeat the throughput phases (every size, RF 1 then RF 3) this many times")
    ap.add_argument("--count-small", type=int, default=300_000, help="messages per produce phase, < 1 KiB")
    ap.add_argument("--count-large", type=int, default=100_000, help="messages per produce phase, >= 1 KiB")
    ap.add_argument("--lag-interval-ms", type=float, default=50)
    ap.add_argument("--e2e-rate", type=int, default=5000)
    ap.add_argument("--e2e-seconds", type=float, default=10)
    ap.add_argument("--e2e-size", type=int, default=100)
    ap.add_argument("--phase-timeout", type=float, default=180)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="extra broker setting for all three brokers (repeatable)")
    ap.add_argument("--markdown", help="also write the report to this file")
    # The default is small on purpose: free memory above the kernel's watermarks is what the brokers'
    # writes take first, and on this VM it is fresh (host-returned) memory; 1 GiB left the probe at 1.1 ms/MiB.
    ap.add_argument("--steady-page-cache", type=float, nargs="?", const=0.25, default=None, metavar="FREE_GIB",
                    help="before the phases, fill free memory with a clean ballast file in the bench's temp dir "
                         "until about FREE_GIB (default 0.25) of MemFree is left; removed at the end")
    ap.add_argument("--ballast-max-gib", type=float, default=24.0, help="cap on the ballast file's size")
    ap.add_argument("--ballast-max-seconds", type=float, default=150.0, help="stop writing the ballast after this")
    ap.add_argument("--probe-mib", type=int, default=256,
                    help="before the phases, CPU ms per MiB of pwrite into new and into cached pages (0: skip)")
    args = ap.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.acks = args.acks.split(",")
    args.failover_signals = args.failover_signals.split(",")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = set(args.only.split(","))
    # bench.py's phases take its own options: its defaults, with ours where they overlap.
    bargs = bench.parse_args(["--bootstrap", "unused"])
    bargs.phase_timeout = args.phase_timeout
    bargs.e2e_rate, bargs.e2e_seconds = args.e2e_rate, args.e2e_seconds
    overrides = {"zookeeper.session.timeout.ms": str(args.session_timeout_ms),
                 "replica.lag.time.max.ms": str(args.replica_lag_ms),
                 "auto.leader.rebalance.enable": "false",
                 **dict(kv.split("=", 1) for kv in args.override)}
    fo: list[dict[str, Any]] = []
    tp: list[dict[str, Any]] = []
    e2e: list[dict[str, Any]] = []
    memory: list[str] = []
    args.ballast = None
    with tempfile.TemporaryDirectory(prefix="pykb-repl-bench-") as tmp, contextlib.ExitStack() as stack:
        if args.steady_page_cache is not None:
            args.ballast, first = stack.enter_context(page_cache.steady_page_cache(
                Path(tmp), args.steady_page_cache, args.ballast_max_gib, args.ballast_max_seconds, log))
            memory.append(f"ballast {args.ballast.size / 2**30:.2f} GiB (MemFree target {args.steady_page_cache} "
                          f"GiB, topped up before each throughput phase): {first.describe()}")
        else:
            memory.append(f"no ballast (MemFree {page_cache.mem_free_gib():.2f} GiB)")
        if args.probe_mib > 0:
            fresh, cached = page_cache.pwrite_probe(Path(tmp), args.probe_mib)
            memory.append(f"pwrite probe, {args.probe_mib} MiB: {fresh:.3f} CPU-ms per MiB into a new file, "
                          f"{cached:.3f} overwriting its cached pages")
            log(memory[-1])
        cluster = stack.enter_context(Cluster(Path(tmp) / "c", 3, overrides=overrides))
        try:
            if "throughput" in only:
                tp = bench_throughput(cluster, args, bargs)
            if "e2e" in only and args.e2e_seconds > 0:
                e2e = bench_e2e(cluster, args, bargs)
            if "failover" in only:
                fo = bench_failover(cluster, args)
        except BaseException:
            sys.stderr.write(cluster.logs()[-4000:])
            raise
    text = report(fo, tp, e2e, args, memory)
    print("\n" + text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    bad = [r for r in tp + e2e if r.get("error")] + [r for r in fo if r["lost"] or r["duplicates"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
