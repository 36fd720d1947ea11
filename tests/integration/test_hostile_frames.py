"""Hostile frames over real sockets cannot take a memory-limited broker down.

The broker runs with its address space capped (RLIMIT_AS, what ``prlimit --as`` sets), so a
request that made kio allocate from a lying length would abort it, as a 21-byte Metadata v12
frame whose topics array claims ~4 billion entries would.  It receives that frame and a few thousand
mutated frames of every advertised (API, version) while a well-behaved idempotent producer keeps writing; afterwards the
producer has seen no failure and a produce-then-consume round trip works.
"""

from __future__ import annotations

import os
import resource
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from confluent_kafka import KafkaError, Message, TopicPartition

from pykbroker.protocol.framing import CloseConnection
from pykbroker.server.context import Services
from pykbroker.server.dispatcher import Dispatcher
from tests.integration.conftest import (
    BrokerFactory,
    RawConnection,
    consume_partitions,
    create_topic,
    make_producer,
    produce_all,
    unique_topic,
)
from tests.support.hostile import HUGE_ARRAY_FRAME, advertised_pairs, mutated_frames

ADDRESS_SPACE = 3 << 30
# Every partition maps its offset and time indexes at full size (10 MiB each by default): the 100
# internal partitions alone take 2 GiB of address space. Smaller indexes leave the limit for the heap.
INDEX_BYTES = 1 << 20
FRAMES_PER_PAIR = int(os.environ.get("PYKB_HOSTILE_FRAMES_PER_PAIR", "20"))  # 170 pairs: 3,400 frames
SEED = int(os.environ.get("PYKB_HOSTILE_SEED", "10"))
# Decodable mutations of these would create topics or partitions by the hundred: slow, and not
# what this test is about. Their undecodable mutations are still sent.
_SKIP_DECODABLE = {19, 37}


def _vm_size(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc status")


def _send_one(port: int, frame: bytes, expect_close: bool) -> str | None:
    """Send one frame on a fresh connection; an error string if the broker misbehaved."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        sock.settimeout(10.0 if expect_close else 0.1)
        deadline = time.monotonic() + (10.0 if expect_close else 0.1)
        for _ in range(1000):  # bounded: each recv returns data, EOF, or times out
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except (ConnectionResetError, BrokenPipeError):
                return None
            if not data:
                return None  # closed by the broker
            if time.monotonic() >= deadline:
                break
        return f"connection left open after a frame Kafka refuses: {frame.hex()}" if expect_close else None


class SteadyProducer(threading.Thread):
    """An idempotent acks=all producer writing throughout; records every failure it sees."""

    def __init__(self, bootstrap_broker: Any, topic: str) -> None:
        super().__init__(daemon=True)
        self.producer = make_producer(bootstrap_broker, acks="all", **{"enable.idempotence": True,
                                                                       "error_cb": self._on_error})
        self.topic = topic
        self.stop = threading.Event()
        self.sent = 0
        self.delivered = 0
        self.failures: list[str] = []

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal() or not err.retriable():
            self.failures.append(f"client error: {err}")

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.failures.append(f"delivery failed: {err}")

    def run(self) -> None:
        for i in range(100_000):  # bounded; stopped long before
            if self.stop.is_set():
                break
            try:
                self.producer.produce(self.topic, value=b"steady-%d" % i, on_delivery=self._on_delivery)
                self.sent += 1
            except BufferError:
                pass
            self.producer.poll(0.02)
        remaining = self.producer.flush(30)
        if remaining:
            self.failures.append(f"{remaining} messages never delivered")


def test_hostile_frames_leave_a_memory_limited_broker_serving(broker_factory: BrokerFactory) -> None:
    b = broker_factory({"log.index.size.max.bytes": str(INDEX_BYTES)})
    assert b.proc is not None
    pid = b.proc.pid
    assert _vm_size(pid) < ADDRESS_SPACE // 2, "the broker no longer fits comfortably under the limit"
    resource.prlimit(pid, resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    assert resource.prlimit(pid, resource.RLIMIT_AS)[0] == ADDRESS_SPACE

    steady_topic = unique_topic("steady")
    create_topic(b, steady_topic)
    steady = SteadyProducer(b, steady_topic)
    steady.start()
    try:
        # The 21-byte frame, byte for byte: answered by a closed connection, not an abort.
        with RawConnection(b) as conn:
            conn.send(HUGE_ARRAY_FRAME)
            assert conn.wait_closed(10), "the 21-byte frame did not close the connection"
        assert b.proc.poll() is None, f"broker died on the 21-byte frame:\n{b.log()[-3000:]}"

        # What Kafka refuses must close the connection; what it accepts is simply served.
        parser = Dispatcher(cast(Services, None))
        jobs: list[tuple[bytes, bool]] = []
        pairs = advertised_pairs()
        for api_key, _version, frame in mutated_frames(FRAMES_PER_PAIR * len(pairs), SEED):
            try:
                parser.parse(frame)
            except CloseConnection:
                jobs.append((frame, True))
                continue
            if api_key not in _SKIP_DECODABLE:
                jobs.append((frame, False))
        refused = sum(1 for _f, close in jobs if close)
        assert refused > len(jobs) // 3, (refused, len(jobs))
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            problems = [p for p in pool.map(lambda j: _send_one(b.port, *j), jobs) if p]
        elapsed = time.monotonic() - started
        assert b.proc.poll() is None, f"broker died under hostile frames (seed {SEED}):\n{b.log()[-3000:]}"
        assert not problems, problems[:5]
        assert elapsed < 120, f"{len(jobs)} frames took {elapsed:.0f}s"
    finally:
        steady.stop.set()
        steady.join(60)
    assert not steady.is_alive(), "the steady producer did not finish"
    assert not steady.failures, steady.failures[:10]
    assert steady.delivered == steady.sent > 0

    # Still serving: a fresh produce and consume round trip.
    topic = unique_topic("after")
    create_topic(b, topic)
    p = make_producer(b, acks="all")
    reports = produce_all(p, topic, [{"value": b"after-%d" % i} for i in range(20)])
    assert all(r.error is None for r in reports), [r.error for r in reports if r.error]
    got = consume_partitions(b, [TopicPartition(topic, 0, 0)], 20)
    assert [m.value() for m in got] == [b"after-%d" % i for i in range(20)]
    assert b.proc.poll() is None
    log = b.log()
    assert "rejected metadata v12 request before decoding" in log
    # Hostile input gets Kafka's answers (a closed connection, error codes), never an internal error.
    internal = [line for line in log.splitlines() if "request failed" in line or "encoding failed" in line]
    assert not internal, internal[:5]
