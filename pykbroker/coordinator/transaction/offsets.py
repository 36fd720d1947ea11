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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.classic import ClassicGroup, GroupState
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
from pykbroker.coordinator.transaction.markers import CONTROL_COMMIT, append_internal, parse_control_key
from pykbroker.protocol.records import BatchHeader, build_batch

if TYPE_CHECKING:
    from pykbroker.coordinator.group.service import GroupCoordinator

log = logging.getLogger("pykbroker.txn")

OFFSETS_TOPIC = "__consumer_offsets"
TopicPartition = tuple[str, int]
KV = tuple[bytes | None, bytes | None]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class TxnLoadFilter:
    """Replays a ``__consumer_offsets`` partition honouring transactions (fed batch by batch)."""

    open: dict[int, list[KV]] = field(default_factory=dict)

    def feed(self, header: BatchHeader, records: list[KV]) -> list[KV]:
        """Records of this batch to apply now, in log order."""
        if header.is_control:
            held = self.open.pop(header.producer_id, [])
            commit = bool(records) and parse_control_key(records[0][0]) == CONTROL_COMMIT
            return held if commit else []
        if header.is_transactional:
            self.open.setdefault(header.producer_id, []).extend(records)
            return []
        return records


class TxnOffsets:
    """Pending transactional offsets, per producer id and group, for the group coordinator."""

    def __init__(self, groups: GroupCoordinator, clock: Callable[[], int] = now_ms) -> None:
        self.groups = groups
        self.clock = clock
        self.pending: dict[int, dict[str, dict[TopicPartition, OffsetValue]]] = {}

    def commit(self, group_id: str, producer_id: int, producer_epoch: int, generation_id: int, member_id: str,
               instance_id: str | None, entries: list[CommitEntry]) -> dict[TopicPartition, ErrorCode]:
        mgr = self.groups.manager

        def all_(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
            return {(e.topic, e.partition): code for e in entries}

        if not group_id:
            return all_(ErrorCode.invalid_group_id)
        err = mgr.coordinator_error(group_id)
        if err is not None:
            return all_(err)
        g = mgr.groups.get(group_id)
        if g is None:
            g = ClassicGroup(group_id, mgr.partition_for(group_id), state_timestamp=self.clock())
            mgr.groups[group_id] = g
        elif isinstance(g, ClassicGroup):
            if g.state == GroupState.DEAD:
                return all_(ErrorCode.coordinator_not_available)
            if member_id and member_id not in g.members:
                return all_(ErrorCode.unknown_member_id)
            if generation_id >= 0 and generation_id != g.generation_id:
                return all_(ErrorCode.illegal_generation)
            if instance_id is not None and g.static_member_id(instance_id) not in (None, member_id):
                return all_(ErrorCode.fenced_instance_id)
        elif mgr.consumer is not None:
            code = mgr.consumer.validate_commit(g, member_id, generation_id)
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
            p = self.groups.replicas.partition(OFFSETS_TOPIC, g.partition)
            if p is None or p.leader_id != self.groups.replicas.broker_id:
                return all_(ErrorCode.not_coordinator)
            buf = bytearray(build_batch(records, timestamp_ms=now, producer_id=producer_id,
                                        producer_epoch=producer_epoch, is_transactional=True))
            try:
                append_internal(p, buf)
            except Exception as e:
                code = getattr(e, "error_code", None)
                log.warning("transactional offset commit of group %s failed: %s", group_id, e)
                return all_(ErrorCode(code) if code is not None else ErrorCode.coordinator_not_available)
            self.groups.replicas.on_appended(p)
            self.pending.setdefault(producer_id, {}).setdefault(group_id, {}).update(values)
            for tp in values:
                result[tp] = ErrorCode.none
        return result

    def complete(self, partition: int, producer_id: int, commit: bool) -> None:
        """The marker for ``producer_id`` was written to ``__consumer_offsets``-``partition``."""
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

    def restore(self, partition: int, open_txns: dict[int, list[KV]]) -> None:
        """After loading a partition: its transactional offsets still waiting for a marker."""
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
                    log.warning("skipping undecodable transactional offset record: %s", e)
                    continue
                self.pending.setdefault(pid, {}).setdefault(k.group, {})[(k.topic, k.partition)] = v

    def pending_for(self, group_id: str) -> dict[TopicPartition, int]:
        """Partitions with a pending transactional offset in this group (producer id each)."""
        out: dict[TopicPartition, int] = {}
        for pid, by_group in self.pending.items():
            for tp in by_group.get(group_id, {}):
                out[tp] = pid
        return out
