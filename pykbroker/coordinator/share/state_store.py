"""The share coordinator (Kafka's ShareCoordinatorService): ``__share_group_state`` for the partitions led here.

Share-partition leaders keep their state with the broker leading the ``__share_group_state`` partition of
the key ``group:topic-id:partition``.  This broker replays each such partition when it becomes its leader
(as the group and transaction coordinators load theirs) and forgets it when it stops leading it; reads and
writes (ReadShareGroupState, WriteShareGroupState, DeleteShareGroupState, or local calls when the
share-partition leader is this broker) are answered from that replay, and a write is answered once it is
durable: appended, fsync'd with ``log.flush.on.ack`` and, in a cluster, replicated to the ISR.

Leader epochs fence share-partition leaders that lost their leadership: a read by a newer leader records
its epoch (written to the log, so it survives a failover of the share coordinator), and a write or read
carrying an older epoch than the one stored is refused with FENCED_LEADER_EPOCH.  State epochs fence a
leader holding state an admin has replaced since (AlterShareGroupOffsets bumps it): FENCED_STATE_EPOCH.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.coordinator import internal_topic
from pykbroker.coordinator.internal_topic import PartitionLoader, now_ms
from pykbroker.coordinator.share import serde
from pykbroker.metadata.store import MetadataStore, TopicRecord
from pykbroker.replica.replica_manager import ReplicaManager
from pykbroker.replica.topics import TopicManager

log = logging.getLogger("pykbroker.share")

STATE_TOPIC = "__share_group_state"
# How long a read or write waits for its partition to be replayed before answering COORDINATOR_LOAD_IN_PROGRESS.
LOAD_WAIT_S = 10.0


def fence(stored: serde.Snapshot | None, leader_epoch: int, state_epoch: int | None = None) -> ErrorCode:
    """Kafka's share coordinator checks: a share-partition leader older than the last one seen, or a write
    of state older than an admin's reset, is fenced.  ``leader_epoch`` < 0 (admin reads) is never fenced."""
    if stored is None:
        return ErrorCode.none
    if 0 <= leader_epoch < stored.leader_epoch:
        return ErrorCode.fenced_leader_epoch
    if state_epoch is not None and state_epoch < stored.state_epoch:
        return ErrorCode.fenced_state_epoch
    return ErrorCode.none


