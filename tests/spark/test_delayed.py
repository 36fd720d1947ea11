"""Delayed delivery (docs/queues.md) seen by Spark's Kafka source: a record produced with a
``pykbroker.delay.ms`` header is not in a batch read before its due time, and is there once after it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tests.spark.kafka_util import Kafka, Rec, read_kafka

pytestmark = pytest.mark.xdist_group("spark")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.support.broker import BrokerProcess

DELAY_MS = 6000


def test_delayed_records_reach_a_batch_read_at_their_due_time(spark: SparkSession, sbroker: BrokerProcess,
                                                              kafka: Kafka) -> None:
    topic = kafka.topic(1, prefix="spark-delayed")
    now = [Rec(0, f"now-{i}".encode(), f"now-{i}".encode()) for i in range(5)]
    later = [Rec(0, f"later-{i}".encode(), f"later-{i}".encode(), headers=(("pykbroker.delay.ms",
                                                                          str(DELAY_MS).encode()),))
             for i in range(5)]
    produced_at = time.time()
    kafka.produce(topic, now + later)

    def values() -> list[str]:
        df = read_kafka(spark, sbroker.bootstrap, subscribe=topic, startingOffsets="earliest",
                        endingOffsets="latest")
        return sorted(bytes(r["value"]).decode() for r in df.collect())

    due = produced_at + DELAY_MS / 1000
    reads: list[tuple[float, list[str]]] = []  # (when the read had finished, what it saw)
    deadline = time.monotonic() + DELAY_MS / 1000 + 60
    for _ in range(200):  # bounded: the clock or all ten records end it
        got = values()
        reads.append((time.time(), got))
        if len(got) >= 10 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for finished, got in reads:
        if finished < due - 0.1:  # a read over before the due time saw none of the delayed records
            assert got == sorted(r.value.decode() for r in now if r.value), (finished - produced_at, got)
    assert reads[-1][1] == sorted([f"now-{i}" for i in range(5)] + [f"later-{i}" for i in range(5)]), reads[-1]
