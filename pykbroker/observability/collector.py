"""The broker as Prometheus metric families, named after Kafka's JMX metrics where one exists.

A scrape arrives on prometheus_client's HTTP thread; the broker's state belongs to the event loop.
So `collect()` asks the loop for a snapshot of plain values (one short loop turn: counters copied,
partitions and groups walked) and builds the metric families on the HTTP thread, where the cost of
exposition does not hold up requests. Kafka's ``kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec,
topic=t`` becomes ``kafka_server_brokertopicmetrics_bytesin_total{topic="t"}``: the jmx_exporter
convention Kafka dashboards are written against.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from pykbroker.observability.lag import LagRow
from pykbroker.observability.otlp import OtlpError, number_points
from pykbroker.protocol import codec

_API_NAMES: dict[int, str] = {}


def _api_name(key: int) -> str:
    if not _API_NAMES:
        # Kafka's request names: "Produce", "FetchConsumer" is not split here; "ApiVersions" etc.
        for k, name in codec.API_NAMES.items():
            _API_NAMES[k] = "".join(part[:1].upper() + part[1:] for part in name.split("_"))
    return _API_NAMES.get(key, str(key))


@dataclass
class PartitionRow:
    topic: str
    partition: int
    size: int
    segments: int
    start_offset: int
    end_offset: int
    high_watermark: int
    leader: bool
    replicas: int
    isr: int
    offline: bool


@dataclass
class Snapshot:
    requests: list[tuple[int, int, list[tuple[str, int]], float, int]] = field(default_factory=list)
    topics: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    connections: Counter[str] = field(default_factory=Counter)
    purgatory: dict[str, int] = field(default_factory=dict)
    partitions: list[PartitionRow] = field(default_factory=list)
    offline_partitions: int | None = None
    active_controller: int = 0
    isr_shrinks: int = 0
    isr_expands: int = 0
    # (topic, error name, answers): produce refused for a too-small ISR (MinIsrRefusals)
    min_isr_refusals: list[tuple[str, str, int]] = field(default_factory=list)
    groups: Counter[tuple[str, str]] = field(default_factory=Counter)
    rebalances: dict[str, int] = field(default_factory=dict)
    transactions: Counter[str] = field(default_factory=Counter)
    lag: list[LagRow] = field(default_factory=list)
    client_pushes: list[tuple[str, str, bytes]] = field(default_factory=list)
    partition_series: bool = True
    quotas: list[Any] = field(default_factory=list)  # pykbroker.quotas.QuotaSnapshot rows


_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def _metric_name(name: str) -> str:
    """A KIP-714 name (org.apache.kafka.producer.record.queue.time.avg) as a Prometheus name."""
    return "kafka_client_" + _UNSAFE.sub("_", name.removeprefix("org.apache.kafka."))


# Kafka's BrokerTopicMetrics, in the order of the values in Snapshot.topics.
_TOPIC_COUNTERS = (
    ("messagesin", "Messages appended (MessagesInPerSec)."),
    ("bytesin", "Bytes appended from producers (BytesInPerSec)."),
    ("bytesout", "Bytes returned to consumers (BytesOutPerSec)."),
    ("replicationbytesin", "Bytes appended as a follower (ReplicationBytesInPerSec)."),
    ("replicationbytesout", "Bytes returned to followers (ReplicationBytesOutPerSec)."),
    ("totalproducerequests", "Partition appends from produce requests (TotalProduceRequestsPerSec)."),
    ("totalfetchrequests", "Consumer fetches that returned data for the topic (TotalFetchRequestsPerSec)."),
)


def families(snap: Snapshot) -> Iterator[Metric]:
    """The snapshot as metric families (on the HTTP thread)."""
    requests = CounterMetricFamily("kafka_network_requestmetrics_requests", "Requests completed, by API "
                                   "and version (Kafka's RequestsPerSec).", labels=["request", "version"])
    latency = HistogramMetricFamily("kafka_network_requestmetrics_totaltime_seconds", "Time from a request's "
                                    "arrival to its response (Kafka's TotalTimeMs), including time waiting in "
                                    "purgatory.", labels=["request", "version"])
    for key, version, buckets, total, count in sorted(snap.requests):
        labels = [_api_name(key), str(version)]
        requests.add_metric(labels, count)
        latency.add_metric(labels, buckets=buckets, sum_value=total)
    yield requests
    yield latency

    topic_families = [CounterMetricFamily(f"kafka_server_brokertopicmetrics_{name}", doc, labels=["topic"])
                      for name, doc in _TOPIC_COUNTERS]
    totals = [0] * len(topic_families)
    for name, values in sorted(snap.topics):
        for i, v in enumerate(values):
            topic_families[i].add_metric([name], v)
            totals[i] += v
    for fam in topic_families:
        yield fam
    for fam, total in zip(topic_families[:3], totals[:3], strict=True):  # the broker-wide rates, as Kafka has
        yield CounterMetricFamily(fam.name + "_all_topics", fam.documentation + " All topics.", value=total)

    conns = GaugeMetricFamily("kafka_server_socketservermetrics_connection_count", "Open client connections.",
                              labels=["listener"])
    for listener, n in sorted(snap.connections.items()):
        conns.add_metric([listener], n)
    yield conns
    purgatory = GaugeMetricFamily("kafka_server_delayedoperationpurgatory_purgatorysize", "Requests waiting: "
                                  "acks=all produces for the ISR, long-poll fetches for data.",
                                  labels=["delayedOperation"])
    for op, n in sorted(snap.purgatory.items()):
        purgatory.add_metric([op], n)
    yield purgatory

    leaders = urp = offline_replicas = 0
    for r in snap.partitions:
        under = r.leader and r.isr < r.replicas
        leaders += r.leader
        urp += under
        offline_replicas += r.offline
    yield from (_partition_families(snap.partitions) if snap.partition_series else _topic_log_families(snap.partitions))
    yield GaugeMetricFamily("kafka_server_replicamanager_partitioncount", "Partitions with a replica here.",
                            value=len(snap.partitions))
    yield GaugeMetricFamily("kafka_server_replicamanager_leadercount", "Partitions this broker leads.", value=leaders)
    yield GaugeMetricFamily("kafka_server_replicamanager_underreplicatedpartitions", "Partitions this broker leads "
                            "whose ISR is smaller than their replica set.", value=urp)
    yield GaugeMetricFamily("kafka_server_replicamanager_offlinereplicacount", "Replicas here whose log dir "
                            "failed.", value=offline_replicas)
    yield CounterMetricFamily("kafka_server_replicamanager_isrshrinks", "ISR shrinks this broker made as a leader "
                              "(followers dropped for lagging or leaving).", value=snap.isr_shrinks)
    yield CounterMetricFamily("kafka_server_replicamanager_isrexpands", "ISR expansions this broker made as a "
                              "leader (followers caught up).", value=snap.isr_expands)
    refusals = CounterMetricFamily("pykbroker_produce_min_isr_refusals", "Produce answers refused because the "
                                   "partition's ISR was smaller than min.insync.replicas, by topic and error "
                                   "(NOT_ENOUGH_REPLICAS before the append, NOT_ENOUGH_REPLICAS_AFTER_APPEND after).",
                                   labels=["topic", "error"])
    for topic, error, n in sorted(snap.min_isr_refusals):
        refusals.add_metric([topic, error], n)
    yield refusals
    yield GaugeMetricFamily("kafka_controller_kafkacontroller_activecontrollercount", "1 on the active controller.",
                            value=snap.active_controller)
    if snap.offline_partitions is not None:
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_offlinepartitionscount", "Partitions without a "
                                "live leader (reported by the controller).", value=snap.offline_partitions)

    groups = GaugeMetricFamily("kafka_coordinator_group_groupmetadatamanager_numgroups", "Groups this broker "
                               "coordinates, by type and state.", labels=["type", "state"])
    for (gtype, state), n in sorted(snap.groups.items()):
        groups.add_metric([gtype, state], n)
    yield groups
    rebalances = CounterMetricFamily("kafka_coordinator_group_rebalances", "Rebalances completed (classic: a "
                                     "generation; consumer: a group epoch).", labels=["type"])
    for gtype, n in sorted(snap.rebalances.items()):
        rebalances.add_metric([gtype], n)
    yield rebalances
    txns = GaugeMetricFamily("kafka_coordinator_transaction_transactions", "Transactional ids this broker "
                             "coordinates, by state.", labels=["state"])
    for state, n in sorted(snap.transactions.items()):
        txns.add_metric([state], n)
    yield txns

    lag = GaugeMetricFamily("kafka_consumergroup_lag", "End offset (high watermark) minus the group's committed "
                            "offset, computed by the broker.", labels=["consumergroup", "topic", "partition"])
    current = GaugeMetricFamily("kafka_consumergroup_current_offset", "The group's committed offset.",
                                labels=["consumergroup", "topic", "partition"])
    lag_sum: Counter[tuple[str, str]] = Counter()
    for row in sorted(snap.lag, key=lambda r: (r.group, r.topic, r.partition)):
        labels = [row.group, row.topic, str(row.partition)]
        lag.add_metric(labels, row.lag)
        current.add_metric(labels, row.committed)
        lag_sum[(row.group, row.topic)] += row.lag
    yield lag
    yield current
    summed = GaugeMetricFamily("kafka_consumergroup_lag_sum", "The group's lag summed over a topic's partitions.",
                               labels=["consumergroup", "topic"])
    for (group, topic), n in sorted(lag_sum.items()):
        summed.add_metric([group, topic], n)
    yield summed
    yield from _quota_families(snap.quotas)
    yield from _client_families(snap.client_pushes)


_QUOTA_UNITS = {"Produce": ("byte_rate", "bytes/s"), "Fetch": ("byte_rate", "bytes/s"),
                "Request": ("request_time", "percent of one thread"),
                "ControllerMutation": ("rate", "partition mutations/s")}


def _quota_families(rows: list[Any]) -> Iterator[Metric]:
    """Kafka's per-client quota sensors (kafka.server:type=Produce|Fetch|Request,user=,client-id=)."""
    by_type: dict[str, list[Any]] = {}
    for row in rows:
        by_type.setdefault(row.quota_type, []).append(row)
    for qtype, items in sorted(by_type.items()):
        prefix = f"kafka_server_{qtype.lower()}"
        rate_name, unit = _QUOTA_UNITS.get(qtype, ("rate", ""))
        labels = ["user", "client_id"]
        rate = GaugeMetricFamily(f"{prefix}_{rate_name}", f"Measured {unit} of a quota entity.", labels=labels)
        quota = GaugeMetricFamily(f"{prefix}_quota", f"The entity's quota ({unit}).", labels=labels)
        throttle = GaugeMetricFamily(f"{prefix}_throttle_time", "Average throttle time given over the last "
                                     "minute, ms.", labels=labels)
        for row in items:
            ls = [row.user, row.client_id]
            rate.add_metric(ls, row.rate)
            quota.add_metric(ls, row.quota)
            throttle.add_metric(ls, row.throttle_time_ms)
        yield from (rate, quota, throttle)


