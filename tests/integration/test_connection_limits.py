"""Connection limits, file descriptors, request memory and slow senders, against real brokers.

Every broker is a subprocess on 127.0.0.1; limits on its descriptors are set from outside with
prlimit (psutil), and its memory and sockets are read with psutil.  Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import resource
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from pykbroker.cli import healthcheck
from tests.integration.conftest import (
    API_VERSIONS_V3_BODY,
    BrokerFactory,
    create_topic,
    make_consumer,
    make_producer,
    produce_all,
    request_frame,
    unique_topic,
    wait_until,
)
from tests.support.broker import BrokerProcess, free_port

MiB = 1 << 20
# Internal topics with one partition each: a broker with a few dozen descriptors, so that a low
# nofile limit is about connections only.
LEAN = {"offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"}


@pytest.fixture(autouse=True)
def _many_descriptors() -> Iterator[None]:
    """The test process opens thousands of sockets: raise its soft limit for the test's duration."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _limit_fds(b: BrokerProcess, n: int) -> psutil.Process:
    """Lower the broker's soft and hard RLIMIT_NOFILE from outside (it raised soft to hard at start)."""
    assert b.proc is not None
    p = psutil.Process(b.proc.pid)
    p.rlimit(psutil.RLIMIT_NOFILE, (n, n))
    assert p.rlimit(psutil.RLIMIT_NOFILE) == (n, n)
    return p


def _established(p: psutil.Process, port: int | None = None) -> int:
    """The broker's established TCP connections (optionally only those on one of its ports)."""
    return sum(1 for c in p.net_connections(kind="tcp")
               if c.status == psutil.CONN_ESTABLISHED and (port is None or c.laddr.port == port))


