"""The idempotent producer: retries after lost responses append nothing twice, in order."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pykbroker.protocol.records import build_batch
from tests.integration.conftest import RawConnection
from tests.support.broker import BrokerProcess

NONE, OUT_OF_ORDER_SEQUENCE_NUMBER, NOT_ENOUGH_REPLICAS = 0, 45, 19


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


def _min_isr(conn: RawConnection, topic: str, value: int, corr: int) -> None:
    resp = conn.request(44, 1, {"validate_only": False, "resources": [
        {"resource_type": 2, "resource_name": topic, "configs": [
            {"name": "min.insync.replicas", "config_operation": 0, "value": str(value)}]}]}, corr)
    assert [int(r.error_code) for r in resp.responses] == [0], resp
    described = conn.request(32, 4, {"include_synonyms": False, "include_documentation": False, "resources": [
        {"resource_type": 2, "resource_name": topic, "configuration_keys": ["min.insync.replicas"]}]}, corr + 1)
    assert [c.value for c in described.results[0].configs] == [str(value)]


def test_batches_behind_a_refused_batch_get_its_refusal(tmp_path: Path) -> None:
    """On one connection, the batches of an idempotent producer behind one refused before the append
    (NOT_ENOUGH_REPLICAS here) get the same retriable refusal rather than OUT_OF_ORDER_SEQUENCE_NUMBER, even
    when the condition has passed: librdkafka answers that error by renumbering records it may have had
    appended (tests/cluster/test_pipelined_produce.py shows the duplicate).  The refused batch's retry, other
    producers and batches past an idempotent producer's in-flight window are checked as usual."""
    b = BrokerProcess(tmp_path / "broker")
    b.start()
    try:
        topic = f"refused-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1, config={"min.insync.replicas": "1"})])[topic].result(30)
        with RawConnection(b) as conn:
            corr = iter(range(1, 1000))

            def produce(pid: int, seq: int, value: bytes) -> Any:
                batch = build_batch([(None, value, [])], timestamp_ms=int(time.time() * 1000), producer_id=pid,
                                    producer_epoch=0, base_sequence=seq)
                resp = conn.request(0, 9, {"transactional_id": None, "acks": -1, "timeout": 10000, "topic_data": [
                    {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}, next(corr))
                part = resp.responses[0].partition_responses[0]
                return int(part.error_code), int(part.base_offset), part.error_message or ""

            assert produce(7, 0, b"a")[:2] == (NONE, 0)
            _min_isr(conn, topic, 2, next(corr) * 10)
            assert produce(7, 1, b"b")[0] == NOT_ENOUGH_REPLICAS
            _min_isr(conn, topic, 1, next(corr) * 10)
            code, _, message = produce(7, 2, b"c")  # continues b, which is not in the log
            assert code == NOT_ENOUGH_REPLICAS and "as the batch before it" in message, (code, message)
            assert produce(8, 0, b"x")[:2] == (NONE, 1)  # another producer: its own sequence
            assert produce(7, 1, b"b")[:2] == (NONE, 2)  # the retry, in order
            assert produce(7, 2, b"c")[:2] == (NONE, 3)
            # At most the in-flight window behind a refusal (four more batches) is refused alike.
            _min_isr(conn, topic, 2, next(corr) * 10)
            assert produce(7, 3, b"d")[0] == NOT_ENOUGH_REPLICAS
            _min_isr(conn, topic, 1, next(corr) * 10)
            assert [produce(7, seq, b"e")[0] for seq in range(4, 8)] == [NOT_ENOUGH_REPLICAS] * 4
            assert produce(7, 8, b"f")[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
            assert produce(7, 3, b"d")[:2] == (NONE, 4)
        # A new connection starts with nothing refused.
        with RawConnection(b) as conn:
            corr = iter(range(1, 1000))
            _min_isr(conn, topic, 2, 500)
            assert produce(7, 4, b"e")[0] == NOT_ENOUGH_REPLICAS
        with RawConnection(b) as conn:
            corr = iter(range(1, 1000))
            _min_isr(conn, topic, 1, 500)
            assert produce(7, 5, b"g")[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
    finally:
        b.kill()
