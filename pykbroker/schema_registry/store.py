"""The registry's topic (``_schemas``, one compacted partition) as the broker holds it: created as the
coordinators create their internal topics, read back in offset order, appended to by its leader with the
leader epoch it was elected in, and committed as an acks=all produce is."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.coordinator.internal_topic import (
    LOAD_CHUNK_BYTES,
    append_records,
    can_append,
    ensure_internal_topic,
    ensure_internal_topic_async,
    flush_partition,
    min_insync_replicas,
    wait_replicated,
)
from pykbroker.metadata.store import MetadataStore
from pykbroker.protocol.records import decode_records, iter_batches
from pykbroker.replica.replica_manager import Partition, ReplicaManager
from pykbroker.replica.topics import TopicManager
from pykbroker.storage.errors import KafkaStorageError
from pykbroker.storage.log import OffsetOutOfRange

from . import errors as e

PARTITION = 0
COMMIT_TIMEOUT_S = 30.0

Entry = tuple[int, bytes | None, bytes | None]  # (offset, key, value)


class SchemasTopic:
    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager,
                 topics: TopicManager) -> None:
        self.config = config
        self.store = store
        self.replicas = replicas
        self.topics = topics
        self.name = str(config["pykbroker.schema.registry.topic"])
        self.replication_factor = int(config["pykbroker.schema.registry.topic.replication.factor"])
        self.commit_timeout_s = min(COMMIT_TIMEOUT_S, config["request.timeout.ms"] / 1000)

    def _configs(self, rf: int) -> dict[str, str | None]:
        return {"cleanup.policy": "compact", "compression.type": "producer"}

    def ensure(self) -> None:
        """Embedded metadata: create the topic now (this broker leads it)."""
        ensure_internal_topic(self.store, self.topics, self.name, 1, self.replication_factor, self._configs)

    async def ensure_async(self) -> bool:
        """Cluster: create the topic once its replication factor's worth of brokers are live."""
        return await ensure_internal_topic_async(self.store, self.topics, self.name, 1, self.replication_factor,
                                                 self._configs)

    def partition(self) -> Partition | None:
        p = self.replicas.partition(self.name, PARTITION)
        return None if p is None or p.offline else p

    def leader_id(self) -> int | None:
        rec = self.store.topic(self.name)
        a = rec.partitions.get(PARTITION) if rec is not None else None
        return a.leader if a is not None and a.leader >= 0 else None

    @staticmethod
    def read(p: Partition, start: int, end: int) -> list[Entry]:
        """The records of ``[start, end)`` with their offsets, control batches skipped (blocking: off-loop)."""
        lg = p.log
        out: list[Entry] = []
        offset = max(start, lg.log_start_offset)
        for _ in range(1_000_000):
            if offset >= end:
                break
            try:
                res = lg.read(offset, LOAD_CHUNK_BYTES, max_offset=end)
            except OffsetOutOfRange:
                break
            if not res.records:
                break
            before = offset
            data = res.records
            for h in iter_batches(data):
                if h.next_offset <= offset:
                    continue
                if not h.is_control:
                    view = memoryview(data)[h.position:h.position + h.size]
                    out.extend((r.offset, r.key, r.value) for r in decode_records(view) if offset <= r.offset < end)
                offset = max(offset, h.next_offset)
            if offset == before:
                break
        return out

    def append(self, p: Partition, leader_epoch: int, records: list[tuple[bytes, bytes | None]]) -> int:
        """Append as the leader elected in ``leader_epoch``; the base offset. Refused (50004) when this broker
        no longer leads the partition in that epoch, or its ISR is too small (50001), as an acks=all produce."""
        if self.replicas.partition(self.name, PARTITION) is not p or not p.is_leader or p.leader_epoch != leader_epoch:
            raise e.unknown_leader("This broker stopped leading the schema registry's topic")
        code = can_append(self.replicas, self.name, PARTITION, self.min_isr())
        if code == ErrorCode.not_enough_replicas:
            raise e.store_error(f"Not enough in-sync replicas of {self.name} to write (min.insync.replicas "
                                f"{self.min_isr()}, ISR {p.isr})")
        if code != ErrorCode.none:
            raise e.unknown_leader(f"Cannot write to {self.name}: {code.name}")
        base = p.log.log_end_offset
        try:
            append_records(self.replicas, self.name, PARTITION, records)
        except KafkaStorageError as exc:
            raise e.store_error(f"Cannot write to {self.name}: {exc}") from None
        return base

    def min_isr(self) -> int:
        return min_insync_replicas(self.store, self.name, int(self.config["min.insync.replicas"]))

    async def wait_committed(self, p: Partition) -> None:
        """Until every record appended so far is committed (the high watermark past it), as acks=all; and
        durable first with ``log.flush.on.ack``."""
        if self.config["log.flush.on.ack"]:
            try:
                await flush_partition(self.replicas, self.name, PARTITION)
            except (OSError, KafkaStorageError) as exc:
                raise e.store_error(f"Cannot make the write to {self.name} durable: {exc}") from None
        if not self.replicas.replicating:
            return  # embedded metadata: one replica, committed on append
        code = await wait_replicated(self.replicas, self.name, PARTITION, self.commit_timeout_s, self.min_isr())
        if code == ErrorCode.none:
            return
        if code == ErrorCode.request_timed_out:
            raise e.timeout(f"The write to {self.name} was not replicated within {self.commit_timeout_s:.0f} s")
        if code == ErrorCode.not_leader_or_follower:
            raise e.unknown_leader("This broker stopped leading the schema registry's topic before the write "
                                   "was committed")
        raise e.store_error(f"The write to {self.name} failed: {code.name}")
