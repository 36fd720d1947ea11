"""Segment rolling, time/size retention, DeleteRecords and CreatePartitions, observed on disk and by clients."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewPartitions

from tests.integration.conftest import (
    CLIENT_TIMEOUT,
    BrokerFactory,
    admin_for,
    consume_partitions,
    create_topic,
    make_producer,
    produce_all,
    unique_topic,
    wait_until,
    watermarks,
)
from tests.support.broker import BrokerProcess, segment_sizes

RETENTION_OVERRIDES = {
    "log.retention.check.interval.ms": "200",
    "log.segment.delete.delay.ms": "0",
}


@pytest.fixture(scope="module")
def rt_broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory(RETENTION_OVERRIDES)


def _pdir(b: BrokerProcess, topic: str, partition: int = 0) -> Path:
    return b.data_dir / "logs" / f"{topic}-{partition}"


def _segment_bases(b: BrokerProcess, topic: str, partition: int = 0) -> list[int]:
    return sorted(int(p.stem) for p in _pdir(b, topic, partition).glob("*.log"))


def _one_batch_each(b: BrokerProcess) -> Any:
    """A producer that sends every message as its own batch."""
    return make_producer(b, **{"linger.ms": 0, "batch.num.messages": 1})


def test_segments_roll_at_segment_bytes(rt_broker: BrokerProcess) -> None:
    topic = unique_topic("rt-roll")
    create_topic(rt_broker, topic, config={"segment.bytes": "4096"})
    assert _segment_bases(rt_broker, topic) == [0]
    values = [f"{i:05d}".encode() * 40 for i in range(100)]  # 200-byte values, ~270-byte batches
    reports = produce_all(_one_batch_each(rt_broker), topic, [{"value": v} for v in values])
    assert all(r.error is None for r in reports)

    bases = _segment_bases(rt_broker, topic)
    assert len(bases) >= 5, bases  # ~28 KB of batches in 4 KB segments
    assert bases[0] == 0 and bases == sorted(set(bases))
    pdir = _pdir(rt_broker, topic)
    for base in bases:
        name = f"{base:020d}"
        assert (pdir / f"{name}.index").exists() and (pdir / f"{name}.timeindex").exists(), name
        assert (pdir / f"{name}.log").stat().st_size <= 4096
    # Nothing is deleted without a retention limit, and reads cross segment boundaries.
    assert watermarks(rt_broker, topic) == (0, 100)
    got = consume_partitions(rt_broker, [TopicPartition(topic, 0, 0)], 100)
    assert [m.value() for m in got] == values


def test_size_retention_deletes_oldest_segments(rt_broker: BrokerProcess) -> None:
    topic = unique_topic("rt-size")
    create_topic(rt_broker, topic, config={"segment.bytes": "2048", "retention.bytes": "6000"})
    values = [f"{i:05d}".encode() * 40 for i in range(120)]
    produce_all(_one_batch_each(rt_broker), topic, [{"value": v} for v in values])

    def trimmed() -> int | None:
        """The low watermark once retention reached Kafka's resting state, else None.

        Kafka deletes the oldest segment while the rest still holds retention.bytes, so at
        rest: total >= retention.bytes > total - oldest.  The low watermark is read before
        and after the file scan so a retention pass in between cannot go unnoticed.
        """
        low = watermarks(rt_broker, topic)[0]
        sizes = segment_sizes(_pdir(rt_broker, topic))
        if not sizes or watermarks(rt_broker, topic)[0] != low:
            return None
        total, first = sum(sizes.values()), min(sizes)
        return low if 0 < low == first and total >= 6000 > total - sizes[first] else None

    low = wait_until(trimmed, timeout=20, interval=0.2, what="size retention to delete segments")
    high = watermarks(rt_broker, topic)[1]
    assert high == 120
    assert len(_segment_bases(rt_broker, topic)) >= 2
    assert "retention size 6000 breach" in rt_broker.log()
    # A consumer starting from the earliest offset starts exactly there and reads to the end.
    got = consume_partitions(rt_broker, [TopicPartition(topic, 0, OFFSET_BEGINNING)], high - low)
    assert [m.offset() for m in got] == list(range(low, high))
    assert [m.value() for m in got] == values[low:]


def test_time_retention_deletes_expired_segments_only(rt_broker: BrokerProcess) -> None:
    topic = unique_topic("rt-time")
    # segment.bytes below two batches (~170 bytes each): every batch gets a segment of its own.
    create_topic(rt_broker, topic, config={"segment.bytes": "300", "retention.ms": "600000"})
    now = int(time.time() * 1000)
    old = [{"value": f"old {i}".encode() * 20, "timestamp": now - 3_600_000 + i} for i in range(7)]
    new = [{"value": f"new {i}".encode() * 20, "timestamp": now + i} for i in range(5)]
    reports = produce_all(_one_batch_each(rt_broker), topic, old + new)
    assert [r.error for r in reports] == [None] * 12
    # One segment per batch (the expired ones may already be gone: retention runs every 200 ms).
    assert _segment_bases(rt_broker, topic)[-5:] == [7, 8, 9, 10, 11]
    wait_until(lambda: watermarks(rt_broker, topic)[0] == 7, timeout=20, interval=0.2,
               what="the 7 expired records to be deleted")
    wait_until(lambda: _segment_bases(rt_broker, topic) == [7, 8, 9, 10, 11], timeout=10, interval=0.2,
               what="the expired segment files to disappear")
    time.sleep(0.6)  # a few more retention passes: nothing younger goes
    assert watermarks(rt_broker, topic) == (7, 12)
    assert "retention time 600000ms breach" in rt_broker.log()
    got = consume_partitions(rt_broker, [TopicPartition(topic, 0, OFFSET_BEGINNING)], 5)
    assert [m.value() for m in got] == [m["value"] for m in new]


def test_time_retention_can_empty_the_log(rt_broker: BrokerProcess) -> None:
    topic = unique_topic("rt-empty")
    create_topic(rt_broker, topic, config={"retention.ms": "1000", "segment.bytes": "1000000"})
    produce_all(make_producer(rt_broker), topic, [{"value": f"short-lived {i}".encode()} for i in range(30)])
    # Everything expires, including the active segment (Kafka rolls a new one first).
    wait_until(lambda: watermarks(rt_broker, topic) == (30, 30), timeout=20, interval=0.2,
               what="every record to expire")
    wait_until(lambda: _segment_bases(rt_broker, topic) == [30], timeout=10, interval=0.2,
               what="only the new empty segment to remain")
    rep = produce_all(make_producer(rt_broker), topic, [{"value": b"fresh"}])
    assert rep[0].error is None and rep[0].offset == 30
    got = consume_partitions(rt_broker, [TopicPartition(topic, 0, OFFSET_BEGINNING)], 1)
    assert [(m.offset(), m.value()) for m in got] == [(30, b"fresh")]


def test_delete_records_advances_low_watermark(broker_factory: BrokerFactory) -> None:
    b = broker_factory(RETENTION_OVERRIDES)
    topic = unique_topic("rt-delrec")
    create_topic(b, topic, partitions=2, config={"segment.bytes": "1024"})
    values = [f"{i:04d}".encode() * 25 for i in range(100)]
    p = _one_batch_each(b)
    produce_all(p, topic, [{"value": v, "partition": 0} for v in values] +
                [{"value": v, "partition": 1} for v in values])
    segments_before = _segment_bases(b, topic, 0)
    assert len(segments_before) > 5

    admin = admin_for(b)
    fs = admin.delete_records([TopicPartition(topic, 0, 40), TopicPartition(topic, 1, OFFSET_END)],
                              request_timeout=CLIENT_TIMEOUT, operation_timeout=10)
    lows = {tp.partition: f.result(timeout=CLIENT_TIMEOUT).low_watermark for tp, f in fs.items()}
    assert lows == {0: 40, 1: 100}
    assert watermarks(b, topic, 0) == (40, 100)
    assert watermarks(b, topic, 1) == (100, 100)

    # Whole segments below the new start are deleted from disk; the one holding 40 stays.
    wait_until(lambda: _segment_bases(b, topic, 0)[0] == max(s for s in segments_before if s <= 40),
               timeout=10, interval=0.1, what="segments below offset 40 to be deleted")

    # Consumers from the earliest offset, or from a deleted one, start at 40.
    for start in (OFFSET_BEGINNING, 5):
        got = consume_partitions(b, [TopicPartition(topic, 0, start)], 60)
        assert [m.offset() for m in got] == list(range(40, 100)), start
        assert [m.value() for m in got] == values[40:]
    assert consume_partitions(b, [TopicPartition(topic, 1, OFFSET_BEGINNING)], 0, timeout=1) == []

    # Deleting before the current start is a no-op; past the high watermark is an error.
    fs = admin.delete_records([TopicPartition(topic, 0, 10)], request_timeout=CLIENT_TIMEOUT)
    assert next(iter(fs.values())).result(timeout=CLIENT_TIMEOUT).low_watermark == 40
    fs = admin.delete_records([TopicPartition(topic, 0, 101)], request_timeout=CLIENT_TIMEOUT)
    with pytest.raises(KafkaException) as ei:
        next(iter(fs.values())).result(timeout=CLIENT_TIMEOUT)
    assert ei.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE

    # The new log start offset survives a restart.
    assert b.stop() == 0
    b.start()
    assert watermarks(b, topic, 0) == (40, 100)
    assert watermarks(b, topic, 1) == (100, 100)


def test_create_partitions_then_produce_to_new_partition(rt_broker: BrokerProcess) -> None:
    topic = unique_topic("rt-cp")
    create_topic(rt_broker, topic, partitions=1)
    produce_all(make_producer(rt_broker), topic, [{"value": b"p0 before"}])
    admin = admin_for(rt_broker)
    fs = admin.create_partitions([NewPartitions(topic, 3)], request_timeout=CLIENT_TIMEOUT, operation_timeout=10)
    fs[topic].result(timeout=CLIENT_TIMEOUT)
    md = admin.list_topics(topic, timeout=CLIENT_TIMEOUT)
    assert sorted(md.topics[topic].partitions) == [0, 1, 2]
    assert all(_pdir(rt_broker, topic, i).is_dir() for i in (1, 2))

    producer = make_producer(rt_broker, **{"topic.metadata.refresh.interval.ms": 500})
    reports = produce_all(producer, topic, [{"value": f"to p{i}".encode(), "partition": i} for i in (2, 1, 0, 2)])
    assert [(r.partition, r.offset, r.error) for r in reports] == [(2, 0, None), (1, 0, None), (0, 1, None),
                                                                   (2, 1, None)]
    got = consume_partitions(rt_broker, [TopicPartition(topic, 2, 0)], 2)
    assert [m.value() for m in got] == [b"to p2", b"to p2"]
    assert watermarks(rt_broker, topic, 0) == (0, 2)
    assert watermarks(rt_broker, topic, 1) == (0, 1)
