"""confluent-kafka producer and consumer (assign mode) against a real broker subprocess."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, Message, TopicPartition
from kio.schema.errors import ErrorCode

from pykbroker.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    decode_records,
    iter_batches,
)
from tests.integration.conftest import (
    CLIENT_TIMEOUT,
    BrokerFactory,
    Delivery,
    RawConnection,
    admin_for,
    consume_partitions,
    create_topic,
    make_consumer,
    make_producer,
    produce_all,
    unique_topic,
    wait_until,
    watermarks,
)
from tests.support.broker import BrokerProcess

DEFAULT_MESSAGE_MAX_BYTES = 1048588
# A v2 batch holding one record with a null key, no headers and a value of 2^14..2^21 bytes:
# 61 header bytes + record length varint (3) + attributes, timestamp delta, offset delta,
# key length (1 each) + value length varint (3) + header count (1).
ONE_RECORD_BATCH_OVERHEAD = 72


@pytest.fixture(scope="module")
def pc_broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory({"num.partitions": "3"})


def _headers_of(m: Message) -> list[tuple[str, bytes | None]]:
    headers = m.headers() or []
    assert isinstance(headers, list)
    out: list[tuple[str, bytes | None]] = []
    for k, v in headers:
        assert v is None or isinstance(v, bytes)
        out.append((k, v))
    return out


def _by_partition(msgs: list[Message]) -> dict[int, list[Message]]:
    out: dict[int, list[Message]] = {}
    for m in msgs:
        p = m.partition()
        assert p is not None
        out.setdefault(p, []).append(m)
    return out


def _partition_batches(b: BrokerProcess, topic: str, partition: int) -> list[bytes]:
    """Every record batch of a partition as stored on disk, in offset order."""
    pdir = b.data_dir / "logs" / f"{topic}-{partition}"
    out: list[bytes] = []
    for seg in sorted(pdir.glob("*.log")):
        data = seg.read_bytes()
        for h in iter_batches(data, verify_crc=True):
            out.append(data[h.position: h.position + h.size])
    return out


def test_keys_headers_and_null_values_round_trip(pc_broker: BrokerProcess) -> None:
    topic = unique_topic("pc-rt")
    create_topic(pc_broker, topic, partitions=3)
    rnd = random.Random(1234)
    header_choices: list[list[tuple[str, bytes | None]] | None] = [
        None,
        [("h", b"v")],
        [("dup", b"1"), ("dup", b"2"), ("empty", b""), ("null", None)],
        [("bin", bytes(range(256))), ("unicode-\u00e9", b"\xff\x00")],
    ]
    base_ts = int(time.time() * 1000) - 60_000
    messages: list[dict[str, Any]] = []
    for i in range(300):
        value: bytes | None = [None, b"", os.urandom(rnd.randrange(1, 2000)), f"v{i}".encode()][i % 4]
        key: bytes | None = [None, b"", f"k{i}".encode(), os.urandom(16)][(i // 4) % 4]
        m: dict[str, Any] = {"key": key, "value": value, "partition": i % 3, "timestamp": base_ts + i}
        headers = header_choices[(i // 3) % len(header_choices)]
        if headers is not None:
            m["headers"] = headers
        messages.append(m)

    reports = produce_all(make_producer(pc_broker), topic, messages)
    assert [r.error for r in reports] == [None] * len(messages)
    # Offsets per partition are assigned contiguously from 0 in production order.
    for p in range(3):
        assert [r.offset for r in reports if r.partition == p] == list(range(100))

    got = consume_partitions(pc_broker, [TopicPartition(topic, p, 0) for p in range(3)], len(messages))
    assert len(got) == len(messages)
    per_part = _by_partition(got)
    for p in range(3):
        expected = [m for m in messages if m["partition"] == p]
        actual = per_part[p]
        assert [m.offset() for m in actual] == list(range(len(expected)))
        for exp, act in zip(expected, actual, strict=True):
            assert act.key() == exp["key"]
            assert act.value() == exp["value"]
            assert _headers_of(act) == (exp.get("headers") or [])
            assert act.timestamp() == (TIMESTAMP_CREATE_TIME, exp["timestamp"])


CODECS = {
    "none": COMPRESSION_NONE,
    "gzip": COMPRESSION_GZIP,
    "snappy": COMPRESSION_SNAPPY,
    "lz4": COMPRESSION_LZ4,
    "zstd": COMPRESSION_ZSTD,
}


@pytest.mark.parametrize("codec", list(CODECS))
def test_every_compression_codec(pc_broker: BrokerProcess, codec: str) -> None:
    topic = unique_topic(f"pc-{codec}")
    create_topic(pc_broker, topic, partitions=1)
    messages: list[dict[str, Any]] = [
        {"key": f"key-{i % 17}".encode(), "value": (f"value {i} " * (1 + i % 50)).encode(),
         "headers": [("i", str(i).encode())]}
        for i in range(400)
    ]
    # Nothing leaves before flush() (which overrides linger), so batches hold many messages: librdkafka
    # sends a batch uncompressed when compressing it would not shrink it, as with a lone short message
    # that a short linger lets go on its own when the test process is slow.
    producer = make_producer(pc_broker, **{"compression.type": codec, "linger.ms": 5000})
    reports = produce_all(producer, topic, messages)
    assert all(r.error is None for r in reports)

    got = consume_partitions(pc_broker, [TopicPartition(topic, 0, 0)], len(messages))
    assert [(m.key(), m.value(), _headers_of(m)) for m in got] == [
        (m["key"], m["value"], m["headers"]) for m in messages
    ]
    assert [m.offset() for m in got] == list(range(len(messages)))

    # The broker stores the producer's batches as they came: compressed with that codec.
    batches = _partition_batches(pc_broker, topic, 0)
    assert batches
    # librdkafka sometimes sends the first message on its own despite the linger (seen about 1 run in 15:
    # a 1-record batch, then the other 399), and uncompressed, since compressing one short record would
    # not shrink it. Every batch of several records must carry the codec it was sent with.
    multi = [b for b in batches if int.from_bytes(b[57:61], "big") > 1]
    assert multi and {b[22] & 0x07 for b in multi} == {CODECS[codec]}
    assert {b[22] & 0x07 for b in batches} <= {CODECS[codec], 0}
    decoded = [r for b in batches for r in decode_records(b)]
    assert [(r.offset, r.value) for r in decoded] == [(i, m["value"]) for i, m in enumerate(messages)]
    if codec != "none":
        assert len(batches) < len(messages)  # batched, so compression had something to work on


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks(pc_broker: BrokerProcess, acks: str) -> None:
    topic = unique_topic("pc-acks")
    create_topic(pc_broker, topic, partitions=1)
    messages: list[dict[str, Any]] = [{"value": f"acks={acks} #{i}".encode()} for i in range(200)]
    reports = produce_all(make_producer(pc_broker, acks=acks), topic, messages)
    assert all(r.error is None for r in reports), [r.error for r in reports if r.error][:3]
    if acks != "0":
        assert [r.offset for r in reports] == list(range(200))
    got = consume_partitions(pc_broker, [TopicPartition(topic, 0, 0)], len(messages))
    assert [m.value() for m in got] == [m["value"] for m in messages]


def test_watermarks(pc_broker: BrokerProcess) -> None:
    topic = unique_topic("pc-wm")
    create_topic(pc_broker, topic, partitions=2)
    assert watermarks(pc_broker, topic, 0) == (0, 0)
    produce_all(make_producer(pc_broker), topic, [{"value": b"x", "partition": 0}] * 7
                + [{"value": b"y", "partition": 1}] * 3)
    assert watermarks(pc_broker, topic, 0) == (0, 7)
    assert watermarks(pc_broker, topic, 1) == (0, 3)
    # cached=False asks the broker (ListOffsets); compare with a consumer that has read partition 0.
    c = make_consumer(pc_broker)
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        seen = 0
        deadline = time.monotonic() + CLIENT_TIMEOUT
        for _ in range(200):
            if seen >= 7 or time.monotonic() > deadline:
                break
            seen += len([m for m in c.consume(10, timeout=0.1) if m.error() is None])
        assert seen == 7
        assert c.get_watermark_offsets(TopicPartition(topic, 0), cached=True) == (0, 7)
    finally:
        c.close()


def test_offsets_for_times(pc_broker: BrokerProcess) -> None:
    topic = unique_topic("pc-oft")
    create_topic(pc_broker, topic, partitions=1)
    base = int(time.time() * 1000) - 3_600_000
    # Several batches (flush_each) with timestamps 1s apart; one batch holding three at once.
    messages: list[dict[str, Any]] = [{"value": f"m{i}".encode(), "timestamp": base + i * 1000} for i in range(10)]
    produce_all(make_producer(pc_broker, **{"linger.ms": 0}), topic, messages, flush_each=True)
    produce_all(make_producer(pc_broker, **{"linger.ms": 100}), topic,
                [{"value": f"b{i}".encode(), "timestamp": base + 20_000 + i * 1000} for i in range(3)])

    c = make_consumer(pc_broker)
    try:
        def lookup(ts: int) -> int:
            (tp,) = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)
            assert tp.error is None
            return int(tp.offset)

        assert lookup(base - 5000) == 0
        assert lookup(base) == 0
        assert lookup(base + 1) == 1
        assert lookup(base + 3500) == 4
        assert lookup(base + 9000) == 9
        assert lookup(base + 9001) == 10  # first of the 3-record batch
        assert lookup(base + 21_000) == 11  # inside the batch: the record, not the batch start
        assert lookup(base + 22_000) == 12
        assert lookup(base + 22_001) == -1  # nothing that late: OFFSET_END
    finally:
        c.close()


def test_message_at_the_size_limit_and_one_byte_over(pc_broker: BrokerProcess) -> None:
    topic = unique_topic("pc-big")
    create_topic(pc_broker, topic, partitions=1)
    # The client would allow much more: it is the broker that must reject.
    producer = make_producer(pc_broker, **{"message.max.bytes": 4_000_000, "linger.ms": 0})
    fits = DEFAULT_MESSAGE_MAX_BYTES - ONE_RECORD_BATCH_OVERHEAD
    big = os.urandom(fits)
    ok = produce_all(producer, topic, [{"value": big}])
    assert ok[0].error is None and ok[0].offset == 0
    over = produce_all(producer, topic, [{"value": os.urandom(fits + 1)}])
    err = over[0].error
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    # The rejection left the log alone; the big message reads back whole.
    assert watermarks(pc_broker, topic) == (0, 1)
    got = consume_partitions(pc_broker, [TopicPartition(topic, 0, 0)], 1)
    assert len(got) == 1 and got[0].value() == big
    assert (batch_size := len(_partition_batches(pc_broker, topic, 0)[0])) == DEFAULT_MESSAGE_MAX_BYTES, batch_size


def test_topic_max_message_bytes_override(pc_broker: BrokerProcess) -> None:
    topic = unique_topic("pc-topicmax")
    create_topic(pc_broker, topic, partitions=1, config={"max.message.bytes": "10000"})
    producer = make_producer(pc_broker, **{"linger.ms": 0})
    small = produce_all(producer, topic, [{"value": b"s" * (10000 - 200)}])
    assert small[0].error is None
    big = produce_all(producer, topic, [{"value": b"b" * 10001}])
    assert big[0].error is not None and big[0].error.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert watermarks(pc_broker, topic) == (0, 1)


def test_unknown_topic_without_auto_create(broker_factory: BrokerFactory) -> None:
    b = broker_factory({"auto.create.topics.enable": "false"})
    topic = unique_topic("pc-unknown")
    producer = make_producer(b, **{"topic.metadata.propagation.max.ms": 1000, "message.timeout.ms": 10000})
    md = producer.list_topics(topic, timeout=CLIENT_TIMEOUT)
    err = md.topics[topic].error
    assert err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    reports: list[Delivery] = produce_all(producer, topic, [{"value": b"lost"}])
    err = reports[0].error
    assert err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert topic not in admin_for(b).list_topics(timeout=CLIENT_TIMEOUT).topics
    assert not (b.data_dir / "logs" / f"{topic}-0").exists()


def test_auto_create_when_enabled(pc_broker: BrokerProcess) -> None:
    topic = unique_topic("pc-auto")
    producer = make_producer(pc_broker)
    reports = produce_all(producer, topic, [{"value": f"auto {i}".encode(), "partition": i % 3} for i in range(9)])
    assert [r.error for r in reports] == [None] * 9
    md = admin_for(pc_broker).list_topics(topic, timeout=CLIENT_TIMEOUT)
    assert md.topics[topic].error is None
    assert sorted(md.topics[topic].partitions) == [0, 1, 2]  # num.partitions=3 on this broker
    got = consume_partitions(pc_broker, [TopicPartition(topic, p, 0) for p in range(3)], 9)
    assert sorted(m.value() or b"" for m in got) == sorted(f"auto {i}".encode() for i in range(9))


def test_auto_created_topic_is_new_to_the_client(pc_broker: BrokerProcess) -> None:
    """The Metadata request that creates a topic answers it as Kafka does: LEADER_NOT_AVAILABLE and no
    partitions, so a client (kafka-go's Metadata v1 here) that deleted a topic reads its re-creation as new."""
    topic = unique_topic("pc-new")

    def metadata_v1() -> Any:
        with RawConnection(pc_broker) as c:
            return c.request(3, 1, {"topics": [{"name": topic}]}).topics[0]

    first = metadata_v1()
    assert (int(first.error_code), list(first.partitions)) == (int(ErrorCode.leader_not_available), [])
    again = metadata_v1()
    assert int(again.error_code) == 0 and len(again.partitions) == 3  # num.partitions=3 on this broker
    admin = admin_for(pc_broker)  # keep a reference: a destroyed client fails its pending futures
    admin.delete_topics([topic], request_timeout=CLIENT_TIMEOUT)[topic].result(timeout=CLIENT_TIMEOUT)
    wait_until(lambda: topic not in admin.list_topics(timeout=CLIENT_TIMEOUT).topics, what="the topic deleted")
    recreated = metadata_v1()
    assert (int(recreated.error_code), list(recreated.partitions)) == (int(ErrorCode.leader_not_available), [])
    # A producer relying on auto-creation retries the retriable error and delivers.
    reports = produce_all(make_producer(pc_broker), topic, [{"value": b"after", "partition": 1}])
    assert [r.error for r in reports] == [None]


def test_consume_from_middle_and_from_end(pc_broker: BrokerProcess) -> None:
    topic = unique_topic("pc-seek")
    create_topic(pc_broker, topic, partitions=1)
    produce_all(make_producer(pc_broker), topic, [{"value": f"{i}".encode()} for i in range(50)])
    got = consume_partitions(pc_broker, [TopicPartition(topic, 0, 30)], 20)
    assert [m.offset() for m in got] == list(range(30, 50))
    assert [m.value() for m in got] == [f"{i}".encode() for i in range(30, 50)]
    # An offset past the end with auto.offset.reset=earliest restarts from the beginning.
    got = consume_partitions(pc_broker, [TopicPartition(topic, 0, 500)], 50)
    assert [m.offset() for m in got] == list(range(50))
