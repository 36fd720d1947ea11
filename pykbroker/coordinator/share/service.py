"""The share coordinator's I/O edge: share groups, share-partitions, their persistence and timers.

It owns the sans-I/O pieces (:class:`ShareGroups`, one :class:`SharePartition` per group, topic and
partition, :class:`ShareSessions`) and gives them a clock, the partition logs to acquire records from,
``__share_group_state`` to persist into, and dead-letter topics.  Every change an acknowledgement makes is
appended to ``__share_group_state`` (and fsync'd with ``log.flush.on.ack``) before the request is
answered; the topic is replayed at start, so a killed broker neither forgets an acknowledgement nor
delivers an acknowledged record again.  Share groups live with embedded metadata only (the config refuses
``group.share.enable`` with ZooKeeper), where this broker leads every partition.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig, effective_group_config
from pykbroker.coordinator import internal_topic
from pykbroker.coordinator.internal_topic import now_ms
from pykbroker.coordinator.share import dlq, serde
from pykbroker.coordinator.share.group import ShareGroups
from pykbroker.coordinator.share.partition import Archived, LogBatch, ShareLimits, SharePartition
from pykbroker.coordinator.share.session import ShareSessions
from pykbroker.metadata.store import GROUP_RESOURCE, INTERNAL_TOPICS, MetadataStore, TopicRecord
from pykbroker.protocol.records import iter_batches
from pykbroker.server.replica_manager import FetchWaiters, Partition, ReplicaManager
from pykbroker.server.topics import TopicManager
from pykbroker.storage.log import KafkaStorageError, OffsetOutOfRange

log = logging.getLogger("pykbroker.share")

STATE_TOPIC = "__share_group_state"
# Log reads per partition per ShareFetch while looking for acquirable records (bounds the work), and the
# most each read asks for: a share fetch returns max_records records, not a whole fetch.max.bytes.
MAX_READS = 8
READ_BYTES = 1 << 20

SpKey = tuple[str, str, int]  # (group id, topic name, partition)


@dataclass
class Acquired:
    records: bytes
    ranges: list[tuple[int, int, int]]


class ShareCoordinator:
    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager,
                 topics: TopicManager) -> None:
        self.config = config
        self.store = store
        self.replicas = replicas
        self.topics = topics
        self.groups = ShareGroups(self._lookup, now_ms, config["group.share.max.size"])
        self.groups.on_member_removed = self._member_removed
        self.sessions = ShareSessions()
        self.partitions: dict[SpKey, SharePartition] = {}
        self.snapshots: dict[serde.StateKey, serde.Snapshot] = {}
        self.loaded = anyio.Event()
        # Fetches waiting for records to become available again (released, lock expired).
        self.waiters = FetchWaiters()
        self._wake = anyio.Event()
        self._num_state_partitions: int = config["share.coordinator.state.topic.num.partitions"]
        self._dirty_state_partitions: set[int] = set()
        store.add_listener(self._on_metadata_change)

    # --- configuration -------------------------------------------------------------------------------

    def group_config(self, group_id: str) -> dict[str, Any]:
        return effective_group_config(self.config, self.store.configs_of(GROUP_RESOURCE, group_id))

    def limits(self, group_id: str) -> ShareLimits:
        g = self.group_config(group_id)
        return ShareLimits(lock_duration_ms=g["share.record.lock.duration.ms"],
                           delivery_count_limit=g["share.delivery.count.limit"],
                           max_record_locks=self.config["group.share.partition.max.record.locks"])

    def _lookup(self, topic: str) -> tuple[uuid.UUID, int] | None:
        if topic in INTERNAL_TOPICS or topic == STATE_TOPIC:
            return None
        rec = self.store.topic(topic)
        return None if rec is None else (rec.topic_id, len(rec.partitions))

    def _on_metadata_change(self, name: str, rec: TopicRecord | None) -> None:
        if name == STATE_TOPIC:
            return
        self.groups.on_topics_changed()
        if rec is None:  # deleted: its share-partitions go
            for key in [k for k in self.partitions if k[1] == name]:
                del self.partitions[key]

    # --- startup -------------------------------------------------------------------------------------

    def _topic_configs(self, rf: int) -> dict[str, str | None]:
        return {"cleanup.policy": "compact", "segment.bytes": str(self.config["share.coordinator.state.topic."
                                                                              "segment.bytes"]),
                "compression.type": "producer"}

    def startup(self) -> None:
        internal_topic.ensure_internal_topic(
            self.store, self.topics, STATE_TOPIC, self._num_state_partitions,
            self.config["share.coordinator.state.topic.replication.factor"], self._topic_configs)

    def _read_state(self) -> dict[serde.StateKey, serde.Snapshot]:
        out: dict[serde.StateKey, serde.Snapshot] = {}
        for i in range(self._num_state_partitions):
            p = self.replicas.partition(STATE_TOPIC, i)
            if p is None or p.offline:
                continue
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
                    log.error("skipping an unreadable %s-%d record: %s", STATE_TOPIC, i, e)
        return out

    async def run(self) -> None:
        try:
            self.snapshots = await anyio.to_thread.run_sync(self._read_state)
            log.info("loaded %d share-partition state(s) from %s", len(self.snapshots), STATE_TOPIC)
        finally:
            self.loaded.set()
        await self._timer_loop()

    # --- share-partitions ----------------------------------------------------------------------------

    def share_partition(self, group_id: str, topic: str, topic_id: uuid.UUID, partition: int,
                        p: Partition) -> SharePartition:
        """The group's state on this partition, restored from ``__share_group_state`` or started per
        ``share.auto.offset.reset`` (and persisted at once, so a restart does not start over)."""
        key = (group_id, topic, partition)
        sp = self.partitions.get(key)
        limits = self.limits(group_id)
        if sp is not None:
            sp.limits = limits
            return sp
        snap = self.snapshots.get(serde.StateKey(group_id, topic_id, partition))
        if snap is not None:
            sp = SharePartition.restore(snap.start_offset, snap.batches, limits)
            sp.state_epoch = snap.state_epoch
        else:
            reset = self.group_config(group_id)["share.auto.offset.reset"]
            start = p.log.log_start_offset if reset == "earliest" else p.high_watermark
            sp = SharePartition(start, limits)
            self.partitions[key] = sp
            self.persist(group_id, topic, partition, sp)
        self.partitions[key] = sp
        return sp

    def acquire(self, group_id: str, member_id: str, topic: str, p: Partition, sp: SharePartition,
                max_records: int, max_bytes: int) -> tuple[Acquired, list[Archived]]:
        """Read the log where the share-partition needs records and acquire up to ``max_records``."""
        lg = p.log
        read_committed = self.group_config(group_id)["share.isolation.level"] == "read_committed"
        max_offset = p.last_stable_offset if read_committed else p.high_watermark
        if lg.log_start_offset > sp.start_offset:
            sp.move_start(lg.log_start_offset)
        offset = sp.fetch_offset()
        if offset >= sp.start_offset + sp.limits.max_record_locks:
            return Acquired(b"", []), []  # the in-flight window is full and nothing in it is available
        chunks: list[bytes] = []
        ranges: list[tuple[int, int, int]] = []
        archived: list[Archived] = []
        remaining = max_records
        now = now_ms()
        for _ in range(MAX_READS):
            if remaining <= 0 or offset >= max_offset or max_bytes <= 0:
                break
            try:
                res = lg.read(offset, min(max_bytes, READ_BYTES), max_offset=max_offset, min_one_message=not chunks)
            except (OffsetOutOfRange, KafkaStorageError):
                break
            data = res.records
            if not data:
                break
            headers = list(iter_batches(data))
            aborted = lg.collect_aborted_transactions(res.first_offset, res.next_offset) if read_committed else []
            batches = _log_batches(headers, aborted)
            got, arch = sp.acquire(member_id, batches, remaining, now)
            archived += arch
            if got:
                ranges += got
                remaining -= sum(last - first + 1 for first, last, _ in got)
                for h in headers:
                    if any(first <= h.last_offset and last >= h.base_offset for first, last, _ in got):
                        chunk = bytes(memoryview(data)[h.position:h.position + h.size])
                        chunks.append(chunk)
                        max_bytes -= len(chunk)
            if res.next_offset <= offset:
                break
            offset = res.next_offset
            if not got and offset >= sp.start_offset + sp.limits.max_record_locks:
                break
        return Acquired(b"".join(chunks), ranges), archived

    # --- acknowledgements, releases, persistence -----------------------------------------------------

    def acknowledge(self, group_id: str, member_id: str, topic: str, partition: int,
                    batches: Sequence[tuple[int, int, list[int]]]) -> ErrorCode:
        """Apply a partition's acknowledgement batches, dead-letter and persist (the caller then awaits
        :meth:`flush` before answering)."""
        sp = self.partitions.get((group_id, topic, partition))
        if sp is None:
            return ErrorCode.invalid_record_state
        now = now_ms()
        code = ErrorCode.none
        archived: list[Archived] = []
        before = sp.state_epoch
        for first, last, types in batches:
            code, arch = sp.acknowledge(member_id, first, last, types, now)
            archived += arch
            if code != ErrorCode.none:
                break
        if sp.state_epoch != before:
            self.after_change(group_id, topic, partition, sp, archived)
        return code

    def after_change(self, group_id: str, topic: str, partition: int, sp: SharePartition,
                     archived: Sequence[Archived]) -> None:
        """Dead-letter what must be, then persist the new state, then wake fetches that may now acquire."""
        self.dead_letter(group_id, topic, partition, archived)
        self.persist(group_id, topic, partition, sp)
        if sp.has_available():
            self.waiters.notify((topic, partition))

    def dead_letter_topic(self, group_id: str, topic: str) -> str:
        """The group's ``pykbroker.share.dlq.topic``, else the source topic's ``pykbroker.dlq.topic`` (whose
        default is the broker's setting of the same name); empty: none."""
        target: str = self.group_config(group_id)["pykbroker.share.dlq.topic"]
        if target:
            return target
        rec = self.store.topic(topic)
        value = rec.configs.get("pykbroker.dlq.topic") if rec is not None else None
        return value if value is not None else str(self.config.topic_default("pykbroker.dlq.topic") or "")

    def dead_letter(self, group_id: str, topic: str, partition: int, archived: Sequence[Archived]) -> None:
        wanted = dlq.dead_letter_reasons(archived)
        if not wanted:
            return
        target = self.dead_letter_topic(group_id, topic)
        if not target:
            return
        if target == topic:
            log.error("share group %s: dead-letter topic %s is the source topic; records not dead-lettered",
                      group_id, topic)
            return
        p = self.replicas.partition(topic, partition)
        if p is None:
            return
        try:
            found = dlq.read_records_at(p, [a.offset for a in wanted])
        except (OffsetOutOfRange, KafkaStorageError) as e:
            log.error("share group %s: cannot read %s-%d for the dead-letter topic: %s", group_id, topic, partition, e)
            return
        out = [dlq.dead_letter_record(found[a.offset], topic=topic, partition=partition, group=group_id,
                                      delivery_count=a.delivery_count, reason=a.reason)
               for a in wanted if a.offset in found]
        dlq.append(self.replicas, self.topics, target, partition, out)

    def persist(self, group_id: str, topic: str, partition: int, sp: SharePartition) -> None:
        rec = self.store.topic(topic)
        if rec is None:
            return
        key = serde.StateKey(group_id, rec.topic_id, partition)
        p = self.replicas.partition(topic, partition)
        snap = serde.Snapshot(sp.state_epoch, p.leader_epoch if p is not None else 0, sp.start_offset,
                              tuple(sp.state_batches()), now_ms())
        idx = internal_topic.partition_for(key.coordinator_key(), self._num_state_partitions)
        internal_topic.append_records(self.replicas, STATE_TOPIC, idx,
                                      [(serde.encode_key(key), serde.encode_value(snap))])
        self.snapshots[key] = snap
        self._dirty_state_partitions.add(idx)

    async def flush(self) -> None:
        """With ``log.flush.on.ack``, fsync what was persisted before the answer goes out."""
        dirty, self._dirty_state_partitions = self._dirty_state_partitions, set()
        if self.config["log.flush.on.ack"]:
            for idx in sorted(dirty):
                await internal_topic.flush_partition(self.replicas, STATE_TOPIC, idx)

    def _member_removed(self, group_id: str, member_id: str) -> None:
        self.sessions.close_member(group_id, member_id)
        self.release_member(group_id, member_id)

    def release_member(self, group_id: str, member_id: str) -> None:
        for (g, topic, partition), sp in list(self.partitions.items()):
            if g == group_id and sp.acquired_by(member_id):
                archived = sp.release_member(member_id)
                self.after_change(g, topic, partition, sp, archived)

    # --- admin: DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets --------------

    def start_offset(self, group_id: str, topic: str, topic_id: uuid.UUID, partition: int
                     ) -> tuple[int, int] | None:
        """(share-partition start offset, lag) of the group on a partition, None if it has no state there.

        The lag counts the records below the high watermark the group has not finished (Kafka 4.1's lag)."""
        sp = self.partitions.get((group_id, topic, partition))
        if sp is None:
            snap = self.snapshots.get(serde.StateKey(group_id, topic_id, partition))
            if snap is None:
                return None
            sp = SharePartition.restore(snap.start_offset, snap.batches, self.limits(group_id))
        p = self.replicas.partition(topic, partition)
        if p is None:
            return sp.start_offset, -1
        hwm = p.high_watermark
        done = sum(1 for off, r in sp.iter_in_flight() if off < hwm and r.state.name in ("ACKNOWLEDGED", "ARCHIVED"))
        return sp.start_offset, max(0, hwm - sp.start_offset - done)

    def reset_start(self, group_id: str, topic: str, partition: int, offset: int) -> None:
        """AlterShareGroupOffsets: the group starts over at ``offset`` on this partition (it has no members)."""
        sp = SharePartition(offset, self.limits(group_id))
        old = self.partitions.get((group_id, topic, partition))
        if old is not None:
            sp.state_epoch = old.state_epoch + 1
        self.partitions[(group_id, topic, partition)] = sp
        self.persist(group_id, topic, partition, sp)

    def delete_topic_state(self, group_id: str, topic: str, topic_id: uuid.UUID) -> None:
        """DeleteShareGroupOffsets: forget the group's state on every partition of the topic (tombstones)."""
        for key in [k for k in self.partitions if k[0] == group_id and k[1] == topic]:
            del self.partitions[key]
        for skey in [k for k in self.snapshots if k.group_id == group_id and k.topic_id == topic_id]:
            idx = internal_topic.partition_for(skey.coordinator_key(), self._num_state_partitions)
            internal_topic.append_records(self.replicas, STATE_TOPIC, idx, [(serde.encode_key(skey), None)])
            del self.snapshots[skey]
            self._dirty_state_partitions.add(idx)

    def has_members(self, group_id: str) -> bool:
        g = self.groups.groups.get(group_id)
        return g is not None and bool(g.members)

    # --- timers --------------------------------------------------------------------------------------

    def tick(self) -> int | None:
        """Expire sessions and acquisition locks due now; the next deadline (ms) if any."""
        self.groups.expire()
        now = now_ms()
        deadline: int | None = None
        for (g, topic, partition), sp in list(self.partitions.items()):
            d = sp.next_deadline()
            if d is not None and d <= now:
                changed, archived = sp.expire_locks(now)
                if changed:
                    self.after_change(g, topic, partition, sp, archived)
                d = sp.next_deadline()
            if d is not None and (deadline is None or d < deadline):
                deadline = d
        for grp in self.groups.groups.values():
            for m in grp.members.values():
                if deadline is None or m.deadline < deadline:
                    deadline = m.deadline
        return deadline

    def timers_changed(self) -> None:
        self._wake.set()

    async def _timer_loop(self) -> None:
        while True:
            try:
                deadline = self.tick()
            except Exception:
                log.exception("share coordinator timer failed")
                deadline = None
            if self._dirty_state_partitions:
                await self.flush()
            wait_ms = 1000 if deadline is None else min(1000, max(5, deadline - now_ms()))
            self._wake = anyio.Event()
            with anyio.move_on_after(wait_ms / 1000):
                await self._wake.wait()


def _log_batches(headers: Sequence[Any], aborted: Sequence[tuple[int, int]]) -> list[LogBatch]:
    """The batches as the share-partition sees them: control batches and, for read_committed, batches of
    aborted transactions are not deliverable (``aborted``: (producer id, first offset), by first offset)."""
    pending = sorted(aborted, key=lambda a: a[1])
    active: set[int] = set()
    out: list[LogBatch] = []
    i = 0
    for h in headers:
        while i < len(pending) and pending[i][1] <= h.base_offset:
            active.add(pending[i][0])
            i += 1
        if h.is_control:
            active.discard(h.producer_id)
            out.append(LogBatch(h.base_offset, h.last_offset, deliverable=False))
        elif h.is_transactional and h.producer_id in active:
            out.append(LogBatch(h.base_offset, h.last_offset, deliverable=False))
        else:
            out.append(LogBatch(h.base_offset, h.last_offset))
    return out