def _partition_families(partitions: list[PartitionRow]) -> list[GaugeMetricFamily]:
    """Kafka's per-partition log gauges. Each is one sample per partition: at 1,000 partitions a scrape
    renders 6,000 samples (about 70 ms of CPU), hence `pykbroker.metrics.partition.series`."""
    labels_ = ["topic", "partition"]
    size = GaugeMetricFamily("kafka_log_log_size", "Bytes of the partition's log.", labels=labels_)
    segs = GaugeMetricFamily("kafka_log_log_numlogsegments", "Segments of the partition's log.", labels=labels_)
    start = GaugeMetricFamily("kafka_log_log_logstartoffset", "The log start offset.", labels=labels_)
    end = GaugeMetricFamily("kafka_log_log_logendoffset", "The log end offset.", labels=labels_)
    hwm = GaugeMetricFamily("kafka_cluster_partition_highwatermark", "The high watermark (what consumers can read "
                            "to).", labels=labels_)
    urp = GaugeMetricFamily("kafka_cluster_partition_underreplicated", "1 when this broker leads the partition "
                            "and its ISR is smaller than its replica set.", labels=labels_)
    for r in sorted(partitions, key=lambda r: (r.topic, r.partition)):
        labels = [r.topic, str(r.partition)]
        size.add_metric(labels, r.size)
        segs.add_metric(labels, r.segments)
        start.add_metric(labels, r.start_offset)
        end.add_metric(labels, r.end_offset)
        hwm.add_metric(labels, r.high_watermark)
        urp.add_metric(labels, int(r.leader and r.isr < r.replicas))
    return [size, segs, start, end, hwm, urp]


