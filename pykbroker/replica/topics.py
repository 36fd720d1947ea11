"""Topic administration: validation, replica assignment and applying metadata to local replicas.

CreateTopics, auto-creation from Metadata, DeleteTopics and CreatePartitions
all come through here, so that every path applies the same rules and error
codes.  Changes go to the metadata store first; this broker's partitions follow
from the store's change notifications.  In a ZooKeeper cluster those arrive
through watches, and each partition's role here follows its state: leader,
follower of the leader it names, or no replica at all (its log removed).  Admin
requests then wait, within their timeout, until this broker's cache shows the
change (:meth:`TopicManager.wait_until`), as Kafka's delayed admin operations do.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig, ConfigError, log_config_for, validate_topic_configs
from pykbroker.controller.assignment import AssignmentError, assign_new_partitions, assign_replicas
from pykbroker.logsetup import fields
from pykbroker.metadata.store import (
    BROKER_RESOURCE,
    MetadataStorageError,
    MetadataStore,
    PartitionAssignment,
    StoreUnavailable,
    TopicExists,
    TopicRecord,
    UnknownTopic,
    run_store,
    topic_name_problem,
)
from pykbroker.metadata.zk_layout import uuid_from_kafka, uuid_to_kafka
from pykbroker.replica.replica_manager import ReplicaManager
from pykbroker.storage.log import KafkaStorageError
from pykbroker.storage.log_config import LogConfig

log = logging.getLogger("pykbroker.topics")

MAX_PARTITIONS = 100_000
# Topics with at least this many partitions on this broker have their logs made on a worker thread.
PRECREATE_LOGS_FROM = 64


class TopicError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class TopicSpec:
    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    assignments: dict[int, list[int]] | None = None
    configs: dict[str, str | None] | None = None


def _storage_error(e: MetadataStorageError) -> TopicError:
    # The metadata store's log dir failed (it went offline, and the broker stops): Kafka's answer for a
    # request that met a failed log dir.
    return TopicError(ErrorCode.kafka_storage_error, f"The log dir holding the metadata failed: {e}")


def _store_unavailable(e: StoreUnavailable) -> TopicError:
    # Kafka answers a request it cannot complete for want of ZooKeeper with a retriable timeout.
    return TopicError(ErrorCode.request_timed_out, f"The metadata store is not reachable: {e}")


class TopicManager:
    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager) -> None:
        self.config = config
        self.store = store
        self.replicas = replicas
        self.cluster = store.is_cluster()
        # Set on every metadata change and replaced: what admin requests wait on (wait_until).
        self._changed = anyio.Event()
        store.add_listener(self._on_metadata_change)
        store.add_config_listener(self._on_config_change)
        if self.cluster:
            store.add_cluster_listener(self._wake_waiters)

    # --- waiting for the metadata to show a change ------------------------------------------------

    def _wake_waiters(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Until ``done()`` holds in this broker's metadata cache, at most ``timeout_s``; whether it held."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        for _ in range(100_000):  # each round waits for a metadata change or the deadline
            if done():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with anyio.move_on_after(min(left, 1.0)):  # re-checked at least every second
                await self._changed.wait()
        return done()

    def has_leaders(self, name: str, partitions: Callable[[int], bool] | None = None) -> bool:
        """Whether every (selected) partition of the topic has a live leader in the cache."""
        rec = self.store.topic(name)
        if rec is None:
            return False
        live = self.store.live_brokers()
        return all(a.leader in live for i, a in rec.partitions.items() if partitions is None or partitions(i))

    # --- applying metadata to this broker -------------------------------------------------------

    def load_all(self) -> None:
        """Open every partition this broker leads, as recorded in the metadata store."""
        self._apply_dynamic_broker_configs()
        for rec in self.store.topics().values():
            self._apply(rec)

    def _apply_dynamic_broker_configs(self) -> list[str]:
        """Install this broker's and the cluster default's dynamic configs into the BrokerConfig."""
        return self.config.apply_dynamic(
            self.store.configs_of(BROKER_RESOURCE, str(self.replicas.broker_id)),
            self.store.configs_of(BROKER_RESOURCE, ""),
        )

    def _on_config_change(self, resource_type: int, name: str) -> None:
        if resource_type != BROKER_RESOURCE or name not in ("", str(self.replicas.broker_id)):
            return
        changed = self._apply_dynamic_broker_configs()
        if changed:
            log.info("dynamic broker configs changed: %(configs)s", {"configs": ', '.join(changed)})
            # Every log's LogConfig falls back to the broker's values: recompute them all, as Kafka's
            # DynamicLogConfig does. The cleaner and retention read the logs' configs on each pass.
            for rec in self.store.topics().values():
                self._apply(rec)

    def _on_metadata_change(self, name: str, rec: TopicRecord | None) -> None:
        if rec is None:
            self.replicas.remove_topic(name)  # stops fetching it, deletes its logs
        else:
            self._apply(rec)
        self._wake_waiters()

    def _apply(self, rec: TopicRecord) -> None:
        """Take this broker's role in every partition of the topic: leader, follower or none.

        Cheap for partitions whose leader, epoch, replicas, ISR and state version are what this
        broker already has (a topic change notification carries every partition of the topic).
        """
        if self.cluster and not self.store.roles_confirmed():
            return  # a starting broker takes no role before the controller confirmed it (every topic follows)
        log_config = log_config_for(self.config, rec.configs)
        me = self.replicas.broker_id
        for index, a in rec.partitions.items():
            p = self.replicas.partition(rec.name, index)
            if p is not None and p.leader_id == a.leader and p.leader_epoch == a.leader_epoch \
                    and p.isr == a.isr and p.replicas == a.replicas \
                    and getattr(p, "zk_version", -1) == a.zk_version:
                # Unchanged role; a log loaded at startup was opened with the static config.
                if not p.log.offline and p.log.config != log_config:
                    p.log.update_config(log_config)
                continue
            if a.leader == me:
                self._make_leader(rec.name, index, log_config, a)
            elif not self.cluster:
                continue  # embedded metadata: every partition is led here
            elif me in a.replicas or me in a.adding_replicas:
                self.replicas.make_follower(
                    rec.name, index, log_config, leader_id=a.leader, leader_epoch=a.leader_epoch,
                    replicas=list(a.replicas), isr=list(a.isr), zk_version=a.zk_version)
            elif p is not None or self.replicas.is_offline(rec.name, index):
                log.info("no longer a replica of %(topic)s-%(partition)d (replicas %(replicas)s): removing it",
                         {"topic": rec.name, "partition": index, "replicas": a.replicas})
                self.replicas.stop_replica(rec.name, index, delete=True)
                continue
            if self.cluster and p is None:  # a replica new to this run: record which topic it belongs to
                opened = self.replicas.partition(rec.name, index)
                if opened is not None and not opened.log.offline:
                    write_partition_metadata(opened.log.dir, rec.topic_id)

    def _make_leader(self, topic: str, index: int, log_config: LogConfig, a: PartitionAssignment) -> None:
        p = self.replicas.make_leader(topic, index, log_config, leader_epoch=a.leader_epoch,
                                      replicas=a.replicas, isr=a.isr, zk_version=a.zk_version)
        # A log loaded at startup was opened with the static config: bring it up to date.
        if p is not None and not p.log.offline and p.log.config != log_config:
            p.log.update_config(log_config)

    def stray_logs(self) -> list[tuple[str, int]]:
        """Local logs of partitions this broker is not a replica of (cluster mode, after the caches load).

        Their topic was deleted while the broker was down, or they were reassigned away.
        """
        topics = self.store.topics()
        me = self.replicas.broker_id
        out = []
        for (topic, index), lg in self.replicas.log_manager.all_logs().items():
            rec = topics.get(topic)
            a = rec.partitions.get(index) if rec is not None else None
            if a is None or (me not in a.replicas and me not in a.adding_replicas):
                out.append((topic, index))
                continue
            assert rec is not None
            recorded = read_partition_metadata(lg.dir)
            if recorded is not None and recorded != rec.topic_id:
                log.info("the log of %(topic)s-%(partition)d belongs to an earlier topic of that name (topic id "
                         "%(recorded)s, now %(topic_id)s)",
                         {"topic": topic, "partition": index, "recorded": recorded, "topic_id": rec.topic_id})
                out.append((topic, index))
        return sorted(out)

    # --- validation -----------------------------------------------------------------------------

    def validate(self, spec: TopicSpec) -> tuple[dict[int, list[int]], dict[str, str]]:
        """Check a creation request; returns the replica assignment and normalised configs."""
        problem = topic_name_problem(spec.name)
        if problem:
            raise TopicError(ErrorCode.invalid_topic_exception, problem)
        if self.store.topic(spec.name) is not None:
            being_deleted: Callable[[], set[str]] | None = getattr(self.store, "topics_being_deleted", None)
            if being_deleted is not None and spec.name in being_deleted():
                raise TopicError(ErrorCode.topic_already_exists, f"Topic '{spec.name}' is marked for deletion.")
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{spec.name}' already exists.")
        brokers = sorted(self.store.live_brokers())
        if spec.assignments:
            if spec.num_partitions != -1 or spec.replication_factor != -1:
                raise TopicError(
                    ErrorCode.invalid_request,
                    "Both numPartitions or replicationFactor and replicasAssignments were set. "
                    "Both cannot be used at the same time.",
                )
            assignment = self._check_assignment(spec.assignments, brokers, start=0)
        else:
            n = self.config["num.partitions"] if spec.num_partitions == -1 else spec.num_partitions
            rf = self.config["default.replication.factor"] if spec.replication_factor == -1 \
                else spec.replication_factor
            if n <= 0:
                raise TopicError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0.")
            if n > MAX_PARTITIONS:
                raise TopicError(ErrorCode.invalid_partitions,
                                 f"Number of partitions must be at most {MAX_PARTITIONS}.")
            if rf <= 0:
                raise TopicError(ErrorCode.invalid_replication_factor, "Replication factor must be larger than 0.")
            if rf > len(brokers):
                raise TopicError(
                    ErrorCode.invalid_replication_factor,
                    f"Unable to replicate the partition {rf} time(s): The target replication factor of {rf} "
                    f"cannot be reached because only {len(brokers)} broker(s) are registered.",
                )
            assignment = self._assign(n, rf, start_partition=0)
        try:
            configs = validate_topic_configs(spec.configs or {}, self.config)
        except ConfigError as e:
            raise TopicError(ErrorCode.invalid_config, str(e)) from None
        return assignment, configs

    @staticmethod
    def _check_assignment(assignments: dict[int, list[int]], brokers: list[int], start: int) -> dict[int, list[int]]:
        expected = list(range(start, start + len(assignments)))
        if sorted(assignments) != expected:
            raise TopicError(
                ErrorCode.invalid_replica_assignment,
                "Partitions should be a consecutive 0-based integer sequence",
            )
        sizes = {len(r) for r in assignments.values()}
        if len(sizes) != 1 or 0 in sizes:
            raise TopicError(
                ErrorCode.invalid_replica_assignment,
                "All partitions should have the same number of replicas, and at least one",
            )
        for p, replicas in assignments.items():
            if len(set(replicas)) != len(replicas):
                raise TopicError(ErrorCode.invalid_replica_assignment,
                                 f"Duplicate brokers not allowed in replica assignment for partition {p}")
            unknown = [b for b in replicas if b not in brokers]
            if unknown:
                raise TopicError(ErrorCode.invalid_replica_assignment,
                                 f"Unknown broker(s) {unknown} in replica assignment for partition {p}")
        return {p: list(r) for p, r in assignments.items()}

    @staticmethod
    def assign_replicas(n: int, rf: int, brokers: list[int], *, start_partition: int) -> dict[int, list[int]]:
        """Round-robin placement, rotating the first replica (embedded metadata: one broker)."""
        out: dict[int, list[int]] = {}
        for i in range(n):
            p = start_partition + i
            first = p % len(brokers)
            out[p] = [brokers[(first + k) % len(brokers)] for k in range(rf)]
        return out

    def _assign(self, n: int, rf: int, *, start_partition: int,
                existing: dict[int, PartitionAssignment] | None = None) -> dict[int, list[int]]:
        """Replica placement for new partitions: Kafka's (rack-aware) algorithm in a cluster."""
        brokers = sorted(self.store.live_brokers())
        if not self.cluster:
            return self.assign_replicas(n, rf, brokers, start_partition=start_partition)

        racks = {b: self.store.broker_rack(b) for b in brokers}
        try:
            if existing:
                return assign_new_partitions(racks, {p: a.replicas for p, a in existing.items()}, start_partition + n)
            return assign_replicas(racks, n, rf, start_partition_id=start_partition)
        except AssignmentError as e:
            raise TopicError(ErrorCode(e.error_code), str(e)) from None

    # --- operations -----------------------------------------------------------------------------

    def _prepare(self, spec: TopicSpec) -> TopicRecord:
        assignment, configs = self.validate(spec)
        return TopicRecord(
            name=spec.name,
            topic_id=uuid.uuid4(),
            partitions={p: PartitionAssignment(replicas=r) for p, r in assignment.items()},
            configs=configs,
        )

    def create(self, spec: TopicSpec, *, validate_only: bool = False) -> TopicRecord:
        """Create a topic from the event loop with a store that does not block (embedded metadata)."""
        rec = self._prepare(spec)
        if validate_only:
            return rec
        try:
            self.store.create_topic(rec)
        except TopicExists:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{spec.name}' already exists.") from None
        except MetadataStorageError as e:
            raise _storage_error(e) from None
        log.info("created topic", extra=fields(topic=rec.name, partitions=len(rec.partitions), configs=rec.configs))
        return rec

    async def create_async(self, spec: TopicSpec, *, validate_only: bool = False) -> TopicRecord:
        """Create a topic; the store write runs off the event loop when it blocks (ZooKeeper)."""
        rec = self._prepare(spec)
        if validate_only:
            return rec
        made = await self._precreate_logs(rec)
        try:
            await run_store(self.store, self.store.create_topic, rec)
        except (TopicExists, StoreUnavailable) as e:
            for index in made:  # not this topic's after all
                self.replicas.log_manager.delete_log(rec.name, index)
            if isinstance(e, TopicExists):
                raise TopicError(ErrorCode.topic_already_exists, f"Topic '{spec.name}' already exists.") from None
            if isinstance(e, MetadataStorageError):
                raise _storage_error(e) from None
            raise _store_unavailable(e) from None
        log.info("created topic", extra=fields(
            topic=rec.name, topic_id=str(rec.topic_id), partitions=len(rec.partitions),
            replicas={p: a.replicas for p, a in sorted(rec.partitions.items())[:8]}, configs=rec.configs))
        return rec

    async def _precreate_logs(self, rec: TopicRecord) -> list[int]:
        """Create this broker's logs of a large new topic on a worker thread; returns the partitions made.

        A new log costs a directory, three files and an fsync'd leader-epoch checkpoint, about 2 ms
        here: done from the store's notification on the event loop, 10,000 partitions would stall
        every connection for 20 s. The notification then finds the logs made.
        """
        me = self.replicas.broker_id
        local = [i for i, a in sorted(rec.partitions.items()) if me in a.replicas]
        if len(local) < PRECREATE_LOGS_FROM:
            return []
        manager = self.replicas.log_manager
        log_config = log_config_for(self.config, rec.configs)

        def make() -> list[int]:
            made = []
            for index in local:
                if manager.get_log(rec.name, index) is not None:
                    continue
                try:
                    manager.get_or_create_log(rec.name, index, log_config)
                except KafkaStorageError:
                    continue  # reported; the notification's own attempt marks the partition offline
                made.append(index)
            return made

        return await anyio.to_thread.run_sync(make)

    async def wait_created(self, rec: TopicRecord, timeout_s: float) -> bool:
        """Until this broker's cache shows the new topic (same id) with a live leader for every partition."""
        def done() -> bool:
            cur = self.store.topic(rec.name)
            return cur is not None and cur.topic_id == rec.topic_id and self.has_leaders(rec.name)
        return await self.wait_until(done, timeout_s)

    async def maybe_auto_create(self, name: str) -> bool:
        """Metadata-triggered creation, per auto.create.topics.enable: True when the topic was created now
        (or by another broker at the same moment), False when auto-creation is off."""
        if not self.config["auto.create.topics.enable"]:
            return False
        if not self.cluster:
            self.create(TopicSpec(name))
            return True
        try:
            await self.create_async(TopicSpec(name))
        except TopicError as e:
            if e.code != ErrorCode.topic_already_exists:  # another broker created it meanwhile: fine
                raise
        return True

    async def delete(self, name: str) -> TopicRecord:
        if not self.config["delete.topic.enable"]:
            raise TopicError(ErrorCode.topic_deletion_disabled, "Topic deletion is disabled.")
        try:
            rec = await run_store(self.store, self.store.delete_topic, name)
        except UnknownTopic:
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             "This server does not host this topic-partition.") from None
        except StoreUnavailable as e:
            raise _store_unavailable(e) from None
        if self.cluster:
            log.info("marked topic for deletion", extra=fields(topic=name))
        return rec

    async def wait_deleted(self, rec: TopicRecord, timeout_s: float) -> bool:
        """Until this broker's cache no longer has that topic (by id: a re-creation does not count)."""
        def done() -> bool:
            cur = self.store.topic(rec.name)
            return cur is None or cur.topic_id != rec.topic_id
        return await self.wait_until(done, timeout_s)

    async def add_partitions(
        self, name: str, count: int, assignments: list[list[int]] | None, *, validate_only: bool
    ) -> range:
        """Add partitions up to ``count``; returns the indexes of the new partitions."""
        rec = self.store.topic(name)
        if rec is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition.")
        being_deleted: Callable[[], set[str]] | None = getattr(self.store, "topics_being_deleted", None)
        if being_deleted is not None and name in being_deleted():
            raise TopicError(ErrorCode.invalid_topic_exception, f"The topic {name} is queued for deletion.")
        current = len(rec.partitions)
        if count < current:
            raise TopicError(ErrorCode.invalid_partitions,
                             f"Topic currently has {current} partitions, which is higher than the requested {count}.")
        if count == current:
            raise TopicError(ErrorCode.invalid_partitions, f"Topic already has {current} partitions.")
        if count > MAX_PARTITIONS:
            raise TopicError(ErrorCode.invalid_partitions, f"Number of partitions must be at most {MAX_PARTITIONS}.")
        brokers = sorted(self.store.live_brokers())
        rf = len(next(iter(rec.partitions.values())).replicas)
        if assignments is not None:
            if len(assignments) != count - current:
                raise TopicError(
                    ErrorCode.invalid_replica_assignment,
                    f"Increasing the number of partitions by {count - current} but {len(assignments)} "
                    "assignments provided.",
                )
            new = self._check_assignment({current + i: a for i, a in enumerate(assignments)}, brokers, start=current)
            if any(len(r) != rf for r in new.values()):
                raise TopicError(ErrorCode.invalid_replica_assignment,
                                 f"Inconsistent replication factor between partitions, partition 0 has {rf}")
        else:
            if rf > len(brokers):
                raise TopicError(
                    ErrorCode.invalid_replication_factor,
                    f"Unable to replicate the partition {rf} time(s): The target replication factor of {rf} "
                    f"cannot be reached because only {len(brokers)} broker(s) are registered.",
                )
            new = self._assign(count - current, rf, start_partition=current, existing=rec.partitions)
        if validate_only:
            return range(current, count)
        try:
            await run_store(self.store, self.store.add_partitions, name,
                            {p: PartitionAssignment(replicas=r) for p, r in new.items()})
        except UnknownTopic:
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             "This server does not host this topic-partition.") from None
        except StoreUnavailable as e:
            raise _store_unavailable(e) from None
        log.info("added partitions", extra=fields(topic=name, partitions_before=current, partitions=count))
        return range(current, count)



