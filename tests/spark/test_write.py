"""Spark's Kafka sink against pykbroker: batch and streaming writes with keys, headers and a topic column."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.spark.kafka_util import Kafka, await_query, stream_kafka

pytestmark = pytest.mark.xdist_group("spark")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.support.broker import BrokerProcess


def _read_back(kafka: Kafka, topic: str, partitions: int) -> list[tuple[str | None, str, tuple[Any, ...]]]:
    out = []
    for m in kafka.consume_all(topic, partitions):
        key = None if m.key() is None else m.key().decode()
        hdrs = tuple((k, None if v is None else v.decode()) for k, v in (m.headers() or ()))
        out.append((key, m.value().decode(), hdrs))
    return sorted(out, key=lambda r: (r[1], r[0] or ""))


def test_batch_write_keys_headers_and_topic_column(spark: SparkSession, sbroker: BrokerProcess,
                                                   kafka: Kafka) -> None:
    even, odd = kafka.topic(2, prefix="even"), kafka.topic(1, prefix="odd")
    rows = [(f"k{i}", f"v{i:02d}", even if i % 2 == 0 else odd, i) for i in range(20)]
    df = spark.createDataFrame(rows, "key STRING, value STRING, topic STRING, i INT").selectExpr(
        "key", "value", "topic",
        "array(named_struct('key', 'i', 'value', CAST(CAST(i AS STRING) AS BINARY)),"
        "      named_struct('key', 'empty', 'value', CAST(NULL AS BINARY))) AS headers",
    )
    df.write.format("kafka").option("kafka.bootstrap.servers", sbroker.bootstrap).save()

    def want(parity: int) -> list[tuple[str | None, str, tuple[Any, ...]]]:
        return [(f"k{i}", f"v{i:02d}", (("i", str(i)), ("empty", None))) for i in range(20) if i % 2 == parity]

    assert _read_back(kafka, even, 2) == want(0)
    assert _read_back(kafka, odd, 1) == want(1)

    # The `topic` option instead of a column, explicit partitions and null keys.
    fixed = kafka.topic(3, prefix="fixed")
    df2 = spark.createDataFrame([(None, f"p{i}", i % 3) for i in range(9)], "key STRING, value STRING, partition INT")
    df2.write.format("kafka").option("kafka.bootstrap.servers", sbroker.bootstrap).option("topic", fixed).save()
    got = kafka.consume_all(fixed, 3)
    assert sorted((m.partition(), m.value().decode(), m.key()) for m in got) == sorted(
        (i % 3, f"p{i}", None) for i in range(9))


def test_streaming_write_routes_to_topics(spark: SparkSession, sbroker: BrokerProcess, kafka: Kafka,
                                          tmp_path: Path) -> None:
    src = kafka.topic(2, prefix="src")
    low, high = kafka.topic(1, prefix="low"), kafka.topic(2, prefix="high")
    kafka.produce_values(src, [str(i) for i in range(40)], partitions=2)
    df = stream_kafka(spark, sbroker.bootstrap, subscribe=src, startingOffsets="earliest", maxOffsetsPerTrigger=15)
    out = df.selectExpr(
        "CONCAT('key-', CAST(value AS STRING)) AS key",
        "CAST(CAST(CAST(value AS STRING) AS INT) * 10 AS STRING) AS value",
        f"IF(CAST(CAST(value AS STRING) AS INT) < 20, '{low}', '{high}') AS topic",
        "array(named_struct('key', 'src-offset', 'value', CAST(CAST(offset AS STRING) AS BINARY)),"
        "      named_struct('key', 'src-partition', 'value', CAST(CAST(partition AS STRING) AS BINARY))) AS headers",
    )
    q = (out.writeStream.format("kafka").option("kafka.bootstrap.servers", sbroker.bootstrap)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    await_query(q, 90)
    assert len([p for p in q.recentProgress if p["numInputRows"]]) >= 3  # several micro-batches

    src_msgs = {m.value().decode(): (m.partition(), m.offset()) for m in kafka.consume_all(src, 2)}

    def want(lo: int, hi: int) -> list[tuple[str | None, str, tuple[Any, ...]]]:
        rows = []
        for i in range(lo, hi):
            p, o = src_msgs[str(i)]
            rows.append((f"key-{i}", str(i * 10), (("src-offset", str(o)), ("src-partition", str(p)))))
        return sorted(rows, key=lambda r: (r[1], r[0] or ""))

    assert _read_back(kafka, low, 1) == want(0, 20)
    assert _read_back(kafka, high, 2) == want(20, 40)