class ShareStateStore(PartitionLoader):
    load_topic = STATE_TOPIC

    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager,
                 topics: TopicManager) -> None:
        super().__init__(config, store, replicas, topics)
        self.num_partitions: int = config["share.coordinator.state.topic.num.partitions"]
        # Loaded partitions led here: their state per key (the newest record per key, tombstones removed).
        self.states: dict[int, dict[serde.StateKey, serde.Snapshot]] = {}
        self._loaded: dict[int, anyio.Event] = {}
        self._epochs: dict[int, int] = {}  # the leader epoch each partition was loaded under
        self._locks: dict[int, anyio.Lock] = {}
        store.add_listener(self._on_metadata_change)

    # --- where a key lives ----------------------------------------------------------------------------

    def partition_for(self, key: serde.StateKey) -> int:
        return internal_topic.partition_for(key.coordinator_key(), self.num_partitions)

    def coordinator_node(self, key: serde.StateKey) -> int | None:
        """The broker leading the key's ``__share_group_state`` partition (None: unknown)."""
        return internal_topic.coordinator_node(self.store, STATE_TOPIC, self.partition_for(key))

    def _topic_configs(self, rf: int) -> dict[str, str | None]:
        return {"cleanup.policy": "compact", "compression.type": "producer",
                "segment.bytes": str(self.config["share.coordinator.state.topic.segment.bytes"]),
                "min.insync.replicas": str(min(rf, self.config["share.coordinator.state.topic.min.isr"]))}

    def ensure_topic(self) -> None:
        """Embedded metadata: create the topic at start (replication factor capped at the live brokers)."""
        internal_topic.ensure_internal_topic(
            self.store, self.topics, STATE_TOPIC, self.num_partitions,
            self.config["share.coordinator.state.topic.replication.factor"], self._topic_configs)

    async def ensure_topic_async(self) -> bool:
        """Cluster mode: create it once enough brokers are live for its replication factor."""
        return await internal_topic.ensure_internal_topic_async(
            self.store, self.topics, STATE_TOPIC, self.num_partitions,
            self.config["share.coordinator.state.topic.replication.factor"], self._topic_configs)

    # --- loading ----------------------------------------------------------------------------------------

    def startup(self) -> None:
        if not self.store.is_cluster():
            self.ensure_topic()
        self._on_metadata_change(STATE_TOPIC, self.store.topic(STATE_TOPIC))

    def _on_metadata_change(self, name: str, rec: TopicRecord | None) -> None:
        if name != STATE_TOPIC:
            return
        led = {} if rec is None else {i: a.leader_epoch for i, a in rec.partitions.items()
                                      if a.leader == self.replicas.broker_id}
        for p in list(self._loaded):
            if led.get(p) != self._epochs.get(p):  # led elsewhere now, or lost and regained meanwhile
                self._loaded.pop(p).set()
                self._epochs.pop(p, None)
                self.states.pop(p, None)
                self._to_load.discard(p)
        for p, epoch in led.items():
            if p not in self._loaded:
                self._loaded[p] = anyio.Event()
                self._epochs[p] = epoch
                self._to_load.add(p)
        self._load_wake.set()

    def _read_partition(self, partition: int) -> dict[serde.StateKey, serde.Snapshot]:
        out: dict[serde.StateKey, serde.Snapshot] = {}
        p = self.replicas.partition(STATE_TOPIC, partition)
        if p is None or p.offline:
            return out
        for k, v in internal_topic.read_records(p):
            if k is None:
                continue
            try:
                key = serde.decode_key(k)
                if key is None:
                    continue
                if v is None:
                    out.pop(key, None)
                else:
                    out[key] = serde.decode_value(v)
            except ValueError as e:
                log.error("skipping an unreadable %(topic)s-%(partition)d record: %(error)s",
                          {"topic": STATE_TOPIC, "partition": partition, "error": e})
        return out

    async def _load(self, partition: int) -> None:
        event = self._loaded.get(partition)
        if event is None:
            return
        try:
            states = await anyio.to_thread.run_sync(self._read_partition, partition)
        except Exception:
            log.exception("failed to read %(topic)s-%(partition)d", {"topic": STATE_TOPIC, "partition": partition})
            states = {}
        if self._loaded.get(partition) is not event or event.is_set():
            return  # no longer led here, or led again under a newer epoch (loaded again)
        self.states[partition] = states
        event.set()

    async def run(self) -> None:
        await self._loader()

    async def _ready(self, partition: int) -> ErrorCode:
        """NONE once the partition is led and replayed here; else the share coordinator's error."""
        event = self._loaded.get(partition)
        if event is None:
            return ErrorCode.not_coordinator
        if not event.is_set():
            with anyio.move_on_after(LOAD_WAIT_S):
                await event.wait()
        if partition in self.states:
            return ErrorCode.none
        return ErrorCode.not_coordinator if partition not in self._loaded else ErrorCode.coordinator_load_in_progress

    def loaded_states(self) -> dict[serde.StateKey, serde.Snapshot]:
        """Every state replayed here (admin listings)."""
        out: dict[serde.StateKey, serde.Snapshot] = {}
        for states in self.states.values():
            out.update(states)
        return out

    # --- ReadShareGroupState / WriteShareGroupState / DeleteShareGroupState ------------------------------

    async def read(self, key: serde.StateKey, leader_epoch: int) -> tuple[ErrorCode, serde.Snapshot | None]:
        """The key's state (None: none yet).  A newer share-partition leader's epoch is recorded first."""
        idx = self.partition_for(key)
        code = await self._ready(idx)
        if code != ErrorCode.none:
            return code, None
        stored = self.states[idx].get(key)
        code = fence(stored, leader_epoch)
        if code != ErrorCode.none or stored is None or leader_epoch <= stored.leader_epoch:
            return code, stored
        newer = dataclasses.replace(stored, leader_epoch=leader_epoch, write_timestamp=now_ms())
        code = (await self.write([(key, newer)]))[key]
        return code, newer if code == ErrorCode.none else None

    async def write(self, items: Sequence[tuple[serde.StateKey, serde.Snapshot | None]]
                    ) -> dict[serde.StateKey, ErrorCode]:
        """Store each snapshot (None: delete the key) unless fenced; answered once durable."""
        out: dict[serde.StateKey, ErrorCode] = {}
        by_partition: dict[int, list[tuple[serde.StateKey, serde.Snapshot | None]]] = {}
        for key, snap in items:
            by_partition.setdefault(self.partition_for(key), []).append((key, snap))
        for idx, group in sorted(by_partition.items()):
            code = await self._ready(idx)
            if code == ErrorCode.none:
                code = internal_topic.can_append(self.replicas, STATE_TOPIC, idx, self._min_isr())
            if code != ErrorCode.none:
                out.update(dict.fromkeys((k for k, _ in group), internal_topic.coordinator_error(code)))
                continue
            lock = self._locks.setdefault(idx, anyio.Lock())
            async with lock:
                states = self.states.get(idx)
                if states is None:
                    out.update(dict.fromkeys((k for k, _ in group), ErrorCode.not_coordinator))
                    continue
                records: list[tuple[bytes, bytes | None]] = []
                accepted: list[serde.StateKey] = []
                for key, snap in group:
                    c = ErrorCode.none if snap is None else fence(states.get(key), snap.leader_epoch,
                                                                  snap.state_epoch)
                    out[key] = c
                    if c != ErrorCode.none:
                        continue
                    records.append((serde.encode_key(key), None if snap is None else serde.encode_value(snap)))
                    accepted.append(key)
                    if snap is None:
                        states.pop(key, None)
                    else:
                        states[key] = snap
                if not records:
                    continue
                try:
                    internal_topic.append_records(self.replicas, STATE_TOPIC, idx, records)
                except Exception as e:  # lost the leadership or the log dir meanwhile
                    log.warning("cannot append to %(topic)s-%(partition)d: %(error)s",
                                {"topic": STATE_TOPIC, "partition": idx, "error": e})
                    out.update(dict.fromkeys(accepted, ErrorCode.not_coordinator))
                    continue
                code = await self._durable(idx)
                if code != ErrorCode.none:
                    out.update(dict.fromkeys(accepted, code))
        return out

    def _min_isr(self) -> int:
        return internal_topic.min_insync_replicas(self.store, STATE_TOPIC, self.config["min.insync.replicas"])

    async def _durable(self, idx: int) -> ErrorCode:
        if self.config["log.flush.on.ack"]:
            await internal_topic.flush_partition(self.replicas, STATE_TOPIC, idx)
        if not self.store.is_cluster():
            return ErrorCode.none
        code = await internal_topic.wait_replicated(self.replicas, STATE_TOPIC, idx,
                                                    self.config["share.coordinator.write.timeout.ms"] / 1000,
                                                    self._min_isr())
        return internal_topic.coordinator_error(code)