def _topic_log_families(partitions: list[PartitionRow]) -> list[GaugeMetricFamily]:
    """The same gauges summed per topic (`pykbroker.metrics.partition.series=false`), for brokers with
    so many partitions that one sample each would make scraping costly."""
    sums: dict[str, list[int]] = {}
    for r in partitions:
        t = sums.setdefault(r.topic, [0, 0, 0, 0])
        t[0] += r.size
        t[1] += r.segments
        t[2] += r.end_offset - r.start_offset
        t[3] += int(r.leader and r.isr < r.replicas)
    names = [("pykbroker_log_topic_size", "Bytes of the topic's logs on this broker."),
             ("pykbroker_log_topic_numlogsegments", "Segments of the topic's logs on this broker."),
             ("pykbroker_log_topic_records", "Log end minus log start offsets, summed over the topic's partitions."),
             ("pykbroker_topic_underreplicatedpartitions", "The topic's partitions this broker leads with an ISR "
              "smaller than their replica set.")]
    fams = [GaugeMetricFamily(n, doc, labels=["topic"]) for n, doc in names]
    for topic in sorted(sums):
        for fam, v in zip(fams, sums[topic], strict=True):
            fam.add_metric([topic], v)
    return fams


def _client_families(pushes: list[tuple[str, str, bytes]]) -> Iterator[Metric]:
    """KIP-714: the latest push of each client instance, one gauge family per metric name."""
    by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
    for instance_id, client_id, data in pushes:
        try:
            points = number_points(data)
        except OtlpError:
            continue
        for pt in points:
            labels = {"client_instance_id": instance_id, "client_id": client_id}
            for k, v in pt.attributes:
                labels.setdefault(_UNSAFE.sub("_", k), v)
            by_name.setdefault(_metric_name(pt.name), []).append((labels, pt.value))
    for name, rows in sorted(by_name.items()):
        keys = sorted({k for labels, _ in rows for k in labels})
        fam = GaugeMetricFamily(name, "Pushed by the client (KIP-714).", labels=keys)
        seen: set[tuple[str, ...]] = set()
        for labels, value in rows:
            values = tuple(labels.get(k, "") for k in keys)
            if values not in seen:  # one sample per label set
                seen.add(values)
                fam.add_metric(list(values), value)
        yield fam


class BrokerCollector(Collector):
    """Registered in the endpoint's registry; each scrape takes a fresh snapshot on the event loop."""

    def __init__(self, snapshot: Callable[[], Snapshot], on_loop: Callable[[Callable[[], Snapshot]], Snapshot]
                 ) -> None:
        self._snapshot = snapshot
        self._on_loop = on_loop

    def collect(self) -> Iterator[Metric]:
        snap = self._on_loop(self._snapshot)
        yield from families(snap)

    def describe(self) -> list[Any]:
        return []  # no fixed set: registration must not take a snapshot
