"""Other clients against the broker: kcat (librdkafka CLI), kafka-python and aiokafka (assign mode)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AIOTopicPartition
from confluent_kafka import TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KPTopicPartition

from tests.integration.conftest import (
    BrokerFactory,
    consume_partitions,
    create_topic,
    make_producer,
    produce_all,
    unique_topic,
)
from tests.support.broker import BrokerProcess

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
needs_kcat = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install -y kcat)")

# (key, value, headers) triples exercising nulls, empties, binary and repeated header keys.
Triple = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def _sample(n: int, tag: str) -> list[Triple]:
    out: list[Triple] = []
    for i in range(n):
        key = None if i % 5 == 0 else f"{tag}-k{i}".encode()
        # kafka-python and aiokafka refuse a record with neither key nor value
        value: bytes | None = f"{tag} value {i} ".encode() * (1 + i % 9)
        if i % 11 == 4:
            value = b""
        elif i % 7 == 3 and key is not None:
            value = None
        headers = [] if i % 2 else [("h", f"{i}".encode()), ("h", b"\x00\xff"), ("e", b"")]
        out.append((key, value, headers))
    return out


@pytest.fixture(scope="module")
def cl_broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory()


# --- kcat ---------------------------------------------------------------------------------------


def _kcat(b: BrokerProcess, *args: str, stdin: bytes | None = None, timeout: float = 30.0) -> bytes:
    assert KCAT is not None
    proc = subprocess.run(
        [KCAT, "-b", b.bootstrap, "-X", "broker.address.family=v4", *args],
        input=stdin, capture_output=True, timeout=timeout, check=False,
    )
    assert proc.returncode == 0, f"kcat {args} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}"
    return proc.stdout


@needs_kcat
def test_kcat_produce_and_consume(cl_broker: BrokerProcess) -> None:
    topic = unique_topic("kcat")
    create_topic(cl_broker, topic, partitions=2)
    lines = [f"key{i % 10}:value number {i}" for i in range(200)]
    _kcat(cl_broker, "-P", "-t", topic, "-K:", stdin=("\n".join(lines) + "\n").encode())

    out = _kcat(cl_broker, "-C", "-t", topic, "-e", "-o", "beginning", "-q", "-f", "%p|%o|%k|%s\n")
    rows = [line.split("|", 3) for line in out.decode().splitlines()]
    assert len(rows) == len(lines)
    per_partition: dict[str, list[tuple[int, str, str]]] = {}
    for p, o, k, v in rows:
        per_partition.setdefault(p, []).append((int(o), k, v))
    # Keyed: one key lands on one partition; per-partition order and offsets follow production order.
    for p, recs in per_partition.items():
        assert [o for o, _, _ in recs] == list(range(len(recs))), p
        expected = [(line.split(":", 1)[0], line.split(":", 1)[1]) for line in lines
                    if any(line.startswith(k + ":") for k in {k for _, k, _ in recs})]
        assert [(k, v) for _, k, v in recs] == expected
    assert sum(len(r) for r in per_partition.values()) == 200

    # The same data through confluent-kafka, byte for byte.
    got = consume_partitions(cl_broker, [TopicPartition(topic, p, 0) for p in (0, 1)], len(lines))
    assert sorted(((m.key() or b"").decode(), (m.value() or b"").decode()) for m in got) == sorted(
        (line.split(":", 1)[0], line.split(":", 1)[1]) for line in lines
    )


@needs_kcat
def test_kcat_reads_what_confluent_kafka_wrote(cl_broker: BrokerProcess) -> None:
    topic = unique_topic("kcat-read")
    create_topic(cl_broker, topic, partitions=1)
    msgs: list[dict[str, Any]] = [
        {"key": f"k{i}".encode(), "value": f"v{i}".encode(), "headers": [("n", f"{i}".encode())]}
        for i in range(50)
    ]
    produce_all(make_producer(cl_broker, **{"compression.type": "zstd"}), topic, msgs)
    out = _kcat(cl_broker, "-C", "-t", topic, "-e", "-o", "beginning", "-q", "-f", "%o|%k|%s|%h\n")
    assert out.decode().splitlines() == [f"{i}|k{i}|v{i}|n={i}" for i in range(50)]
    # A bounded read from an offset in the middle
    out = _kcat(cl_broker, "-C", "-t", topic, "-p", "0", "-o", "45", "-e", "-q", "-f", "%o\n")
    assert out.decode().split() == [str(i) for i in range(45, 50)]


@needs_kcat
def test_kcat_metadata_listing(cl_broker: BrokerProcess) -> None:
    topic = unique_topic("kcat-md")
    create_topic(cl_broker, topic, partitions=3)
    md = json.loads(_kcat(cl_broker, "-L", "-J"))
    assert md["controllerid"] == 0
    assert [(br["id"], br["name"]) for br in md["brokers"]] == [(0, cl_broker.bootstrap)]
    topics = {t["topic"]: t for t in md["topics"]}
    assert topic in topics
    parts = sorted(topics[topic]["partitions"], key=lambda p: p["partition"])
    assert [p["partition"] for p in parts] == [0, 1, 2]
    for p in parts:
        assert p["leader"] == 0
        assert [r["id"] for r in p["replicas"]] == [0]
        assert [r["id"] for r in p["isrs"]] == [0]
    # Plain-text form, asking for the one topic
    text = _kcat(cl_broker, "-L", "-t", topic).decode()
    assert "1 brokers:" in text and f'topic "{topic}" with 3 partitions:' in text


# --- kafka-python ---------------------------------------------------------------------------------


def test_kafka_python_round_trip(cl_broker: BrokerProcess) -> None:
    topic = unique_topic("kpy")
    create_topic(cl_broker, topic, partitions=2)
    data = _sample(120, "kpy")
    producer = KafkaProducer(bootstrap_servers=cl_broker.bootstrap, acks="all", compression_type="gzip",
                             linger_ms=5, request_timeout_ms=15000)
    try:
        futures = [producer.send(topic, key=k, value=v, headers=h, partition=i % 2)
                   for i, (k, v, h) in enumerate(data)]
        producer.flush(timeout=20)
        metas = [f.get(timeout=20) for f in futures]
    finally:
        producer.close(timeout=10)
    for p in (0, 1):
        assert [m.offset for m in metas if m.partition == p] == list(range(60))

    consumer = KafkaConsumer(bootstrap_servers=cl_broker.bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", request_timeout_ms=15000)
    try:
        consumer.assign([KPTopicPartition(topic, 0), KPTopicPartition(topic, 1)])
        consumer.seek_to_beginning()
        got: dict[int, list[Any]] = {0: [], 1: []}
        deadline = time.monotonic() + 20
        for _ in range(200):
            if sum(len(v) for v in got.values()) >= len(data) or time.monotonic() > deadline:
                break
            for tp, records in consumer.poll(timeout_ms=200).items():
                got[tp.partition].extend(records)
    finally:
        consumer.close()
    for p in (0, 1):
        expected = [d for i, d in enumerate(data) if i % 2 == p]
        assert [r.offset for r in got[p]] == list(range(len(expected)))
        assert [(r.key, r.value, list(r.headers)) for r in got[p]] == expected

    # And confluent-kafka reads kafka-python's batches identically.
    msgs = consume_partitions(cl_broker, [TopicPartition(topic, 0, 0)], 60)
    assert [(m.key(), m.value(), list(m.headers() or [])) for m in msgs] == [
        d for i, d in enumerate(data) if i % 2 == 0
    ]


# --- aiokafka -------------------------------------------------------------------------------------


async def _aiokafka_round_trip(b: BrokerProcess, topic: str, data: list[Triple]) -> list[Any]:
    producer = AIOKafkaProducer(bootstrap_servers=b.bootstrap, acks="all", compression_type="lz4",
                                linger_ms=5, request_timeout_ms=15000)
    await producer.start()
    try:
        sends = [await producer.send(topic, key=k, value=v, headers=h, partition=0) for k, v, h in data]
        metas = await asyncio.wait_for(asyncio.gather(*sends), timeout=20)
    finally:
        await producer.stop()
    assert [m.offset for m in metas] == list(range(len(data)))

    consumer = AIOKafkaConsumer(bootstrap_servers=b.bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", request_timeout_ms=15000)
    await consumer.start()
    try:
        tp = AIOTopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got: list[Any] = []
        deadline = time.monotonic() + 20
        for _ in range(200):
            if len(got) >= len(data) or time.monotonic() > deadline:
                break
            batch = await consumer.getmany(tp, timeout_ms=200)
            got.extend(batch.get(tp, []))
        return got
    finally:
        await consumer.stop()


def test_aiokafka_round_trip(cl_broker: BrokerProcess) -> None:
    topic = unique_topic("aio")
    create_topic(cl_broker, topic, partitions=1)
    data = _sample(150, "aio")
    got = asyncio.run(_aiokafka_round_trip(cl_broker, topic, data))
    assert [r.offset for r in got] == list(range(len(data)))
    assert [(r.key, r.value, list(r.headers)) for r in got] == data
    msgs = consume_partitions(cl_broker, [TopicPartition(topic, 0, 0)], len(data))
    assert [(m.key(), m.value(), list(m.headers() or [])) for m in msgs] == data


def test_kafka_python_reads_confluent_batches(cl_broker: BrokerProcess) -> None:
    topic = unique_topic("kpy-read")
    create_topic(cl_broker, topic, partitions=1)
    data = _sample(80, "cf")
    msgs: list[dict[str, Any]] = [{"key": k, "value": v, "headers": h} for k, v, h in data]
    # zstd: kafka-python has no snappy codec without python-snappy
    produce_all(make_producer(cl_broker, **{"compression.type": "zstd", "linger.ms": 20}), topic, msgs)
    consumer = KafkaConsumer(bootstrap_servers=cl_broker.bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", request_timeout_ms=15000)
    got: list[Any] = []
    try:
        tp = KPTopicPartition(topic, 0)
        consumer.assign([tp])
        deadline = time.monotonic() + 20
        for _ in range(200):
            if len(got) >= len(data) or time.monotonic() > deadline:
                break
            got.extend(consumer.poll(timeout_ms=200).get(tp, []))
    finally:
        consumer.close()
    assert [(r.offset, r.key, r.value, list(r.headers)) for r in got] == [
        (i, k, v, h) for i, (k, v, h) in enumerate(data)
    ]
