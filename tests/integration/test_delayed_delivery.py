"""Delayed delivery (docs/queues.md "Delayed delivery") with real clients against a broker subprocess.

Records carry ``pykbroker.delay.ms`` / ``pykbroker.deliver.at.ms`` headers (confluent-kafka, kafka-python)
or go to a topic created with the ``pykbroker.delay.ms`` config; a consumer reading the target topic must
see each of them neither before its due time nor more than LATE_S after it, in due order, exactly once,
also across kill -9 of the broker.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from tests.integration.conftest import (
    BrokerFactory,
    create_topic,
    make_consumer,
    make_producer,
    produce_all,
    unique_topic,
    wait_until,
)
from tests.support.broker import BrokerProcess

# How late a record may appear after its due time on this shared 2-core machine (timer, fetch long-poll
# of 100 ms, client scheduling).
LATE_S = 1.5
ENABLED = {"pykbroker.delay.enable": "true", "log.cleaner.backoff.ms": "1000"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def read_with_arrival(b: BrokerProcess, topic: str, expected: int, timeout: float) -> list[tuple[int, Any]]:
    """Consume ``topic``-0 from the start until ``expected`` records arrived (bounded), plus a short grace
    period for extras; each record with the wall-clock ms it arrived at."""
    c = make_consumer(b, **{"fetch.wait.max.ms": 50})
    out: list[tuple[int, Any]] = []
    try:
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.05) + 100):
            if len(out) >= expected or time.monotonic() >= deadline:
                break
            for m in c.consume(num_messages=500, timeout=0.05):
                assert m.error() is None, m.error()
                out.append((now_ms(), m))
        for m in c.consume(num_messages=500, timeout=1.0):
            if m.error() is None:
                out.append((now_ms(), m))
    finally:
        c.close()
    return out


def check_on_time(arrivals: list[tuple[int, Any]], due: dict[bytes, int]) -> None:
    got = [m.key() for _, m in arrivals]
    assert sorted(got) == sorted(due), f"expected each key once: {sorted(due)}, got {got}"
    for at, m in arrivals:
        d = due[m.key()]
        assert at >= d, f"{m.key()!r} arrived {d - at} ms before its due time"
        assert at - d <= LATE_S * 1000, f"{m.key()!r} arrived {at - d} ms after its due time"
    dues = [due[k] for k in got]
    assert dues == sorted(dues), f"not in due order: {got}"


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_header_delays_with_confluent_kafka(broker_factory: BrokerFactory, compression: str) -> None:
    b = broker_factory(ENABLED)
    topic = unique_topic("delay")
    create_topic(b, topic)
    p = make_producer(b, **{"compression.type": compression})
    base = now_ms()
    msgs: list[dict[str, Any]] = [
        {"key": b"d3000", "value": b"v", "timestamp": base, "headers": [("pykbroker.delay.ms", b"3000")]},
        {"key": b"now", "value": b"v", "timestamp": base},
        {"key": b"d1000", "value": b"v", "timestamp": base, "headers": [("pykbroker.delay.ms", b"1000")]},
        {"key": b"at2000", "value": b"v", "timestamp": base,
         "headers": [("pykbroker.deliver.at.ms", str(base + 2000).encode()), ("other", b"x")]},
    ]
    reports = produce_all(p, topic, msgs)
    assert all(r.error is None for r in reports), reports
    arrivals = read_with_arrival(b, topic, 4, timeout=15)
    # The undelayed record is there at once; the others at their due times, in due order.
    assert arrivals and arrivals[0][1].key() == b"now"
    assert arrivals[0][0] - base < 2500
    check_on_time(arrivals[1:], {b"d1000": base + 1000, b"at2000": base + 2000, b"d3000": base + 3000})
    delivered = {m.key(): m for _, m in arrivals}
    # Value, timestamp and headers are the producer's.
    m = delivered[b"at2000"]
    assert m.value() == b"v" and m.timestamp()[1] == base
    assert ("other", b"x") in (m.headers() or [])


def test_bad_header_is_invalid_record(broker_factory: BrokerFactory) -> None:
    b = broker_factory(ENABLED)
    topic = unique_topic("delay-bad")
    create_topic(b, topic)
    p = make_producer(b, retries=0)
    reports = produce_all(p, topic, [{"key": b"k", "value": b"v", "headers": [("pykbroker.delay.ms", b"soon")]}])
    assert reports[0].error is not None and reports[0].error.code() == KafkaError.INVALID_RECORD, reports[0]
    assert "pykbroker.delay.ms" in b.log()


def test_idempotent_producer_keeps_its_sequence(broker_factory: BrokerFactory) -> None:
    """An idempotent producer's delayed batch is scheduled whole; its next batches stay in sequence."""
    b = broker_factory(ENABLED)
    topic = unique_topic("delay-idem")
    create_topic(b, topic)
    p = make_producer(b, **{"enable.idempotence": True})
    base = now_ms()
    reports = produce_all(p, topic, [{"key": b"first", "value": b"v", "timestamp": base}], flush_each=True)
    reports += produce_all(p, topic, [{"key": b"late", "value": b"v", "timestamp": base,
                                       "headers": [("pykbroker.delay.ms", b"2000")]}], flush_each=True)
    reports += produce_all(p, topic, [{"key": b"second", "value": b"v", "timestamp": base}], flush_each=True)
    assert all(r.error is None for r in reports), [r.error for r in reports]
    arrivals = read_with_arrival(b, topic, 3, timeout=15)
    assert [m.key() for _, m in arrivals[:2]] == [b"first", b"second"]
    check_on_time(arrivals[2:], {b"late": base + 2000})
    with pytest.raises(KafkaException, match="transaction"):
        tp = make_producer(b, **{"transactional.id": unique_topic("txn")})
        tp.init_transactions(20)
        tp.begin_transaction()
        tp.produce(topic, key=b"t", value=b"v", headers=[("pykbroker.delay.ms", b"100")])
        tp.commit_transaction(20)


