"""The idempotent producer: retries after lost responses append nothing twice, in order."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess


@pytest.fixture
def faulty_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    # Drops the connection after appending, before answering, for 4 produce requests.
    b = BrokerProcess(tmp_path / "broker", overrides={"pykbroker.fault.drop.produce.response": "4",
                                                      "transaction.state.log.num.partitions": "2",
                                                      "offsets.topic.num.partitions": "2"})
    b.start()
    try:
        yield b
    finally:
        b.kill()


def read(bootstrap: str, topic: str, expect: int, timeout_s: float = 20) -> list[str]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[str] = []
    deadline = time.monotonic() + timeout_s
    idle = time.monotonic()
    try:
        while time.monotonic() < deadline and time.monotonic() - idle < 2:
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            out.append(m.value().decode())
            idle = time.monotonic()
    finally:
        c.close()
    return out


def test_idempotent_retries_are_exactly_once_and_in_order(faulty_broker: BrokerProcess, topic_name: str) -> None:
    bs = faulty_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": bs})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(15)
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 2,
                  "batch.num.messages": 20, "max.in.flight.requests.per.connection": 5,
                  "retry.backoff.ms": 50, "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200})
    errors: list[str] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    n = 400
    for i in range(n):
        p.produce(topic_name, f"v{i:04d}".encode(), partition=0, on_delivery=on_delivery)
        if i % 50 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    assert errors == []
    got = read(bs, topic_name, n)
    assert got == [f"v{i:04d}" for i in range(n)]
    assert faulty_broker.log().count("fault injection: dropping the connection") == 4
