"""Request quotas and user-principal quotas on a real broker.

- ``request_percentage`` on one client id: a raw connection flooding cheap Metadata requests is told to
  back off (throttle_time_ms > 0) and is slowed down by its muted connection, while another client id
  flooding the same way alongside it is not.
- ``producer_byte_rate`` on a SASL user (User:alice over SASL_PLAINTEXT, PLAIN): alice's confluent-kafka
  producer is throttled to about its quota while an anonymous producer on the PLAINTEXT listener is not.

The broker measures over 2 windows of 1 s so that rates settle within a few seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import RawConnection, create_topic, make_producer, request_frame, unique_topic
from tests.integration.test_security_sasl import rd_conf, start_broker
from tests.support.broker import BrokerProcess
from tests.support.quotas import KpQuotas

RUN_S = 4.0


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    b, sasl = start_broker(tmp_path_factory.mktemp("quota-principals"),
                           **{"quota.window.num": "2", "quota.window.size.seconds": "1"})
    try:
        yield b, sasl
    finally:
        b.stop()


@pytest.fixture
def kp(brokers: tuple[BrokerProcess, str]) -> Iterator[KpQuotas]:
    c = KpQuotas(brokers[0])
    try:
        yield c
    finally:
        c.close()


class MetadataFlood(threading.Thread):
    """Metadata requests back to back on one connection for ``seconds``: how many were answered and the
    throttle times the broker gave."""

    def __init__(self, broker: BrokerProcess, client_id: str, seconds: float) -> None:
        super().__init__(daemon=True)
        self.broker, self.client_id, self.seconds = broker, client_id, seconds
        self.answered = 0
        self.throttles: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with RawConnection(self.broker) as conn:
                end = time.monotonic() + self.seconds
                for correlation_id in range(1, 1_000_000):  # bounded; the clock ends it
                    if time.monotonic() >= end:
                        break
                    conn.send(request_frame(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                    "include_topic_authorized_operations": False},
                                            correlation_id, client_id=self.client_id))
                    r = conn.read_response(3, 12, correlation_id)
                    self.answered += 1
                    ms = int(r.throttle_time.total_seconds() * 1000)
                    if ms:
                        self.throttles.append(ms)
        except BaseException as e:  # reported by the test
            self.error = e


def test_request_percentage_throttles_the_flooding_client_id_only(brokers: tuple[BrokerProcess, str],
                                                                  kp: KpQuotas) -> None:
    broker = brokers[0]
    # 1% of one thread: 10 ms of handling per second, a few dozen Metadata requests.
    assert kp.alter((("client-id", "flooder"),), {"request_percentage": 1.0}) == (0, None)
    try:
        limited = MetadataFlood(broker, "flooder", RUN_S)
        free = MetadataFlood(broker, "not-limited", RUN_S)
        limited.start()
        free.start()
        limited.join(RUN_S + 30)
        free.join(RUN_S + 30)
        assert limited.error is None and free.error is None, (limited.error, free.error)
        assert limited.throttles and max(limited.throttles) > 0
        assert max(limited.throttles) <= 1000  # request-time throttles are bounded to one window
        assert free.throttles == []
        # Muted for its throttle times, the flooder got far fewer answers than the other client id.
        assert limited.answered * 3 < free.answered, (limited.answered, free.answered)
    finally:
        assert kp.alter((("client-id", "flooder"),), {"request_percentage": None}) == (0, None)


class ProduceFlood(threading.Thread):
    """1 KB messages as fast as the producer takes them for ``seconds``: bytes delivered and throttles."""

    def __init__(self, broker: BrokerProcess, topic: str, seconds: float, **conf: Any) -> None:
        super().__init__(daemon=True)
        self.topic, self.seconds = topic, seconds
        self.delivered = 0
        self.throttles: list[float] = []
        self.errors: list[Any] = []
        self.producer = make_producer(broker, **{"linger.ms": 2, "queue.buffering.max.kbytes": 256,
                                                 "throttle_cb": lambda e: self.throttles.append(e.throttle_time),
                                                 **conf})

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.delivered += len(msg.value())

    def run(self) -> None:
        p = self.producer
        end = time.monotonic() + self.seconds
        for _ in range(10_000_000):  # bounded; the clock ends it
            if time.monotonic() >= end:
                break
            try:
                p.produce(self.topic, b"v" * 1000, on_delivery=self._delivered)
            except BufferError:
                p.poll(0.005)
            p.poll(0)
        p.flush(30)


def test_user_quota_throttles_the_sasl_user_not_anonymous(brokers: tuple[BrokerProcess, str], kp: KpQuotas) -> None:
    broker, sasl = brokers
    quota = 100_000  # bytes per second
    topic = unique_topic("user-quota")
    create_topic(broker, topic)
    assert kp.alter((("user", "alice"),), {"producer_byte_rate": float(quota)}) == (0, None)
    try:
        alice = ProduceFlood(broker, topic, RUN_S, **rd_conf(sasl, "PLAIN", "alice", "alice-secret"))
        anonymous = ProduceFlood(broker, topic, RUN_S)
        alice.start()
        anonymous.start()
        alice.join(RUN_S + 60)
        anonymous.join(RUN_S + 60)
        assert alice.errors == [] and anonymous.errors == []
        assert alice.throttles, "alice was never throttled"
        assert anonymous.throttles == []
        # Alice stays near her quota (Kafka's sampled rate lets a burst of about two windows through, and
        # a produce request is charged whole); the anonymous producer is limited by nothing but the machine.
        assert alice.delivered < quota * RUN_S * 4, alice.delivered
        assert anonymous.delivered > 10 * alice.delivered, (anonymous.delivered, alice.delivered)
    finally:
        assert kp.alter((("user", "alice"),), {"producer_byte_rate": None}) == (0, None)
