"""The Prometheus endpoint (``pykbroker.metrics.listener``), served by prometheus_client's own HTTP server.

It runs on prometheus_client's thread, so a slow scraper never holds up the event loop; each scrape
reads the broker through `BrokerCollector`, which takes its snapshot on the loop. The registry is the
endpoint's own (not the library's global one), with the process, platform and GC collectors added:
process_cpu_seconds_total and process_resident_memory_bytes are what dashboards chart beside Kafka's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, start_http_server
from prometheus_client.registry import CollectorRegistry

from pykbroker.observability.collector import BrokerCollector, Snapshot

log = logging.getLogger("pykbroker.metrics")


def parse_metrics_listener(value: str) -> tuple[str, int]:
    """``http://host:port`` (or ``host:port``) → (host, port). Raises ValueError, saying why."""
    text = value.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme != "http":
        raise ValueError(f"pykbroker.metrics.listener must be http://host:port, not {value!r} (no TLS on the "
                         "metrics endpoint; put a proxy in front if it needs one)")
    if parts.path not in ("", "/", "/metrics") or parts.query:
        raise ValueError(f"pykbroker.metrics.listener {value!r}: the path is always /metrics")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None or not parts.hostname:
        raise ValueError(f"pykbroker.metrics.listener {value!r} needs a host and a port, e.g. http://0.0.0.0:9404")
    return parts.hostname, port


class MetricsEndpoint:
    def __init__(self, listener: str, snapshot: Callable[[], Snapshot],
                 on_loop: Callable[[Callable[[], Snapshot]], Snapshot]) -> None:
        self.host, self.port = parse_metrics_listener(listener)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(snapshot, on_loop))
        for extra in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(extra)
        self._server: Any = None
        self._thread: Any = None

    def start(self) -> int:
        """Bind and serve; returns the bound port (port 0 picks a free one). OSError if it cannot bind."""
        self._server, self._thread = start_http_server(self.port, self.host, registry=self.registry)
        self.port = self._server.server_address[1]
        log.info("metrics endpoint listening on http://%(host)s:%(port)d/metrics",
                 {"host": self.host, "port": self.port})
        return int(self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
