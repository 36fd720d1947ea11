"""What every API handler can reach: the broker's services (the request's own context is
:class:`pykbroker.security.request.RequestContext`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from pykbroker.config import BrokerConfig, Listener
from pykbroker.metadata.store import MetadataStore
from pykbroker.observability.stats import BrokerStats
from pykbroker.replica.append_hooks import AppendHooks
from pykbroker.replica.replica_manager import ReplicaManager
from pykbroker.replica.topics import TopicManager
from pykbroker.server.fetch_session import FetchSessionCache
from pykbroker.server.telemetry import ClientTelemetry

if TYPE_CHECKING:  # group coordinator
    from pykbroker.coordinator.group.service import GroupCoordinator
    from pykbroker.coordinator.share.service import ShareCoordinator
    from pykbroker.coordinator.transaction.service import TransactionCoordinator
    from pykbroker.delay.service import DelayService
    from pykbroker.quotas.manager import QuotaManager
    from pykbroker.security.authorizer import Authorizer


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# A full cache gives the slot of a session unused this long to a new one (Kafka's constant).
FETCH_SESSION_EVICTION_MS = 120_000


@dataclass
class Services:
    config: BrokerConfig
    store: MetadataStore
    replicas: ReplicaManager
    topics: TopicManager
    advertised: list[Listener]
    shutting_down: anyio.Event = field(default_factory=anyio.Event)
    # Testing hook: how many more produce responses to drop after the append.
    drop_produce_responses: int = 0
    # The group coordinator; set by the broker at construction.
    groups: GroupCoordinator | None = None
    # The transaction coordinator; set by the broker at construction.
    txn_coordinator: TransactionCoordinator | None = None
    # Share groups (KIP-932); None unless group.share.enable.
    shares: ShareCoordinator | None = None
    # Delayed delivery (pykbroker.delay.enable); None: produce never looks at delay headers.
    delays: DelayService | None = None
    # The features on the produce path (transaction verification, delayed delivery), registered at start.
    append_hooks: AppendHooks = field(default_factory=AppendHooks)
    # The authorizer (authorizer.class.name); None: every principal may do everything.
    authorizer: Authorizer | None = None
    # Client quota enforcement (pykbroker.quotas); set by the broker, None: no client is throttled.
    quotas: QuotaManager | None = None
    # Client telemetry (KIP-714); made from the config on first use.
    _telemetry: ClientTelemetry | None = None
    # Incremental fetch sessions (KIP-227); made from the config on first use.
    _fetch_sessions: FetchSessionCache | None = None
    # Counters for the metrics endpoint (pykbroker.observability).
    stats: BrokerStats = field(default_factory=BrokerStats)

    @property
    def telemetry(self) -> ClientTelemetry:
        if self._telemetry is None:
            self._telemetry = ClientTelemetry(max_bytes=self.config["telemetry.max.bytes"])
        return self._telemetry

    @property
    def fetch_sessions(self) -> FetchSessionCache:
        if self._fetch_sessions is None:
            self._fetch_sessions = FetchSessionCache(self.config["max.incremental.fetch.session.cache.slots"],
                                                     FETCH_SESSION_EVICTION_MS, now_ms)
        return self._fetch_sessions

    @property
    def broker_id(self) -> int:
        return self.replicas.broker_id

    def endpoint_for(self, listener: str) -> Listener:
        for a in self.advertised:
            if a.name == listener:
                return a
        return self.advertised[0]
