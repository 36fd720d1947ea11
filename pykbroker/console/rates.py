"""Messages in per second from the broker's own Prometheus endpoint (pykbroker.metrics.listener), sampled a few
times a minute for the overview's sparkline. When the endpoint is off or unreachable the overview says so."""

from __future__ import annotations

import time
import urllib.request
from collections import deque
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

MESSAGES_IN = "kafka_server_brokertopicmetrics_messagesin_all_topics"
SAMPLES = 60


def read_messages_in(url: str, timeout: float = 2.0) -> float:
    """The broker's MessagesInPerSec counter (all topics) from one scrape."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == MESSAGES_IN:
            return float(sum(s.value for s in family.samples if s.name.endswith("_total")))
    raise ValueError(f"{url} has no {MESSAGES_IN}")


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
        self.error: str | None = None if url else "the broker's metrics endpoint (pykbroker.metrics.listener) is off"
        self._previous: tuple[float, float] | None = None

    def sample(self) -> None:
        """One scrape (blocking: run in a worker thread)."""
        if self.url is None:
            return
        try:
            count = read_messages_in(self.url)
        except (OSError, ValueError) as e:
            self.error = f"cannot read {self.url}: {e}"
            self._previous = None
            return
        now = time.monotonic()
        if self._previous is not None and now > self._previous[0]:
            self.rates.append(max(0.0, (count - self._previous[1]) / (now - self._previous[0])))
        self._previous = (now, count)
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
