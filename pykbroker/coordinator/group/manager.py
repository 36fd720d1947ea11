"""The group coordinator's core, with no I/O: groups, offsets, timers and records to persist.

Everything here is driven by method calls and an injected clock.  Delayed answers
(JoinGroup, SyncGroup) are delivered through callbacks; timers live in :class:`Timers`
and fire from :meth:`GroupManager.tick`.  Writes to ``__consumer_offsets`` go through the
injected ``writer`` (partition, [(key, value-or-None)]), which raises on failure; state
changes are applied only after it returns, so memory never runs ahead of the log.

Semantics follow Kafka's classic group coordinator (GroupCoordinator/ClassicGroup), including
its error codes per state.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.classic import (
    Callback,
    ClassicGroup,
    ClassicMember,
    GroupState,
    Response,
)
from pykbroker.coordinator.group.serde import (
    GroupKey,
    GroupValue,
    MemberRecord,
    OffsetKey,
    OffsetValue,
    SerdeError,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_key,
    encode_group_value,
    encode_offset_key,
    encode_offset_value,
)
from pykbroker.coordinator.group.timers import Timers
from pykbroker.coordinator.internal_topic import java_string_hash as java_string_hash
from pykbroker.coordinator.internal_topic import partition_for

log = logging.getLogger("pykbroker.groups")

Writer = Callable[[int, list[tuple[bytes, bytes | None]]], None]
TopicPartition = tuple[str, int]

NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000


@dataclass
class GroupConfig:
    num_partitions: int = 50
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3000
    max_size: int = 2**31 - 1
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offset_metadata_max_bytes: int = 4096
    # KIP-848 consumer groups.
    consumer_session_timeout_ms: int = 45000
    consumer_min_session_timeout_ms: int = 45000
    consumer_max_session_timeout_ms: int = 60000
    consumer_heartbeat_interval_ms: int = 5000
    consumer_assignors: list[str] = field(default_factory=lambda: ["uniform", "range"])
    consumer_max_size: int = 2**31 - 1
    # Kafka 4.0's group.consumer.migration.policy: disabled, upgrade, downgrade or bidirectional.
    consumer_migration_policy: str = "bidirectional"


class CoordinatorError(Exception):
    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.name)
        self.code = code


@dataclass
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    require_known_member_id: bool = True
    reason: str | None = None


@dataclass
class CommitEntry:
    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""


PARTITION_LOADING = "loading"
PARTITION_ACTIVE = "active"


class GroupManager:
    def __init__(self, config: GroupConfig, writer: Writer, clock: Callable[[], int]) -> None:
        self.config = config
        self.writer = writer
        self.clock = clock
        self.timers = Timers()
        self.groups: dict[str, Any] = {}
        self.offsets: dict[str, dict[TopicPartition, OffsetValue]] = {}
        # Rebalances completed, by group type (for the metrics): a classic generation, a consumer group epoch.
        self.rebalances: Counter[str] = Counter()
        self.partitions: dict[int, str] = {}
        # Set by the consumer-protocol module; None until it is attached.
        self.consumer: Any = None
        # Called when the set of timers may have changed (the I/O edge re-arms its sleep).
        self.on_timers_changed: Callable[[], None] = lambda: None
        # Partitions of a group with a pending transactional offset commit (set by the I/O edge).
        self.pending_txn_offsets: Callable[[str], Iterable[TopicPartition]] = lambda _g: ()
        # Resolves a topic name to its partition count (for KIP-848 assignment); None if unknown.
        self.topic_partitions: Callable[[str], int | None] = lambda _t: None

    # --- partitions (the coordinator's ownership of __consumer_offsets) ----------------------

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.config.num_partitions)

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
                    self._respond_join(m, {"error_code": ErrorCode.not_coordinator})
                    self._respond_sync(m, {"error_code": ErrorCode.not_coordinator})
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

    def coordinator_error(self, group_id: str | None) -> ErrorCode | None:
        if group_id is None:
            return ErrorCode.invalid_group_id
        state = self.partitions.get(self.partition_for(group_id))
        if state is None:
            return ErrorCode.not_coordinator
        if state == PARTITION_LOADING:
            return ErrorCode.coordinator_load_in_progress
        return None

    # --- timers ------------------------------------------------------------------------------

    def tick(self) -> None:
        self.timers.fire_due(self.clock())

    def next_deadline(self) -> int | None:
        return self.timers.next_deadline()

    def _schedule(self, key: tuple[Any, ...], delay_ms: int, fn: Callable[[], None]) -> None:
        self.timers.schedule(key, self.clock() + delay_ms, fn)
        self.on_timers_changed()

    def _schedule_heartbeat(self, g: ClassicGroup, m: ClassicMember, timeout_ms: int | None = None) -> None:
        t = timeout_ms if timeout_ms is not None else (
            NEW_MEMBER_JOIN_TIMEOUT_MS if m.is_new else m.session_timeout_ms)
        gid, mid = g.group_id, m.member_id
        self._schedule(("hb", gid, mid), t, lambda: self._heartbeat_expired(gid, mid))

    def _heartbeat_expired(self, gid: str, member_id: str) -> None:
        g = self.groups.get(gid)
        if not isinstance(g, ClassicGroup):
            return
        m = g.members.get(member_id)
        if m is None:
            return
        if not m.is_new and (m.join_cb is not None or m.sync_cb is not None):
            # Members with a JoinGroup or SyncGroup outstanding satisfy their heartbeat.
            self._schedule_heartbeat(g, m)
            return
        log.info("member %(member_id)s of group %(group_id)s expired (session timeout)",
                 {"member_id": member_id, "group_id": gid})
        self._remove_member_and_update(g, m, "session timeout expired")

    # --- group lookup and persistence --------------------------------------------------------

    def _classic(self, group_id: str) -> ClassicGroup | None:
        g = self.groups.get(group_id)
        return g if isinstance(g, ClassicGroup) else None

    def _group_record(self, g: ClassicGroup, assignments: dict[str, bytes] | None = None) -> bytes:
        members = [
            MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                         m.session_timeout_ms, m.metadata(g.protocol_name),
                         (assignments or {}).get(m.member_id, m.assignment) if assignments is not None
                         else m.assignment)
            for m in g.members.values()
        ]
        return encode_group_value(GroupValue(g.protocol_type or "", g.generation_id, g.protocol_name,
                                             g.leader_id, g.state_timestamp, members))

    def classic_records(self, g: Any) -> list[tuple[bytes, bytes | None]]:
        """The GroupMetadata record of a classic group (marks it persisted)."""
        if not isinstance(g, ClassicGroup):
            return []
        g.persisted = True
        return [(encode_group_key(g.group_id), self._group_record(g))]

    def downgrade_to_classic(self, gid: str, partition: int, generation: int,
                             members: list[tuple[str, str | None, str, str, int, int, list[tuple[str, bytes]],
                                                 bytes]]) -> ClassicGroup:
        """Kafka's ClassicGroup.fromConsumerGroup, then a rebalance so the members rejoin as a classic group."""
        now = self.clock()
        g = ClassicGroup(gid, partition, state=GroupState.STABLE, state_timestamp=now, generation_id=generation)
        for mid, instance, client_id, host, rebalance, session, protocols, assignment in members:
            m = ClassicMember(mid, instance, client_id, host, rebalance, session, "consumer", protocols,
                              assignment=assignment)
            g.add(m)
        g.protocol_type = "consumer"
        first = next(iter(g.members.values()))
        g.protocol_name = first.protocols[0][0] if first.protocols else None
        if g.protocol_name not in g.candidate_protocols() and g.candidate_protocols():
            g.protocol_name = g.select_protocol()
        g.compute_subscriptions()
        self.groups[gid] = g
        for m in g.members.values():
            self._schedule_heartbeat(g, m)
        self._prepare_rebalance(g, f"Downgrade group {gid} from consumer to classic.")
        return g

    def _store_group(self, g: ClassicGroup, assignments: dict[str, bytes] | None = None) -> None:
        self.writer(g.partition, [(encode_group_key(g.group_id), self._group_record(g, assignments))])
        g.persisted = True

    # --- responses ---------------------------------------------------------------------------

    @staticmethod
    def _respond_join(m: ClassicMember, resp: Response) -> None:
        cb, m.join_cb = m.join_cb, None
        if cb is not None:
            cb(resp)

    @staticmethod
    def _respond_sync(m: ClassicMember, resp: Response) -> None:
        cb, m.sync_cb = m.sync_cb, None
        if cb is not None:
            cb(resp)

    @staticmethod
    def join_error(code: ErrorCode, member_id: str = "") -> Response:
        return {"error_code": code, "generation_id": -1, "protocol_type": None, "protocol_name": None,
                "leader": "", "skip_assignment": False, "member_id": member_id, "members": []}

    def _join_response(self, g: ClassicGroup, m: ClassicMember, *, with_members: bool,
                       skip_assignment: bool = False) -> Response:
        members = []
        if with_members:
            members = [{"member_id": x.member_id, "group_instance_id": x.group_instance_id,
                        "metadata": x.metadata(g.protocol_name)} for x in g.members.values()]
        return {"error_code": ErrorCode.none, "generation_id": g.generation_id,
                "protocol_type": g.protocol_type, "protocol_name": g.protocol_name,
                "leader": g.leader_id or "", "skip_assignment": skip_assignment,
                "member_id": m.member_id, "members": members}

    # --- JoinGroup ---------------------------------------------------------------------------

    def join_group(self, req: JoinRequest, cb: Callback) -> None:
        err = self.coordinator_error(req.group_id)
        if not req.group_id:
            err = ErrorCode.invalid_group_id
        if err is not None:
            cb(self.join_error(err, req.member_id))
            return
        if not (self.config.min_session_timeout_ms <= req.session_timeout_ms
                <= self.config.max_session_timeout_ms):
            cb(self.join_error(ErrorCode.invalid_session_timeout, req.member_id))
            return
        unknown = req.member_id == ""
        g = self.groups.get(req.group_id)
        if g is not None and not isinstance(g, ClassicGroup):
            if self.consumer is None:
                cb(self.join_error(ErrorCode.inconsistent_group_protocol, req.member_id))
                return
            if not self.consumer.can_convert_to_classic(g):
                # Kafka 4.0: a classic member joins a non-empty consumer group through JoinGroup/SyncGroup.
                self.consumer.classic_join(g, req, cb)
                return
            try:
                self.consumer.delete_for_conversion(g)
            except Exception:
                log.exception("failed to delete empty consumer group %(group_id)s", {"group_id": req.group_id})
                cb(self.join_error(ErrorCode.coordinator_not_available, req.member_id))
                return
            g = None
        if g is None:
            if not unknown:
                cb(self.join_error(ErrorCode.unknown_member_id, req.member_id))
                return
            g = ClassicGroup(req.group_id, self.partition_for(req.group_id), state_timestamp=self.clock())
            self.groups[req.group_id] = g
        assert isinstance(g, ClassicGroup)
        if g.state == GroupState.DEAD:
            cb(self.join_error(ErrorCode.coordinator_not_available if unknown else ErrorCode.unknown_member_id,
                               req.member_id))
            return
        if not g.supports(req.protocol_type, req.protocols):
            cb(self.join_error(ErrorCode.inconsistent_group_protocol, req.member_id))
            return
        if unknown:
            self._join_new_member(g, req, cb)
        else:
            self._join_known_member(g, req, cb)

    def _join_new_member(self, g: ClassicGroup, req: JoinRequest, cb: Callback) -> None:
        existing = g.static_member_id(req.group_instance_id) if req.group_instance_id is not None else None
        if existing is None and len(g.members) + len(g.pending_members) >= self.config.max_size:
            cb(self.join_error(ErrorCode.group_max_size_reached))
            return
        new_id = f"{req.client_id}-{uuid.uuid4()}"
        if req.group_instance_id is not None:
            if existing is not None:
                self._replace_static_member(g, existing, new_id, req, cb)
            else:
                self._add_member_and_rebalance(g, new_id, req, cb)
        elif req.require_known_member_id:
            # KIP-394: hand out the id and ask the member to come back with it.
            g.pending_members.add(new_id)
            self._schedule(("pending", g.group_id, new_id), req.session_timeout_ms,
                           lambda: self._pending_member_expired(g.group_id, new_id))
            cb(self.join_error(ErrorCode.member_id_required, new_id))
        else:
            self._add_member_and_rebalance(g, new_id, req, cb)

    def _pending_member_expired(self, gid: str, member_id: str) -> None:
        g = self._classic(gid)
        if g is None or member_id not in g.pending_members:
            return
        g.pending_members.discard(member_id)
        self._check_join_complete(g)

    def _add_member_and_rebalance(self, g: ClassicGroup, member_id: str, req: JoinRequest, cb: Callback) -> None:
        m = ClassicMember(member_id, req.group_instance_id, req.client_id, req.client_host,
                          req.rebalance_timeout_ms, req.session_timeout_ms, req.protocol_type,
                          list(req.protocols), join_cb=cb, is_new=True)
        g.pending_members.discard(member_id)
        self.timers.cancel(("pending", g.group_id, member_id))
        if g.state == GroupState.PREPARING_REBALANCE and g.initial_delay_active:
            g.new_member_added = True
        g.add(m)
        self._schedule_heartbeat(g, m)
        log.debug("member %(member_id)s joined group %(group_id)s (%(reason)s)",
                  {"member_id": member_id, "group_id": g.group_id, "reason": req.reason or 'new member'})
        self._maybe_prepare_rebalance(g, f"member {member_id} joined")

    def _replace_static_member(self, g: ClassicGroup, old_id: str, new_id: str, req: JoinRequest,
                               cb: Callback) -> None:
        m = g.members[old_id]
        self._respond_join(m, self.join_error(ErrorCode.fenced_instance_id, old_id))
        self._respond_sync(m, {"error_code": ErrorCode.fenced_instance_id, "assignment": b""})
        self.timers.cancel(("hb", g.group_id, old_id))
        old_protocols = m.protocols
        del g.members[old_id]
        was_leader = g.leader_id == old_id
        m.member_id = new_id
        g.members[new_id] = m
        g.static_members[req.group_instance_id or ""] = new_id
        if was_leader:
            g.leader_id = new_id
        if old_id in g.pending_sync:
            g.pending_sync.discard(old_id)
            g.pending_sync.add(new_id)
        m.protocols = list(req.protocols)
        m.rebalance_timeout_ms = req.rebalance_timeout_ms
        m.session_timeout_ms = req.session_timeout_ms
        m.client_id, m.client_host = req.client_id, req.client_host
        log.info("static member %(group_instance_id)s of group %(group_id)s rejoined as %(new_member_id)s",
                 {"group_instance_id": req.group_instance_id, "group_id": g.group_id, "new_member_id": new_id})
        if g.state == GroupState.STABLE:
            if g.protocol_name == g.select_protocol():
                try:
                    self._store_group(g)
                except Exception:
                    log.exception("failed to persist group %(group_id)s", {"group_id": g.group_id})
                    # Revert, as Kafka does, and let the member retry.
                    del g.members[new_id]
                    m.member_id = old_id
                    m.protocols = old_protocols
                    g.members[old_id] = m
                    g.static_members[req.group_instance_id or ""] = old_id
                    if was_leader:
                        g.leader_id = old_id
                    self._schedule_heartbeat(g, m)
                    cb(self.join_error(ErrorCode.unknown_server_error, new_id))
                    return
                self._schedule_heartbeat(g, m)
                leader = g.is_leader(new_id)
                cb(self._join_response(g, m, with_members=leader, skip_assignment=leader))
                return
            m.join_cb = cb
            self._schedule_heartbeat(g, m)
            self._prepare_rebalance(g, f"static member {new_id} rejoined with a protocol change")
            return
        m.join_cb = cb
        self._schedule_heartbeat(g, m)
        if g.state == GroupState.COMPLETING_REBALANCE:
            self._prepare_rebalance(g, f"static member {new_id} rejoined during the sync phase")
        else:
            self._check_join_complete(g)

    def validate_member(self, g: ClassicGroup, member_id: str, instance_id: str | None) -> ErrorCode | None:
        if instance_id is not None:
            existing = g.static_member_id(instance_id)
            if existing is None:
                return ErrorCode.unknown_member_id
            if existing != member_id:
                return ErrorCode.fenced_instance_id
        elif member_id not in g.members:
            return ErrorCode.unknown_member_id
        return None

    def _join_known_member(self, g: ClassicGroup, req: JoinRequest, cb: Callback) -> None:
        if req.member_id in g.pending_members:
            self._add_member_and_rebalance(g, req.member_id, req, cb)
            return
        err = self.validate_member(g, req.member_id, req.group_instance_id)
        if err is not None:
            cb(self.join_error(err, req.member_id))
            return
        m = g.members[req.member_id]
        if g.state == GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(g, m, req, cb)
        elif g.state == GroupState.COMPLETING_REBALANCE:
            if m.matches(req.protocols):
                cb(self._join_response(g, m, with_members=g.is_leader(m.member_id)))
            else:
                self._update_member_and_rebalance(g, m, req, cb)
        elif g.state == GroupState.STABLE:
            if g.is_leader(m.member_id) or not m.matches(req.protocols):
                self._update_member_and_rebalance(g, m, req, cb)
            else:
                cb(self._join_response(g, m, with_members=False))
        else:
            cb(self.join_error(ErrorCode.unknown_member_id, req.member_id))
            return
        self._schedule_heartbeat(g, m)

    def _update_member_and_rebalance(self, g: ClassicGroup, m: ClassicMember, req: JoinRequest,
                                     cb: Callback) -> None:
        m.protocols = list(req.protocols)
        m.rebalance_timeout_ms = req.rebalance_timeout_ms
        m.session_timeout_ms = req.session_timeout_ms
        if m.join_cb is not None:
            # A duplicate JoinGroup: the earlier one is superseded.
            self._respond_join(m, self.join_error(ErrorCode.rebalance_in_progress, m.member_id))
        m.join_cb = cb
        self._maybe_prepare_rebalance(g, f"member {m.member_id} rejoined ({req.reason or 'no reason'})")

    # --- rebalancing -------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, g: ClassicGroup, reason: str) -> None:
        if g.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(g, reason)
        else:
            self._check_join_complete(g)

    def _prepare_rebalance(self, g: ClassicGroup, reason: str) -> None:
        now = self.clock()
        if g.state == GroupState.COMPLETING_REBALANCE:
            for m in g.members.values():
                m.assignment = b""
                self._respond_sync(m, {"error_code": ErrorCode.rebalance_in_progress, "assignment": b""})
        g.pending_sync.clear()
        self.timers.cancel(("sync", g.group_id))
        delay = self.config.initial_rebalance_delay_ms
        if g.state == GroupState.EMPTY and delay > 0:
            g.initial_delay_active = True
            g.new_member_added = False
            remaining = max(g.rebalance_timeout_ms() - delay, 0)
            self._schedule(("join", g.group_id), delay,
                           lambda: self._initial_delay_expired(g, delay, remaining))
        else:
            g.initial_delay_active = False
            self._schedule(("join", g.group_id), g.rebalance_timeout_ms(), lambda: self._complete_join(g))
        log.info("preparing to rebalance group %(group_id)s in state %(state)s with old generation "
                 "%(generation_id)d: %(reason)s",
                 {"group_id": g.group_id, "state": g.state.value, "generation_id": g.generation_id, "reason": reason})
        g.transition(GroupState.PREPARING_REBALANCE, now)
        self._check_join_complete(g)

    def _initial_delay_expired(self, g: ClassicGroup, delay: int, remaining: int) -> None:
        if g.new_member_added and remaining > 0:
            g.new_member_added = False
            d = min(delay, remaining)
            rest = max(remaining - delay, 0)
            self._schedule(("join", g.group_id), d, lambda: self._initial_delay_expired(g, d, rest))
            return
        g.initial_delay_active = False
        self._complete_join(g)

    def _check_join_complete(self, g: ClassicGroup) -> None:
        if g.state == GroupState.PREPARING_REBALANCE and not g.initial_delay_active and g.all_joined():
            self._complete_join(g)

    def _complete_join(self, g: ClassicGroup) -> None:
        self.timers.cancel(("join", g.group_id))
        if g.state != GroupState.PREPARING_REBALANCE or self.groups.get(g.group_id) is not g:
            return
        for m in [m for m in g.members.values() if m.join_cb is None]:
            log.info("removing member %(member_id)s of group %(group_id)s: it did not rejoin in time",
                     {"member_id": m.member_id, "group_id": g.group_id})
            self.timers.cancel(("hb", g.group_id, m.member_id))
            g.remove(m.member_id)
        if g.leader_id is None and g.members:
            g.leader_id = next(iter(g.members))
        now = self.clock()
        g.generation_id += 1
        if not g.members:
            g.protocol_name = None
            g.transition(GroupState.EMPTY, now)
            g.subscribed = None
            log.info("group %(group_id)s is empty at generation %(generation_id)d",
                     {"group_id": g.group_id, "generation_id": g.generation_id})
            try:
                self._store_group(g, {})
            except Exception:
                log.exception("failed to persist empty group %(group_id)s", {"group_id": g.group_id})
            return
        g.protocol_name = g.select_protocol()
        g.compute_subscriptions()
        g.transition(GroupState.COMPLETING_REBALANCE, now)
        self.rebalances["classic"] += 1
        log.info("stabilized group %(group_id)s generation %(generation_id)d protocol %(protocol)s with %(members)d "
                 "members",
                 {"group_id": g.group_id, "generation_id": g.generation_id, "protocol": g.protocol_name,
                  "members": len(g.members)})
        for m in g.members.values():
            resp = self._join_response(g, m, with_members=g.is_leader(m.member_id))
            m.is_new = False
            self._respond_join(m, resp)
            self._schedule_heartbeat(g, m)
        g.pending_sync = set(g.members)
        self._schedule(("sync", g.group_id), g.rebalance_timeout_ms(), lambda: self._pending_sync_expired(g))

    def _pending_sync_expired(self, g: ClassicGroup) -> None:
        if self.groups.get(g.group_id) is not g or not g.pending_sync:
            return
        if g.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        for mid in list(g.pending_sync):
            m = g.members.get(mid)
            if m is not None:
                log.info("removing member %(member_id)s of group %(group_id)s: no SyncGroup in time",
                         {"member_id": mid, "group_id": g.group_id})
                self._remove_member(g, m)
        g.pending_sync.clear()
        self._prepare_rebalance(g, "members did not sync in time")

    def _remove_member(self, g: ClassicGroup, m: ClassicMember) -> None:
        self.timers.cancel(("hb", g.group_id, m.member_id))
        self._respond_join(m, self.join_error(ErrorCode.unknown_member_id, m.member_id))
        self._respond_sync(m, {"error_code": ErrorCode.unknown_member_id, "assignment": b""})
        g.remove(m.member_id)

    def _remove_member_and_update(self, g: ClassicGroup, m: ClassicMember, reason: str) -> None:
        self._remove_member(g, m)
        if g.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(g, f"removing member {m.member_id}: {reason}")
        elif g.state == GroupState.PREPARING_REBALANCE:
            self._check_join_complete(g)

    # --- SyncGroup ---------------------------------------------------------------------------

    def sync_group(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
                   protocol_type: str | None, protocol_name: str | None, assignments: dict[str, bytes],
                   cb: Callback) -> None:
        def fail(code: ErrorCode) -> None:
            cb({"error_code": code, "protocol_type": None, "protocol_name": None, "assignment": b""})

        err = self.coordinator_error(group_id)
        if err is not None:
            return fail(err)
        cg = self.groups.get(group_id)
        if cg is not None and self.consumer is not None and not isinstance(cg, ClassicGroup):
            cb(self.consumer.classic_sync(cg, generation_id, member_id, instance_id, protocol_type, protocol_name))
            return
        g = self._classic(group_id)
        if g is None:
            return fail(ErrorCode.unknown_member_id)
        if g.state == GroupState.DEAD:
            return fail(ErrorCode.coordinator_not_available)
        err = self.validate_member(g, member_id, instance_id)
        if err is not None:
            return fail(err)
        if generation_id != g.generation_id:
            return fail(ErrorCode.illegal_generation)
        if (protocol_type is not None and protocol_type != g.protocol_type) or (
                protocol_name is not None and protocol_name != g.protocol_name):
            return fail(ErrorCode.inconsistent_group_protocol)
        if g.state == GroupState.EMPTY:
            return fail(ErrorCode.unknown_member_id)
        if g.state == GroupState.PREPARING_REBALANCE:
            return fail(ErrorCode.rebalance_in_progress)
        m = g.members[member_id]
        self._schedule_heartbeat(g, m)
        g.pending_sync.discard(member_id)
        if not g.pending_sync:
            self.timers.cancel(("sync", g.group_id))
        if g.state == GroupState.STABLE:
            cb(self._sync_ok(g, m.assignment))
            return
        m.sync_cb = cb
        if not g.is_leader(member_id):
            return
        full = {mid: assignments.get(mid, b"") for mid in g.members}
        generation = g.generation_id
        try:
            self._store_group(g, full)
        except Exception:
            log.exception("failed to persist group %(group_id)s", {"group_id": g.group_id})
            if g.state == GroupState.COMPLETING_REBALANCE and g.generation_id == generation:
                for x in g.members.values():
                    x.assignment = b""
                    self._respond_sync(x, {"error_code": ErrorCode.coordinator_not_available,
                                           "assignment": b""})
                self._prepare_rebalance(g, "failed to persist the assignment")
            return
        if g.state == GroupState.COMPLETING_REBALANCE and g.generation_id == generation:
            for x in g.members.values():
                x.assignment = full[x.member_id]
            g.transition(GroupState.STABLE, self.clock())
            for x in g.members.values():
                self._respond_sync(x, self._sync_ok(g, x.assignment))
                self._schedule_heartbeat(g, x)

    @staticmethod
    def _sync_ok(g: ClassicGroup, assignment: bytes) -> Response:
        return {"error_code": ErrorCode.none, "protocol_type": g.protocol_type, "protocol_name": g.protocol_name,
                "assignment": assignment}

    # --- Heartbeat / LeaveGroup --------------------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None) -> ErrorCode:
        err = self.coordinator_error(group_id)
        if err is not None:
            return err
        cg = self.groups.get(group_id)
        if cg is not None and self.consumer is not None and not isinstance(cg, ClassicGroup):
            code: ErrorCode = self.consumer.classic_heartbeat(cg, generation_id, member_id, instance_id)
            return code
        g = self._classic(group_id)
        if g is None:
            return ErrorCode.unknown_member_id
        if g.state == GroupState.DEAD:
            return ErrorCode.coordinator_not_available
        err = self.validate_member(g, member_id, instance_id)
        if err is not None:
            return err
        if generation_id != g.generation_id:
            return ErrorCode.illegal_generation
        if g.state == GroupState.EMPTY:
            return ErrorCode.unknown_member_id
        self._schedule_heartbeat(g, g.members[member_id])
        if g.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[ErrorCode, list[ErrorCode]]:
        err = self.coordinator_error(group_id)
        if err is not None:
            return err, []
        cg = self.groups.get(group_id)
        if cg is not None and self.consumer is not None and not isinstance(cg, ClassicGroup):
            return ErrorCode.none, self.consumer.classic_leave(cg, members)
        g = self._classic(group_id)
        if g is None:
            return ErrorCode.none, [ErrorCode.unknown_member_id for _ in members]
        if g.state == GroupState.DEAD:
            return ErrorCode.coordinator_not_available, []
        out: list[ErrorCode] = []
        for member_id, instance_id in members:
            if member_id == "" and instance_id is not None:
                found = g.static_member_id(instance_id)
                if found is None:
                    out.append(ErrorCode.unknown_member_id)
                    continue
                member_id = found
            elif instance_id is not None:
                existing = g.static_member_id(instance_id)
                if existing is not None and existing != member_id:
                    out.append(ErrorCode.fenced_instance_id)
                    continue
            if member_id in g.pending_members:
                g.pending_members.discard(member_id)
                self.timers.cancel(("pending", g.group_id, member_id))
                self._check_join_complete(g)
                out.append(ErrorCode.none)
                continue
            m = g.members.get(member_id)
            if m is None:
                out.append(ErrorCode.unknown_member_id)
                continue
            log.debug("member %(member_id)s left group %(group_id)s", {"member_id": member_id, "group_id": group_id})
            self._remove_member_and_update(g, m, "the member left the group")
            out.append(ErrorCode.none)
        return ErrorCode.none, out

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
                    ) -> list[dict[str, Any]]:
        out = []
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

    def describe_group(self, gid: str) -> dict[str, Any]:
        err = self.coordinator_error(gid)
        base: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None, "group_id": gid,
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
            base.update(g.describe_as_classic())
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
