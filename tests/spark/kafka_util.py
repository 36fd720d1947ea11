"""Helpers shared by the Spark tests: topics, producing with confluent-kafka, reading back, waiting."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

DEPRECATED_FETCHING = "spark.sql.streaming.kafka.useDeprecatedOffsetFetching"


@dataclass(frozen=True)
class Rec:
    """One record as produced, for comparing with what Spark returns."""

    partition: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()


class Kafka:
    """Admin, produce and consume against one broker."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self._producer: Producer | None = None

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None

    def topic(self, partitions: int = 1, config: dict[str, str] | None = None, prefix: str = "spark") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name].result(15)
        return name

    def add_partitions(self, topic: str, total: int) -> None:
        self.admin.create_partitions([NewPartitions(topic, total)])[topic].result(15)

    def produce(self, topic: str, recs: Iterable[Rec], **conf: Any) -> list[tuple[int, int]]:
        """Produce records (each to its partition) and return their (partition, offset)s in order."""
        if conf:
            p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, **conf})
        else:
            if self._producer is None:
                self._producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
            p = self._producer
        out: dict[int, tuple[int, int]] = {}
        errors: list[str] = []

        def on_delivery(i: int) -> Callable[[KafkaError | None, Any], None]:
            def cb(err: KafkaError | None, msg: Any) -> None:
                if err is not None:
                    errors.append(str(err))
                else:
                    out[i] = (msg.partition(), msg.offset())
            return cb

        n = 0
        for n, r in enumerate(recs, 1):
            kw: dict[str, Any] = {"partition": r.partition, "on_delivery": on_delivery(n - 1)}
            if r.timestamp is not None:
                kw["timestamp"] = r.timestamp
            if r.headers:
                kw["headers"] = list(r.headers)
            p.produce(topic, value=r.value, key=r.key, **kw)
            p.poll(0)
        assert p.flush(30) == 0, "produce did not finish"
        assert not errors, errors
        return [out[i] for i in range(n)]

    def produce_values(self, topic: str, values: Sequence[str], partitions: int = 1,
                       timestamp: int | None = None) -> None:
        self.produce(topic, [Rec(i % partitions, f"k{i}".encode(), v.encode(), timestamp)
                             for i, v in enumerate(values)])

    def transactional_producer(self) -> Producer:
        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
                      "linger.ms": 5, "transaction.timeout.ms": 60000})
        p.init_transactions(30)
        return p

    def watermarks(self, topic: str, partition: int = 0) -> tuple[int, int]:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "watermarks"})
        try:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            return int(lo), int(hi)
        finally:
            c.close()

    def consume_all(self, topic: str, partitions: int, isolation: str = "read_uncommitted",
                    timeout: float = 30.0) -> list[Any]:
        """Every record now in the topic (up to the high watermark / LSO), by assign, in partition order."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                      "enable.auto.commit": False, "isolation.level": isolation,
                      "enable.partition.eof": True})
        try:
            c.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
            out: list[Any] = []
            done: set[int] = set()
            deadline = time.monotonic() + timeout
            while len(done) < partitions:
                assert time.monotonic() < deadline, f"timed out reading {topic}"
                m = c.poll(0.5)
                if m is None:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(int(m.partition() or 0))
                        continue
                    raise AssertionError(str(err))
                out.append(m)
            return out
        finally:
            c.close()


def read_kafka(spark: SparkSession, bootstrap: str, **opts: Any) -> DataFrame:
    """A batch read; option names with dots are passed as ``**{"kafka.isolation.level": ...}``."""
    r = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def stream_kafka(spark: SparkSession, bootstrap: str, **opts: Any) -> DataFrame:
    r = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def wait_for(pred: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def await_query(q: StreamingQuery, timeout: float) -> None:
    """Wait for an AvailableNow/once query to finish; stop it and fail if it does not in time."""
    finished = q.awaitTermination(int(timeout))
    if not finished:
        q.stop()
        raise AssertionError(f"streaming query did not finish within {timeout}s; last progress: {q.lastProgress}")
    if q.exception() is not None:
        raise AssertionError(f"streaming query failed: {q.exception()}")


def stream_available_now(spark: SparkSession, bootstrap: str, opts: dict[str, Any],
                         timeout: float = 90.0) -> tuple[list[Any], int]:
    """Run a Trigger.AvailableNow query into a memory table; return its rows (value, partition, offset) and
    how many micro-batches carried data."""
    name = f"q_{uuid.uuid4().hex[:8]}"
    df = stream_kafka(spark, bootstrap, **opts).selectExpr("value", "partition", "offset")
    q = df.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    try:
        await_query(q, timeout)
        rows = spark.sql(f"SELECT * FROM {name} ORDER BY partition, offset").collect()
        return rows, len([p for p in q.recentProgress if p["numInputRows"]])
    finally:
        spark.catalog.dropTempView(name)
