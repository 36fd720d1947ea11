"""Client quotas enforced on real clients: confluent-kafka producers and consumers on one broker, one
client id under a byte-rate quota set through kafka-python's AlterClientQuotas, the other not.

The broker measures with 2 windows of 1 s (quota.window.num / quota.window.size.seconds) so that the
rate settles within the run: with Kafka's default 11 windows a client may first send 10 s worth of its
quota at once.  Observed rates are the slope of the bytes a client got through over the steady part
of the run (after the first windows), fitted by least squares, which the bursts within a window do
not swing the way a start-to-end difference would.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from tests.integration.conftest import (
    BrokerFactory,
    create_topic,
    make_consumer,
    make_producer,
    produce_all,
    unique_topic,
)
from tests.integration.test_metrics import scrape, value
from tests.support.broker import BrokerProcess, free_port
from tests.support.quotas import KpQuotas

QUOTA = 200_000  # bytes per second
METRICS_PORT = free_port()
RUN_S = 12.0
STEADY = (3.0, 11.0)  # seconds into the run
VALUE = b"v" * 1000


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory({"quota.window.num": "2", "quota.window.size.seconds": "1",
                                  "pykbroker.metrics.listener": f"http://127.0.0.1:{METRICS_PORT}"})


def _assert_sensor(kind: str, client_id: str) -> None:
    """The quota sensor on the metrics endpoint, as Kafka's kafka.server:type=Produce|Fetch,client-id= beans."""
    samples = scrape(METRICS_PORT)
    assert value(samples, f"kafka_server_{kind}_quota", user="", client_id=client_id) == QUOTA
    assert value(samples, f"kafka_server_{kind}_throttle_time", user="", client_id=client_id) > 0
    assert 0 < value(samples, f"kafka_server_{kind}_byte_rate", user="", client_id=client_id) < 2 * QUOTA


def slope(events: list[tuple[float, int]], start: float, end: float) -> float:
    """Bytes per second: least-squares slope of the cumulative bytes over [start, end)."""
    points, total = [], 0
    for t, n in events:
        total += n
        if start <= t < end:
            points.append((t, total))
    assert len(points) >= 10, f"only {len(points)} deliveries in the steady part"
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


class ProducerRun(threading.Thread):
    """Produce 1 KB messages as fast as the client lets us for ``seconds``; delivery times and throttles."""

    def __init__(self, broker: BrokerProcess, topic: str, client_id: str, seconds: float) -> None:
        super().__init__(daemon=True)
        self.topic, self.seconds = topic, seconds
        self.delivered: list[tuple[float, int]] = []
        self.throttles: list[int] = []
        self.errors: list[Any] = []
        self.producer = make_producer(
            broker, **{"client.id": client_id, "batch.size": 16384, "linger.ms": 2,
                       "queue.buffering.max.kbytes": 256, "throttle_cb": self._throttled})
        self.started = 0.0

    def _throttled(self, event: Any) -> None:
        self.throttles.append(int(event.throttle_time * 1000))

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.delivered.append((time.monotonic() - self.started, len(msg.value())))

    def run(self) -> None:
        p = self.producer
        self.started = time.monotonic()
        end = self.started + self.seconds
        for _ in range(10_000_000):  # bounded; the clock ends it
            if time.monotonic() >= end:
                break
            try:
                p.produce(self.topic, VALUE, on_delivery=self._delivered)
            except BufferError:
                p.poll(0.005)
            p.poll(0)
        p.flush(30)


