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

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, start_http_server
from prometheus_client.registry import CollectorRegistry

from pykbroker.config import parse_metrics_listener
from pykbroker.observability.collector import BrokerCollector, Snapshot

log = logging.getLogger("pykbroker.metrics")


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
