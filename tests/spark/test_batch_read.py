"""Spark's built-in Kafka source, batch reads, against pykbroker."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import NewTopic

from tests.spark.kafka_util import Kafka, Rec, read_kafka, stream_available_now, wait_for

pytestmark = pytest.mark.xdist_group("spark")

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.support.broker import BrokerProcess

PARTS = 3
PER_PART = 10
BASE_TS = (int(time.time()) - 3600) * 1000


@dataclass(frozen=True)
class Produced:
    topic: str
    rows: list[tuple[int, int, bytes, bytes, int, tuple[tuple[str, bytes | None], ...]]]  # p, off, k, v, ts, h


@pytest.fixture(scope="module")
def data(kafka: Kafka) -> Produced:
    """3 partitions x 10 records; record i of partition p has timestamp BASE_TS + i*1000 + p and headers."""
    topic = kafka.topic(PARTS)
    recs = []
    for i in range(PER_PART):
        for p in range(PARTS):
            hdrs: tuple[tuple[str, bytes | None], ...] = (("i", str(i).encode()), ("p", str(p).encode()))
            if i % 3 == 0:
                hdrs += (("dup", b"a"), ("dup", b"b"), ("none", None))
            recs.append(Rec(p, f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), BASE_TS + i * 1000 + p, hdrs))
    offsets = kafka.produce(topic, recs)
    by = dict(zip([(r.partition, r.key) for r in recs], offsets, strict=True))
    rows = sorted((r.partition, by[(r.partition, r.key)][1], r.key or b"", r.value or b"", r.timestamp or 0,
                   r.headers) for r in recs)
    return Produced(topic, rows)


def _rows(df: DataFrame) -> list[tuple[int, int, bytes, bytes, int, tuple[tuple[str, bytes | None], ...]]]:
    out = []
    for r in df.selectExpr("*", "unix_millis(timestamp) AS ts_ms").orderBy("partition", "offset").collect():
        hdrs = tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in (r["headers"] or ()))
        out.append((r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"]), r["ts_ms"], hdrs))
    return out


def _kv(df: DataFrame) -> list[tuple[int, int, bytes]]:
    return [(r["partition"], r["offset"], bytes(r["value"])) for r in df.orderBy("partition", "offset").collect()]


def test_subscribe_earliest_to_latest_with_headers(spark: SparkSession, sbroker: BrokerProcess, data: Produced,
                                                   offset_fetching: str) -> None:
    df = read_kafka(spark, sbroker.bootstrap, subscribe=data.topic, includeHeaders="true",
                    startingOffsets="earliest", endingOffsets="latest")
    got = _rows(df)
    assert got == data.rows
    assert {r["topic"] for r in df.select("topic").collect()} == {data.topic}
    assert {r["timestampType"] for r in df.select("timestampType").collect()} == {0}  # CreateTime


def test_subscribe_pattern(spark: SparkSession, sbroker: BrokerProcess, kafka: Kafka, offset_fetching: str) -> None:
    tag = uuid.uuid4().hex[:8]
    a = f"pat{tag}-a"
    b = f"pat{tag}-b"
    other = f"nopat{tag}"
    for name, n in ((a, 2), (b, 1), (other, 1)):
        kafka.admin.create_topics([NewTopic(name, n, 1)])[name].result(15)
        kafka.produce_values(name, [f"{name}:{i}" for i in range(4)], partitions=n)
    df = read_kafka(spark, sbroker.bootstrap, subscribePattern=f"pat{tag}-.*")
    got = sorted((r["topic"], bytes(r["value"]).decode()) for r in df.collect())
    assert got == sorted([(a, f"{a}:{i}") for i in range(4)] + [(b, f"{b}:{i}") for i in range(4)])


def test_assign_subset_of_partitions(spark: SparkSession, sbroker: BrokerProcess, data: Produced,
                                     offset_fetching: str) -> None:
    df = read_kafka(spark, sbroker.bootstrap, assign=json.dumps({data.topic: [0, 2]}))
    got = _kv(df)
    assert got == [(p, o, v) for p, o, _k, v, _t, _h in data.rows if p in (0, 2)]


def test_json_offsets(spark: SparkSession, sbroker: BrokerProcess, data: Produced, offset_fetching: str) -> None:
    t = data.topic
    start = {t: {"0": 2, "1": -2, "2": 5}}
    end = {t: {"0": 6, "1": -1, "2": 8}}
    df = read_kafka(spark, sbroker.bootstrap, assign=json.dumps({t: [0, 1, 2]}),
                    startingOffsets=json.dumps(start), endingOffsets=json.dumps(end))
    bounds = {0: (2, 6), 1: (0, PER_PART), 2: (5, 8)}
    want = [(p, o, v) for p, o, _k, v, _t, _h in data.rows if bounds[p][0] <= o < bounds[p][1]]
    assert _kv(df) == want
    # The same with subscribe and explicit earliest/latest words.
    df2 = read_kafka(spark, sbroker.bootstrap, subscribe=t, startingOffsets="earliest", endingOffsets="latest")
    assert len(_kv(df2)) == PARTS * PER_PART


def test_starting_and_ending_by_timestamp(spark: SparkSession, sbroker: BrokerProcess, data: Produced,
                                          offset_fetching: str) -> None:
    t = data.topic
    # startingTimestamp: the first record of each partition with timestamp >= ts.
    ts = BASE_TS + 4 * 1000 + 1  # partition 0's i=4 is BASE+4000 (<), partition 1's is BASE+4001 (>=)
    df = read_kafka(spark, sbroker.bootstrap, subscribe=t, startingTimestamp=ts)
    want = [(p, o, v) for p, o, _k, v, rts, _h in data.rows if rts >= ts]
    assert _kv(df) == want
    # startingOffsetsByTimestamp / endingOffsetsByTimestamp, per partition.
    start = {t: {"0": BASE_TS + 2000, "1": BASE_TS + 7001, "2": BASE_TS}}
    end = {t: {"0": BASE_TS + 5000, "1": BASE_TS + 9001, "2": BASE_TS + 1002}}
    df = read_kafka(spark, sbroker.bootstrap, subscribe=t, startingOffsetsByTimestamp=json.dumps(start),
                    endingOffsetsByTimestamp=json.dumps(end))
    want = [(p, o, v) for p, o, _k, v, rts, _h in data.rows
            if start[t][str(p)] <= rts < end[t][str(p)]]
    assert _kv(df) == want
    # endingTimestamp alone (global), and a start past every record with the "latest" fallback strategy.
    df = read_kafka(spark, sbroker.bootstrap, subscribe=t, endingTimestamp=BASE_TS + 3000)
    assert _kv(df) == [(p, o, v) for p, o, _k, v, rts, _h in data.rows if rts < BASE_TS + 3000]
    df = read_kafka(spark, sbroker.bootstrap, subscribe=t, startingTimestamp=BASE_TS + 10**9,
                    startingOffsetsByTimestampStrategy="latest")
    assert df.count() == 0


def test_min_partitions_splits_ranges(spark: SparkSession, sbroker: BrokerProcess, data: Produced,
                                      offset_fetching: str) -> None:
    df = read_kafka(spark, sbroker.bootstrap, subscribe=data.topic, minPartitions=9)
    assert df.rdd.getNumPartitions() >= 9
    assert _kv(df) == [(p, o, v) for p, o, _k, v, _t, _h in data.rows]


def test_read_committed_skips_aborted_and_control_records(spark: SparkSession, sbroker: BrokerProcess,
                                                          kafka: Kafka, offset_fetching: str) -> None:
    t = kafka.topic(2, prefix="txn")
    kafka.produce_values(t, ["plain-0", "plain-1"], partitions=2)
    p = kafka.transactional_producer()
    for batch, commit in (("a", True), ("b", False), ("c", True), ("d", False), ("e", True)):
        p.begin_transaction()
        for i in range(5):
            p.produce(t, value=f"{batch}{i}".encode(), key=f"{batch}{i}".encode(), partition=i % 2)
        p.flush(30)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    kafka.produce_values(t, ["plain-2", "plain-3"], partitions=2)
    committed = sorted([f"plain-{i}" for i in range(4)] + [f"{b}{i}" for b in "ace" for i in range(5)])
    everything = sorted(committed + [f"{b}{i}" for b in "bd" for i in range(5)])

    rc = read_kafka(spark, sbroker.bootstrap, subscribe=t, **{"kafka.isolation.level": "read_committed"})
    got = rc.select("partition", "offset", "value").collect()
    assert sorted(bytes(r["value"]).decode() for r in got) == committed
    assert rc.count() == len(committed)
    # offsets have holes (control records, aborted batches): Spark must not have called it data loss
    offs = sorted(r["offset"] for r in got if r["partition"] == 0)
    assert offs[-1] - offs[0] + 1 > len(offs)
    ru = read_kafka(spark, sbroker.bootstrap, subscribe=t)
    assert sorted(bytes(r["value"]).decode() for r in ru.select("value").collect()) == everything
    # Streaming, failOnDataLoss=true (the default), micro-batches ending inside the gaps.
    srows, batches = stream_available_now(spark, sbroker.bootstrap, {
        "subscribe": t, "startingOffsets": "earliest", "maxOffsetsPerTrigger": 3,
        "kafka.isolation.level": "read_committed"})
    assert sorted(bytes(r["value"]).decode() for r in srows) == committed
    assert batches >= 3

    # An open transaction: read_committed stops at the last stable offset.
    p.begin_transaction()
    p.produce(t, value=b"open", partition=0)
    p.flush(30)
    rc2 = read_kafka(spark, sbroker.bootstrap, subscribe=t, **{"kafka.isolation.level": "read_committed"})
    assert sorted(bytes(r["value"]).decode() for r in rc2.select("value").collect()) == committed
    p.abort_transaction(30)
    del p


def test_compacted_topic_with_offset_gaps(spark: SparkSession, sbroker: BrokerProcess, kafka: Kafka,
                                          offset_fetching: str) -> None:
    t = kafka.topic(1, prefix="compact", config={
        "cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "100", "segment.ms": "100",
    })
    recs = [Rec(0, f"key{i % 5}".encode(), f"val{i}".encode()) for i in range(60)]
    recs.append(Rec(0, b"gone", b"x"))
    recs.append(Rec(0, b"gone", None))  # tombstone
    kafka.produce(t, recs, **{"batch.num.messages": 1})  # one record per batch: segments roll often

    def compacted() -> bool:
        got = kafka.consume_all(t, 1)
        kafka.produce(t, [Rec(0, b"tick", b"t")])  # keeps rolling segments so the dirty ones become cleanable
        return len(got) < 40

    wait_for(compacted, 60, "the broker to compact the topic (cleanup.policy=compact)", interval=0.5)
    want = [(m.partition(), m.offset(), m.value()) for m in kafka.consume_all(t, 1)]
    df = read_kafka(spark, sbroker.bootstrap, subscribe=t)
    got = [(r["partition"], r["offset"], None if r["value"] is None else bytes(r["value"]))
           for r in df.orderBy("offset").collect()]
    # Spark may see the topic a little later than our snapshot (more ticks); compare the common prefix.
    assert got[: len(want)] == want
    offs = [o for _p, o, _v in want]
    assert offs != list(range(offs[0], offs[0] + len(offs))), "expected gaps in a compacted topic"
    latest = {}
    for r in df.collect():
        latest[bytes(r["key"])] = r["value"]
    for k in range(5):
        assert bytes(latest[f"key{k}".encode()]) == f"val{55 + k}".encode()
    # Streaming over the gaps, failOnDataLoss=true, small micro-batches.
    srows, batches = stream_available_now(spark, sbroker.bootstrap, {
        "subscribe": t, "startingOffsets": "earliest", "maxOffsetsPerTrigger": 4})
    sgot = [(r["partition"], r["offset"], None if r["value"] is None else bytes(r["value"])) for r in srows]
    assert sgot[: len(want)] == want
    assert batches >= 3
