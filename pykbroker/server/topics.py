"""Topic administration: validation, replica assignment and applying metadata to local replicas.

CreateTopics, auto-creation from Metadata, DeleteTopics and CreatePartitions
all come through here, so that every path applies the same rules and error
codes.  Changes go to the metadata store first; this broker's partitions follow
from the store's change notifications, which is how they will follow
ZooKeeper's too.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig, ConfigError, log_config_for, validate_topic_configs
from pykbroker.metadata.store import (
    BROKER_RESOURCE,
    MetadataStore,
    PartitionAssignment,
    TopicExists,
    TopicRecord,
    UnknownTopic,
    topic_name_problem,
)
from pykbroker.server.replica_manager import ReplicaManager

log = logging.getLogger("pykbroker.topics")

MAX_PARTITIONS = 100_000


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


class TopicManager:
    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager) -> None:
        self.config = config
        self.store = store
        self.replicas = replicas
        store.add_listener(self._on_metadata_change)
        store.add_config_listener(self._on_config_change)

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
            log.info("dynamic broker configs changed: %s", ", ".join(changed))
            # Every log's LogConfig falls back to the broker's values: recompute them all, as Kafka's
            # DynamicLogConfig does. The cleaner and retention read the logs' configs on each pass.
            for rec in self.store.topics().values():
                self._apply(rec)

    def _on_metadata_change(self, name: str, rec: TopicRecord | None) -> None:
        if rec is None:
            self.replicas.remove_topic(name)
        else:
            self._apply(rec)

    def _apply(self, rec: TopicRecord) -> None:
        log_config = log_config_for(self.config, rec.configs)
        for index, a in rec.partitions.items():
            if a.leader == self.replicas.broker_id:
                p = self.replicas.make_leader(
                    rec.name, index, log_config, leader_epoch=a.leader_epoch, replicas=a.replicas, isr=a.isr
                )
                # A log loaded at startup was opened with the static config: bring it up to date.
                if p is not None and not p.log.offline and p.log.config != log_config:
                    p.log.update_config(log_config)

    # --- validation -----------------------------------------------------------------------------

    def validate(self, spec: TopicSpec) -> tuple[dict[int, list[int]], dict[str, str]]:
        """Check a creation request; returns the replica assignment and normalised configs."""
        problem = topic_name_problem(spec.name)
        if problem:
            raise TopicError(ErrorCode.invalid_topic_exception, problem)
        if self.store.topic(spec.name) is not None:
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
            assignment = self.assign_replicas(n, rf, brokers, start_partition=0)
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
        """Round-robin placement, rotating the first replica (Kafka's rack-unaware scheme, simplified)."""
        out: dict[int, list[int]] = {}
        for i in range(n):
            p = start_partition + i
            first = p % len(brokers)
            out[p] = [brokers[(first + k) % len(brokers)] for k in range(rf)]
        return out

    # --- operations -----------------------------------------------------------------------------

    def create(self, spec: TopicSpec, *, validate_only: bool = False) -> TopicRecord:
        assignment, configs = self.validate(spec)
        rec = TopicRecord(
            name=spec.name,
            topic_id=uuid.uuid4(),
            partitions={p: PartitionAssignment(replicas=r) for p, r in assignment.items()},
            configs=configs,
        )
        if validate_only:
            return rec
        try:
            self.store.create_topic(rec)
        except TopicExists:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{spec.name}' already exists.") from None
        log.info("created topic=%s partitions=%d configs=%s", rec.name, len(rec.partitions), configs)
        return rec

    def maybe_auto_create(self, name: str) -> TopicRecord | None:
        """Metadata-triggered creation, per auto.create.topics.enable; None when not allowed."""
        if not self.config["auto.create.topics.enable"]:
            return None
        return self.create(TopicSpec(name))

    def delete(self, name: str) -> TopicRecord:
        if not self.config["delete.topic.enable"]:
            raise TopicError(ErrorCode.topic_deletion_disabled, "Topic deletion is disabled.")
        try:
            return self.store.delete_topic(name)
        except UnknownTopic:
            raise TopicError(ErrorCode.unknown_topic_or_partition,
                             "This server does not host this topic-partition.") from None

    def add_partitions(
        self, name: str, count: int, assignments: list[list[int]] | None, *, validate_only: bool
    ) -> None:
        rec = self.store.topic(name)
        if rec is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, "This server does not host this topic-partition.")
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
            new = self.assign_replicas(count - current, rf, brokers, start_partition=current)
        if validate_only:
            return
        self.store.add_partitions(name, {p: PartitionAssignment(replicas=r) for p, r in new.items()})
        log.info("added partitions topic=%s from=%d to=%d", name, current, count)
