"""The classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), with no I/O.

Kafka's classic rebalance as its GroupCoordinator runs it, with its error codes per group state:
members join (KIP-394 member ids, KIP-345 static members), the group waits for everyone (with
``group.initial.rebalance.delay.ms`` for an empty group), the leader's assignment is persisted
as the group's GroupMetadata record before SyncGroup answers, and session timeouts remove
members.  Delayed answers go through callbacks; requests for a KIP-848 group are handed to the
consumer protocol (``consumer``), which runs classic members inside it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.classic import (
    ClassicGroup,
    ClassicMember,
    GroupState,
    JoinCallback,
    SyncCallback,
)
from pykbroker.coordinator.group.coordinator_state import GroupCoordinatorState
from pykbroker.coordinator.group.serde import (
    GroupValue,
    MemberRecord,
    encode_group_key,
    encode_group_value,
)
from pykbroker.protocol.responses.group import JoinGroupResponse, JoinGroupResponseMember, SyncGroupResponse

__all__ = ["NEW_MEMBER_JOIN_TIMEOUT_MS", "ClassicGroupCoordinator", "JoinRequest"]

log = logging.getLogger("pykbroker.groups")

NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000


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


class ClassicGroupCoordinator(GroupCoordinatorState):
    """The classic protocol's requests and timers over the coordinator's state."""

    # --- heartbeats ------------------------------------------------------------------------------

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

    # --- persistence -----------------------------------------------------------------------------

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
    def _respond_join(m: ClassicMember, resp: JoinGroupResponse) -> None:
        cb, m.join_cb = m.join_cb, None
        if cb is not None:
            cb(resp)

    @staticmethod
    def _respond_sync(m: ClassicMember, resp: SyncGroupResponse) -> None:
        cb, m.sync_cb = m.sync_cb, None
        if cb is not None:
            cb(resp)

    @staticmethod
    def join_error(code: ErrorCode, member_id: str = "") -> JoinGroupResponse:
        return {"error_code": code, "generation_id": -1, "protocol_type": None, "protocol_name": None,
                "leader": "", "skip_assignment": False, "member_id": member_id, "members": []}

    def _join_response(self, g: ClassicGroup, m: ClassicMember, *, with_members: bool,
                       skip_assignment: bool = False) -> JoinGroupResponse:
        members: list[JoinGroupResponseMember] = []
        if with_members:
            members = [{"member_id": x.member_id, "group_instance_id": x.group_instance_id,
                        "metadata": x.metadata(g.protocol_name)} for x in g.members.values()]
        return {"error_code": ErrorCode.none, "generation_id": g.generation_id,
                "protocol_type": g.protocol_type, "protocol_name": g.protocol_name,
                "leader": g.leader_id or "", "skip_assignment": skip_assignment,
                "member_id": m.member_id, "members": members}

    # --- JoinGroup ---------------------------------------------------------------------------

    def join_group(self, req: JoinRequest, cb: JoinCallback) -> None:
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

    def _join_new_member(self, g: ClassicGroup, req: JoinRequest, cb: JoinCallback) -> None:
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

    def _add_member_and_rebalance(self, g: ClassicGroup, member_id: str, req: JoinRequest, cb: JoinCallback) -> None:
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
                               cb: JoinCallback) -> None:
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

    def _join_known_member(self, g: ClassicGroup, req: JoinRequest, cb: JoinCallback) -> None:
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
                                     cb: JoinCallback) -> None:
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
                   cb: SyncCallback) -> None:
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
    def _sync_ok(g: ClassicGroup, assignment: bytes) -> SyncGroupResponse:
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
