"""Transactional offset commits (TxnOffsetCommit): offsets that become visible only on commit.

The group coordinator's ``__consumer_offsets`` partition gets the offset records as a
transactional batch of the producer (so the log holds them like any transactional write); they
are kept pending per producer id and become the group's committed offsets when the commit
marker is written to that partition, or are dropped on abort.  On load, :class:`TxnLoadFilter`
holds transactional records back until their marker: committed ones are replayed at the
marker's position, aborted ones dropped, open ones handed back as pending.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.classic import ClassicGroup
from pykbroker.coordinator.group.manager import CommitEntry
from pykbroker.coordinator.group.serde import (
    OffsetKey,
    OffsetValue,
    SerdeError,
    decode_key,
    decode_offset_value,
    encode_offset_key,
    encode_offset_value,
)
from pykbroker.coordinator.transaction.markers import append_internal
from pykbroker.coordinator.transaction.verification import opens_transaction
from pykbroker.protocol.records import build_batch

if TYPE_CHECKING:
    from pykbroker.coordinator.group.service import GroupCoordinator

log = logging.getLogger("pykbroker.txn")

OFFSETS_TOPIC = "__consumer_offsets"
TopicPartition = tuple[str, int]
KV = tuple[bytes | None, bytes | None]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# How Kafka's group coordinator answers an offset commit whose append, or whose transaction's
# verification, failed (GroupMetadataManager.maybeConvertOffsetCommitError); other codes as they are.
_COMMIT_ERRORS = {
    ErrorCode.network_exception: ErrorCode.coordinator_load_in_progress,  # retried without a coordinator lookup
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.message_too_large: ErrorCode.invalid_commit_offset_size,
    ErrorCode.record_list_too_large: ErrorCode.invalid_commit_offset_size,
    ErrorCode.invalid_fetch_size: ErrorCode.invalid_commit_offset_size,
}
ABORTABLE_SINCE = 4  # TxnOffsetCommit v4 knows TRANSACTION_ABORTABLE (KIP-890)

# The transaction coordinator's answer whether a partition is in a producer's transaction
# (transactional id, producer id, epoch, partition): AddPartitionsToTxn ``verify_only``.
Verify = Callable[[str, int, int, TopicPartition], Awaitable[ErrorCode]]


def offset_commit_error(code: ErrorCode) -> ErrorCode:
    return _COMMIT_ERRORS.get(code, code)


def verification_error(code: ErrorCode, version: int) -> ErrorCode:
    """TxnOffsetCommit's error when the offsets partition failed verification: as a partition leader
    reports the coordinator's answer (a fenced epoch is INVALID_PRODUCER_EPOCH, TRANSACTION_ABORTABLE
    only to versions that know it), then as any failed offset commit."""
    if code == ErrorCode.producer_fenced:
        code = ErrorCode.invalid_producer_epoch
    elif code == ErrorCode.transaction_abortable and version < ABORTABLE_SINCE:
        code = ErrorCode.invalid_txn_state
    return offset_commit_error(code)


@dataclass(eq=False)
class VerificationGuard:
    """A TxnOffsetCommit between its verification and its append.  A marker of its producer on the
    offsets partition meanwhile ends the transaction that was verified: the guard is cleared and the
    append, which would open a transaction no marker will end, refused (Kafka's verification guard)."""

    cleared: bool = False


class TxnOffsets:
    """Pending transactional offsets, per producer id and group, for the group coordinator."""

    def __init__(self, groups: GroupCoordinator, clock: Callable[[], int] = now_ms, verify: Verify | None = None
                 ) -> None:
        self.groups = groups
        self.clock = clock
        self.verify = verify  # None: nothing to verify against (no transaction coordinator)
        self.pending: dict[int, dict[str, dict[TopicPartition, OffsetValue]]] = {}
        self._guards: dict[tuple[int, int], list[VerificationGuard]] = {}

    async def commit(self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
                     generation_id: int, member_id: str, instance_id: str | None, entries: list[CommitEntry],
                     version: int) -> dict[TopicPartition, ErrorCode]:
        """A TxnOffsetCommit, in Kafka's order: the group coordinator's own checks, then (KIP-890) the
        transaction coordinator's word that the group's offsets partition is in the producer's transaction,
        then the group's member and generation (KIP-447), then the transactional append.

        Whether this broker also coordinates the transactional id changes only where the answer comes
        from, never the answer.  With ``transaction.partition.verification.enable`` off the producer is
        checked only by the offsets partition's producer state, as in Kafka.
        """
        def all_(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            return {(e.topic, e.partition): code for e in entries}

        if not group_id:
            return all_(ErrorCode.invalid_group_id)
        mgr = self.groups.manager
        err = mgr.coordinator_error(group_id)
        if err is not None:
            return all_(err)
        partition = mgr.partition_for(group_id)
        if not self._needs_verification(partition, producer_id, producer_epoch):
            return self._commit(group_id, partition, producer_id, producer_epoch, generation_id, member_id,
                                instance_id, entries, None)
        assert self.verify is not None
        guard = VerificationGuard()
        key = (partition, producer_id)
        self._guards.setdefault(key, []).append(guard)
        try:
            code = await self.verify(transactional_id, producer_id, producer_epoch, (OFFSETS_TOPIC, partition))
            if code != ErrorCode.none:
                return all_(verification_error(code, version))
            return self._commit(group_id, partition, producer_id, producer_epoch, generation_id, member_id,
                                instance_id, entries, guard)
        finally:
            waiting = self._guards.get(key)
            if waiting is not None and guard in waiting:
                waiting.remove(guard)
                if not waiting:
                    del self._guards[key]

    def _needs_verification(self, partition: int, producer_id: int, producer_epoch: int) -> bool:
        if self.verify is None or not self.groups.config["transaction.partition.verification.enable"]:
            return False
        p = self.groups.replicas.partition(OFFSETS_TOPIC, partition)
        if p is None or p.leader_id != self.groups.replicas.broker_id:
            return False  # not leading it: the append answers NOT_COORDINATOR
        return opens_transaction(p, producer_id, producer_epoch)

    def _commit(self, group_id: str, partition: int, producer_id: int, producer_epoch: int, generation_id: int,
                member_id: str, instance_id: str | None, entries: list[CommitEntry],
                guard: VerificationGuard | None) -> dict[TopicPartition, ErrorCode]:
        """The checks after verification, and the append; nothing awaited from here on."""
        mgr = self.groups.manager

        def all_(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            return {(e.topic, e.partition): code for e in entries}

        err = mgr.coordinator_error(group_id)  # again: the partition may have moved during verification
        if err is not None:
            return all_(err)
        g = mgr.groups.get(group_id)
        new_group = g is None
        if g is None:
            g = ClassicGroup(group_id, partition, state_timestamp=self.clock())
        if isinstance(g, ClassicGroup):
            code = mgr.validate_classic_commit(g, generation_id, member_id, instance_id, transactional=True)
        else:
            code = mgr.consumer.validate_commit(g, member_id, generation_id) if mgr.consumer is not None else None
        if code is not None:
            return all_(code)
        now = self.clock()
        result: dict[TopicPartition, ErrorCode] = {}
        values: dict[TopicPartition, OffsetValue] = {}
        records: list[tuple[bytes | None, bytes | None, tuple[()]]] = []
        for e in entries:
            tp = (e.topic, e.partition)
            if e.metadata is not None and len(e.metadata.encode()) > mgr.config.offset_metadata_max_bytes:
                result[tp] = ErrorCode.offset_metadata_too_large
                continue
            v = OffsetValue(e.offset, e.leader_epoch, e.metadata or "", now, -1)
            values[tp] = v
            records.append((encode_offset_key(group_id, e.topic, e.partition), encode_offset_value(v), ()))
        if records:
            p = self.groups.replicas.partition(OFFSETS_TOPIC, partition)
            if p is None or p.leader_id != self.groups.replicas.broker_id:
                return all_(ErrorCode.not_coordinator)
            if guard is not None and guard.cleared and opens_transaction(p, producer_id, producer_epoch):
                log.info("transactional offset commit of group %(group_id)s: the verified transaction of producer "
                         "%(producer_id)d ended before the append",
                         {"group_id": group_id, "producer_id": producer_id})
                return all_(ErrorCode.invalid_txn_state)
            buf = bytearray(build_batch(records, timestamp_ms=now, producer_id=producer_id,
                                        producer_epoch=producer_epoch, is_transactional=True))
            try:
                append_internal(p, buf)
            except Exception as e:
                code = getattr(e, "error_code", None)
                log.warning("transactional offset commit of group %(group_id)s failed: %(error)s",
                            {"group_id": group_id, "error": e})
                return all_(offset_commit_error(ErrorCode(code)) if code is not None
                            else ErrorCode.coordinator_not_available)
            self.groups.replicas.on_appended(p)
            if new_group:
                mgr.groups[group_id] = g
            self.pending.setdefault(producer_id, {}).setdefault(group_id, {}).update(values)
            for tp in values:
                result[tp] = ErrorCode.none
        return result

    def complete(self, partition: int, producer_id: int, commit: bool) -> None:
        """The marker for ``producer_id`` was written to ``__consumer_offsets``-``partition``."""
        for guard in self._guards.pop((partition, producer_id), ()):
            guard.cleared = True
        by_group = self.pending.get(producer_id)
        if not by_group:
            return
        mgr = self.groups.manager
        for gid in [g for g in by_group if mgr.partition_for(g) == partition]:
            values = by_group.pop(gid)
            if commit:
                self._apply(gid, partition, values)
        if not by_group:
            self.pending.pop(producer_id, None)

    def _apply(self, group_id: str, partition: int, values: dict[TopicPartition, OffsetValue]) -> None:
        mgr = self.groups.manager
        if mgr.partitions.get(partition) is None:
            return
        if group_id not in mgr.groups:
            mgr.groups[group_id] = ClassicGroup(group_id, partition, state_timestamp=self.clock())
        mgr.offsets.setdefault(group_id, {}).update(values)

    def unload(self, partition: int) -> None:
        """This broker no longer leads the offsets ``partition``: the offsets pending there are the next leader's
        to settle (their markers land there). Kept, the producer's next commit marker here, once this broker
        leads the partition again, would apply them over what the log says since."""
        mgr = self.groups.manager
        for pid in list(self.pending):
            by_group = self.pending[pid]
            for gid in [g for g in by_group if mgr.partition_for(g) == partition]:
                del by_group[gid]
            if not by_group:
                del self.pending[pid]

    def restore(self, partition: int, open_txns: dict[int, list[KV]]) -> None:
        """After loading a partition: its transactional offsets still waiting for a marker (the log's word
        alone: nothing of an earlier leadership is kept)."""
        self.unload(partition)
        for pid, records in open_txns.items():
            for key, value in records:
                if key is None or value is None:
                    continue
                try:
                    k = decode_key(key)
                    if not isinstance(k, OffsetKey):
                        continue
                    v = decode_offset_value(value)
                except (SerdeError, UnicodeDecodeError) as e:
                    log.warning("skipping undecodable transactional offset record: %(error)s", {"error": e})
                    continue
                self.pending.setdefault(pid, {}).setdefault(k.group, {})[(k.topic, k.partition)] = v

    def pending_for(self, group_id: str) -> dict[TopicPartition, int]:
        """Partitions with a pending transactional offset in this group (producer id each)."""
        out: dict[TopicPartition, int] = {}
        for pid, by_group in self.pending.items():
            for tp in by_group.get(group_id, {}):
                out[tp] = pid
        return out
