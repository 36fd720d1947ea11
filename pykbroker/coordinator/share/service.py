"""Share groups' I/O edge on one broker: membership, share-partitions, their persistence and timers.

It owns the sans-I/O pieces (:class:`ShareGroups`, one :class:`SharePartition` per group, topic and
partition, :class:`ShareSessions`) and gives them a clock, the partition logs to acquire records from, a
:class:`Persister` to keep their state with its share coordinator, and dead-letter topics.  The roles are
Kafka's: this broker is the *group coordinator* of the share groups whose ``__consumer_offsets`` partition
it leads (membership, persisted there as ShareGroupMetadata records), the *share-partition leader* of the
partitions it leads (in-flight state, read from the share coordinator when first needed under the current
leader epoch, dropped when the leadership moves), and the *share coordinator* (:class:`ShareStateStore`)
of the ``__share_group_state`` partitions it leads.  Every change an acknowledgement makes is written to
the share coordinator (durable there) before the request is answered, so a killed broker neither forgets
an acknowledgement nor delivers an acknowledged record again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig, effective_group_config
from pykbroker.coordinator import internal_topic
from pykbroker.coordinator.internal_topic import monotonic_ms, now_ms
from pykbroker.coordinator.share import dlq, membership, serde
from pykbroker.coordinator.share.group import ShareGroup, ShareGroups
from pykbroker.coordinator.share.partition import Archived, LogBatch, ShareLimits, SharePartition
from pykbroker.coordinator.share.persister import Persister
from pykbroker.coordinator.share.session import ShareSessions
from pykbroker.coordinator.share.state_store import STATE_TOPIC, ShareStateStore
from pykbroker.metadata.store import GROUP_RESOURCE, INTERNAL_TOPICS, MetadataStore, TopicRecord
from pykbroker.protocol.records import iter_batches
from pykbroker.replica.replica_manager import FetchWaiters, Partition, ReplicaManager
from pykbroker.replica.topics import TopicManager
from pykbroker.storage.log import KafkaStorageError, OffsetOutOfRange

if TYPE_CHECKING:
    from pykbroker.coordinator.group.service import GroupCoordinator

log = logging.getLogger("pykbroker.share")

__all__ = ["STATE_TOPIC", "ShareCoordinator"]
OFFSETS_TOPIC = "__consumer_offsets"
# How long a state write is retried (share coordinator moving, ISR short) before the request is answered
# with the error; the state stays queued and the timer retries it.
WRITE_RETRY_S = 15.0
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
                 topics: TopicManager, group_coordinator: GroupCoordinator | None = None) -> None:
        self.config = config
        self.store = store
        self.replicas = replicas
        self.topics = topics
        self.groups = ShareGroups(self._lookup, monotonic_ms, config["group.share.max.size"])
        self.groups.on_member_removed = self._member_removed
        self.sessions = ShareSessions()
        self.partitions: dict[SpKey, SharePartition] = {}
        self._leader_epochs: dict[SpKey, int] = {}  # the leader epoch each share-partition was read under
        self._state_epochs: dict[SpKey, int] = {}  # the state epoch it was read with (admin resets bump it)
        self._init_locks: dict[SpKey, anyio.Lock] = {}
        self._topic_shapes: dict[str, tuple[uuid.UUID, int] | None] = {}  # what the assignment depends on
        self.state = ShareStateStore(config, store, replicas, topics)
        self.persister = Persister(self.state, replicas.broker_id)
        # State written but not yet acknowledged by its share coordinator (newest per key; None: delete).
        self._pending: dict[serde.StateKey, tuple[SpKey, serde.Snapshot | None]] = {}
        self._flush_lock = anyio.Lock()
        # Fetches waiting for records to become available again (released, lock expired).
        self.waiters = FetchWaiters()
        self._wake = anyio.Event()
        # Membership records in __consumer_offsets: the epoch last written per group.
        self.gc = group_coordinator
        self._written_epochs: dict[str, int] = {}
        # The topics each group coordinated here has (or had) share state on, as last written.
        self._state_topics: dict[str, dict[uuid.UUID, str]] = {}
        # Topics whose state DeleteShareGroupOffsets deleted: left out of the group's next record.
        self._dropped_state_topics: dict[str, set[uuid.UUID]] = {}
        if group_coordinator is not None:
            group_coordinator.load_listeners.append(self._offsets_loaded)
            group_coordinator.unload_listeners.append(self._offsets_unloaded)
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
        if name in (STATE_TOPIC, OFFSETS_TOPIC):
            return
        shape = None if rec is None else (rec.topic_id, len(rec.partitions))
        if self._topic_shapes.get(name) != shape:  # created, deleted or grown; not a leader or ISR change
            self._topic_shapes[name] = shape
            self.groups.on_topics_changed()
        me = self.replicas.broker_id
        for key in [k for k in self.partitions if k[1] == name]:
            a = rec.partitions.get(key[2]) if rec is not None else None
            if a is None or a.leader != me:  # deleted, or led elsewhere: the new leader reads the persisted state
                self._drop(key)

    def _drop(self, key: SpKey) -> None:
        """Forget a share-partition this broker no longer leads (its acquisitions die with it)."""
        self.partitions.pop(key, None)
        self._leader_epochs.pop(key, None)
        self._state_epochs.pop(key, None)

    # --- startup -------------------------------------------------------------------------------------

    def set_cluster(self, endpoint_of: Callable[[int], tuple[str, int] | None]) -> None:
        """Cluster mode: share coordinators on other brokers are reached on the inter-broker listener."""
        self.persister.set_cluster(endpoint_of, self.config["request.timeout.ms"] / 1000)

    def startup(self) -> None:
        self.state.startup()  # embedded metadata: creates __share_group_state

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.state.run)  # replays the __share_group_state partitions led here
            if self.store.is_cluster():
                tg.start_soon(self._ensure_state_topic)
            await self._timer_loop()

    async def _ensure_state_topic(self) -> None:
        """Cluster mode: create __share_group_state once enough brokers are live for its replication factor."""
        for _ in range(1_000_000):
            try:
                if self.store.topic(STATE_TOPIC) is not None or await self.state.ensure_topic_async():
                    return
            except Exception as e:  # ZooKeeper unavailable: try again
                log.debug("cannot create %(topic)s yet: %(error)s", {"topic": STATE_TOPIC, "error": e})
            await anyio.sleep(1.0)

    async def close(self) -> None:
        await self.persister.close()

    # --- share-partitions ----------------------------------------------------------------------------

    async def share_partition(self, group_id: str, topic: str, topic_id: uuid.UUID, partition: int,
                              p: Partition) -> SharePartition | None:
        """The group's state on this partition this broker leads: read from its share coordinator under the
        current leader epoch (fencing an older leader), or started per ``share.auto.offset.reset`` and
        persisted.  None while the share coordinator cannot answer (the fetch finds nothing this time)."""
        key = (group_id, topic, partition)
        limits = self.limits(group_id)
        sp = self.partitions.get(key)
        if sp is not None and self._leader_epochs.get(key) == p.leader_epoch:
            sp.limits = limits
            return sp
        lock = self._init_locks.setdefault(key, anyio.Lock())
        async with lock:
            sp = self.partitions.get(key)
            if sp is not None and self._leader_epochs.get(key) == p.leader_epoch:
                return sp
            epoch = p.leader_epoch
            code, snap = await self.persister.read(serde.StateKey(group_id, topic_id, partition), epoch)
            if code != ErrorCode.none:
                log.debug("share group %(group_id)s: state of %(topic)s-%(partition)d not readable yet: %(error)s",
                          {"group_id": group_id, "topic": topic, "partition": partition, "error": code.name})
                return None
            if self.replicas.partition(topic, partition) is not p or not p.is_leader or p.leader_epoch != epoch:
                return None  # the leadership moved while reading
            if snap is not None:
                sp = SharePartition.restore(snap.start_offset, snap.batches, limits)
                sp.state_epoch = snap.snapshot_epoch
                self.partitions[key] = sp
                self._leader_epochs[key] = epoch
                self._state_epochs[key] = snap.state_epoch
            else:
                reset = self.group_config(group_id)["share.auto.offset.reset"]
                start = p.log.log_start_offset if reset == "earliest" else p.high_watermark
                sp = SharePartition(start, limits)
                self.partitions[key] = sp
                self._leader_epochs[key] = epoch
                self._state_epochs[key] = 0
                self.persist(group_id, topic, partition, sp)
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
        now = monotonic_ms()
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
        now = monotonic_ms()
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
            log.error("share group %(group_id)s: dead-letter topic %(topic)s is the source topic; records not "
                      "dead-lettered",
                      {"group_id": group_id, "topic": topic})
            return
        p = self.replicas.partition(topic, partition)
        if p is None:
            return
        try:
            found = dlq.read_records_at(p, [a.offset for a in wanted])
        except (OffsetOutOfRange, KafkaStorageError) as e:
            log.error("share group %(group_id)s: cannot read %(topic)s-%(partition)d for the dead-letter topic: "
                      "%(error)s",
                      {"group_id": group_id, "topic": topic, "partition": partition, "error": e})
            return
        out = [dlq.dead_letter_record(found[a.offset], topic=topic, partition=partition, group=group_id,
                                      delivery_count=a.delivery_count, reason=a.reason)
               for a in wanted if a.offset in found]
        dlq.append(self.replicas, self.topics, target, partition, out)

    def persist(self, group_id: str, topic: str, partition: int, sp: SharePartition) -> None:
        """Queue the share-partition's state for its share coordinator; :meth:`flush` writes it."""
        rec = self.store.topic(topic)
        if rec is None:
            return
        key = serde.StateKey(group_id, rec.topic_id, partition)
        p = self.replicas.partition(topic, partition)
        spk = (group_id, topic, partition)
        epoch = self._leader_epochs.get(spk, p.leader_epoch if p is not None else -1)
        snap = serde.Snapshot(self._state_epochs.get(spk, 0), epoch, sp.start_offset, tuple(sp.state_batches()),
                              now_ms(), sp.state_epoch)
        self._pending[key] = ((group_id, topic, partition), snap)

    async def flush(self) -> dict[SpKey, ErrorCode]:
        """Write the queued state to the share coordinators before the answer goes out; the share-partitions
        whose state could not be written within :data:`WRITE_RETRY_S`, with the error.  Such a share-partition
        is dropped, to be read again from its share coordinator, which undoes the changes that were not
        written (as Kafka rolls them back).  A fenced write means another broker leads the partition now, or
        an admin reset its state: dropped too."""
        failed: dict[SpKey, ErrorCode] = {}
        self.write_group_records()  # a deleted group's tombstone, with its state's
        async with self._flush_lock:
            deadline = anyio.current_time() + WRITE_RETRY_S
            backoff = 0.05
            for _ in range(10_000):
                if not self._pending:
                    break
                items = list(self._pending.items())
                self._pending.clear()
                codes = await self.persister.write([(k, snap) for k, (_, snap) in items])
                retry: list[tuple[serde.StateKey, tuple[SpKey, serde.Snapshot | None]]] = []
                for k, (spk, snap) in items:
                    code = codes.get(k, ErrorCode.unknown_server_error)
                    if code == ErrorCode.none:
                        failed.pop(spk, None)
                    elif code in (ErrorCode.fenced_leader_epoch, ErrorCode.fenced_state_epoch):
                        log.info("share group %(group_id)s: state of %(topic)s-%(partition)d fenced (%(error)s); "
                                 "dropping it",
                                 {"group_id": spk[0], "topic": spk[1], "partition": spk[2], "error": code.name})
                        self._drop(spk)
                        failed[spk] = (ErrorCode.not_leader_or_follower if code == ErrorCode.fenced_leader_epoch
                                       else code)
                    else:
                        failed[spk] = code
                        if k not in self._pending:  # not superseded by a newer state meanwhile
                            retry.append((k, (spk, snap)))
                for k, v in retry:
                    self._pending.setdefault(k, v)
                if not retry:
                    continue
                if anyio.current_time() + backoff >= deadline:
                    log.warning("share state of %(share_partitions)d share-partition(s) not written (%(errors)s): "
                                "read again from their share coordinators",
                                {"share_partitions": len(retry), "errors": sorted({c.name for c in failed.values()})})
                    for k, (spk, _) in retry:
                        self._pending.pop(k, None)
                        self._drop(spk)
                    break
                await anyio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
        return failed

    def evict_if_idle(self, group_id: str) -> None:
        """The group's last share session here closed and its state is written: forget its share-partitions,
        as Kafka's leader does when a group has no members left there, so that the next member reads the
        state afresh (an AlterShareGroupOffsets or DeleteShareGroupOffsets made meanwhile applies)."""
        if self.sessions.has_group(group_id) or any(spk[0] == group_id for spk, _ in self._pending.values()):
            return
        for key in [k for k in self.partitions if k[0] == group_id]:
            self._drop(key)

    def _member_removed(self, group_id: str, member_id: str) -> None:
        self.sessions.close_member(group_id, member_id)
        self.release_member(group_id, member_id)

    def release_member(self, group_id: str, member_id: str) -> None:
        for (g, topic, partition), sp in list(self.partitions.items()):
            if g == group_id and sp.acquired_by(member_id):
                archived = sp.release_member(member_id)
                self.after_change(g, topic, partition, sp, archived)

    # --- admin: DescribeShareGroupOffsets, AlterShareGroupOffsets, DeleteShareGroupOffsets --------------

    async def start_offset(self, group_id: str, topic: str, topic_id: uuid.UUID, partition: int
                           ) -> tuple[int, int] | None:
        """(share-partition start offset, lag) of the group on a partition, None if it has no state there.

        The lag counts the records below the high watermark the group has not finished (Kafka 4.1's lag)."""
        sp = self.partitions.get((group_id, topic, partition))
        if sp is None:
            _, snap = await self.persister.read(serde.StateKey(group_id, topic_id, partition), -1)
            if snap is None:
                return None
            sp = SharePartition.restore(snap.start_offset, snap.batches, self.limits(group_id))
        p = self.replicas.partition(topic, partition)
        if p is None:
            return sp.start_offset, -1
        hwm = p.high_watermark if p.is_leader else p.log.log_end_offset
        done = sum(1 for off, r in sp.iter_in_flight() if off < hwm and r.state.name in ("ACKNOWLEDGED", "ARCHIVED"))
        return sp.start_offset, max(0, hwm - sp.start_offset - done)

    async def reset_start(self, group_id: str, topic: str, topic_id: uuid.UUID, partition: int, offset: int
                          ) -> ErrorCode:
        """AlterShareGroupOffsets: the group starts over at ``offset`` on this partition (it has no members).

        The new state carries the next state epoch, which fences a share-partition leader still holding the
        old state: its next write fails and it reads the new state."""
        key = serde.StateKey(group_id, topic_id, partition)
        code, cur = await self.persister.read(key, -1)
        if code != ErrorCode.none:
            return code
        snap = serde.Snapshot(cur.state_epoch + 1 if cur is not None else 1,
                              cur.leader_epoch if cur is not None else -1, offset, (), now_ms())
        self._pending.pop(key, None)
        self._drop((group_id, topic, partition))
        return (await self.persister.write([(key, snap)])).get(key, ErrorCode.unknown_server_error)

    def delete_topic_state(self, group_id: str, topic: str, topic_id: uuid.UUID, partitions: int | None = None
                           ) -> None:
        """DeleteShareGroupOffsets: forget the group's state on every partition of the topic (tombstones;
        ``partitions``: how many, by default the topic's count, else those known here)."""
        for key in [k for k in self.partitions if k[0] == group_id and k[1] == topic]:
            self._drop(key)
        if partitions is None:
            rec = self.store.topic_by_id(topic_id)
            known = {k.partition for k in self.snapshots if k.group_id == group_id and k.topic_id == topic_id}
            partitions = max([len(rec.partitions) if rec is not None else 0, *(i + 1 for i in known)])
        for i in range(partitions):
            self._pending[serde.StateKey(group_id, topic_id, i)] = ((group_id, topic, i), None)
        self._dropped_state_topics.setdefault(group_id, set()).add(topic_id)

    @property
    def snapshots(self) -> dict[serde.StateKey, serde.Snapshot]:
        """The share-partition states replayed on this broker's share coordinator partitions."""
        return self.state.loaded_states()

    def _known_state_topics(self, group_id: str) -> dict[uuid.UUID, str]:
        """The topics written for the group before, less those whose state was deleted since, plus those its
        members subscribe to now (a member's share-partitions get state under their topic ids)."""
        dropped = self._dropped_state_topics.get(group_id, set())
        topics = {t: n for t, n in self._state_topics.get(group_id, {}).items() if t not in dropped}
        grp = self.groups.groups.get(group_id)
        for name in sorted(grp.subscribed_topics()) if grp is not None else ():
            rec = self.store.topic(name)
            if rec is not None:
                topics[rec.topic_id] = name
        return topics

    def state_topic_ids(self, group_id: str) -> set[uuid.UUID]:
        """Topics the group has state for: those its coordinator recorded in ``__consumer_offsets`` (every
        topic it ever subscribed to, wherever that state's share coordinators are), plus what this broker
        knows (its share coordinator partitions, the share-partitions it leads, current subscriptions)."""
        ids = set(self._known_state_topics(group_id))
        ids |= {k.topic_id for k in self.state.loaded_states() if k.group_id == group_id}
        for g, topic, _ in self.partitions:
            rec = self.store.topic(topic) if g == group_id else None
            if rec is not None:
                ids.add(rec.topic_id)
        grp = self.groups.groups.get(group_id)
        for topic in grp.subscribed_topics() if grp is not None else ():
            rec = self.store.topic(topic)
            if rec is not None:
                ids.add(rec.topic_id)
        return ids

    # --- membership records in __consumer_offsets ----------------------------------------------------

    def _offsets_loaded(self, partition: int, records: list[tuple[bytes | None, bytes | None]]) -> None:
        """The group coordinator replayed an offsets partition: its share groups exist again (no members)."""
        replayed = membership.replay(records)
        for gid, epoch in replayed.epochs.items():
            if gid not in self.groups.groups:
                self.groups.groups[gid] = ShareGroup(gid, group_epoch=epoch, assignment_epoch=epoch)
            self._written_epochs[gid] = epoch
        for gid, topics in replayed.state_topics.items():
            self._state_topics[gid] = topics

    def _offsets_unloaded(self, partition: int) -> None:
        """Another broker coordinates these groups now."""
        assert self.gc is not None
        for gid in [g for g in self.groups.groups if self.gc.partition_for(g) == partition]:
            del self.groups.groups[gid]
            self._written_epochs.pop(gid, None)
        for gid in [g for g in self._state_topics if self.gc.partition_for(g) == partition]:
            del self._state_topics[gid]
        for gid in [g for g in self._dropped_state_topics if self.gc.partition_for(g) == partition]:
            del self._dropped_state_topics[gid]

    def write_group_records(self) -> list[str]:
        """Append a ShareGroupMetadata record for each group whose epoch changed (a tombstone for a deleted
        group) to its offsets partition; the groups written (the caller awaits their durability)."""
        gc = self.gc
        if gc is None:
            return []
        written: list[str] = []
        changes: list[tuple[str, int | None]] = [(gid, g.group_epoch) for gid, g in self.groups.groups.items()
                                                 if self._written_epochs.get(gid) != g.group_epoch]
        changes += [(gid, None) for gid in self._written_epochs if gid not in self.groups.groups]
        changing = {gid for gid, _ in changes}
        # The group's topics changed without its epoch (DeleteShareGroupOffsets): that record alone.
        changes += [(gid, g.group_epoch) for gid, g in self.groups.groups.items() if gid not in changing
                    and self._known_state_topics(gid) != self._state_topics.get(gid, {})]
        for gid, epoch in changes:
            idx = gc.partition_for(gid)
            if gc.manager.partitions.get(idx) != "active" or gc.writable(gid) != ErrorCode.none:
                continue  # not coordinated here, loading, or the ISR is short: the timer tries again
            value = None if epoch is None else membership.encode_value(epoch)
            records = [(membership.encode_key(gid), value)]
            topics = self._known_state_topics(gid) if epoch is not None else {}
            if topics != self._state_topics.get(gid, {}):
                records.append((membership.encode_state_topics_key(gid),
                                membership.encode_state_topics(topics) if topics else None))
            try:
                internal_topic.append_records(self.replicas, OFFSETS_TOPIC, idx, records)
            except Exception as e:
                log.warning("share group %(group_id)s: cannot write its metadata record: %(error)s",
                            {"group_id": gid, "error": e})
                continue
            if topics:
                self._state_topics[gid] = topics
            else:
                self._state_topics.pop(gid, None)
            self._dropped_state_topics.pop(gid, None)
            if epoch is None:
                self._written_epochs.pop(gid, None)
            else:
                self._written_epochs[gid] = epoch
            written.append(gid)
        return written

    def has_members(self, group_id: str) -> bool:
        g = self.groups.groups.get(group_id)
        return g is not None and bool(g.members)

    # --- timers --------------------------------------------------------------------------------------

    def tick(self) -> int | None:
        """Expire sessions and acquisition locks due now; the next deadline (ms) if any."""
        self.groups.expire()
        now = monotonic_ms()
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
            try:
                self.write_group_records()
            except Exception:
                log.exception("share group records not written")
            if self._pending:
                await self.flush()
            wait_ms = 1000 if deadline is None else min(1000, max(5, deadline - monotonic_ms()))
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
