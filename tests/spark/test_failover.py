"""Spark's Kafka source reading a replicated topic while the leader of a partition is killed.

A 3-broker ZooKeeper cluster, an RF 3 topic (min.insync.replicas=2) pre-filled and written to during the
run by an idempotent acks=all producer; a Structured Streaming query (small micro-batches, exactly-once
parquet sink) reads it while kill -9 takes down the leader of one partition. Spark must finish with every
record exactly once, at the partition and offset the producer was acknowledged; a batch read afterwards
(the broker still dead) must return the same, and no micro-batch may wait on its offset lookup much longer
than ``kafka.default.api.timeout.ms`` (the Java AdminClient's ListOffsets for a leader that died stays bound
to that broker until this timeout; docs/spark.md). Skips, like the rest of tests/spark, only where Spark
cannot run; ZooKeeper is required (scripts/install.sh --test).
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.steady import SteadyProducer, assert_nothing_lost, read_all
from tests.spark.kafka_util import read_kafka, stream_kafka, wait_for
from tests.support.cluster import Cluster
from tests.support.zookeeper import zookeeper_available

pytestmark = [pytest.mark.xdist_group("spark"), pytest.mark.timeout(300)]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from pipelines.spark_env import Connector

PARTS = 3
PREFILL = 1500  # per partition: the query is still working through it when the leader dies
PER_TRIGGER = 600
TIMEOUT = 120.0
# What bounds a ListOffsets whose leader died (kafka.default.api.timeout.ms); the admin client wants it no
# smaller than request.timeout.ms (10 s here).
API_TIMEOUT_MS = 15000

Rows = list[tuple[str, int, int]]  # value, partition, offset


@pytest.fixture
def fcluster(connector: Connector, tmp_path: Path) -> Iterator[Cluster]:
    """Three brokers on one ZooKeeper; ``connector`` first, so nothing starts when Spark is missing."""
    if not zookeeper_available():
        raise RuntimeError("ZooKeeper (Debian package zookeeper) is needed: run scripts/install.sh --test")
    with Cluster(tmp_path / "cluster", 3) as c:
        yield c


def create_replicated_topic(cluster: Cluster) -> str:
    name = f"spark-fo-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, PARTS, 3, config={"min.insync.replicas": "2"})])[name].result(30)
    cluster.wait_leaders(name, PARTS)
    wait_for(lambda: all(len(isr) == 3 for _l, _e, isr in cluster.partition_states(name).values()), 30,
             "a full ISR on every partition")
    return name


def prefill(cluster: Cluster, topic: str) -> None:
    """PREFILL records per partition, acks=all and idempotent (acknowledged by the whole ISR)."""
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5})
    errors: list[str] = []
    for i in range(PREFILL):
        for part in range(PARTS):
            for _ in range(100):  # the local queue drains within a few polls
                try:
                    p.produce(topic, f"pre-{part}-{i:05d}".encode(), partition=part,
                              on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
                    break
                except BufferError:
                    p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0, "pre-fill not acknowledged"
    assert not errors, errors[:5]


def victim_leader(cluster: Cluster, topic: str) -> int:
    """The leader of some partition that is not the controller (a pure leader failover, bounded by the
    session timeout), else partition 0's leader."""
    leaders = cluster.leaders(topic)
    controller = cluster.controller_id()
    return next((b for b in leaders.values() if b != controller), leaders[0])


def _offsets(v: Any) -> Any:
    """A progress offset: PySpark 4.0 gives JSON, or the repr of the parsed dict."""
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return ast.literal_eval(v)


def _committed_ends(q: StreamingQuery, topic: str) -> dict[int, int]:
    """partition -> end offset of the query's last finished micro-batch."""
    if not q.isActive:
        raise AssertionError(f"the streaming query stopped: {q.exception()}")
    last = q.lastProgress
    if not last or not last["sources"] or last["sources"][0]["endOffset"] is None:
        return {}
    return {int(p): int(o) for p, o in _offsets(last["sources"][0]["endOffset"]).get(topic, {}).items()}


