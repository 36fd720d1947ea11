"""The sans-I/O pieces of the metrics endpoint and the log formats."""

from __future__ import annotations

import json
import logging
import struct

import pytest

from pykbroker import logsetup
from pykbroker.config import parse_metrics_listener
from pykbroker.observability.collector import Snapshot, families
from pykbroker.observability.lag import LagRow, consumer_lag
from pykbroker.observability.otlp import OtlpError, Point, number_points
from pykbroker.observability.stats import LATENCY_BUCKETS, BrokerStats, LatencyHistogram


def test_metrics_listener_forms() -> None:
    assert parse_metrics_listener("http://127.0.0.1:9404") == ("127.0.0.1", 9404)
    assert parse_metrics_listener("0.0.0.0:9404") == ("0.0.0.0", 9404)
    assert parse_metrics_listener("http://[::1]:9404/metrics") == ("::1", 9404)
    for bad in ("https://h:1", "http://h", "http://:9404", "http://h:1/other", "http://h:notaport"):
        with pytest.raises(ValueError, match="pykbroker.metrics.listener"):
            parse_metrics_listener(bad)


def test_histogram_buckets_are_cumulative() -> None:
    h = LatencyHistogram()
    for s in (0.0001, 0.0005, 0.003, 100.0):
        h.observe(s)
    cum = dict(h.cumulative())
    assert cum["0.0005"] == 2  # le is inclusive
    assert cum["0.005"] == 3
    assert cum["30.0"] == 3 and cum["+Inf"] == 4
    assert h.count == 4 and h.sum == pytest.approx(100.0036)
    assert len(h.cumulative()) == len(LATENCY_BUCKETS) + 1


def test_lag_rows() -> None:
    class V:
        def __init__(self, offset: int) -> None:
            self.offset = offset

    committed = {"g": {("t", 0): V(5), ("t", 1): V(12), ("elsewhere", 0): V(1), ("t", 2): V(-1)}}
    rows = consumer_lag(committed, {("t", 0): 10, ("t", 1): 10, ("t", 2): 10})
    assert sorted(rows, key=lambda r: r.partition) == [LagRow("g", "t", 0, 5, 10), LagRow("g", "t", 1, 12, 10)]
    assert [r.lag for r in sorted(rows, key=lambda r: r.partition)] == [5, 0]  # never negative


def _ld(field: int, payload: bytes) -> bytes:
    def varint(n: int) -> bytes:
        out = b""
        while True:
            b, n = n & 0x7F, n >> 7
            out += bytes([b | (0x80 if n else 0)])
            if not n:
                return out
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def _point(value: float | int, attrs: dict[str, str]) -> bytes:
    body = b"".join(_ld(7, _ld(1, k.encode()) + _ld(2, _ld(1, v.encode()))) for k, v in attrs.items())
    body += bytes([3 << 3 | 1]) + struct.pack("<Q", 123)  # time_unix_nano, skipped
    if isinstance(value, float):
        body += bytes([4 << 3 | 1]) + struct.pack("<d", value)
    else:
        body += bytes([6 << 3 | 1]) + struct.pack("<q", value)
    return body


def _metric(name: str, kind: int, *points: bytes) -> bytes:
    return _ld(1, name.encode()) + _ld(kind, b"".join(_ld(1, p) for p in points))


def test_otlp_gauge_and_sum_points() -> None:
    metrics = [_metric("org.apache.kafka.producer.node.request.latency.avg", 5, _point(1.5, {"node_id": "1"})),
               _metric("org.apache.kafka.producer.record.queue.time.max", 7, _point(-3, {}))]
    data = _ld(1, _ld(1, b"resource") + _ld(2, _ld(1, b"scope") + b"".join(_ld(2, m) for m in metrics)))
    assert number_points(data) == [
        Point("org.apache.kafka.producer.node.request.latency.avg", (("node_id", "1"),), 1.5),
        Point("org.apache.kafka.producer.record.queue.time.max", (), -3.0)]
    with pytest.raises(OtlpError):
        number_points(data[:-3])


def test_families_from_a_snapshot() -> None:
    stats = BrokerStats()
    stats.request(0, 9, 0.002)
    stats.request(0, 9, 0.004)
    stats.appended("t", 10, 1000)
    snap = Snapshot()
    for (key, version), h in stats.requests.items():
        snap.requests.append((key, version, h.cumulative(), h.sum, h.count))
    snap.topics = [("t", (10, 1000, 0, 0, 0, 1, 0))]
    snap.lag = [LagRow("g", "t", 0, 3, 10)]
    got = {f.name: f for f in families(snap)}
    req = got["kafka_network_requestmetrics_requests"]
    assert [(s.labels, s.value) for s in req.samples] == [({"request": "Produce", "version": "9"}, 2)]
    assert [s.value for s in got["kafka_server_brokertopicmetrics_messagesin"].samples] == [10]
    assert [s.value for s in got["kafka_consumergroup_lag"].samples] == [7]
    assert "kafka_controller_kafkacontroller_offlinepartitionscount" not in got  # only from a controller


@pytest.mark.parametrize("fmt", logsetup.FORMATS)
def test_log_formats_carry_fields(fmt: str) -> None:
    record = logging.LogRecord("pykbroker.x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    record.kv = {"client_id": "a b", "latency_ms": 1.5}
    line = logsetup._FORMATTERS[fmt]().format(record)
    if fmt == "json":
        doc = json.loads(line)
        assert doc["msg"] == "hello world" and doc["client_id"] == "a b" and doc["level"] == "info"
    elif fmt == "logfmt":
        assert 'msg="hello world"' in line and 'client_id="a b"' in line and "latency_ms=1.5" in line
        assert line.startswith("ts=")
    else:
        assert "pykbroker.x: hello world" in line and 'client_id="a b"' in line
    with pytest.raises(ValueError):
        logsetup.configure("INFO", "xml")


def test_partition_series_or_per_topic_sums() -> None:
    from pykbroker.observability.collector import PartitionRow

    rows = [PartitionRow("t", i, 100 * (i + 1), 1, 5, 10 + i, 10 + i, True, 3, 3 - (i == 1), False) for i in range(3)]
    per_partition = {f.name: f for f in families(Snapshot(partitions=rows))}
    assert [s.value for s in per_partition["kafka_log_log_size"].samples] == [100, 200, 300]
    assert [s.value for s in per_partition["kafka_cluster_partition_underreplicated"].samples] == [0, 1, 0]
    assert [s.value for s in per_partition["kafka_server_replicamanager_underreplicatedpartitions"].samples] == [1]
    summed = {f.name: f for f in families(Snapshot(partitions=rows, partition_series=False))}
    assert "kafka_log_log_size" not in summed
    assert [(s.labels, s.value) for s in summed["pykbroker_log_topic_size"].samples] == [({"topic": "t"}, 600)]
    assert [s.value for s in summed["pykbroker_log_topic_records"].samples] == [5 + 6 + 7]
    assert [s.value for s in summed["pykbroker_topic_underreplicatedpartitions"].samples] == [1]
