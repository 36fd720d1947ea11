"""The windowed-counts PySpark pipeline (pipelines/), end to end against pykbroker, output checked exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pipelines.demo import compare, expected_output, generate_events, produce_events, read_topic, run_demo
from pipelines.windowed_counts import JobConfig, parse_args, run_available_now
from tests.spark.kafka_util import Kafka

pytestmark = pytest.mark.xdist_group("spark")

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.support.broker import BrokerProcess


def test_windowed_counts_exact_output_over_several_batches(spark: SparkSession, sbroker: BrokerProcess,
                                                           kafka: Kafka, tmp_path: Path) -> None:
    events_topic, counts_topic = kafka.topic(3, prefix="events"), kafka.topic(2, prefix="counts")
    events = generate_events(6000, keys=7, step_ms=50)
    produce_events(sbroker.bootstrap, events_topic, events)
    cfg = JobConfig(bootstrap=sbroker.bootstrap, input_topic=events_topic, output_topic=counts_topic,
                    checkpoint=str(tmp_path / "ckpt"), max_offsets_per_trigger=1500)
    stats = run_available_now(spark, cfg, timeout=180)
    assert stats.input_rows == len(events)
    assert stats.batches >= 4

    want = expected_output(events)
    got = read_topic(sbroker.bootstrap, counts_topic)
    assert compare(got, want) == []
    assert {k: json.loads(v) for k, v in got} == want  # the same, said plainly
    assert sum(v["count"] for v in want.values()) == len(events) - 1  # all but the flush event are counted

    # A second run from the same checkpoint finds nothing new and writes nothing.
    again = run_available_now(spark, cfg, timeout=120)
    assert again.input_rows == 0
    assert len(read_topic(sbroker.bootstrap, counts_topic)) == len(got)


def test_demo_runner(spark: SparkSession, sbroker: BrokerProcess) -> None:
    rate, problems = run_demo(spark, sbroker.bootstrap, 3000, keys=5, partitions=2, log=lambda _m: None)
    assert problems == []
    assert rate > 0


def test_job_arguments() -> None:
    cfg = parse_args(["--bootstrap", "127.0.0.1:1", "--input", "a", "--output", "b", "--available-now",
                      "--max-offsets-per-trigger", "10", "--window", "5 minutes"])
    assert (cfg.bootstrap, cfg.input_topic, cfg.output_topic, cfg.available_now, cfg.max_offsets_per_trigger,
            cfg.window) == ("127.0.0.1:1", "a", "b", True, 10, "5 minutes")


def test_expected_output_and_compare() -> None:
    events = generate_events(500, keys=3, step_ms=200)
    want = expected_output(events)
    assert sum(v["count"] for v in want.values()) == 500
    assert all(k == f"{v['key']}|{v['window_start']}" for k, v in want.items())
    got = [(k, json.dumps(v)) for k, v in want.items()]
    assert compare(got, want) == []
    k0 = next(iter(want))
    assert compare(got[1:], want) == [f"missing output for {k0}"]
    assert len(compare([*got, got[0]], want)) == 1  # a duplicate
