"""Fixtures and helpers for the core integration tests: real clients, real broker subprocesses.

Every broker runs as a subprocess on a free 127.0.0.1 port with its own data directory
(:class:`tests.support.broker.BrokerProcess`), so the tests are safe under pytest-xdist.
Every wait here is bounded both in iterations and in wall time.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pykbroker.protocol import codec
from tests.support.broker import BrokerProcess
from tests.support.quotas import KpQuotas

T = TypeVar("T")

CLIENT_TIMEOUT = 20.0


# --- bounded waiting ---------------------------------------------------------------------------


def wait_until(
    fn: Callable[[], T | None], *, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"
) -> T:
    """Poll ``fn`` until it returns something truthy; bounded in time and in attempts."""
    deadline = time.monotonic() + timeout
    max_attempts = int(timeout / interval) + 2
    last: T | None = None
    for _ in range(max_attempts):
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value {last!r})")


def unique_topic(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --- brokers -----------------------------------------------------------------------------------


class BrokerFactory:
    """Starts brokers with given overrides; all are killed at teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.brokers: list[BrokerProcess] = []

    def __call__(self, overrides: dict[str, str] | None = None, *, start: bool = True) -> BrokerProcess:
        b = BrokerProcess(self.base / f"broker{len(self.brokers)}", overrides)
        self.brokers.append(b)
        if start:
            b.start()
        return b

    def close(self) -> None:
        for b in self.brokers:
            b.kill()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    f = BrokerFactory(tmp_path)
    try:
        yield f
    finally:
        f.close()


@pytest.fixture(scope="module")
def module_broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    """For modules whose tests share one broker (each test uses its own topics)."""
    f = BrokerFactory(tmp_path_factory.mktemp("mod"))
    try:
        yield f
    finally:
        f.close()


# --- confluent-kafka helpers ----------------------------------------------------------------------


def admin_for(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4"})


def create_topic(
    b: BrokerProcess, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = admin_for(b)  # keep a reference: a destroyed client fails its pending futures
    fs = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=10, request_timeout=CLIENT_TIMEOUT,
    )
    fs[name].result(timeout=CLIENT_TIMEOUT)


@dataclass
class Delivery:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error: KafkaError | None


def make_producer(b: BrokerProcess, **conf: Any) -> Producer:
    base: dict[str, Any] = {
        "bootstrap.servers": b.bootstrap,
        "broker.address.family": "v4",
        "linger.ms": 5,
        "message.timeout.ms": 20000,
    }
    base.update(conf)
    return Producer(base)


def produce_all(
    p: Producer, topic: str, messages: list[dict[str, Any]], *, flush_each: bool = False
) -> list[Delivery]:
    """Produce ``messages`` (kwargs for Producer.produce) and return their delivery reports in order."""
    reports: list[Delivery | None] = [None] * len(messages)

    def cb_for(i: int) -> Callable[[KafkaError | None, Message], None]:
        def cb(err: KafkaError | None, msg: Message) -> None:
            partition, offset = msg.partition(), msg.offset()
            reports[i] = Delivery(msg.topic() or "", -1 if partition is None else partition,
                                  -1 if offset is None else offset, msg.key(), msg.value(), err)
        return cb

    for i, m in enumerate(messages):
        for _ in range(1000):  # bounded: the local queue is large, this only guards BufferError
            try:
                p.produce(topic, on_delivery=cb_for(i), **m)
                break
            except BufferError:
                p.poll(0.05)
        if flush_each:
            p.flush(CLIENT_TIMEOUT)
    remaining = p.flush(CLIENT_TIMEOUT)
    assert remaining == 0, f"{remaining} messages still in the producer queue"
    missing = [i for i, r in enumerate(reports) if r is None]
    assert not missing, f"no delivery report for messages {missing[:10]}"
    return [r for r in reports if r is not None]


def make_consumer(b: BrokerProcess, **conf: Any) -> Consumer:
    base: dict[str, Any] = {
        "bootstrap.servers": b.bootstrap,
        "broker.address.family": "v4",
        "group.id": f"g-{uuid.uuid4().hex[:8]}",  # required by librdkafka; never joined with assign()
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
    }
    base.update(conf)
    return Consumer(base)


def consume_partitions(
    b: BrokerProcess,
    assignments: list[TopicPartition],
    expected: int,
    *,
    timeout: float = CLIENT_TIMEOUT,
    **conf: Any,
) -> list[Message]:
    """assign() and read until ``expected`` messages arrived (bounded); returns them in arrival order."""
    c = make_consumer(b, **conf)
    try:
        c.assign(assignments)
        out: list[Message] = []
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.1) + 100):
            if len(out) >= expected or time.monotonic() >= deadline:
                break
            for m in c.consume(num_messages=500, timeout=0.1):
                err = m.error()
                assert err is None, f"consumer error: {err}"
                out.append(m)
        # a short grace period to catch extra (unexpected) messages
        for m in c.consume(num_messages=500, timeout=0.3):
            if m.error() is None:
                out.append(m)
        return out
    finally:
        c.close()


def watermarks(b: BrokerProcess, topic: str, partition: int = 0) -> tuple[int, int]:
    c = make_consumer(b)
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
        return int(low), int(high)
    finally:
        c.close()


# --- raw protocol helpers ------------------------------------------------------------------------


def request_frame(api_key: int, version: int, body: dict[str, Any], correlation_id: int,
                  client_id: str = "raw-test") -> bytes:
    """A whole request frame (size prefix included) encoded with kio."""
    cid = client_id.encode()
    header = struct.pack(">hhih", api_key, version, correlation_id, len(cid)) + cid
    if codec.is_flexible(api_key, version):
        header += b"\x00"  # empty tagged fields
    payload = header + codec.encode_entity(codec.build(codec.request_class(api_key, version), body))
    return struct.pack(">i", len(payload)) + payload


class RawConnection:
    """A blocking socket speaking Kafka framing, for bad-input and pipelining tests."""

    def __init__(self, b: BrokerProcess, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", b.port), timeout=timeout)
        self.sock.settimeout(timeout)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        for _ in range(n + 1):  # each recv returns at least one byte or ends the loop
            if len(buf) >= n:
                break
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def recv_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self.recv_exact(4))
        assert 0 <= size < 1 << 28, f"implausible response size {size}"
        return self.recv_exact(size)

    def request(self, api_key: int, version: int, body: dict[str, Any], correlation_id: int = 1) -> Any:
        self.send(request_frame(api_key, version, body, correlation_id))
        return self.read_response(api_key, version, correlation_id)

    def read_response(self, api_key: int, version: int, correlation_id: int) -> Any:
        payload = self.recv_frame()
        (corr,) = struct.unpack_from(">i", payload, 0)
        assert corr == correlation_id, f"expected correlation id {correlation_id}, got {corr}"
        flexible = codec.is_flexible(api_key, version) and api_key != 18  # ApiVersions: header v0
        return codec.decode_response(api_key, version, payload, 5 if flexible else 4)

    def wait_closed(self, timeout: float = 10.0) -> bool:
        """True once the broker has closed the connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(0.2)
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.2) + 10):
            if time.monotonic() >= deadline:
                return False
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not data:
                return True
        return False


API_VERSIONS_V3_BODY: dict[str, Any] = {"client_software_name": "raw-test", "client_software_version": "1.0"}


@pytest.fixture
def kp(broker: BrokerProcess) -> Iterator[KpQuotas]:
    """Client quota admin (kafka-python) on the module's ``broker`` fixture (each quota test module has one)."""
    c = KpQuotas(broker, CLIENT_TIMEOUT)
    try:
        yield c
    finally:
        c.close()