def _api_versions_ok(sock: socket.socket, correlation_id: int = 7) -> bool:
    """An ApiVersions v3 round trip on an open socket: True if answered, False if the broker closed it."""
    try:
        sock.sendall(request_frame(18, 3, API_VERSIONS_V3_BODY, correlation_id))
        head = _recv_exact(sock, 8)
    except (ConnectionError, TimeoutError, OSError):
        return False
    if head is None:
        return False
    size, corr = struct.unpack(">ii", head)
    rest = _recv_exact(sock, size - 4)
    return corr == correlation_id and rest is not None


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    for _ in range(n + 1):
        if len(buf) >= n:
            break
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _connect(port: int, source: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
    s.settimeout(timeout)
    return s


def _closed_by_broker(sock: socket.socket, timeout: float) -> bool:
    """True once the peer closed the socket (EOF or reset) within ``timeout``."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.2) + 10):
        if time.monotonic() >= deadline:
            return False
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return True
        if not data:
            return True
    return False


def _start(b: BrokerProcess, factory: BrokerFactory) -> BrokerProcess:
    factory.brokers.append(b)  # killed at teardown
    return b.start()


# --- per-IP limits ---------------------------------------------------------------------------------


def test_max_connections_per_ip_and_overrides(broker_factory: BrokerFactory) -> None:
    b = broker_factory({**LEAN, "max.connections.per.ip": "2",
                        "max.connections.per.ip.overrides": "localhost:3,127.0.0.2:4"})
    with contextlib.ExitStack() as stack:
        # localhost resolves to 127.0.0.1: 3 allowed; 127.0.0.2: 4; any other address: 2.
        for source, allowed in (("127.0.0.1", 3), ("127.0.0.2", 4), ("127.0.0.3", 2)):
            held = [stack.enter_context(_connect(b.port, source)) for _ in range(allowed)]
            for i, s in enumerate(held):
                assert _api_versions_ok(s, i), f"connection {i + 1} of {allowed} from {source} refused"
            extra = stack.enter_context(_connect(b.port, source))
            assert _closed_by_broker(extra, 10), f"connection {allowed + 1} from {source} was not closed"
        # A slot freed by a closing connection is available again.
        held[0].close()
        time.sleep(0.3)
        again = wait_until(lambda: _try_answered(b.port, "127.0.0.3"), timeout=10,
                           what="a new connection from 127.0.0.3 after one closed")
        again.close()
    log = b.log()
    assert "rejected connection: the address already has its maximum of connections" in log
    assert "ip=127.0.0.1" in log and "limit=3" in log
    assert b.proc is not None and b.proc.poll() is None


def _try_answered(port: int, source: str) -> socket.socket | None:
    s = _connect(port, source)
    if _api_versions_ok(s):
        return s
    s.close()
    return None


# --- creation rate ---------------------------------------------------------------------------------


def test_max_connection_creation_rate_throttles_accepting(broker_factory: BrokerFactory) -> None:
    """Kafka averages the rate over ten one-second windows: 10 s worth (200) pass, then each waits more."""
    rate = 20
    b = broker_factory({**LEAN, "max.connection.creation.rate": str(rate)})
    socks: list[socket.socket] = []
    try:
        started = time.monotonic()
        for i in range(10 * rate + 10):
            s = _connect(b.port, timeout=30)
            socks.append(s)
            s.sendall(request_frame(18, 3, API_VERSIONS_V3_BODY, i))
        for i, s in enumerate(socks):
            head = _recv_exact(s, 8)
            assert head is not None and struct.unpack(">ii", head)[1] == i, f"connection {i} not answered"
        elapsed = time.monotonic() - started
    finally:
        for s in socks:
            s.close()
    # The 10 connections beyond the burst wait k/rate seconds each (k = 1..10): 2.75 s in all.
    assert elapsed >= 2.0, f"{len(socks)} connections in {elapsed:.2f}s: not throttled"
    assert elapsed < 30
    assert "above max.connection.creation.rate" in b.log()


# --- running out of file descriptors ------------------------------------------------------------------


def test_out_of_file_descriptors_backs_off_and_recovers(broker_factory: BrokerFactory) -> None:
    b = broker_factory(dict(LEAN))
    p = _limit_fds(b, 128)
    assert p.num_fds() < 100, f"the broker already holds {p.num_fds()} descriptors"
    clients: list[socket.socket] = []
    try:
        for _ in range(250):  # more than the broker has descriptors; the kernel queues the rest
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", b.port))
            clients.append(s)
        wait_until(lambda: "cannot accept connections" in b.log(), timeout=15, what="the accept back-off log")
        time.sleep(1.5)  # ~15 more failed accepts: still one log line, still alive
        assert b.proc is not None and b.proc.poll() is None, f"broker died:\n{b.log()[-3000:]}"
        assert p.num_fds() <= 128
        assert b.log().count("cannot accept connections") == 1, "the back-off log line is not rate-limited"
    finally:
        for s in clients:
            s.close()
    wait_until(lambda: healthcheck(b.bootstrap, 2.0), timeout=30, what="the broker serving again")
    topic = unique_topic("emfile")
    reports = produce_all(make_producer(b), topic, [{"value": b"after EMFILE"}])
    assert reports[0].error is None and reports[0].offset == 0
    assert b.proc.poll() is None


def test_soft_nofile_limit_is_raised_to_the_hard_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard > 512, "the machine's hard nofile limit is too low for this test"

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    out = subprocess.run(
        [sys.executable, "-c",
         "import logging, resource; logging.basicConfig(level=logging.INFO);"
         "from pykbroker.server.network import raise_nofile_limit;"
         "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0]); raise_nofile_limit();"
         "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"],
        preexec_fn=low_soft_limit, capture_output=True, text=True, timeout=60, check=True,
    )
    before, after = (int(x) for x in out.stdout.split())
    assert (before, after) == (256, hard)
    assert f"raised the file descriptor limit (nofile) from 256 to {hard}" in out.stderr


# --- request memory and slow senders -------------------------------------------------------------------


def test_request_memory_pool_bounds_rss_and_slow_requests_are_dropped(broker_factory: BrokerFactory) -> None:
    """8 connections each start a 100 MiB-1 request and send 40 MiB of it: with queued.max.request.bytes
    only the requests that got memory are read (Kafka's pool lets one overdraw it, so two), the others
    wait in the kernel; each dropped after pykbroker.request.receive.timeout.ms; then all is well."""
    b = broker_factory({**LEAN, "queued.max.request.bytes": str(100 * MiB),
                        "pykbroker.request.receive.timeout.ms": "2500"})
    assert b.proc is not None
    p = psutil.Process(b.proc.pid)
    rss0 = p.memory_info().rss
    chunk = memoryview(bytes(MiB))
    target = 40 * MiB
    socks = [_connect(b.port) for _ in range(8)]
    sent = [0] * len(socks)
    peak = rss0
    try:
        for s in socks:
            s.sendall(struct.pack(">i", 100 * MiB - 1))
            s.setblocking(False)
        last_progress = time.monotonic()
        deadline = time.monotonic() + 8
        for _ in range(100_000):  # bounded: each turn sends or waits up to 50 ms
            if time.monotonic() >= deadline or time.monotonic() - last_progress > 2.0:
                break
            pending = [s for s, n in zip(socks, sent, strict=True) if n < target]
            if not pending:
                break
            _, writable, _ = select.select([], pending, [], 0.05)
            for s in writable:
                i = socks.index(s)
                try:
                    sent[i] += s.send(chunk[: min(MiB, target - sent[i])])
                    last_progress = time.monotonic()
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:  # dropped by the receive timeout meanwhile: nothing more to send
                    sent[i] = target + 1
            peak = max(peak, p.memory_info().rss)
        for _ in range(10):
            peak = max(peak, p.memory_info().rss)
            time.sleep(0.05)
        growth = (peak - rss0) / MiB
        fully_sent = sum(1 for n in sent if n == target)
        # Two requests got memory and were read (80 MiB, held as received: 79-80 MiB measured); without the
        # pool all eight would be (~320 MiB). A buffer grown chunk by chunk could cost up to twice what was read.
        assert fully_sent >= 2, f"sent per connection: {[n // MiB for n in sent]} MiB"
        assert growth < 120, f"RSS grew by {growth:.0f} MiB (sent {[n // MiB for n in sent]} MiB)"
        assert "request memory exhausted" in b.log() and "queued_max_request_bytes=104857600" in b.log()
        # Every half-sent request is dropped after the receive timeout; the waiting ones get memory
        # in turn and are dropped in turn.
        for s in socks:
            s.setblocking(True)
        closed = [_closed_by_broker(s, 30) for s in socks]
        assert all(closed), f"connections still open: {[i for i, c in enumerate(closed) if not c]}"
    finally:
        for s in socks:
            s.close()
    assert "request not received within pykbroker.request.receive.timeout.ms" in b.log()
    assert "timeout_ms=2500" in b.log()
    wait_until(lambda: p.memory_info().rss - rss0 < 40 * MiB, timeout=10, what="memory given back")
    topic = unique_topic("pool")
    reports = produce_all(make_producer(b), topic, [{"value": b"x" * 1000} for _ in range(10)])
    assert [r.error for r in reports] == [None] * 10


# --- a connection flood against max.connections -----------------------------------------------------


class _Clients:
    """A producer and a consumer on the inter-broker listener, recording every error they see."""

    def __init__(self, bootstrap_broker: BrokerProcess, topic: str) -> None:
        self.topic = topic
        self.errors: list[str] = []
        self.produced = 0
        self.delivered = 0
        self.consumed = 0
        self._stop = threading.Event()
        self._producer_done = threading.Event()
        self.producer = make_producer(bootstrap_broker, **{"linger.ms": 2, "message.timeout.ms": 60000})
        self.consumer = make_consumer(bootstrap_broker)
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self._threads = [threading.Thread(target=self._produce), threading.Thread(target=self._consume)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.errors.append(f"delivery: {err}")
        else:
            self.delivered += 1

    def _produce(self) -> None:
        for i in range(100_000):  # bounded; stopped long before
            if self._stop.is_set():
                break
            try:
                self.producer.produce(self.topic, value=b"v%d" % i, on_delivery=self._on_delivery)
                self.produced += 1
            except BufferError:
                pass
            self.producer.poll(0.02)
        left = self.producer.flush(30)
        if left:
            self.errors.append(f"{left} messages not delivered")
        self._producer_done.set()

    def _consume(self) -> None:
        stop_deadline = None
        for _ in range(100_000):  # bounded; and at most 60 s once the producer is done
            if self._producer_done.is_set():
                stop_deadline = stop_deadline or time.monotonic() + 60
                if self.consumed >= self.delivered or time.monotonic() > stop_deadline:
                    break
            for m in self.consumer.consume(num_messages=500, timeout=0.1):
                err: Any = m.error()
                if err is not None:
                    self.errors.append(f"consume: {err}")
                else:
                    self.consumed += 1

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        self.consumer.close()


def test_connection_flood_against_max_connections(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    max_connections = 1000
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    flood = min(5000, soft - 500)
    assert flood >= 2 * max_connections, f"the test process may open only {soft} descriptors"
    internal, external = free_port(), free_port()
    b = _start(BrokerProcess(tmp_path / "flood", {
        **LEAN,
        "listeners": f"PLAINTEXT://127.0.0.1:{internal},EXTERNAL://127.0.0.1:{external}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
        "max.connections": str(max_connections),
    }, port=internal), broker_factory)
    # Without max.connections, 5000 connections would exhaust this limit (and then back off).
    p = _limit_fds(b, max_connections + 400)
    topic = unique_topic("flood")
    create_topic(b, topic)
    clients = _Clients(b, topic)  # on PLAINTEXT, the inter-broker listener, exempt from max.connections
    clients.start()
    wait_until(lambda: clients.consumed >= 10, timeout=30, what="clients working before the flood")
    early = _connect(external)  # an EXTERNAL connection opened before the flood keeps working
    assert _api_versions_ok(early, 1)
    flood_socks: list[socket.socket] = []
    try:
        for _ in range(flood):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", external))
            flood_socks.append(s)
        wait_until(lambda: _established(p) >= max_connections, timeout=60, what="the broker at max.connections")
        samples = []
        for _ in range(10):
            samples.append(_established(p))
            time.sleep(0.2)
        assert max(samples) <= max_connections, f"broker connections sampled: {samples}"
        assert b.proc is not None and b.proc.poll() is None
        assert _api_versions_ok(early, 2), "the connection opened before the flood stopped working"
        # A new connection on the inter-broker listener is let in: the least recently used other
        # connection (a silent flood connection, not `early`, which was just used) is closed for it.
        assert healthcheck(b.bootstrap, 10), "the inter-broker listener refused a connection at the limit"
        wait_until(lambda: "closing the least recently used connection" in b.log(), timeout=10,
                   what="the LRU connection closed")
        assert _api_versions_ok(early, 3)
        assert clients.errors == [], clients.errors[:10]
    finally:
        for s in flood_socks:
            s.close()
    wait_until(lambda: healthcheck(f"127.0.0.1:{external}", 2.0), timeout=60,
               what="EXTERNAL accepting again after the flood")
    wait_until(lambda: _established(p) < 50, timeout=60, what="the flood's connections gone")
    produced_before_stop = clients.delivered
    wait_until(lambda: clients.delivered > produced_before_stop + 10, timeout=30, what="clients still working")
    clients.stop()
    assert clients.errors == [], clients.errors[:10]
    assert clients.consumed == clients.delivered == clients.produced
    log = b.log()
    assert "connection limit reached: not accepting new connections until one closes listener=EXTERNAL" in log
    assert log.count("connection limit reached") <= 10, "limit log is not rate-limited"
    assert b.proc.poll() is None


def test_trickled_request_is_dropped_but_idle_connections_are_not(broker_factory: BrokerFactory) -> None:
    """A request dribbling in slower than pykbroker.request.receive.timeout.ms is dropped; a connection
    that sends nothing is idle, which only connections.max.idle.ms governs."""
    b = broker_factory({**LEAN, "pykbroker.request.receive.timeout.ms": "1000"})
    with _connect(b.port) as idle, _connect(b.port) as slow:
        frame = request_frame(18, 3, API_VERSIONS_V3_BODY, 5)
        started = time.monotonic()
        closed_at = None
        for i in range(len(frame)):  # one byte every 200 ms: the whole request would take seconds
            try:
                slow.sendall(frame[i : i + 1])
            except OSError:
                closed_at = time.monotonic()
                break
            if _closed_by_broker(slow, 0.2):
                closed_at = time.monotonic()
                break
        assert closed_at is not None, "the trickled request was answered or never dropped"
        assert 0.9 <= closed_at - started <= 5.0, f"dropped after {closed_at - started:.2f}s"
        time.sleep(max(0.0, 1.5 - (time.monotonic() - started)))
        assert _api_versions_ok(idle), "an idle connection was closed by the receive timeout"
    assert "request not received within pykbroker.request.receive.timeout.ms" in b.log()
    assert "timeout_ms=1000" in b.log()
