"""The measured phases of one scenario against one broker (bench.py's produce, consume and
end-to-end latency phases), with the topic creation and deletion around them and the librdkafka
configuration and log they share."""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import queue as _queue
import signal
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
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

from benchlib.brokers import Target
from benchlib.console import err_str, fmt, log, pct
from benchlib.procstats import Snap, snap

E2E_HEADER = 9  # 8-byte CLOCK_MONOTONIC ns + 1 flag byte


FLAG_WARMUP, FLAG_MEASURE, FLAG_END = 0, 1, 2


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
                if v is None or len(v) <= 8:  # not the phase's: e.g. the record a cluster run warms a partition with
                    continue
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
                           f"send -> append p50 {fmt(pct(b_ms, 50), 2)} p99 {fmt(pct(b_ms, 99), 2)} "
                           f"max {fmt(max(b_ms) if b_ms else None, 1)}; append -> poll p50 "
                           f"{fmt(pct(a_ms, 50), 2)} p99 {fmt(pct(a_ms, 99), 2)} "
                           f"max {fmt(max(a_ms) if a_ms else None, 1)}")
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
    f = fmt
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
