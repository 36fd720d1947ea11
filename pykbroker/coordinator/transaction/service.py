"""The transaction coordinator's I/O edge: ``__transaction_state``, loading, markers and timers.

:class:`TransactionCoordinator` owns a sans-I/O :class:`TransactionStateMachine` and gives it a
clock, a producer id allocator (blocks reserved through the metadata store, so ids are unique
for the cluster), and a writer that appends to ``__transaction_state`` through the replica
manager.  Which broker coordinates a transactional id is :meth:`coordinator_node` (id ->
partition -> that partition's leader in the metadata store).  Markers are written as local
appends (:func:`write_marker`); a background task aborts timed-out transactions, expires idle
transactional ids and retries the markers of prepared transactions (also those found prepared
when a partition is loaded after a restart).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Protocol

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.coordinator import internal_topic
from pykbroker.coordinator.group.manager import CommitEntry
from pykbroker.coordinator.inter_broker import InterBrokerClients
from pykbroker.coordinator.internal_topic import PartitionLoader, now_ms
from pykbroker.coordinator.transaction.markers import write_marker
from pykbroker.coordinator.transaction.state import MarkerJob, TransactionStateMachine, TxnConfig
from pykbroker.metadata.store import MetadataStore, StoreUnavailable, TopicRecord, run_store
from pykbroker.replica.replica_manager import ReplicaManager
from pykbroker.replica.topics import TopicManager

log = logging.getLogger("pykbroker.txn")


class TxnOffsets(Protocol):
    """The transactional offset commits of ``__consumer_offsets`` (transaction.offsets): TxnOffsetCommit
    goes there, and a marker written for one of their producers completes them; set by the broker at start."""

    async def commit(self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
                     generation_id: int, member_id: str, instance_id: str | None, entries: list[CommitEntry],
                     version: int) -> dict[tuple[str, int], ErrorCode]: ...

    def complete(self, partition: int, producer_id: int, commit: bool) -> None: ...

TXN_TOPIC = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"
PRODUCER_ID_BLOCK = 1000
ABORT_CHECK_INTERVAL_S = 1.0
EXPIRE_CHECK_INTERVAL_S = 60.0
# Testing hook: if this file exists in the first log dir when a commit is prepared, the broker
# halts (like kill -9) right after writing PrepareCommit, before any marker.
FAULT_FILE = "pykbroker-fault-txn-halt-after-prepare"


class ProducerIdManager:
    """Hands out producer ids from blocks reserved in the metadata store (Kafka's ProducerIdManager)."""

    def __init__(self, store: MetadataStore, block: int = PRODUCER_ID_BLOCK) -> None:
        self.store = store
        self.block = block
        self._next = 0
        self._end = 0

        self._refilling = anyio.Lock()

    def next(self) -> int:
        if self._next >= self._end:
            self._next = self.store.allocate_producer_ids(self.block)
            self._end = self._next + self.block
        pid = self._next
        self._next += 1
        return pid

    async def ensure_available(self) -> None:
        """Reserve the next block off the event loop when the store blocks (ZooKeeper) and this one is used up,
        so that :meth:`next` does not wait on the network. Raises StoreUnavailable."""
        if self._next < self._end or not self.store.blocking:
            return
        async with self._refilling:
            if self._next < self._end:
                return
            first = await run_store(self.store, self.store.allocate_producer_ids, self.block)
            self._next, self._end = first, first + self.block


class TransactionCoordinator(PartitionLoader):
    load_topic = TXN_TOPIC

    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager,
                 topics: TopicManager) -> None:
        super().__init__(config, store, replicas, topics)
        self.producer_ids = ProducerIdManager(store)
        self.sm = TransactionStateMachine(
            TxnConfig(num_partitions=config["transaction.state.log.num.partitions"],
                      max_timeout_ms=config["transaction.max.timeout.ms"],
                      id_expiration_ms=config["transactional.id.expiration.ms"]),
            self._write, now_ms, self.producer_ids.next)
        self.flush_on_ack: bool = config["log.flush.on.ack"]
        self.txn_offsets: TxnOffsets | None = None  # set by the broker when the group coordinator runs
        self._in_flight: set[str] = set()
        self._fault_file = Path(config.log_dirs[0]) / FAULT_FILE
        # Cluster mode: requests to other brokers (markers on partitions they lead, KIP-890 checks),
        # and the answers of checks asked before an append (verification.verify_with_coordinator).
        self.remote: InterBrokerClients | None = None
        self.remote_verified: dict[tuple[str, int, int, int], ErrorCode] = {}
        store.add_listener(self._on_metadata_change)

    # --- the coordinator seam ---------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return self.sm.partition_for(transactional_id)

    def coordinator_node(self, transactional_id: str) -> int | None:
        return internal_topic.coordinator_node(self.store, TXN_TOPIC, self.partition_for(transactional_id))

    async def verify_partition(self, transactional_id: str, producer_id: int, producer_epoch: int,
                               tp: tuple[str, int]) -> ErrorCode:
        """KIP-890: is ``tp`` in the producer's ongoing transaction?  The coordinator's answer to
        AddPartitionsToTxn ``verify_only``: this broker's state machine when it coordinates the id (or is
        alone), else asked of the coordinating broker, as Kafka's brokers always ask it."""
        if self.remote is not None:
            node = self.coordinator_node(transactional_id)
            if node is None:
                return ErrorCode.coordinator_not_available
            if node != self.replicas.broker_id:
                return await self.remote.verify(node, transactional_id, producer_id, producer_epoch, tp)
        return self.sm.verify_partitions(transactional_id, producer_id, producer_epoch, [tp])[tp]

    def _topic_configs(self, rf: int) -> dict[str, str | None]:
        return {"cleanup.policy": "compact", "compression.type": "uncompressed",
                "min.insync.replicas": str(min(rf, self.config["transaction.state.log.min.isr"])),
                "segment.bytes": str(100 * 1024 * 1024)}

    def ensure_topic(self) -> None:
        internal_topic.ensure_internal_topic(
            self.store, self.topics, TXN_TOPIC, self.config["transaction.state.log.num.partitions"],
            self.config["transaction.state.log.replication.factor"], self._topic_configs)

    async def ensure_topic_async(self) -> bool:
        """Cluster mode: create the topic on first use; False when too few brokers are live for it."""
        return await internal_topic.ensure_internal_topic_async(
            self.store, self.topics, TXN_TOPIC, self.config["transaction.state.log.num.partitions"],
            self.config["transaction.state.log.replication.factor"], self._topic_configs)

    def _on_metadata_change(self, name: str, rec: TopicRecord | None) -> None:
        if name != TXN_TOPIC:
            return
        led = {} if rec is None else {i: a.leader_epoch for i, a in rec.partitions.items()
                                      if a.leader == self.replicas.broker_id}
        for p in list(self.sm.partitions):
            if p not in led:
                self.sm.unload(p)
        for p, epoch in led.items():
            part = self.sm.partitions.get(p)
            if part is None or part.coordinator_epoch != epoch:
                self.sm.begin_loading(p, epoch)
                self._to_load.add(p)
        self._load_wake.set()

    # --- writes ------------------------------------------------------------------------------

    def _write(self, partition: int, key: bytes, value: bytes | None) -> None:
        internal_topic.append_records(self.replicas, TXN_TOPIC, partition, [(key, value)])

    def writable(self, transactional_id: str) -> ErrorCode:
        """Cluster mode, before a state change: as Kafka's acks=all append to the transaction log, refused
        (COORDINATOR_NOT_AVAILABLE) while its partition's ISR is below its min ISR, NOT_COORDINATOR once
        this broker no longer leads it."""
        if not self.store.is_cluster():
            return ErrorCode.none
        partition = self.partition_for(transactional_id)
        return internal_topic.coordinator_error(internal_topic.can_append(
            self.replicas, TXN_TOPIC, partition, self._min_isr(TXN_TOPIC)))

    def _min_isr(self, topic: str) -> int:
        return internal_topic.min_insync_replicas(self.store, topic, self.config["min.insync.replicas"])

    async def flush(self, transactional_id: str) -> ErrorCode:
        """Make the transaction's latest state durable before answering: fsync (log.flush.on.ack) and, in
        a cluster, replication to the ISR (bounded by request.timeout.ms); the client's error if that
        failed (COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR, Kafka's mapping of a failed append)."""
        if self.flush_on_ack:
            await internal_topic.flush_partition(self.replicas, TXN_TOPIC, self.partition_for(transactional_id))
        if not self.store.is_cluster():
            return ErrorCode.none
        code = await internal_topic.wait_replicated(self.replicas, TXN_TOPIC, self.partition_for(transactional_id),
                                                    self.config["request.timeout.ms"] / 1000,
                                                    self._min_isr(TXN_TOPIC))
        return internal_topic.coordinator_error(code)

    # --- markers -----------------------------------------------------------------------------

    def _leader_elsewhere(self, topic: str, index: int) -> int | None:
        """Cluster mode: the leader of a partition this broker does not lead (-1: none), else None."""
        if self.remote is None:
            return None
        rec = self.store.topic(topic)
        a = rec.partitions.get(index) if rec is not None else None
        if a is None or a.leader == self.replicas.broker_id:
            return None
        return a.leader

    async def write_markers(self, job: MarkerJob) -> dict[tuple[str, int], ErrorCode]:
        """Append the job's marker to each of its partitions, through their leaders (WriteTxnMarkers)
        for those another broker leads; returns the failures to retry."""
        results: dict[tuple[str, int], ErrorCode] = {}
        remote: dict[int, list[tuple[str, int]]] = {}
        local: list[tuple[str, int]] = []
        for topic, index in sorted(job.partitions):
            leader = self._leader_elsewhere(topic, index)
            if leader is None:
                results[(topic, index)] = self.write_one_marker(
                    topic, index, job.producer_id, job.producer_epoch, job.commit, job.coordinator_epoch)
                local.append((topic, index))
            elif leader < 0:
                results[(topic, index)] = ErrorCode.not_leader_or_follower
            else:
                remote.setdefault(leader, []).append((topic, index))
        if self.remote is not None:
            for broker_id, tps in remote.items():
                results.update(await self.remote.write_markers(
                    broker_id, job.producer_id, job.producer_epoch, job.commit, job.coordinator_epoch, tps))
            for topic, index in local:  # as Kafka, markers are written with acks=all: retried until replicated
                if results[(topic, index)] == ErrorCode.none:
                    results[(topic, index)] = await internal_topic.wait_replicated(
                        self.replicas, topic, index, self.config["request.timeout.ms"] / 1000, self._min_isr(topic))
        failed: dict[tuple[str, int], ErrorCode] = {}
        for (topic, index), code in results.items():
            if code == ErrorCode.unknown_topic_or_partition and self.store.topic(topic) is None:
                continue  # the topic was deleted: nothing left to close
            if code != ErrorCode.none:
                failed[(topic, index)] = code
        return failed

    def write_one_marker(self, topic: str, index: int, producer_id: int, producer_epoch: int, commit: bool,
                         coordinator_epoch: int) -> ErrorCode:
        if self.store.is_cluster() and self.replicas.partition(topic, index) is not None:
            # acks=all: not below the partition's min ISR (NOT_ENOUGH_REPLICAS: the coordinator retries)
            code = internal_topic.can_append(self.replicas, topic, index, self._min_isr(topic))
            if code != ErrorCode.none:
                return code
        code = write_marker(self.replicas, topic, index, producer_id, producer_epoch, commit, coordinator_epoch)
        if code == ErrorCode.none and topic == OFFSETS_TOPIC and self.txn_offsets is not None:
            self.txn_offsets.complete(index, producer_id, commit)
        return code

    async def finish(self, job: MarkerJob) -> bool:
        """Write the markers of a prepared transaction, then record it complete."""
        if job.transactional_id in self._in_flight or not self.sm.is_pending(job):
            return False
        self._in_flight.add(job.transactional_id)
        try:
            if job.commit and self._fault_file.exists():
                self._fault_file.unlink()
                await self.flush(job.transactional_id)
                log.warning("fault injection: halting after PrepareCommit of %(transactional_id)s",
                            {"transactional_id": job.transactional_id})
                os._exit(137)
            # The PrepareCommit/PrepareAbort record first: were it lost in a failover, a new coordinator could
            # decide otherwise (abort on timeout) after some markers said commit.
            prepared = await self.flush(job.transactional_id) if self.store.is_cluster() else ErrorCode.none
            if prepared != ErrorCode.none:
                log.warning("transaction %(transactional_id)s: its prepared state is not replicated (%(state)s); "
                            "markers will be retried",
                            {"transactional_id": job.transactional_id, "state": prepared.name})
                return False
            if not self.sm.is_pending(job):  # completed meanwhile (the flush awaited): nothing left to write
                return False
            failed = await self.write_markers(job)
            if failed:
                log.warning("markers of transaction %(transactional_id)s not written to %(partitions)s; will retry",
                            {"transactional_id": job.transactional_id,
                             "partitions": {f'{t}-{p}': c.name for (t, p), c in failed.items()}})
                return False
            if self.flush_on_ack:
                for topic, index in job.partitions:
                    p = self.replicas.partition(topic, index)
                    if p is not None:
                        await anyio.to_thread.run_sync(p.log.flush)
            try:
                done = self.sm.complete(job)
            except Exception:
                log.exception("failed to complete transaction %(transactional_id)s",
                              {"transactional_id": job.transactional_id})
                return False
            if done:
                await self.flush(job.transactional_id)
            return done
        finally:
            self._in_flight.discard(job.transactional_id)

    # --- loading -----------------------------------------------------------------------------

    def _read_partition(self, partition: int) -> list[tuple[bytes | None, bytes | None]]:
        p = self.replicas.partition(TXN_TOPIC, partition)
        return [] if p is None else internal_topic.read_records(p)

    async def _load(self, partition: int) -> None:
        started = time.monotonic()
        try:
            records = await anyio.to_thread.run_sync(self._read_partition, partition)
        except Exception:
            log.exception("failed to read %(topic)s-%(partition)d", {"topic": TXN_TOPIC, "partition": partition})
            records = []
        part = self.sm.partitions.get(partition)
        if part is None or not part.loading:
            return
        n = self.sm.load(partition, records)
        jobs = self.sm.finish_loading(partition)
        if records:
            log.debug("loaded %(topic)s-%(partition)d: %(transactional_ids)d transactional ids (%(prepared)d "
                      "prepared) in %(elapsed_s).3fs",
                      {"topic": TXN_TOPIC, "partition": partition, "transactional_ids": n, "prepared": len(jobs),
                       "elapsed_s": time.monotonic() - started})
        for job in jobs:
            log.info("completing %(result)s of transaction %(transactional_id)s found prepared at load",
                     {"result": 'commit' if job.commit else 'abort', "transactional_id": job.transactional_id})
            await self.finish(job)

    # --- tasks -------------------------------------------------------------------------------

    def startup(self) -> None:
        """Embedded metadata: create the topic now; a cluster creates it on first use (FindCoordinator)."""
        if not self.store.is_cluster():
            self.ensure_topic()
        self._on_metadata_change(TXN_TOPIC, self.store.topic(TXN_TOPIC))

    def shutdown(self) -> None:
        for p in list(self.sm.partitions):
            self.sm.unload(p)
        self._to_load.clear()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._loader)
            tg.start_soon(self._abort_loop)
            tg.start_soon(self._expire_loop)

    async def _abort_loop(self) -> None:
        while True:
            await anyio.sleep(ABORT_CHECK_INTERVAL_S)
            try:
                # An abort may bump a producer to a new id: reserve ids here, off the event loop.
                await self.producer_ids.ensure_available()
            except StoreUnavailable as e:
                log.warning("cannot reserve producer ids: %(error)s", {"error": e})
                continue
            try:
                for job in self.sm.abort_timed_out():
                    await self.flush(job.transactional_id)
                    await self.finish(job)
                for job in self.sm.prepared_jobs():
                    await self.finish(job)  # markers that failed earlier
            except Exception:
                log.exception("transaction timeout check failed")

    async def _expire_loop(self) -> None:
        while True:
            await anyio.sleep(EXPIRE_CHECK_INTERVAL_S)
            try:
                expired = self.sm.expire_transactional_ids()
                if expired:
                    log.info("expired %(expired)d transactional ids", {"expired": len(expired)})
            except Exception:
                log.exception("transactional id expiration failed")
