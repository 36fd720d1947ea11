"""What the group coordinator keeps for the ``__consumer_offsets`` partitions it leads, with no I/O.

The groups (classic and KIP-848), the committed offsets, which partitions are loaded or loading,
and the timers of every group, fired from :meth:`GroupCoordinatorState.tick` with an injected
clock (the timer clock: monotonic in the broker, so a step of the wall clock neither expires every session
nor postpones every expiry; the wall clock only stamps what is recorded).  The classic protocol
(:mod:`.classic_protocol`) and the manager's loading, offsets and admin operations (:mod:`.manager`) build on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.classic import ClassicGroup
from pykbroker.coordinator.group.serde import OffsetValue
from pykbroker.coordinator.group.timers import Timers
from pykbroker.coordinator.internal_topic import partition_for

__all__ = ["PARTITION_ACTIVE", "PARTITION_LOADING", "GroupConfig", "GroupCoordinatorState", "TopicPartition",
           "Writer"]

Writer = Callable[[int, list[tuple[bytes, bytes | None]]], None]
TopicPartition = tuple[str, int]

PARTITION_LOADING = "loading"
PARTITION_ACTIVE = "active"


@dataclass
class GroupConfig:
    num_partitions: int = 50
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3000
    max_size: int = 2**31 - 1
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offset_metadata_max_bytes: int = 4096
    # KIP-848 consumer groups.
    consumer_session_timeout_ms: int = 45000
    consumer_min_session_timeout_ms: int = 45000
    consumer_max_session_timeout_ms: int = 60000
    consumer_heartbeat_interval_ms: int = 5000
    consumer_assignors: list[str] = field(default_factory=lambda: ["uniform", "range"])
    consumer_max_size: int = 2**31 - 1
    # Kafka 4.0's group.consumer.migration.policy: disabled, upgrade, downgrade or bidirectional.
    consumer_migration_policy: str = "bidirectional"


class GroupCoordinatorState:
    """The coordinator's groups, offsets, partitions and timers, and the checks every request starts with."""

    def __init__(self, config: GroupConfig, writer: Writer, clock: Callable[[], int],
                 timer_clock: Callable[[], int] | None = None) -> None:
        self.config = config
        self.writer = writer
        # Wall-clock milliseconds: the timestamps groups and offsets record and answer.
        self.clock = clock
        # Milliseconds of a clock that never steps, for session, rebalance and join timers (Kafka's timers run
        # on its monotonic clock too); the wall clock where none is given (tests driving one fake clock).
        self.timer_clock = timer_clock or clock
        self.timers = Timers()
        self.groups: dict[str, Any] = {}
        self.offsets: dict[str, dict[TopicPartition, OffsetValue]] = {}
        # Rebalances completed, by group type (for the metrics): a classic generation, a consumer group epoch.
        self.rebalances: Counter[str] = Counter()
        self.partitions: dict[int, str] = {}
        # Set by the consumer-protocol module; None until it is attached.
        self.consumer: Any = None
        # Called when the set of timers may have changed (the I/O edge re-arms its sleep).
        self.on_timers_changed: Callable[[], None] = lambda: None
        # Partitions of a group with a pending transactional offset commit (set by the I/O edge).
        self.pending_txn_offsets: Callable[[str], Iterable[TopicPartition]] = lambda _g: ()
        # Resolves a topic name to its partition count (for KIP-848 assignment); None if unknown.
        self.topic_partitions: Callable[[str], int | None] = lambda _t: None

    # --- partitions (the coordinator's ownership of __consumer_offsets) ----------------------

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.config.num_partitions)

    def coordinator_error(self, group_id: str | None) -> ErrorCode | None:
        if group_id is None:
            return ErrorCode.invalid_group_id
        state = self.partitions.get(self.partition_for(group_id))
        if state is None:
            return ErrorCode.not_coordinator
        if state == PARTITION_LOADING:
            return ErrorCode.coordinator_load_in_progress
        return None

    # --- timers ------------------------------------------------------------------------------

    def tick(self) -> None:
        self.timers.fire_due(self.timer_clock())

    def next_deadline(self) -> int | None:
        """The next timer's deadline on :attr:`timer_clock`."""
        return self.timers.next_deadline()

    def _schedule(self, key: tuple[Any, ...], delay_ms: int, fn: Callable[[], None]) -> None:
        self.timers.schedule(key, self.timer_clock() + delay_ms, fn)
        self.on_timers_changed()

    # --- group lookup ---------------------------------------------------------------------------

    def _classic(self, group_id: str) -> ClassicGroup | None:
        g = self.groups.get(group_id)
        return g if isinstance(g, ClassicGroup) else None
