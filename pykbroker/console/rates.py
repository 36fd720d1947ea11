"""Messages in per second from the broker's own Prometheus endpoint (pykbroker.metrics.listener), sampled a few
times a minute for the overview's sparkline, and each topic's messages in, bytes in and bytes out per second on
this broker (Kafka's BrokerTopicMetrics: what the partitions this broker leads took and served) for the topics
page. When the endpoint is off or unreachable the pages say so."""

from __future__ import annotations

import time
import urllib.request
from collections import deque
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

MESSAGES_IN = "kafka_server_brokertopicmetrics_messagesin_all_topics"
# Per topic, as the topics page shows them: messages in, bytes in, bytes out.
TOPIC_COUNTERS = ("kafka_server_brokertopicmetrics_messagesin", "kafka_server_brokertopicmetrics_bytesin",
                  "kafka_server_brokertopicmetrics_bytesout")
SAMPLES = 60


@dataclass
class TopicRates:
    messages_in: float
    bytes_in: float
    bytes_out: float


def read_counters(url: str, timeout: float = 2.0) -> tuple[float, dict[str, tuple[float, float, float]]]:
    """From one scrape: the broker's MessagesInPerSec counter (all topics), and each topic's messages in, bytes in
    and bytes out counters."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    total: float | None = None
    topics: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name == MESSAGES_IN:
            total = float(sum(s.value for s in family.samples if s.name.endswith("_total")))
        elif family.name in TOPIC_COUNTERS:
            column = TOPIC_COUNTERS.index(family.name)
            for s in family.samples:
                if s.name.endswith("_total") and "topic" in s.labels:
                    topics.setdefault(s.labels["topic"], [0.0, 0.0, 0.0])[column] += float(s.value)
    if total is None:
        raise ValueError(f"{url} has no {MESSAGES_IN}")
    return total, {t: (v[0], v[1], v[2]) for t, v in topics.items()}


@dataclass
class Sparkline:
    points: str  # SVG polyline points
    width: int
    height: int
    last: float
    peak: float
    last_x: float  # where the newest sample is drawn
    last_y: float


class MessagesInRate:
    """The last SAMPLES rates (messages per second between two scrapes)."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.rates: deque[float] = deque(maxlen=SAMPLES)
        self.topics: dict[str, TopicRates] = {}  # over the last interval between two scrapes
        self.error: str | None = None if url else "the broker's metrics endpoint (pykbroker.metrics.listener) is off"
        self._previous: tuple[float, float] | None = None
        self._previous_topics: dict[str, tuple[float, float, float]] = {}

    def sample(self) -> None:
        """One scrape (blocking: run in a worker thread)."""
        if self.url is None:
            return
        try:
            count, topics = read_counters(self.url)
        except (OSError, ValueError) as e:
            self.error = f"cannot read {self.url}: {e}"
            self._previous = None
            self.topics = {}
            return
        now = time.monotonic()
        if self._previous is not None and now > self._previous[0]:
            elapsed = now - self._previous[0]
            self.rates.append(max(0.0, (count - self._previous[1]) / elapsed))
            self.topics = {t: TopicRates(*(max(0.0, (v - p) / elapsed)
                                           for v, p in zip(values, self._previous_topics.get(t, (0.0, 0.0, 0.0)),
                                                           strict=True)))
                           for t, values in topics.items()}
        self._previous = (now, count)
        self._previous_topics = topics
        self.error = None

    def sparkline(self, width: int = 240, height: int = 40) -> Sparkline | None:
        if not self.rates:
            return None
        values = list(self.rates)
        peak = max(values) or 1.0
        step = (width - 6) / max(1, SAMPLES - 1)
        offset = width - 3 - step * (len(values) - 1)
        xy = [(offset + i * step, height - 3 - (v / peak) * (height - 6)) for i, v in enumerate(values)]
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
        return Sparkline(points, width, height, values[-1], max(values), round(xy[-1][0], 1), round(xy[-1][1], 1))