def test_topic_default_delay_and_kafka_python(broker_factory: BrokerFactory) -> None:
    from kafka import KafkaProducer

    b = broker_factory(ENABLED)
    topic = unique_topic("delay-topic")
    create_topic(b, topic, config={"pykbroker.delay.ms": "1500"})
    kp = KafkaProducer(bootstrap_servers=b.bootstrap, linger_ms=5)
    try:
        base = now_ms()
        kp.send(topic, key=b"default", value=b"v", timestamp_ms=base, partition=0).get(timeout=20)
        # A header overrides the topic's default: 0 is at once, 3000 later.
        kp.send(topic, key=b"zero", value=b"v", timestamp_ms=base, partition=0,
                headers=[("pykbroker.delay.ms", b"0")]).get(timeout=20)
        kp.send(topic, key=b"longer", value=b"v", timestamp_ms=base, partition=0,
                headers=[("pykbroker.delay.ms", b"3000")]).get(timeout=20)
    finally:
        kp.close(timeout=10)
    arrivals = read_with_arrival(b, topic, 3, timeout=15)
    assert arrivals and arrivals[0][1].key() == b"zero"
    check_on_time(arrivals[1:], {b"default": base + 1500, b"longer": base + 3000})


def test_topic_config_refused_when_disabled(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    with pytest.raises(KafkaException, match="pykbroker.delay.enable"):
        create_topic(b, unique_topic("delay-off"), config={"pykbroker.delay.ms": "1000"})


def test_kill_9_delivers_each_record_exactly_once(broker_factory: BrokerFactory) -> None:
    b = broker_factory(ENABLED)
    topic = unique_topic("delay-kill")
    create_topic(b, topic)
    p = make_producer(b)
    base = now_ms()
    # Some records fall due before the kill, some while the broker is down, some after the restart.
    n = 60
    msgs = [{"key": f"k{i:03d}".encode(), "value": b"v", "timestamp": base,
             "headers": [("pykbroker.delay.ms", str(500 + i * 100).encode())]} for i in range(n)]
    reports = produce_all(p, topic, msgs)
    assert all(r.error is None for r in reports), [r.error for r in reports if r.error]
    due = {m["key"]: base + 500 + i * 100 for i, m in enumerate(msgs)}
    wait_until(lambda: now_ms() >= base + 2000, timeout=10, what="some deliveries")
    b.kill()
    time.sleep(1.0)
    b.start()
    arrivals = read_with_arrival(b, topic, n, timeout=20)
    got = [m.key() for _, m in arrivals]
    assert sorted(got) == sorted(due), f"missing {sorted(set(due) - set(got))[:5]}, extra {len(got) - len(set(got))}"
    for at, m in arrivals:
        assert at >= due[m.key()] - 50 or m.timestamp()[1] == base
    # The stored order is due order (records overdue at the restart were delivered at once, in due order).
    assert [due[k] for k in got] == sorted(due[k] for k in got)
    # Records due after the restart came on time.
    restarted = now_ms()
    late = [(m.key(), at - due[m.key()]) for at, m in arrivals if due[m.key()] > restarted + 1000]
    assert all(d <= LATE_S * 1000 for _, d in late), late