def _source_opts(topic: str) -> dict[str, Any]:
    # Client timeouts that ride out a leader failover (ZooKeeper session 6 s + election), bounded: a
    # ListOffsets stuck on the dead leader gives up after API_TIMEOUT_MS, and Spark's next attempt looks
    # the leader up again.
    return {"subscribe": topic, "startingOffsets": "earliest", "kafkaConsumer.pollTimeoutMs": 60000,
            "kafka.metadata.max.age.ms": 1000, "kafka.reconnect.backoff.max.ms": 500,
            "kafka.request.timeout.ms": 10000, "kafka.default.api.timeout.ms": API_TIMEOUT_MS,
            "fetchOffset.numRetries": 10, "fetchOffset.retryIntervalMs": 500}


def test_streaming_read_through_leader_kill_every_record_once(spark: SparkSession, fcluster: Cluster,
                                                               tmp_path: Path) -> None:
    cluster = fcluster
    topic = create_replicated_topic(cluster)
    prefill(cluster, topic)
    producer = SteadyProducer(cluster.bootstrap, topic, rate=150, max_seconds=TIMEOUT)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    df = stream_kafka(spark, cluster.bootstrap, maxOffsetsPerTrigger=PER_TRIGGER, **_source_opts(topic)) \
        .selectExpr("CAST(value AS STRING) AS v", "partition", "offset")
    q = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
         .trigger(processingTime="300 milliseconds").start())
    try:
        wait_for(lambda: sum(p["numInputRows"] for p in q.recentProgress) > 0, TIMEOUT, "a first micro-batch")
        read_before = sum(p["numInputRows"] for p in q.recentProgress)
        assert read_before < PARTS * PREFILL, "the query read the whole pre-fill before the kill: raise PREFILL"
        # Records written through the kill; started once the query reads, so that a slow query start does
        # not use up the producer's time.
        producer.start()
        wait_for(lambda: producer.acked_count() > 150, 60, "acknowledgements before the kill")
        victim = victim_leader(cluster, topic)
        acked_at_kill = producer.acked_count()
        cluster.kill(victim)
        cluster.wait_leaders(topic, PARTS, exclude=(victim,), timeout=60)
        # About two more seconds of records, written through the new leaders.
        wait_for(lambda: producer.acked_count() > acked_at_kill + 300, 60, "acknowledgements after the failover")
        producer.stop(flush_timeout=60)
        seen = read_all(cluster.any_bootstrap(), topic, PARTS)
        ends = {p: 0 for p in range(PARTS)}
        for where in seen.values():
            for p, o in where:
                ends[p] = max(ends[p], o + 1)
        wait_for(lambda: all(_committed_ends(q, topic).get(p, -1) >= e for p, e in ends.items()), TIMEOUT,
                 f"the query to reach the end offsets {ends}", interval=0.5)
    finally:
        progress = list(q.recentProgress)
        q.stop()
    assert q.exception() is None, q.exception()
    # The lookup that met the dead leader waited out API_TIMEOUT_MS once, then found the new leader.
    lookups = [int(p["durationMs"].get("latestOffset", 0)) for p in progress if p["batchId"] > 0]
    assert max(lookups) < 2 * API_TIMEOUT_MS, lookups

    # What the topic holds: every acknowledged record once, at its acknowledged offset, plus the pre-fill.
    assert_nothing_lost(producer, seen)
    assert all(f"pre-{p}-{i:05d}".encode() in seen for p in range(PARTS) for i in range(PREFILL))
    want: Rows = sorted((v.decode(), where[0][0], where[0][1]) for v, where in seen.items())

    got: Rows = sorted((r["v"], r["partition"], r["offset"]) for r in spark.read.parquet(str(out)).collect())
    assert len(got) == len(set(got)), "Spark wrote some records twice"
    assert got == want

    # A batch read now, the killed broker still down, returns the same.
    batch = read_kafka(spark, cluster.bootstrap, **_source_opts(topic), endingOffsets="latest") \
        .selectExpr("CAST(value AS STRING) AS v", "partition", "offset")
    assert sorted((r["v"], r["partition"], r["offset"]) for r in batch.collect()) == want