def test_producer_byte_rate_throttles_one_client_id_only(broker: BrokerProcess, kp: KpQuotas) -> None:
    topic = unique_topic("quota-produce")
    create_topic(broker, topic)
    # Set while the broker runs: it applies to the next request.
    assert kp.alter((("client-id", "slow-producer"),), {"producer_byte_rate": float(QUOTA)}) == (0, None)
    slow = ProducerRun(broker, topic, "slow-producer", RUN_S)
    fast = ProducerRun(broker, topic, "fast-producer", RUN_S)
    slow.start()
    fast.start()
    slow.join(60)
    fast.join(60)
    assert not slow.is_alive() and not fast.is_alive()
    assert not slow.errors and not fast.errors
    slow_rate = slope(slow.delivered, *STEADY)
    fast_rate = slope(fast.delivered, *STEADY)
    # The quota bounds the rate from above; below, a loaded machine (2 shared cores) may slow the client too.
    assert 0.75 * QUOTA <= slow_rate <= 1.10 * QUOTA, (slow_rate, fast_rate)
    assert fast_rate > 3 * QUOTA, (slow_rate, fast_rate)
    # librdkafka read the throttle time from the responses (KIP-219) and reported it.
    assert slow.throttles and max(slow.throttles) > 0
    assert not fast.throttles
    _assert_sensor("produce", "slow-producer")

    # Removed while the broker runs: the same client id is no longer held back.
    assert kp.alter((("client-id", "slow-producer"),), {"producer_byte_rate": None}) == (0, None)
    freed = ProducerRun(broker, topic, "slow-producer", 4.0)
    freed.start()
    freed.join(60)
    assert not freed.errors
    assert slope(freed.delivered, 2.0, 4.0) > 3 * QUOTA


class ConsumerRun(threading.Thread):
    def __init__(self, broker: BrokerProcess, topic: str, client_id: str, seconds: float, expected: int) -> None:
        super().__init__(daemon=True)
        self.seconds, self.expected = seconds, expected
        self.received: list[tuple[float, int]] = []
        self.throttles: list[int] = []
        self.consumer = make_consumer(
            broker, **{"client.id": client_id, "fetch.max.bytes": 16384, "max.partition.fetch.bytes": 16384,
                       "message.max.bytes": 16384,
                       "throttle_cb": self._throttled})
        self.consumer.assign([TopicPartition(topic, 0, 0)])

    def _throttled(self, event: Any) -> None:
        self.throttles.append(int(event.throttle_time * 1000))

    def run(self) -> None:
        c = self.consumer
        started = time.monotonic()
        end = started + self.seconds
        try:
            for _ in range(1_000_000):  # bounded; the clock or the end of the data ends it
                if time.monotonic() >= end or len(self.received) >= self.expected:
                    break
                for m in c.consume(num_messages=100, timeout=0.05):
                    if m.error() is None:
                        self.received.append((time.monotonic() - started, len(m.value() or b"")))
        finally:
            c.close()


def test_consumer_byte_rate_throttles_one_client_id_only(broker: BrokerProcess, kp: KpQuotas) -> None:
    topic = unique_topic("quota-fetch")
    create_topic(broker, topic)
    count = 4000  # 4 MB: more than the throttled consumer can read in the run
    # Batches of at most 16 KB: a batch is fetched whole (KIP-74), and one larger than the quota lets
    # through in the windows (here 200 KB) could never be answered, with Kafka as here.
    loader = make_producer(broker, **{"client.id": "loader", "batch.size": 16384})
    produce_all(loader, topic, [{"value": VALUE}] * count)
    assert kp.alter((("client-id", "slow-consumer"),), {"consumer_byte_rate": float(QUOTA)}) == (0, None)
    slow = ConsumerRun(broker, topic, "slow-consumer", RUN_S, count)
    fast = ConsumerRun(broker, topic, "fast-consumer", RUN_S, count)
    slow.start()
    fast.start()
    slow.join(60)
    fast.join(60)
    assert not slow.is_alive() and not fast.is_alive()
    slow_rate = slope(slow.received, *STEADY)
    assert 0.75 * QUOTA <= slow_rate <= 1.10 * QUOTA, slow_rate  # as for the producer
    assert len(slow.received) < count  # still reading when the run ended
    # The other consumer read all 4 MB in a fraction of the run: far above the quota.
    assert len(fast.received) == count
    fast_seconds = fast.received[-1][0]
    assert count * len(VALUE) / fast_seconds > 3 * QUOTA, fast_seconds
    assert slow.throttles and max(slow.throttles) > 0
    assert not fast.throttles
    _assert_sensor("fetch", "slow-consumer")