PARTITION_METADATA = "partition.metadata"


def write_partition_metadata(log_dir: Path, topic_id: uuid.UUID) -> None:
    """Kafka's ``partition.metadata`` (the topic id of a partition's log), written once per replica.

    It tells a log of a deleted-and-recreated topic from the new topic's (see stray_logs).
    """
    path = log_dir / PARTITION_METADATA
    try:
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(f"version: 0\ntopic_id: {uuid_to_kafka(topic_id)}\n")
            tmp.replace(path)
    except OSError as e:  # the log dir's failure shows elsewhere (its next read or write)
        log.warning("could not write %(path)s: %(error)s", {"path": path, "error": e})


def read_partition_metadata(log_dir: Path) -> uuid.UUID | None:
    """The topic id recorded in a log dir's ``partition.metadata``, or None when absent or unreadable."""
    try:
        text = (log_dir / PARTITION_METADATA).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            try:
                return uuid_from_kafka(value.strip())
            except ValueError:
                return None
    return None


def timeout_ms_of(value: object) -> int:
    """A request's TimeoutMs field (kio gives a timedelta) in milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    return int(value)  # type: ignore[call-overload]


def timeout_s(timeout_ms: int) -> float:
    """A request's timeout_ms as seconds to wait (0 or less: do not wait)."""
    return max(0, int(timeout_ms)) / 1000
