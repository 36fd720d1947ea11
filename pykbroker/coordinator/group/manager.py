"""The group coordinator's core, with no I/O: groups, offsets, timers and records to persist.

Everything here is driven by method calls and an injected clock.  Delayed answers
(JoinGroup, SyncGroup) are delivered through callbacks; timers live in :class:`Timers`
and fire from :meth:`GroupManager.tick`.  Writes to ``__consumer_offsets`` go through the
injected ``writer`` (partition, [(key, value-or-None)]), which raises on failure; state
changes are applied only after it returns, so memory never runs ahead of the log.

Semantics follow Kafka's classic group coordinator (GroupCoordinator/ClassicGroup), including
its error codes per state.  :class:`GroupManager` adds loading a partition's records, offset
commits and fetches, the admin operations and offset expiry to the classic protocol
(:mod:`.classic_protocol`) and the coordinator's state (:mod:`.coordinator_state`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.classic import ClassicGroup, ClassicMember, GroupState
from pykbroker.coordinator.group.classic_protocol import ClassicGroupCoordinator
from pykbroker.coordinator.group.coordinator_state import PARTITION_ACTIVE, PARTITION_LOADING, TopicPartition
from pykbroker.coordinator.group.serde import (
    GroupKey,
    GroupValue,
    OffsetKey,
    OffsetValue,
    SerdeError,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_offset_key,
    encode_offset_value,
)
from pykbroker.protocol.responses.group import DescribeGroupsDescribedGroup, ListedGroup

log = logging.getLogger("pykbroker.groups")


class CoordinatorError(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


@dataclass
class CommitEntry:
    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""


class GroupManager(ClassicGroupCoordinator):
    """The group coordinator's core: the classic protocol plus loading, offsets, admin and offset expiry."""

    # --- loading (the coordinator's ownership of __consumer_offsets) -------------------------------

    def begin_loading(self, partition: int) -> None:
        self.partitions[partition] = PARTITION_LOADING

    def load_records(self, partition: int, records: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        """Replay ``(key, value)`` records of one partition in log order."""
        groups: dict[str, GroupValue | None] = {}
        offsets: dict[str, dict[TopicPartition, OffsetValue | None]] = {}
        for key, value in records:
            if key is None:
                continue
            try:
                k = decode_key(key)
                if isinstance(k, OffsetKey):
                    offsets.setdefault(k.group, {})[(k.topic, k.partition)] = (
                        None if value is None else decode_offset_value(value))
                elif isinstance(k, GroupKey):
                    groups[k.group] = None if value is None else decode_group_value(value)
                elif self.consumer is not None:
                    self.consumer.replay(partition, key, value)
            except (SerdeError, UnicodeDecodeError) as e:
                log.warning("skipping an undecodable __consumer_offsets record of partition %(partition)d: %(error)s",
                            {"partition": partition, "error": e})
        now = self.clock()
        for gid, gv in groups.items():
            if gv is None:
                continue
            self.groups[gid] = self._group_from_record(gid, partition, gv, now)
        if self.consumer is not None:
            self.consumer.finish_loading(partition)
        for gid, offs in offsets.items():
            live = {tp: v for tp, v in offs.items() if v is not None}
            if not live:
                continue
            self.offsets[gid] = live
            if gid not in self.groups:
                g = ClassicGroup(gid, partition, state_timestamp=now)
                self.groups[gid] = g

    def finish_loading(self, partition: int) -> None:
        self.partitions[partition] = PARTITION_ACTIVE
        self.on_timers_changed()

    def unload(self, partition: int) -> None:
        self.partitions.pop(partition, None)
        for gid in [g for g, grp in self.groups.items() if grp.partition == partition]:
            grp = self.groups.pop(gid)
            self.offsets.pop(gid, None)
            if isinstance(grp, ClassicGroup):
                for m in list(grp.members.values()):
                    self.timers.cancel(("hb", gid, m.member_id))
                    self._respond_join(m, {"error_code": ErrorCode.not_coordinator, "protocol_name": None,
                                           "leader": "", "member_id": "", "members": []})
                    self._respond_sync(m, {"error_code": ErrorCode.not_coordinator, "assignment": b""})
                self.timers.cancel(("join", gid))
                self.timers.cancel(("sync", gid))
                grp.transition(GroupState.DEAD, self.clock())
            elif self.consumer is not None:
                self.consumer.unload_group(grp)

    def _group_from_record(self, gid: str, partition: int, gv: GroupValue, now: int) -> ClassicGroup:
        g = ClassicGroup(gid, partition, state_timestamp=gv.current_state_timestamp if gv.current_state_timestamp
                         >= 0 else now)
        g.protocol_type = gv.protocol_type or None
        g.protocol_name = gv.protocol
        g.generation_id = gv.generation
        g.persisted = True
        for mr in gv.members:
            m = ClassicMember(mr.member_id, mr.group_instance_id, mr.client_id, mr.client_host,
                              mr.rebalance_timeout, mr.session_timeout, gv.protocol_type,
                              [(gv.protocol or "", mr.subscription)], assignment=mr.assignment)
            g.members[m.member_id] = m
            if m.group_instance_id is not None:
                g.static_members[m.group_instance_id] = m.member_id
        g.leader_id = gv.leader if gv.leader in g.members else next(iter(g.members), None)
        if g.members:
            g.state = GroupState.STABLE
            g.compute_subscriptions()
            for m in g.members.values():
                self._schedule_heartbeat(g, m, m.session_timeout_ms)
        else:
            g.state = GroupState.EMPTY
        return g

    # --- offsets -----------------------------------------------------------------------------

    def commit_offsets(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
                       entries: list[CommitEntry], retention_ms: int = -1) -> dict[TopicPartition, ErrorCode]:
        """Validate, write and make visible at once (embedded mode, tests); see prepare_commit."""
        result, values = self.prepare_commit(group_id, generation_id, member_id, instance_id, entries, retention_ms)
        self.complete_commit(group_id, values)
        return result

    def complete_commit(self, group_id: str, values: dict[TopicPartition, OffsetValue]) -> None:
        """Make written offsets visible to OffsetFetch: after their append is durable (replicated), as Kafka
        keeps a commit pending until its append completes.  Nothing if the partition moved meanwhile."""
        if values and self.coordinator_error(group_id) is None:
            self.offsets.setdefault(group_id, {}).update(values)

    def prepare_commit(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
                       entries: list[CommitEntry], retention_ms: int = -1
                       ) -> tuple[dict[TopicPartition, ErrorCode], dict[TopicPartition, OffsetValue]]:
        """Validate and append an offset commit; the values still to pass to :meth:`complete_commit`."""
        def all_(code: ErrorCode) -> tuple[dict[TopicPartition, ErrorCode], dict[TopicPartition, OffsetValue]]:
            return {(e.topic, e.partition): code for e in entries}, {}

        err = self.coordinator_error(group_id)
        if not group_id:
            err = ErrorCode.invalid_group_id
        if err is not None:
            return all_(err)
        g = self.groups.get(group_id)
        if g is not None and not isinstance(g, ClassicGroup):
            assert self.consumer is not None
            code = self.consumer.validate_commit(g, member_id, generation_id)
            if code is not None:
                return all_(code)
        elif g is None:
            if generation_id >= 0:
                return all_(ErrorCode.illegal_generation)
            g = ClassicGroup(group_id, self.partition_for(group_id), state_timestamp=self.clock())
            self.groups[group_id] = g
        else:
            code = self.validate_classic_commit(g, generation_id, member_id, instance_id)
            if code is not None:
                return all_(code)
        now = self.clock()
        result: dict[TopicPartition, ErrorCode] = {}
        records: list[tuple[bytes, bytes | None]] = []
        values: dict[TopicPartition, OffsetValue] = {}
        for e in entries:
            tp = (e.topic, e.partition)
            if e.metadata is not None and len(e.metadata.encode()) > self.config.offset_metadata_max_bytes:
                result[tp] = ErrorCode.offset_metadata_too_large
                continue
            v = OffsetValue(e.offset, e.leader_epoch, e.metadata or "", now,
                            now + retention_ms if retention_ms >= 0 else -1)
            values[tp] = v
            records.append((encode_offset_key(group_id, e.topic, e.partition), encode_offset_value(v)))
        if records:
            try:
                self.writer(g.partition, records)
            except Exception:
                log.exception("failed to persist offsets of group %(group_id)s", {"group_id": group_id})
                for tp in values:
                    result[tp] = ErrorCode.coordinator_not_available
                return result, {}
            for tp in values:
                result[tp] = ErrorCode.none
        return result, values

    def validate_classic_commit(self, g: ClassicGroup, generation_id: int, member_id: str,
                                instance_id: str | None, *, transactional: bool = False) -> ErrorCode | None:
        """Kafka's ClassicGroup.validateOffsetCommit, in its order: the member and its generation are
        checked before the state, so a commit from an older generation gets ILLEGAL_GENERATION even while
        the group completes a rebalance (REBALANCE_IN_PROGRESS only for the current generation).

        A transactional commit (TxnOffsetCommit) is checked only when it names a generation, member or
        instance (KIP-447): versions before 3 name none, so without them it is accepted in any state."""
        if g.state == GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and g.state == GroupState.EMPTY:
            return None  # the admin client or a consumer without group management
        if generation_id >= 0 or member_id or instance_id is not None:
            err = self.validate_member(g, member_id, instance_id)
            if err is not None:
                return err
            if generation_id != g.generation_id:
                return ErrorCode.illegal_generation
        elif transactional:
            return None
        elif g.state != GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        if transactional:
            return None
        if g.state == GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        m = g.members.get(member_id)
        if m is not None:
            self._schedule_heartbeat(g, m)
        return None

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None,
                      member_id: str | None = None, member_epoch: int = -1
                      ) -> tuple[ErrorCode, list[tuple[TopicPartition, OffsetValue | None]]]:
        """(group error, [(tp, committed or None)]); ``partitions=None`` means every committed offset."""
        err = self.coordinator_error(group_id)
        if err is not None:
            return err, []
        g = self.groups.get(group_id)
        if g is not None and not isinstance(g, ClassicGroup) and member_id is not None:
            assert self.consumer is not None
            code = self.consumer.validate_fetch(g, member_id, member_epoch)
            if code is not None:
                return code, []
        offs = self.offsets.get(group_id, {})
        if partitions is None:
            return ErrorCode.none, sorted(offs.items())
        return ErrorCode.none, [(tp, offs.get(tp)) for tp in partitions]

    def unstable_offsets(self, group_id: str) -> set[TopicPartition]:
        """Partitions whose offset commit is pending in an open transaction (UNSTABLE_OFFSET_COMMIT)."""
        return set(self.pending_txn_offsets(group_id))

    def delete_offsets(self, group_id: str, partitions: list[TopicPartition]
                       ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        err = self.coordinator_error(group_id)
        if err is not None:
            return err, {}
        g = self.groups.get(group_id)
        if g is None:
            return ErrorCode.group_id_not_found, {}
        if isinstance(g, ClassicGroup):
            if g.state == GroupState.DEAD:
                return ErrorCode.group_id_not_found, {}
            if g.state != GroupState.EMPTY and g.protocol_type != "consumer":
                return ErrorCode.non_empty_group, {}
            subscribed = g.is_subscribed_to
        else:
            subscribed = g.is_subscribed_to
        out: dict[TopicPartition, ErrorCode] = {}
        records: list[tuple[bytes, bytes | None]] = []
        offs = self.offsets.get(group_id, {})
        to_delete = []
        for tp in partitions:
            if subscribed(tp[0]):
                out[tp] = ErrorCode.group_subscribed_to_topic
                continue
            out[tp] = ErrorCode.none
            if tp in offs:
                to_delete.append(tp)
                records.append((encode_offset_key(group_id, tp[0], tp[1]), None))
        if records:
            self.writer(g.partition, records)
            for tp in to_delete:
                offs.pop(tp, None)
        return ErrorCode.none, out

    # --- admin -------------------------------------------------------------------------------

    def delete_groups(self, group_ids: list[str]) -> dict[str, ErrorCode]:
        out: dict[str, ErrorCode] = {}
        for gid in group_ids:
            err = self.coordinator_error(gid)
            if err is not None:
                out[gid] = err
                continue
            g = self.groups.get(gid)
            if g is None or (isinstance(g, ClassicGroup) and g.state == GroupState.DEAD):
                out[gid] = ErrorCode.group_id_not_found
                continue
            if isinstance(g, ClassicGroup):
                if g.state != GroupState.EMPTY:
                    out[gid] = ErrorCode.non_empty_group
                    continue
            elif not g.is_empty():
                out[gid] = ErrorCode.non_empty_group
                continue
            try:
                self._delete_group(gid)
            except Exception:
                log.exception("failed to delete group %(group_id)s", {"group_id": gid})
                out[gid] = ErrorCode.coordinator_not_available
                continue
            out[gid] = ErrorCode.none
        return out

    def _delete_group(self, gid: str) -> None:
        g = self.groups[gid]
        records: list[tuple[bytes, bytes | None]] = [
            (encode_offset_key(gid, t, p), None) for (t, p) in self.offsets.get(gid, {})]
        if isinstance(g, ClassicGroup):
            if g.persisted:
                records.append((encode_group_key(gid), None))
        else:
            records += g.tombstones()
        if records:
            self.writer(g.partition, records)
        self.offsets.pop(gid, None)
        del self.groups[gid]
        if isinstance(g, ClassicGroup):
            g.transition(GroupState.DEAD, self.clock())
            self.timers.cancel(("join", gid))
            self.timers.cancel(("sync", gid))
        log.info("deleted group %(group_id)s", {"group_id": gid})

    def list_groups(self, states: set[str] | None = None, types: set[str] | None = None
                    ) -> list[ListedGroup]:
        out: list[ListedGroup] = []
        for gid, g in self.groups.items():
            if self.partitions.get(g.partition) != PARTITION_ACTIVE:
                continue
            if isinstance(g, ClassicGroup):
                state, ptype = g.state.value, g.protocol_type or ""
                if g.state == GroupState.DEAD:
                    continue
            else:
                state, ptype = g.state_name(), "consumer"
            if states and state.lower() not in states:
                continue
            if types and g.kind not in types:
                continue
            out.append({"group_id": gid, "protocol_type": ptype, "group_state": state, "group_type": g.kind})
        return out

    def describe_group(self, gid: str) -> DescribeGroupsDescribedGroup:
        err = self.coordinator_error(gid)
        base: DescribeGroupsDescribedGroup = {"error_code": ErrorCode.none, "error_message": None, "group_id": gid,
                                              "group_state": "Dead", "protocol_type": "", "protocol_data": "",
                                              "members": [], "authorized_operations": -2147483648}
        if err is not None:
            base["error_code"] = err
            return base
        g = self.groups.get(gid)
        if g is None:
            base["error_code"] = ErrorCode.group_id_not_found
            return base
        if not isinstance(g, ClassicGroup):
            state, members = g.describe_as_classic()
            base.update({"group_state": state, "protocol_type": "consumer", "protocol_data": "", "members": members})
            return base
        base["group_state"] = g.state.value
        base["protocol_type"] = g.protocol_type or ""
        stable = g.state == GroupState.STABLE
        base["protocol_data"] = (g.protocol_name or "") if stable else ""
        base["members"] = [{
            "member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
            "client_host": m.client_host,
            "member_metadata": m.metadata(g.protocol_name) if stable else b"",
            "member_assignment": m.assignment if stable else b"",
        } for m in g.members.values()]
        return base

    # --- offset expiration -------------------------------------------------------------------

    def expire_offsets(self) -> int:
        """Tombstone expired offsets and drop empty groups with none left; returns how many expired."""
        now = self.clock()
        retention = self.config.offsets_retention_ms
        expired_total = 0
        for gid in list(self.groups):
            g = self.groups[gid]
            if self.partitions.get(g.partition) != PARTITION_ACTIVE:
                continue
            offs = self.offsets.get(gid, {})
            if isinstance(g, ClassicGroup):
                if g.state == GroupState.EMPTY:
                    use_state_ts = g.protocol_type is not None
                    candidates = list(offs)
                elif g.protocol_type == "consumer" and g.state == GroupState.STABLE and g.subscribed is not None:
                    use_state_ts = False
                    candidates = [tp for tp in offs if tp[0] not in g.subscribed]
                else:
                    candidates = []
                    use_state_ts = False
            else:
                use_state_ts = g.is_empty()
                candidates = list(offs) if g.is_empty() else [tp for tp in offs if not g.is_subscribed_to(tp[0])]
            expired = []
            for tp in candidates:
                v = offs[tp]
                if v.expire_timestamp >= 0:
                    dead = now >= v.expire_timestamp
                else:
                    base = g.state_timestamp if use_state_ts and isinstance(g, ClassicGroup) else v.commit_timestamp
                    dead = now >= base + retention
                if dead:
                    expired.append(tp)
            records: list[tuple[bytes, bytes | None]] = [(encode_offset_key(gid, t, p), None) for t, p in expired]
            drop_group = (len(expired) == len(offs)) and (
                (isinstance(g, ClassicGroup) and g.state == GroupState.EMPTY)
                or (not isinstance(g, ClassicGroup) and g.is_empty()))
            if drop_group:
                if isinstance(g, ClassicGroup):
                    if g.persisted:
                        records.append((encode_group_key(gid), None))
                else:
                    records += g.tombstones()
            if not records:
                continue
            try:
                self.writer(g.partition, records)
            except Exception:
                log.exception("failed to expire offsets of group %(group_id)s", {"group_id": gid})
                continue
            for tp in expired:
                offs.pop(tp, None)
            expired_total += len(expired)
            if drop_group:
                self.offsets.pop(gid, None)
                del self.groups[gid]
                if isinstance(g, ClassicGroup):
                    g.transition(GroupState.DEAD, now)
                log.info("group %(group_id)s expired with %(expired)d offsets",
                         {"group_id": gid, "expired": len(expired)})
        return expired_total
