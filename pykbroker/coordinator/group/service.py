"""The group coordinator's I/O edge: the internal topic, loading, timers and appends.

:class:`GroupCoordinator` owns a sans-I/O :class:`GroupManager` and gives it a wall clock, a monotonic one
for its timers, a writer that appends to ``__consumer_offsets`` through the replica manager, and a task that
fires its timers.  Which broker coordinates a group is answered by :meth:`coordinator_node`
(group id -> offsets partition -> that partition's leader in the metadata store); leadership
changes arrive as metadata-store notifications and load or unload partitions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.coordinator import internal_topic
from pykbroker.coordinator.group.consumer import ConsumerGroups
from pykbroker.coordinator.group.coordinator_state import GroupConfig
from pykbroker.coordinator.group.manager import GroupManager
from pykbroker.coordinator.internal_topic import PartitionLoader, monotonic_ms, now_ms
from pykbroker.coordinator.transaction.load_filter import TxnLoadFilter
from pykbroker.metadata.store import GROUP_RESOURCE, MetadataStore, TopicRecord
from pykbroker.replica.replica_manager import ReplicaManager
from pykbroker.replica.topics import TopicManager


class TxnOffsets(Protocol):
    """The transactional offset commits (TxnOffsetCommit) waiting for their markers, kept by the
    transaction package, which registers them here at broker start."""

    def pending_for(self, group_id: str) -> dict[tuple[str, int], int]: ...

    def restore(self, partition: int, open_txns: dict[int, list[tuple[bytes | None, bytes | None]]]) -> None: ...

    def unload(self, partition: int) -> None: ...

log = logging.getLogger("pykbroker.groups")

OFFSETS_TOPIC = "__consumer_offsets"


def group_config_from(config: BrokerConfig) -> GroupConfig:
    return GroupConfig(
        num_partitions=config["offsets.topic.num.partitions"],
        min_session_timeout_ms=config["group.min.session.timeout.ms"],
        max_session_timeout_ms=config["group.max.session.timeout.ms"],
        initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
        max_size=config["group.max.size"],
        offsets_retention_ms=config["offsets.retention.minutes"] * 60_000,
        offset_metadata_max_bytes=config["offset.metadata.max.bytes"],
        consumer_session_timeout_ms=config["group.consumer.session.timeout.ms"],
        consumer_min_session_timeout_ms=config["group.consumer.min.session.timeout.ms"],
        consumer_max_session_timeout_ms=config["group.consumer.max.session.timeout.ms"],
        consumer_heartbeat_interval_ms=config["group.consumer.heartbeat.interval.ms"],
        consumer_assignors=list(config["group.consumer.assignors"]),
        consumer_max_size=config["group.consumer.max.size"],
        consumer_migration_policy=config["group.consumer.migration.policy"],
    )


class GroupCoordinator(PartitionLoader):
    load_topic = OFFSETS_TOPIC

    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager,
                 topics: TopicManager) -> None:
        super().__init__(config, store, replicas, topics)
        self.manager = GroupManager(group_config_from(config), self._write, now_ms, monotonic_ms)
        if store.is_cluster():  # __consumer_offsets takes the broker's min.insync.replicas, as in Kafka
            warning = internal_topic.unmeetable_min_isr(
                OFFSETS_TOPIC, config["offsets.topic.replication.factor"], config["min.insync.replicas"])
            if warning is not None:
                log.warning("%(warning)s", {"warning": warning})
        self.manager.on_timers_changed = self._timers_changed
        self.manager.topic_partitions = self._topic_partitions
        self._wake = anyio.Event()
        self._sleep_until: int | None = None
        self.flush_on_ack: bool = config["log.flush.on.ack"]
        self.consumer_protocol_enabled = "consumer" in config["group.coordinator.rebalance.protocols"]
        self.manager.consumer = ConsumerGroups(self.manager)
        self.manager.consumer.topic_ids = self._topic_id
        self.manager.consumer.topic_names = self._topic_names
        self.manager.consumer.group_configs = lambda gid: self.store.configs_of(GROUP_RESOURCE, gid)
        self.txn_offsets: TxnOffsets | None = None
        self._txn_open: dict[int, dict[int, list[tuple[bytes | None, bytes | None]]]] = {}
        self.manager.pending_txn_offsets = self._pending_txn_offsets
        # Share groups (pykbroker/coordinator/share) keep their records in the same partitions: told what a
        # partition replayed when it is loaded, and when it is unloaded.
        self.load_listeners: list[Callable[[int, list[tuple[bytes | None, bytes | None]]], None]] = []
        self.unload_listeners: list[Callable[[int], None]] = []
        store.add_listener(self._on_metadata_change)

    # --- the coordinator seam -------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return self.manager.partition_for(group_id)

    def coordinator_node(self, group_id: str) -> int | None:
        """The broker leading the offsets partition of this group, or None if unknown."""
        return internal_topic.coordinator_node(self.store, OFFSETS_TOPIC, self.partition_for(group_id))

    def _topic_configs(self, rf: int) -> dict[str, str | None]:
        return {"cleanup.policy": "compact", "segment.bytes": str(self.config["offsets.topic.segment.bytes"]),
                "compression.type": "producer"}

    def ensure_topic(self) -> None:
        internal_topic.ensure_internal_topic(
            self.store, self.topics, OFFSETS_TOPIC, self.config["offsets.topic.num.partitions"],
            self.config["offsets.topic.replication.factor"], self._topic_configs)

    async def ensure_topic_async(self) -> bool:
        """Cluster mode: create the topic on first use; False when too few brokers are live for it."""
        return await internal_topic.ensure_internal_topic_async(
            self.store, self.topics, OFFSETS_TOPIC, self.config["offsets.topic.num.partitions"],
            self.config["offsets.topic.replication.factor"], self._topic_configs)

    def _led_partitions(self, rec: TopicRecord | None) -> set[int]:
        if rec is None:
            return set()
        return {i for i, a in rec.partitions.items() if a.leader == self.replicas.broker_id}

    def _on_metadata_change(self, name: str, rec: TopicRecord | None) -> None:
        if name != OFFSETS_TOPIC:
            if self.manager.consumer is not None:
                self.manager.consumer.on_topic_change(name, rec)
            return
        led = self._led_partitions(rec)
        for p in list(self.manager.partitions):
            if p not in led:
                self.manager.unload(p)
                if self.txn_offsets is not None:
                    self.txn_offsets.unload(p)
                for unloaded in self.unload_listeners:
                    unloaded(p)
        for p in led:
            if p not in self.manager.partitions:
                self.manager.begin_loading(p)
                self._to_load.add(p)
        self._load_wake.set()

    def _pending_txn_offsets(self, group_id: str) -> list[tuple[str, int]]:
        return list(self.txn_offsets.pending_for(group_id)) if self.txn_offsets is not None else []

    def _topic_partitions(self, topic: str) -> int | None:
        rec = self.store.topic(topic)
        return None if rec is None else len(rec.partitions)

    def _topic_id(self, topic: str) -> Any:
        rec = self.store.topic(topic)
        return None if rec is None else rec.topic_id

    def _topic_names(self) -> list[str]:
        return [n for n in self.store.topics() if n not in (OFFSETS_TOPIC, "__transaction_state")]

    # --- writes ---------------------------------------------------------------------------

    def _write(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        internal_topic.append_records(self.replicas, OFFSETS_TOPIC, partition, records)

    def _min_isr(self) -> int:
        return internal_topic.min_insync_replicas(self.store, OFFSETS_TOPIC, self.config["min.insync.replicas"])

    def writable(self, group_id: str) -> ErrorCode:
        """Cluster mode, before a write: as Kafka's acks=all append, refused (COORDINATOR_NOT_AVAILABLE) while
        the offsets partition's ISR is below its min ISR, NOT_COORDINATOR once this broker no longer leads it."""
        if not self.store.is_cluster():
            return ErrorCode.none
        return internal_topic.coordinator_error(internal_topic.can_append(
            self.replicas, OFFSETS_TOPIC, self.partition_for(group_id), self._min_isr()))

    def log_end(self, group_id: str) -> int:
        """The group's offsets-partition log end (-1 when not led here): did a request write anything?"""
        p = self.replicas.partition(OFFSETS_TOPIC, self.partition_for(group_id))
        return -1 if p is None or p.offline else p.log.log_end_offset

    async def flush(self, group_id: str) -> ErrorCode:
        """Make the group's latest writes durable before answering: fsync (log.flush.on.ack) and, in a
        cluster, replication to the ISR (bounded by offsets.commit.timeout.ms); the client's error if
        that failed (COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR, as Kafka maps a failed append)."""
        if self.flush_on_ack:
            await internal_topic.flush_partition(self.replicas, OFFSETS_TOPIC, self.partition_for(group_id))
        if not self.store.is_cluster():
            return ErrorCode.none
        code = await internal_topic.wait_replicated(self.replicas, OFFSETS_TOPIC, self.partition_for(group_id),
                                                    self.config["offsets.commit.timeout.ms"] / 1000, self._min_isr())
        return internal_topic.coordinator_error(code)

    # --- loading --------------------------------------------------------------------------

    def _read_partition(self, partition: int) -> list[tuple[bytes | None, bytes | None]]:
        p = self.replicas.partition(OFFSETS_TOPIC, partition)
        if p is None:
            return []
        txn = TxnLoadFilter()  # transactional records wait for their marker (control batches included)
        out = internal_topic.read_records(p, txn.feed)
        self._txn_open[partition] = txn.open  # still-open transactions, restored by _load
        return out

    async def _load(self, partition: int) -> None:
        started = time.monotonic()
        try:
            records = await anyio.to_thread.run_sync(self._read_partition, partition)
        except Exception:
            log.exception("failed to read %(topic)s-%(partition)d", {"topic": OFFSETS_TOPIC, "partition": partition})
            records = []
        if self.manager.partitions.get(partition) is None:
            return  # unloaded meanwhile
        self.manager.load_records(partition, records)
        for loaded in self.load_listeners:
            try:
                loaded(partition, records)
            except Exception:
                log.exception("share group records of %(topic)s-%(partition)d not loaded",
                              {"topic": OFFSETS_TOPIC, "partition": partition})
        open_txns = self._txn_open.pop(partition, {})
        if self.txn_offsets is not None:
            self.txn_offsets.restore(partition, open_txns)
        self.manager.finish_loading(partition)
        if records:
            log.debug("loaded %(topic)s-%(partition)d: %(records)d records in %(elapsed_s).3fs",
                      {"topic": OFFSETS_TOPIC, "partition": partition, "records": len(records),
                       "elapsed_s": time.monotonic() - started})

    # --- tasks ----------------------------------------------------------------------------

    def startup(self) -> None:
        """Create the internal topic (embedded metadata; a cluster creates it on first use, in
        FindCoordinator) and mark the partitions this broker leads as loading."""
        if not self.store.is_cluster():
            self.ensure_topic()
        self._on_metadata_change(OFFSETS_TOPIC, self.store.topic(OFFSETS_TOPIC))

    def shutdown(self) -> None:
        """Stop coordinating: pending JoinGroup/SyncGroup requests get NOT_COORDINATOR now."""
        for p in list(self.manager.partitions):
            self.manager.unload(p)
        self._to_load.clear()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._loader)
            tg.start_soon(self._timer_loop)
            tg.start_soon(self._expiry_loop)

    def _timers_changed(self) -> None:
        deadline = self.manager.next_deadline()
        if deadline is not None and (self._sleep_until is None or deadline < self._sleep_until):
            self._wake.set()

    async def _timer_loop(self) -> None:
        while True:
            try:
                self.manager.tick()
            except Exception:
                log.exception("group coordinator timer failed")
            deadline = self.manager.next_deadline()
            now = monotonic_ms()
            wait_ms = 1000 if deadline is None else min(1000, max(0, deadline - now))
            self._sleep_until = now + wait_ms
            self._wake = anyio.Event()
            with anyio.move_on_after(wait_ms / 1000):
                await self._wake.wait()
            self._sleep_until = None

    async def _expiry_loop(self) -> None:
        interval = self.config["offsets.retention.check.interval.ms"] / 1000
        while True:
            await anyio.sleep(interval)
            try:
                n = self.manager.expire_offsets()
                if n:
                    log.info("expired %(offsets)d committed offsets", {"offsets": n})
            except Exception:
                log.exception("offset expiration failed")
