"""Counters the request paths bump: plain integers in dicts, read by the collector at scrape time.

Why not prometheus_client metrics directly: each of their updates takes a lock and a label lookup,
several per produced partition at a million messages a second; a dict increment is a fraction of
that, and the collector turns these into metric families only when Prometheus asks.
Everything here is touched from the event loop only.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

# Request latency buckets, seconds (Prometheus conventions; Kafka's TotalTimeMs as a histogram).
LATENCY_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                      1.0, 2.5, 5.0, 10.0, 30.0)


class LatencyHistogram:
    """Cumulative-at-read bucket counts, a sum and a count, as a Prometheus histogram has."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        out = []
        total = 0
        for bound, n in zip((*[repr(b) for b in LATENCY_BUCKETS], "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    @property
    def count(self) -> int:
        return sum(self.counts)


class TopicCounters:
    """Kafka's BrokerTopicMetrics for one topic: messages and bytes in, bytes out, and the bytes sent to
    followers counted apart (ReplicationBytesOut), as Kafka does. (ReplicationBytesIn is counted by the
    replica fetchers, `ReplicaManager.replication_bytes_in`.)"""

    __slots__ = ("bytes_in", "bytes_out", "fetch_requests", "messages_in", "produce_requests",
                 "replication_bytes_out")

    def __init__(self) -> None:
        self.messages_in = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.replication_bytes_out = 0
        self.produce_requests = 0
        self.fetch_requests = 0


class MinIsrRefusals:
    """Produce answers of NOT_ENOUGH_REPLICAS (the ISR was below min.insync.replicas before the append) and
    NOT_ENOUGH_REPLICAS_AFTER_APPEND (it shrank below while the append waited for the ISR): counted per topic
    and error, and remembered per partition and error with the ISR the leader saw, so that each is logged once
    per partition, cause and ISR rather than once per request of a retrying producer."""

    __slots__ = ("counts", "logged")

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()  # (topic, error name) -> answers
        self.logged: dict[tuple[str, int, str], tuple[int, ...]] = {}  # (topic, partition, error) -> ISR

    def refused(self, topic: str, partition: int, error: str, isr: tuple[int, ...]) -> bool:
        """Count one refusal; True when it is news worth a log line (a new cause or another ISR)."""
        self.counts[(topic, error)] += 1
        key = (topic, partition, error)
        if self.logged.get(key) == isr:
            return False
        self.logged[key] = isr
        return True

    def accepted(self, topic: str, partition: int) -> None:
        """The partition took an acks=all append again: its next refusal is logged anew."""
        for error in ("NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND"):
            self.logged.pop((topic, partition, error), None)


class BrokerStats:
    """The broker's counters; one instance per broker (Services.stats)."""

    def __init__(self) -> None:
        self.requests: dict[tuple[int, int], LatencyHistogram] = {}
        self.topics: dict[str, TopicCounters] = {}
        self.connections_opened = 0
        self.connections_closed = 0
        self.min_isr = MinIsrRefusals()

    def request(self, api_key: int, version: int, seconds: float) -> None:
        h = self.requests.get((api_key, version))
        if h is None:
            h = self.requests[(api_key, version)] = LatencyHistogram()
        h.observe(seconds)

    def topic(self, name: str) -> TopicCounters:
        c = self.topics.get(name)
        if c is None:
            c = self.topics[name] = TopicCounters()
        return c

    def appended(self, topic: str, messages: int, size: int) -> None:
        c = self.topics.get(topic) or self.topic(topic)
        c.messages_in += messages
        c.bytes_in += size
        c.produce_requests += 1

    def forget_topic(self, name: str) -> None:
        """A deleted topic's series go away with it (Kafka removes its BrokerTopicMetrics too)."""
        self.topics.pop(name, None)
        for key in [k for k in self.min_isr.counts if k[0] == name]:
            del self.min_isr.counts[key]
        for lkey in [k for k in self.min_isr.logged if k[0] == name]:
            del self.min_isr.logged[lkey]
