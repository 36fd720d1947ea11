"""Clients from before Kafka 0.11: the oldest protocol versions and message formats v0/v1.

kafka-python pinned to an old ``api_version`` speaks what those brokers spoke (0.8.2: Produce
v0 and Fetch v0 with message format v0; 0.9: v1; 0.10.1: Produce v2 / Fetch v3 with format v1),
and kcat with ``broker.version.fallback=0.9.0`` is librdkafka's old-protocol client.  Data goes
both ways between them and confluent-kafka's modern clients.  Every client talks through the
compat suite's recording proxy, so each test also checks that the old versions were really used.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition

from pykbroker.protocol.message_format import parse_message_set
from tests.integration.conftest import (
    BrokerFactory,
    RawConnection,
    consume_partitions,
    create_topic,
    make_consumer,
    unique_topic,
    wait_until,
)
from tests.support.broker import BrokerProcess
from tests.support.recording_proxy import Proxied, proxied_broker

ROOT = Path(__file__).resolve().parents[2]
NOW = int(time.time() * 1000)
# api_version -> (Produce version, Fetch version) kafka-python sends.
OLD = {(0, 8, 2): (0, 0), (0, 9): (1, 1), (0, 10, 0): (2, 2), (0, 10, 1): (2, 3)}
UNSUPPORTED_VERSION = 35


@pytest.fixture(scope="module")
def old(module_broker_factory: BrokerFactory) -> Iterator[Proxied]:
    with proxied_broker(module_broker_factory.base, "old-clients", {}, module_broker_factory.brokers.append,
                        wait_until) as p:
        yield p


def _old_consume(p: Proxied, topic: str, api: tuple[int, ...], expected: int, client_id: str,
                 **conf: Any) -> list[Any]:
    c = KafkaConsumer(bootstrap_servers=p.bootstrap, api_version=api, client_id=client_id,
                      auto_offset_reset="earliest", enable_auto_commit=False, **conf)
    try:
        if "group_id" not in conf:
            c.assign([KTopicPartition(topic, 0)])
        else:
            c.subscribe([topic])
        out: list[Any] = []
        deadline = time.monotonic() + 20
        for _ in range(400):  # bounded in count and time
            if len(out) >= expected or time.monotonic() > deadline:
                break
            for msgs in c.poll(timeout_ms=100).values():
                out += msgs
        if "group_id" in conf:
            c.commit()
        return out
    finally:
        c.close()


@pytest.mark.parametrize(("api", "compression"), [
    ((0, 8, 2), None), ((0, 9), "gzip"), ((0, 10, 0), "snappy"), ((0, 10, 1), None), ((0, 10, 1), "gzip"),
])
def test_old_producer_modern_consumer(old: Proxied, api: tuple[int, ...], compression: str | None) -> None:
    topic = unique_topic("oldp")
    create_topic(old.broker, topic)
    client_id = f"old-producer-{'.'.join(map(str, api))}-{compression}"
    producer = KafkaProducer(bootstrap_servers=old.bootstrap, api_version=api, compression_type=compression,
                             client_id=client_id, linger_ms=20)
    try:
        sent = [(f"k{i}".encode() if i % 3 else None, f"value-{i}".encode() * (i + 1), NOW + i) for i in range(7)]
        futures = [producer.send(topic, key=k, value=v, timestamp_ms=ts) for k, v, ts in sent]
        producer.flush(20)
        offsets = [f.get(timeout=20).offset for f in futures]
    finally:
        producer.close(10)
    assert offsets == list(range(7))
    produce_version = OLD[api][0]
    assert (0, produce_version) in old.versions(client_id)

    got = consume_partitions(old.broker, [TopicPartition(topic, 0, 0)], 7)
    assert [(m.offset(), m.key(), m.value()) for m in got] == [(i, k, v) for i, (k, v, _ts) in enumerate(sent)]
    if produce_version == 2:  # message format v1 carries timestamps; v0 has none (stored as -1)
        assert [m.timestamp()[1] for m in got] == [ts for _k, _v, ts in sent]
    else:
        assert {m.timestamp()[1] for m in got} == {-1}


@pytest.fixture(scope="module")
def modern_topic(old: Proxied) -> tuple[str, list[tuple[bytes | None, bytes, int]]]:
    """A topic written by confluent-kafka in a committed transaction (so it holds a control batch)."""
    topic = unique_topic("modern")
    create_topic(old.broker, topic)
    p = Producer({"bootstrap.servers": old.broker.bootstrap, "broker.address.family": "v4",
                  "transactional.id": f"tx-{topic}", "compression.type": "gzip", "linger.ms": 5})
    p.init_transactions(20)
    p.begin_transaction()
    sent = [(f"k{i}".encode() if i else None, f"modern-{i}".encode(), NOW + 10 * i) for i in range(5)]
    for k, v, ts in sent:
        p.produce(topic, key=k, value=v, timestamp=ts, headers=[("h", b"dropped in v0/v1")])
    p.commit_transaction(20)
    return topic, sent


@pytest.mark.parametrize("api", [(0, 8, 2), (0, 9), (0, 10, 1)])
def test_modern_producer_old_consumer(old: Proxied, modern_topic: tuple[str, list[Any]],
                                      api: tuple[int, ...]) -> None:
    topic, sent = modern_topic
    client_id = f"old-consumer-{'.'.join(map(str, api))}"
    got = _old_consume(old, topic, api, len(sent), client_id)
    # The transaction marker is not a message in formats v0/v1: Kafka's down-conversion drops it.
    assert [(m.offset, m.key, m.value) for m in got] == [(i, k, v) for i, (k, v, _ts) in enumerate(sent)]
    fetch_version = OLD[api][1]
    if fetch_version >= 2:
        assert [m.timestamp for m in got] == [ts for _k, _v, ts in sent]
    else:
        assert {m.timestamp for m in got} == {None}
    assert (1, fetch_version) in old.versions(client_id)


@pytest.mark.parametrize("api", [(0, 8, 2), (0, 10, 1)])
def test_old_consumer_within_a_small_partition_limit(old: Proxied, api: tuple[int, ...]) -> None:
    """Converted data is cut at the partition's max bytes; the cut message at the end is fetched again."""
    topic = unique_topic("small")
    create_topic(old.broker, topic)
    p = Producer({"bootstrap.servers": old.broker.bootstrap, "broker.address.family": "v4", "linger.ms": 50})
    values = [f"value-{i:03d}-".encode() * 4 for i in range(30)]
    for v in values:  # one v2 batch of 30 records
        p.produce(topic, v)
    assert p.flush(20) == 0
    with RawConnection(old.broker) as conn:  # what the old client gets: 300 bytes, ending inside a message
        resp = conn.request(1, OLD[api][1], {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "topics": [
            {"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 3, "partition_max_bytes": 300}]}]})
    records = resp.responses[0].partitions[0].records
    whole = parse_message_set(records)
    assert len(records) == 300 and sum(size for _m, size in whole) < 300
    assert [(m.offset, m.value) for m, _size in whole] == list(enumerate(values))[3:3 + len(whole)]
    got = _old_consume(old, topic, api, len(values), f"old-small-{'.'.join(map(str, api))}",
                       max_partition_fetch_bytes=300)
    assert [(m.offset, m.value) for m in got] == list(enumerate(values))


@pytest.mark.parametrize("api", [(0, 8, 2), (0, 9)])
def test_old_groups_commit_and_list_offsets(old: Proxied, modern_topic: tuple[str, list[Any]],
                                            api: tuple[int, ...]) -> None:
    """0.8.2 commits with OffsetCommit v1 and no membership, 0.9 as a group member; ListOffsets v0."""
    topic, sent = modern_topic
    group = unique_topic("oldgrp")
    client_id = f"old-group-{'.'.join(map(str, api))}"
    assert len(_old_consume(old, topic, api, len(sent), client_id, group_id=group)) == len(sent)
    c = make_consumer(old.broker, **{"group.id": group})
    try:
        committed = c.committed([TopicPartition(topic, 0)], timeout=20)
    finally:
        c.close()
    # The position after the last message it saw: the marker at offset 5 never reached it (as with Kafka).
    assert committed[0].offset == 5
    seen = old.versions(client_id)
    assert (8, 1 if api == (0, 8, 2) else 2) in seen and (2, 0) in seen

    k = KafkaConsumer(bootstrap_servers=old.bootstrap, api_version=api, client_id=f"{client_id}-lo")
    try:
        tp = KTopicPartition(topic, 0)
        k.assign([tp])
        k.seek_to_end(tp)
        assert k.position(tp) == 6  # the log end, past the transaction marker
        k.seek_to_beginning(tp)
        assert k.position(tp) == 0
    finally:
        k.close()


def _fetch_errors(b: BrokerProcess, topic: str) -> dict[int, int]:
    """Fetch v0-4 from offset 0 of ``topic``: version -> the partition's error code."""
    out = {}
    with RawConnection(b) as conn:
        for version in range(5):
            resp = conn.request(1, version, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
                "topics": [{"topic": topic, "partitions": [
                    {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}, version + 1)
            part = resp.responses[0].partitions[0]
            out[version] = int(part.error_code)
            if out[version]:
                assert part.high_watermark == -1 and not part.records
            else:
                assert part.high_watermark == 1 and part.records
    return out


def _one_record(b: BrokerProcess, topic: str) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4"})
    p.produce(topic, b"x")
    assert p.flush(20) == 0


def test_downconversion_can_be_disabled_per_topic(old: Proxied) -> None:
    off = unique_topic("nodown")
    create_topic(old.broker, off, config={"message.downconversion.enable": "false"})
    _one_record(old.broker, off)
    assert _fetch_errors(old.broker, off) == {0: UNSUPPORTED_VERSION, 1: UNSUPPORTED_VERSION,
                                               2: UNSUPPORTED_VERSION, 3: UNSUPPORTED_VERSION, 4: 0}


def test_downconversion_can_be_disabled_per_broker(broker_factory: BrokerFactory) -> None:
    b = broker_factory({"log.message.downconversion.enable": "false"})
    off, on = unique_topic("nodown"), unique_topic("down")
    create_topic(b, off)
    create_topic(b, on, config={"message.downconversion.enable": "true"})  # the topic's setting wins
    for t in (off, on):
        _one_record(b, t)
    assert set(_fetch_errors(b, off).values()) == {UNSUPPORTED_VERSION, 0}
    assert set(_fetch_errors(b, on).values()) == {0}
    with RawConnection(b) as conn:  # a dynamic cluster default applies without a restart, as in Kafka
        resp = conn.request(44, 0, {"resources": [{"resource_type": 4, "resource_name": "", "configs": [
            {"name": "log.message.downconversion.enable", "config_operation": 0, "value": "true"}]}],
            "validate_only": False})
    assert int(resp.responses[0].error_code) == 0
    wait_until(lambda: set(_fetch_errors(b, off).values()) == {0}, timeout=10, what="down-conversion enabled")


def test_kcat_with_the_0_9_protocol(old: Proxied) -> None:
    topic = unique_topic("kcat")
    create_topic(old.broker, topic)
    legacy = ["-X", "api.version.request=false", "-X", "broker.version.fallback=0.9.0", "-X", "client.id=kcat-0.9"]
    lines = [f"key{i}:value{i}" for i in range(4)]
    produced = subprocess.run(["kcat", "-b", old.bootstrap, "-P", "-t", topic, "-K:", *legacy],
                              input="\n".join(lines).encode() + b"\n", capture_output=True, timeout=60, check=False)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(["kcat", "-b", old.bootstrap, "-C", "-t", topic, "-o", "beginning", "-e",
                               "-f", "%o %k %s\\n", *legacy], capture_output=True, timeout=60, check=False)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.decode().splitlines() == [f"{i} key{i} value{i}" for i in range(4)]
    assert {(0, 1), (1, 1), (2, 0)} <= old.versions("kcat-0.9")
