"""Per-key windowed event counts: a PySpark Structured Streaming job from one Kafka topic to another.

Input records (topic ``--input``, default ``events``) have a JSON value ``{"key": "user-3", "ts": 1704067200123}``
(``ts`` in epoch milliseconds, the event time).  The job counts events per key in tumbling event-time windows
(``--window``, default 1 minute) and, once the watermark (``--watermark``, default 10 minutes behind the newest
event seen) passes a window's end, writes one record per (key, window) to ``--output`` (default ``counts``):

    key   = "<key>|<window start, ISO-8601 UTC>"
    value = {"key": ..., "window_start": ..., "window_end": ..., "count": N}   (JSON, keys sorted)

Each window is written exactly once (append mode), so the output topic's contents do not depend on how the input
was split into micro-batches.  Run it with ``python -m pipelines.windowed_counts --help``; ``pipelines.demo``
feeds it generated events and checks its output.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


@dataclass(frozen=True)
class JobConfig:
    bootstrap: str = "127.0.0.1:9092"
    input_topic: str = "events"
    output_topic: str = "counts"
    checkpoint: str = "/tmp/pykbroker-windowed-counts-checkpoint"
    window: str = "1 minute"
    watermark: str = "10 minutes"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    available_now: bool = False  # process what is there, then stop; else run until stopped
    trigger_interval: str = "1 second"


def windowed_counts(events: DataFrame, window: str, watermark: str) -> DataFrame:
    """Kafka rows (key, value, ...) of JSON events -> Kafka rows (key, value) of per-key window counts."""
    from pyspark.sql import functions as F

    schema = "key STRING, ts LONG"
    parsed = (
        events.select(F.from_json(F.col("value").cast("string"), schema).alias("e"))
        .select(F.col("e.key").alias("key"), F.timestamp_millis(F.col("e.ts")).alias("event_time"))
        .where(F.col("key").isNotNull() & F.col("event_time").isNotNull())
    )
    counts = (
        parsed.withWatermark("event_time", watermark)
        .groupBy(F.col("key"), F.window(F.col("event_time"), window).alias("w"))
        .count()
    )
    iso = "yyyy-MM-dd'T'HH:mm:ss'Z'"
    start = F.date_format(F.col("w.start"), iso)
    end = F.date_format(F.col("w.end"), iso)
    return counts.select(
        F.concat_ws("|", F.col("key"), start).alias("key"),
        F.to_json(F.struct(
            F.col("count"), F.col("key"), end.alias("window_end"), start.alias("window_start"),
        )).alias("value"),
    )


def start_job(spark: SparkSession, cfg: JobConfig) -> StreamingQuery:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", cfg.bootstrap)
        .option("subscribe", cfg.input_topic)
        .option("startingOffsets", cfg.starting_offsets)
    )
    if cfg.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(cfg.max_offsets_per_trigger))
    out = windowed_counts(reader.load(), cfg.window, cfg.watermark)
    writer = (
        out.writeStream.format("kafka")
        .queryName("windowed_counts")
        .outputMode("append")
        .option("kafka.bootstrap.servers", cfg.bootstrap)
        .option("topic", cfg.output_topic)
        .option("checkpointLocation", cfg.checkpoint)
    )
    writer = writer.trigger(availableNow=True) if cfg.available_now else writer.trigger(
        processingTime=cfg.trigger_interval)
    return writer.start()


@dataclass(frozen=True)
class RunStats:
    input_rows: int
    batches: int
    seconds: float  # wall time from start to the end of the last batch, query start-up included
    batch_seconds: float  # time spent inside micro-batches (Spark's durationMs.triggerExecution, summed)

    @property
    def rows_per_second(self) -> float:
        return self.input_rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def rows_per_batch_second(self) -> float:
        return self.input_rows / self.batch_seconds if self.batch_seconds > 0 else 0.0


def run_available_now(spark: SparkSession, cfg: JobConfig, timeout: float = 600.0) -> RunStats:
    """Run the job with Trigger.AvailableNow until it has consumed the input; raise if it fails or times out."""
    cfg = JobConfig(**{**cfg.__dict__, "available_now": True})
    t0 = time.monotonic()
    q = start_job(spark, cfg)
    try:
        if not q.awaitTermination(int(timeout)):
            raise TimeoutError(f"windowed_counts did not finish in {timeout}s; last progress: {q.lastProgress}")
    finally:
        if q.isActive:
            q.stop()
    elapsed = time.monotonic() - t0
    if q.exception() is not None:
        raise RuntimeError(f"windowed_counts failed: {q.exception()}")
    progress = q.recentProgress
    in_batches = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in progress) / 1000
    return RunStats(sum(int(p["numInputRows"]) for p in progress), len(progress), elapsed, in_batches)


def parse_args(argv: list[str] | None) -> JobConfig:
    d = JobConfig()
    ap = argparse.ArgumentParser(prog="python -m pipelines.windowed_counts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default=d.bootstrap)
    ap.add_argument("--input", default=d.input_topic, dest="input_topic")
    ap.add_argument("--output", default=d.output_topic, dest="output_topic")
    ap.add_argument("--checkpoint", default=d.checkpoint)
    ap.add_argument("--window", default=d.window)
    ap.add_argument("--watermark", default=d.watermark)
    ap.add_argument("--starting-offsets", default=d.starting_offsets)
    ap.add_argument("--max-offsets-per-trigger", type=int, default=None)
    ap.add_argument("--available-now", action="store_true", help="process what is in the topic, then exit")
    ap.add_argument("--trigger-interval", default=d.trigger_interval)
    return JobConfig(**vars(ap.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    from pipelines.spark_env import ConnectorUnavailable, local_session

    cfg = parse_args(argv)
    try:
        spark = local_session("windowed-counts")
    except ConnectorUnavailable as e:
        print(f"cannot start Spark: {e}", file=sys.stderr)
        return 2
    try:
        if cfg.available_now:
            stats = run_available_now(spark, cfg)
            print(f"{stats.input_rows} events in {stats.batches} micro-batches, {stats.seconds:.1f}s, "
                  f"{stats.rows_per_second:.0f} rows/s ({stats.rows_per_batch_second:.0f} rows/s inside batches)")
        else:
            q = start_job(spark, cfg)
            print(f"windowed_counts running: {cfg.input_topic} -> {cfg.output_topic} (Ctrl-C stops it)")
            try:
                q.awaitTermination()
            except KeyboardInterrupt:
                q.stop()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
