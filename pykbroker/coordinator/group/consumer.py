"""KIP-848 consumer groups: server-side assignment, member epochs, incremental reconciliation.

A member heartbeats with its epoch; the coordinator keeps a group epoch (bumped whenever
subscriptions, membership or subscribed topics' partition counts change), computes a target
assignment for that epoch with the group's assignor, and moves each member towards its
target: partitions it must give up are revoked first (the member keeps its epoch until it
acknowledges), then it receives the new epoch with the partitions no other member still owns.

Scope: this state is kept in memory.  Committed offsets are persisted as for classic groups,
but after a coordinator restart consumer-protocol members are fenced (UNKNOWN_MEMBER_ID) and
rejoin with epoch 0.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

if TYPE_CHECKING:
    from pykbroker.coordinator.group.manager import GroupManager
    from pykbroker.metadata.store import TopicRecord

log = logging.getLogger("pykbroker.groups")

Assignment = dict[uuid.UUID, set[int]]
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

STABLE = "stable"
UNREVOKED = "unrevoked_partitions"
UNRELEASED = "unreleased_partitions"


class HeartbeatError(Exception):
    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


@dataclass(eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300_000
    subscribed_names: list[str] = field(default_factory=list)
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_epoch: int = -1
    state: str = STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    last_sent: Assignment | None = None


def _copy(a: Assignment) -> Assignment:
    return {t: set(p) for t, p in a.items() if p}


def _minus(a: Assignment, b: Assignment) -> Assignment:
    return {t: ps - b.get(t, set()) for t, ps in a.items() if ps - b.get(t, set())}


def _and(a: Assignment, b: Assignment) -> Assignment:
    return {t: ps & b.get(t, set()) for t, ps in a.items() if ps & b.get(t, set())}


def _count(a: Assignment) -> int:
    return sum(len(p) for p in a.values())


@dataclass(eq=False)
class ConsumerGroup:
    group_id: str
    partition: int
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    # Partition counts of subscribed topics when the target was computed.
    topic_snapshot: dict[str, int] = field(default_factory=dict)
    state_timestamp: int = 0
    assignor: str = "uniform"
    resolve: Callable[[str], bool] = field(default=lambda _t: False)

    kind = "consumer"

    def is_empty(self) -> bool:
        return not self.members

    def state_name(self) -> str:
        if not self.members:
            return "Empty"
        if self.group_epoch > self.assignment_epoch:
            return "Assigning"
        if any(m.member_epoch != self.assignment_epoch or m.state != STABLE for m in self.members.values()):
            return "Reconciling"
        return "Stable"

    def subscribed_topics(self, all_topics: list[str]) -> set[str]:
        out: set[str] = set()
        for m in self.members.values():
            out.update(m.subscribed_names)
            if m.subscribed_regex:
                try:
                    rx = re.compile(m.subscribed_regex)
                except re.error:
                    continue
                out.update(t for t in all_topics if rx.fullmatch(t))
        return out

    def is_subscribed_to(self, topic: str) -> bool:
        for m in self.members.values():
            if topic in m.subscribed_names:
                return True
            if m.subscribed_regex:
                try:
                    if re.fullmatch(m.subscribed_regex, topic):
                        return True
                except re.error:
                    pass
        return False

    def owner_map(self, exclude: str) -> dict[tuple[uuid.UUID, int], str]:
        out: dict[tuple[uuid.UUID, int], str] = {}
        for mid, m in self.members.items():
            if mid == exclude:
                continue
            for src in (m.assigned, m.pending_revocation):
                for t, ps in src.items():
                    for p in ps:
                        out[(t, p)] = mid
        return out

    def tombstones(self) -> list[tuple[bytes, bytes | None]]:
        return []

    def describe_as_classic(self) -> dict[str, Any]:
        return {"group_state": self.state_name(), "protocol_type": "consumer", "protocol_data": "",
                "members": [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                             "client_id": m.client_id, "client_host": m.client_host,
                             "member_metadata": b"", "member_assignment": b""} for m in self.members.values()]}


# --- assignors --------------------------------------------------------------------------------

Topics = dict[str, tuple[uuid.UUID, int]]  # name -> (id, partition count)


def _member_topics(m: ConsumerMember, topics: Topics) -> list[str]:
    names = set(m.subscribed_names) & set(topics)
    if m.subscribed_regex:
        try:
            rx = re.compile(m.subscribed_regex)
            names |= {t for t in topics if rx.fullmatch(t)}
        except re.error:
            pass
    return sorted(names)


def range_assign(members: dict[str, ConsumerMember], topics: Topics,
                 current: dict[str, Assignment]) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {mid: {} for mid in members}
    by_topic: dict[str, list[str]] = {}
    for mid, m in members.items():
        for t in _member_topics(m, topics):
            by_topic.setdefault(t, []).append(mid)
    for t, mids in by_topic.items():
        tid, n = topics[t]
        mids = sorted(mids)
        per, extra = divmod(n, len(mids))
        start = 0
        for i, mid in enumerate(mids):
            k = per + (1 if i < extra else 0)
            if k:
                out[mid][tid] = set(range(start, start + k))
            start += k
    return out


def uniform_assign(members: dict[str, ConsumerMember], topics: Topics,
                   current: dict[str, Assignment]) -> dict[str, Assignment]:
    """Balanced and sticky: members keep what they had, up to their share; the rest goes to the least loaded."""
    out: dict[str, Assignment] = {mid: {} for mid in members}
    subs = {mid: set(_member_topics(m, topics)) for mid, m in members.items()}
    ids = {topics[t][0]: t for t in topics}
    all_parts: list[tuple[str, uuid.UUID, int]] = []
    for t in sorted({t for s in subs.values() for t in s}):
        tid, n = topics[t]
        all_parts.extend((t, tid, p) for p in range(n))
    eligible = sorted(mid for mid in members if subs[mid])
    if not eligible:
        return out
    base, extra = divmod(len(all_parts), len(eligible))
    counts = dict.fromkeys(members, 0)
    taken: set[tuple[uuid.UUID, int]] = set()
    keepable: dict[str, list[tuple[uuid.UUID, int]]] = {}
    for mid in eligible:
        keepable[mid] = sorted(
            ((tid, p) for tid, ps in current.get(mid, {}).items() for p in ps
             if tid in ids and ids[tid] in subs[mid] and p < topics[ids[tid]][1]),
            key=lambda x: (str(x[0]), x[1]))

    def take(mid: str, tid: uuid.UUID, p: int) -> None:
        out[mid].setdefault(tid, set()).add(p)
        taken.add((tid, p))
        counts[mid] += 1

    for mid in eligible:
        for tid, p in keepable[mid]:
            if counts[mid] >= base:
                break
            if (tid, p) not in taken:
                take(mid, tid, p)
    for mid in eligible:
        if extra <= 0:
            break
        for tid, p in keepable[mid]:
            if (tid, p) not in taken:
                take(mid, tid, p)
                extra -= 1
                break
    for t, tid, p in all_parts:
        if (tid, p) in taken:
            continue
        cands = [mid for mid in eligible if t in subs[mid]]
        if cands:
            take(min(cands, key=lambda x: (counts[x], x)), tid, p)
    return out


ASSIGNORS = {"uniform": uniform_assign, "range": range_assign}


# --- the coordinator side ----------------------------------------------------------------------

class ConsumerGroups:
    def __init__(self, manager: GroupManager) -> None:
        self.m = manager
        self.topic_ids: Callable[[str], Any] = lambda _t: None
        self.topic_names: Callable[[], list[str]] = list

    @property
    def cfg(self) -> Any:
        return self.m.config

    # Hooks called by the manager.
    def replay(self, partition: int, key: bytes, value: bytes | None) -> None:
        """Consumer-group records of other implementations are ignored (state is in memory)."""

    def finish_loading(self, partition: int) -> None:
        pass

    def unload_group(self, g: ConsumerGroup) -> None:
        for mid in g.members:
            self.m.timers.cancel(("chb", g.group_id, mid))
            self.m.timers.cancel(("crev", g.group_id, mid))

    def can_convert_to_classic(self, g: ConsumerGroup) -> bool:
        return g.is_empty()

    def delete_for_conversion(self, g: ConsumerGroup) -> None:
        self.m.groups.pop(g.group_id, None)

    def on_topic_change(self, name: str, rec: TopicRecord | None) -> None:
        for g in self.m.groups.values():
            if isinstance(g, ConsumerGroup) and g.members and (name in g.topic_snapshot or g.is_subscribed_to(name)):
                g.group_epoch += 1

    def validate_commit(self, g: ConsumerGroup, member_id: str, epoch: int) -> ErrorCode | None:
        if epoch < 0 and not member_id:
            return None if g.is_empty() else ErrorCode.unknown_member_id
        m = g.members.get(member_id)
        if m is None:
            return ErrorCode.unknown_member_id
        if epoch > m.member_epoch:
            return ErrorCode.fenced_member_epoch
        if epoch < m.member_epoch:
            return ErrorCode.stale_member_epoch
        return None

    def validate_fetch(self, g: ConsumerGroup, member_id: str, epoch: int) -> ErrorCode | None:
        if epoch < 0 and not member_id:
            return None
        m = g.members.get(member_id)
        if m is None:
            return ErrorCode.unknown_member_id
        if epoch != m.member_epoch:
            return ErrorCode.stale_member_epoch
        return None

    # --- heartbeat ----------------------------------------------------------------------------

    def heartbeat(self, req: Any, client_id: str, client_host: str) -> dict[str, Any]:
        try:
            return self._heartbeat(req, client_id, client_host)
        except HeartbeatError as e:
            return {"error_code": e.code, "error_message": e.message, "member_id": req.member_id or None,
                    "member_epoch": -1, "heartbeat_interval": 0, "assignment": None}

    def _topics(self) -> Topics:
        out: Topics = {}
        for name in self.topic_names():
            tid = self.topic_ids(name)
            n = self.m.topic_partitions(name)
            if tid is not None and n:
                out[name] = (tid, n)
        return out

    def _heartbeat(self, req: Any, client_id: str, client_host: str) -> dict[str, Any]:
        gid = req.group_id
        err = self.m.coordinator_error(gid)
        if not gid:
            raise HeartbeatError(ErrorCode.invalid_request, "GroupId can't be empty.")
        if err is not None:
            raise HeartbeatError(err)
        epoch = int(req.member_epoch)
        member_id = req.member_id or ""
        instance_id = req.instance_id
        if epoch == 0 and not member_id:
            member_id = str(uuid.uuid4())
        if epoch == 0 and req.subscribed_topic_names is None and getattr(req, "subscribed_topic_regex", None) is None:
            raise HeartbeatError(ErrorCode.invalid_request,
                                 "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        if req.server_assignor is not None and req.server_assignor not in self.cfg.consumer_assignors:
            raise HeartbeatError(ErrorCode.unsupported_assignor,
                                 f"ServerAssignor {req.server_assignor} is not supported.")
        regex = getattr(req, "subscribed_topic_regex", None)
        if regex:
            try:
                re.compile(regex)
            except re.error as e:
                raise HeartbeatError(ErrorCode.invalid_regular_expression, str(e)) from None
        g = self.m.groups.get(gid)
        from pykbroker.coordinator.group.classic import ClassicGroup, GroupState
        if isinstance(g, ClassicGroup):
            if g.state == GroupState.EMPTY and not g.members:
                self.m.groups.pop(gid)  # Kafka converts an empty classic group
                g = None
            else:
                raise HeartbeatError(ErrorCode.group_id_not_found,
                                     f"Group {gid} is not a consumer group.")
        if g is None:
            if epoch != 0:
                raise HeartbeatError(ErrorCode.unknown_member_id if epoch > 0 else ErrorCode.group_id_not_found)
            g = ConsumerGroup(gid, self.m.partition_for(gid), state_timestamp=self.m.clock(),
                              assignor=self.cfg.consumer_assignors[0])
            self.m.groups[gid] = g
        assert isinstance(g, ConsumerGroup)
        now = self.m.clock()

        if epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(g, member_id, instance_id, epoch)

        m = g.members.get(member_id)
        created = False
        if epoch == 0:
            if instance_id is not None and instance_id in g.static_members:
                old_id = g.static_members[instance_id]
                old = g.members.get(old_id)
                if old is not None and old_id != member_id:
                    if old.member_epoch != STATIC_LEAVE_EPOCH:
                        raise HeartbeatError(ErrorCode.unreleased_instance_id,
                                             f"Static member {instance_id} is still in use.")
                    # A static member coming back takes over its predecessor's assignment.
                    del g.members[old_id]
                    self.m.timers.cancel(("chb", gid, old_id))
                    old.member_id = member_id
                    old.member_epoch = old.previous_epoch if old.previous_epoch > 0 else 0
                    g.members[member_id] = old
                    g.static_members[instance_id] = member_id
                    if old_id in g.target:
                        g.target[member_id] = g.target.pop(old_id)
                    m = old
                    m.last_sent = None
            if m is None:
                if len(g.members) >= self.cfg.consumer_max_size:
                    raise HeartbeatError(ErrorCode.group_max_size_reached,
                                         f"The consumer group has reached its maximum capacity of "
                                         f"{self.cfg.consumer_max_size} members.")
                m = ConsumerMember(member_id, instance_id)
                g.members[member_id] = m
                if instance_id is not None:
                    g.static_members[instance_id] = member_id
                g.group_epoch += 1
                created = True
                log.info("member %s joined consumer group %s (group epoch %d)", member_id, gid, g.group_epoch)
            elif m.member_epoch > 0 and m.last_sent is not None:
                # A member rejoining with epoch 0 lost its state: start again from nothing.
                m.last_sent = None
        else:
            if m is None:
                raise HeartbeatError(ErrorCode.unknown_member_id,
                                     f"Member {member_id} is not a member of group {gid}.")
            if instance_id is not None and g.static_members.get(instance_id) not in (None, member_id):
                raise HeartbeatError(ErrorCode.fenced_instance_id)
            owned = self._owned(req)
            if epoch > m.member_epoch:
                raise HeartbeatError(ErrorCode.fenced_member_epoch,
                                     f"The consumer group member has a greater member epoch ({epoch}) than the "
                                     f"one known by the group coordinator ({m.member_epoch}).")
            if epoch < m.member_epoch and (epoch != m.previous_epoch or (
                    owned is not None and _minus(owned, m.assigned))):
                raise HeartbeatError(ErrorCode.fenced_member_epoch,
                                     f"The consumer group member has a smaller member epoch ({epoch}) than the "
                                     f"one known by the group coordinator ({m.member_epoch}).")

        # Apply the member's (changed) fields.
        m.client_id, m.client_host = client_id, client_host
        if req.rack_id is not None:
            m.rack_id = req.rack_id
        rt = int(req.rebalance_timeout.total_seconds() * 1000) if hasattr(req.rebalance_timeout, "total_seconds") \
            else int(req.rebalance_timeout)
        if rt > 0:
            m.rebalance_timeout_ms = rt
        changed = False
        if req.subscribed_topic_names is not None and sorted(req.subscribed_topic_names) != sorted(
                m.subscribed_names):
            m.subscribed_names = list(req.subscribed_topic_names)
            changed = True
        if regex is not None and (regex or None) != m.subscribed_regex:
            m.subscribed_regex = regex or None
            changed = True
        if req.server_assignor is not None and req.server_assignor != m.server_assignor:
            m.server_assignor = req.server_assignor
            changed = True
        if changed and not created:
            g.group_epoch += 1

        topics = self._topics()
        subscribed = g.subscribed_topics(list(topics))
        snapshot = {t: topics[t][1] for t in subscribed if t in topics}
        if snapshot != g.topic_snapshot:
            g.group_epoch = max(g.group_epoch, g.assignment_epoch + 1)
        if g.group_epoch > g.assignment_epoch:
            self._compute_target(g, topics)
            g.topic_snapshot = snapshot

        owned = self._owned(req)
        self._reconcile(g, m, owned)
        self._schedule_session(g, m)

        resp: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None, "member_id": member_id,
                                "member_epoch": m.member_epoch,
                                "heartbeat_interval": self.cfg.consumer_heartbeat_interval_ms,
                                "assignment": None}
        if m.last_sent is None or m.last_sent != m.assigned or epoch == 0 or (owned is not None and owned != \
                m.assigned):
            m.last_sent = _copy(m.assigned)
            resp["assignment"] = {"topic_partitions": [
                {"topic_id": t, "partitions": sorted(ps)} for t, ps in sorted(m.assigned.items(),
                                                                              key=lambda x: str(x[0]))]}
        g.state_timestamp = now
        return resp

    @staticmethod
    def _owned(req: Any) -> Assignment | None:
        if req.topic_partitions is None:
            return None
        return {tp.topic_id: set(tp.partitions) for tp in req.topic_partitions if tp.partitions}

    def _leave(self, g: ConsumerGroup, member_id: str, instance_id: str | None, epoch: int) -> dict[str, Any]:
        if instance_id is not None and not member_id:
            member_id = g.static_members.get(instance_id, "")
        m = g.members.get(member_id)
        if m is None:
            raise HeartbeatError(ErrorCode.unknown_member_id)
        if epoch == STATIC_LEAVE_EPOCH and m.instance_id is not None:
            # Keep the assignment for the session timeout; the instance is expected back.
            m.previous_epoch = m.member_epoch
            m.member_epoch = STATIC_LEAVE_EPOCH
            self._schedule_session(g, m)
        else:
            self._remove(g, m, "left the group")
        return {"error_code": ErrorCode.none, "error_message": None, "member_id": member_id,
                "member_epoch": epoch, "heartbeat_interval": 0, "assignment": None}

    def _remove(self, g: ConsumerGroup, m: ConsumerMember, why: str) -> None:
        g.members.pop(m.member_id, None)
        g.target.pop(m.member_id, None)
        if m.instance_id is not None and g.static_members.get(m.instance_id) == m.member_id:
            del g.static_members[m.instance_id]
        self.m.timers.cancel(("chb", g.group_id, m.member_id))
        self.m.timers.cancel(("crev", g.group_id, m.member_id))
        g.group_epoch += 1
        g.state_timestamp = self.m.clock()
        log.info("member %s %s consumer group %s (group epoch %d)", m.member_id, why, g.group_id, g.group_epoch)

    def _schedule_session(self, g: ConsumerGroup, m: ConsumerMember) -> None:
        gid, mid = g.group_id, m.member_id

        def expire() -> None:
            grp = self.m.groups.get(gid)
            if isinstance(grp, ConsumerGroup) and mid in grp.members:
                self._remove(grp, grp.members[mid], "expired from (session timeout)")

        self.m._schedule(("chb", gid, mid), self.cfg.consumer_session_timeout_ms, expire)

    def _compute_target(self, g: ConsumerGroup, topics: Topics) -> None:
        votes: dict[str, int] = {}
        for m in g.members.values():
            if m.server_assignor:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if votes:
            g.assignor = max(votes, key=lambda a: (votes[a], a))
        fn = ASSIGNORS.get(g.assignor, uniform_assign)
        current = {mid: g.target.get(mid, m.assigned) for mid, m in g.members.items()}
        g.target = fn(g.members, topics, current)
        g.assignment_epoch = g.group_epoch
        log.info("computed target assignment of consumer group %s at epoch %d with %s", g.group_id,
                 g.assignment_epoch, g.assignor)

    def _reconcile(self, g: ConsumerGroup, m: ConsumerMember, owned: Assignment | None) -> None:
        target = g.target.get(m.member_id, {})
        if m.state == UNREVOKED:
            # Still waiting for the member to give up partitions?
            if owned is not None and not _and(owned, m.pending_revocation):
                m.pending_revocation = {}
                self.m.timers.cancel(("crev", g.group_id, m.member_id))
                m.state = STABLE
            else:
                return
        if m.member_epoch == g.assignment_epoch and m.state == STABLE and m.assigned == _copy(target):
            return
        revoke = _minus(m.assigned, target)
        if revoke:
            m.assigned = _and(m.assigned, target)
            m.pending_revocation = revoke
            m.state = UNREVOKED
            gid, mid = g.group_id, m.member_id

            def revocation_timeout() -> None:
                grp = self.m.groups.get(gid)
                if isinstance(grp, ConsumerGroup) and mid in grp.members and grp.members[mid].state == UNREVOKED:
                    self._remove(grp, grp.members[mid], "was fenced: it did not revoke partitions in time")

            self.m._schedule(("crev", gid, mid), m.rebalance_timeout_ms, revocation_timeout)
            return
        owners = g.owner_map(m.member_id)
        new = _copy(m.assigned)
        unreleased = False
        for t, ps in target.items():
            for p in ps:
                if (t, p) in owners:
                    unreleased = True
                else:
                    new.setdefault(t, set()).add(p)
        m.assigned = new
        if m.member_epoch != g.assignment_epoch:
            m.previous_epoch = m.member_epoch
            m.member_epoch = g.assignment_epoch
        m.state = UNRELEASED if unreleased else STABLE

    # --- describe ---------------------------------------------------------------------------------

    def describe(self, gid: str, topic_name: Callable[[uuid.UUID], str | None]) -> dict[str, Any]:
        out: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None, "group_id": gid,
                               "group_state": "Dead", "group_epoch": -1, "assignment_epoch": -1,
                               "assignor_name": "", "members": [], "authorized_operations": -2147483648}
        err = self.m.coordinator_error(gid)
        if err is not None:
            out["error_code"] = err
            return out
        g = self.m.groups.get(gid)
        if not isinstance(g, ConsumerGroup):
            out["error_code"] = ErrorCode.group_id_not_found
            out["error_message"] = f"Group {gid} not found." if g is None else f"Group {gid} is not a consumer group."
            return out

        def asg(a: Assignment) -> dict[str, Any]:
            return {"topic_partitions": [{"topic_id": t, "topic_name": topic_name(t) or "", "partitions": sorted(p)}
                                         for t, p in a.items()]}

        out.update(group_state=g.state_name(), group_epoch=g.group_epoch, assignment_epoch=g.assignment_epoch,
                   assignor_name=g.assignor)
        out["members"] = [{
            "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
            "member_epoch": m.member_epoch, "client_id": m.client_id, "client_host": m.client_host,
            "subscribed_topic_names": m.subscribed_names, "subscribed_topic_regex": m.subscribed_regex,
            "assignment": asg(m.assigned), "target_assignment": asg(g.target.get(m.member_id, {})),
            "member_type": 1,
        } for m in g.members.values()]
        return out
