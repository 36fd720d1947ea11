"""Spark Structured Streaming's Kafka source against pykbroker: checkpoints, triggers, partitions, data loss."""

from __future__ import annotations

import ast
import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.spark.kafka_util import Kafka, Rec, await_query, stream_kafka, wait_for

pytestmark = pytest.mark.xdist_group("spark")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from tests.support.broker import BrokerProcess

TIMEOUT = 90


def _offsets(v: Any) -> Any:
    """A progress offset: PySpark 4.0 gives JSON, or the repr of the parsed dict (fromJson does str(dict))."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return ast.literal_eval(v)


def _qname() -> str:
    return f"q_{uuid.uuid4().hex[:8]}"


def _memory(spark: SparkSession, bootstrap: str, name: str, trigger: dict[str, Any], **opts: Any) -> StreamingQuery:
    df = stream_kafka(spark, bootstrap, **opts).selectExpr("CAST(value AS STRING) AS v", "partition", "offset")
    return df.writeStream.format("memory").queryName(name).outputMode("append").trigger(**trigger).start()


def _parquet(spark: SparkSession, bootstrap: str, out: Path, ckpt: Path, trigger: dict[str, Any],
             **opts: Any) -> StreamingQuery:
    """A query writing to an exactly-once file sink: unlike the memory sink it can restart from its checkpoint."""
    df = stream_kafka(spark, bootstrap, **opts).selectExpr("CAST(value AS STRING) AS v", "partition", "offset")
    return (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
            .trigger(**trigger).start())


def _files(spark: SparkSession, out: Path) -> list[str]:
    return sorted(r["v"] for r in spark.read.parquet(str(out)).collect())


def _table(spark: SparkSession, name: str) -> list[str]:
    return sorted(r["v"] for r in spark.sql(f"SELECT v FROM {name}").collect())


def test_checkpoint_stop_restart_resumes_exactly(spark: SparkSession, sbroker: BrokerProcess, kafka: Kafka,
                                                 tmp_path: Path, offset_fetching: str) -> None:
    t = kafka.topic(2)
    first = [f"a{i:03d}" for i in range(100)]
    kafka.produce_values(t, first, partitions=2)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def start(trigger: dict[str, Any]) -> StreamingQuery:
        return _parquet(spark, sbroker.bootstrap, out, ckpt, trigger, subscribe=t, startingOffsets="earliest",
                        maxOffsetsPerTrigger=20)

    q = start({"processingTime": "300 milliseconds"})
    try:
        wait_for(lambda: sum(p["numInputRows"] for p in q.recentProgress) >= 40, TIMEOUT, "two batches")
    finally:
        q.stop()
    done_first = sum(p["numInputRows"] for p in q.recentProgress)
    last_end = _offsets(q.recentProgress[-1]["sources"][0]["endOffset"])

    second = [f"b{i:03d}" for i in range(50)]
    kafka.produce_values(t, second, partitions=2)
    q2 = start({"availableNow": True})
    await_query(q2, TIMEOUT)
    first_start = _offsets(q2.recentProgress[0]["sources"][0]["startOffset"])
    # the restarted query starts where the stopped one had reported, not earlier nor later
    assert first_start == last_end, (first_start, last_end)
    # and reads to the end: every offset of both partitions (75 each), once
    assert _offsets(q2.recentProgress[-1]["sources"][0]["endOffset"]) == {t: {"0": 75, "1": 75}}
    # Rows counted by progress are 150 - done_first, or 20 fewer: when stop() lands after a batch reached the file
    # sink but before its progress was reported, the restarted query replays that batch and the sink, which already
    # holds it, skips it unread (numInputRows 0). The files below are what must be exact.
    read_second = sum(p["numInputRows"] for p in q2.recentProgress)
    assert read_second in (150 - done_first, 150 - done_first - 20), (read_second, done_first)

    assert _files(spark, out) == sorted(first + second)  # every record exactly once across the two runs


def test_available_now_with_max_offsets_per_trigger(spark: SparkSession, sbroker: BrokerProcess, kafka: Kafka,
                                                    offset_fetching: str) -> None:
    t = kafka.topic(3)
    vals = [f"m{i:03d}" for i in range(90)]
    kafka.produce_values(t, vals, partitions=3)
    name = _qname()
    q = _memory(spark, sbroker.bootstrap, name, {"availableNow": True}, subscribe=t, startingOffsets="earliest",
                maxOffsetsPerTrigger=20)
    await_query(q, TIMEOUT)
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 90 and max(sizes) <= 20 and len(sizes) >= 5, sizes
    assert _table(spark, name) == sorted(vals)
    # records produced after AvailableNow started are left for a later run
    q.stop()


def test_starting_latest_sees_only_new_records(spark: SparkSession, sbroker: BrokerProcess, kafka: Kafka,
                                               offset_fetching: str) -> None:
    t = kafka.topic(2)
    kafka.produce_values(t, [f"old{i}" for i in range(10)], partitions=2)
    name = _qname()
    q = _memory(spark, sbroker.bootstrap, name, {"processingTime": "200 milliseconds"}, subscribe=t,
                startingOffsets="latest")
    try:
        wait_for(lambda: q.lastProgress is not None, TIMEOUT, "the first batch")
        new = [f"new{i}" for i in range(10)]
        kafka.produce_values(t, new, partitions=2)
        wait_for(lambda: len(_table(spark, name)) >= 10, TIMEOUT, "the new records")
        q.processAllAvailable()
        assert _table(spark, name) == sorted(new)
    finally:
        q.stop()


def test_topic_gains_partitions_while_running(spark: SparkSession, sbroker: BrokerProcess, kafka: Kafka,
                                              offset_fetching: str) -> None:
    t = kafka.topic(2)
    before = [f"x{i}" for i in range(10)]
    kafka.produce_values(t, before, partitions=2)
    name = _qname()
    q = _memory(spark, sbroker.bootstrap, name, {"processingTime": "200 milliseconds"}, subscribe=t,
                startingOffsets="earliest", **{"kafka.metadata.max.age.ms": "500"})
    try:
        wait_for(lambda: len(_table(spark, name)) >= 10, TIMEOUT, "the first records")
        kafka.add_partitions(t, 4)
        after = [f"y{i}" for i in range(20)]
        # a fresh producer, which sees the new partitions
        kafka.produce(t, [Rec(i % 4, None, v.encode()) for i, v in enumerate(after)], **{"linger.ms": 1})
        wait_for(lambda: len(_table(spark, name)) >= 30, TIMEOUT, "records of the new partitions")
        q.processAllAvailable()
        assert _table(spark, name) == sorted(before + after)
        parts = {r["partition"] for r in spark.sql(f"SELECT partition FROM {name}").collect()}
        assert parts == {0, 1, 2, 3}
    finally:
        q.stop()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_retention_deletes_unread_data(spark: SparkSession, sbroker: BrokerProcess, kafka: Kafka, tmp_path: Path,
                                       fail_on_data_loss: bool, offset_fetching: str) -> None:
    """Retention (retention.bytes) removes records a stopped query has not read; on restart Spark must see it."""
    t = kafka.topic(1, prefix="retention", config={"segment.bytes": "500", "retention.bytes": "1500"})
    kafka.produce_values(t, ["early0", "early1", "early2"])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    opts = {"subscribe": t, "startingOffsets": "earliest", "failOnDataLoss": str(fail_on_data_loss).lower()}
    q = _parquet(spark, sbroker.bootstrap, out, ckpt, {"availableNow": True}, **opts)
    await_query(q, TIMEOUT)
    assert _files(spark, out) == ["early0", "early1", "early2"]

    for i in range(100):  # one batch per record, so segments roll and old ones fall to retention.bytes
        kafka.produce(t, [Rec(0, None, f"late{i:03d}".encode())])
    wait_for(lambda: kafka.watermarks(t)[0] > 10, 30, "retention to delete the oldest segments")
    time.sleep(0.5)  # retention.bytes is reached; nothing more is deleted after this
    low, high = kafka.watermarks(t)
    assert high == 103

    from pyspark.errors import StreamingQueryException

    q2 = _parquet(spark, sbroker.bootstrap, out, ckpt, {"availableNow": True}, **opts)
    try:
        finished = q2.awaitTermination(TIMEOUT)
    except StreamingQueryException:
        finished = True
    if not finished:
        q2.stop()
        raise AssertionError("query did not finish")
    if fail_on_data_loss:
        exc = q2.exception()
        assert exc is not None, "expected the query to fail on data loss"
        text = str(exc).lower()
        assert "data loss" in text or "lost" in text or "out of range" in text, text
    else:
        assert q2.exception() is None, q2.exception()
        want = ["early0", "early1", "early2"] + [f"late{i:03d}" for i in range(low - 3, 100)]
        assert _files(spark, out) == sorted(want)
