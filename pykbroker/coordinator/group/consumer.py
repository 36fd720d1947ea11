"""KIP-848 consumer groups: server-side assignment, member epochs, incremental reconciliation.

A member heartbeats with its epoch; the coordinator keeps a group epoch (bumped whenever
subscriptions, membership or subscribed topics' partition counts change), computes a target
assignment for that epoch with the group's assignor, and moves each member towards its
target: partitions it must give up are revoked first (the member keeps its epoch until it
acknowledges), then it receives the new epoch with the partitions no other member still owns.

Regular-expression subscriptions follow Kafka 4: a member's ``SubscribedTopicRegex`` counts only once
the group has *resolved* it (:class:`ResolvedRegex`, kept per group).  The heartbeat that brings a new
regex is answered from the literal topic names alone; the resolution runs off the heartbeat path (a
timer of this sans-I/O state machine, which the I/O edge fires on its next tick), and if it changes
what the group subscribes to, the group epoch is bumped so that a later heartbeat gets the regex's
partitions.  As in Kafka, a heartbeat asks for a refresh when a regex is unresolved, when topics were
created since the last resolution, or when ``REGEX_REFRESH_INTERVAL_MS`` passed, but never within
``REGEX_BATCH_REFRESH_MIN_INTERVAL_MS`` of the previous one: all the regexes of a group are resolved
together, so a burst of changes costs one rebalance.  Kafka matches with RE2/J; this uses Python's
``re`` (``fullmatch``), which agrees on the patterns clients send (``^prefix.*``, alternations) but not
on every construct (README, differences).

Persistence follows Kafka: every change is written to ``__consumer_offsets`` as Kafka's
consumer-group records (:mod:`.consumer_records`) before the heartbeat is answered, and the
records are replayed when the partition is loaded, so members keep their epochs and
assignments across a coordinator restart.  Writes are computed as a diff between the group's
state and what was last persisted (one batch per change); a member's removal or the group's
deletion writes tombstones.  The group, its members and their records are
:mod:`.consumer_group`; the assignors are :mod:`.assignors`.
"""

from __future__ import annotations

import copy
import logging
import re
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group import consumer_records as cr
from pykbroker.coordinator.group.assignors import ASSIGNORS, Topics, uniform_assign
from pykbroker.coordinator.group.classic import ClassicGroup, GroupState
from pykbroker.coordinator.group.classic_protocol import ClassicGroupCoordinator
from pykbroker.coordinator.group.consumer_group import (
    LEAVE_EPOCH,
    STABLE,
    STATIC_LEAVE_EPOCH,
    UNRELEASED,
    UNREVOKED,
    Assignment,
    ConsumerGroup,
    ConsumerMember,
    ResolvedRegex,
    assignment_and,
    assignment_copy,
    assignment_minus,
    diff_records,
    group_records,
)
from pykbroker.coordinator.group.consumer_records import ClassicMetadata
from pykbroker.coordinator.group.serde import (
    decode_consumer_assignment,
    decode_consumer_subscription,
    encode_consumer_assignment,
    encode_group_key,
)
from pykbroker.protocol.responses.group import (
    ConsumerGroupDescribeAssignment,
    ConsumerGroupDescribeDescribedGroup,
    ConsumerGroupHeartbeatResponse,
    JoinGroupResponse,
    SyncGroupResponse,
)

if TYPE_CHECKING:
    from pykbroker.metadata.store import TopicRecord

log = logging.getLogger("pykbroker.groups")

R = TypeVar("R")

# Kafka's REGEX_BATCH_REFRESH_MIN_INTERVAL_MS: a group's regexes are not resolved again sooner.
REGEX_BATCH_REFRESH_MIN_INTERVAL_MS = 10_000
# Kafka's group.consumer.regex.refresh.interval.ms default: resolutions older than this are redone.
REGEX_REFRESH_INTERVAL_MS = 600_000

class HeartbeatError(Exception):
    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message


# --- the coordinator side ----------------------------------------------------------------------

class ConsumerGroups:
    def __init__(self, manager: ClassicGroupCoordinator) -> None:
        self.m = manager
        self._loading: dict[int, dict[tuple[int, str, str | None], bytes | None]] = {}
        self.topic_ids: Callable[[str], Any] = lambda _t: None
        self.topic_names: Callable[[], list[str]] = list
        # A group's own dynamic configs (ConfigResource GROUP: consumer.session.timeout.ms,
        # consumer.heartbeat.interval.ms), which override the broker's group.consumer.* defaults.
        self.group_configs: Callable[[str], Mapping[str, str]] = lambda _gid: {}
        # Kafka's metadata image version, and lastMetadataImageWithNewTopics: regexes resolved
        # against an older version than the latter are resolved again.
        self.metadata_version = 0
        self.new_topics_version = 0
        self.regex_refresh_min_interval_ms = REGEX_BATCH_REFRESH_MIN_INTERVAL_MS
        self.regex_refresh_interval_ms = REGEX_REFRESH_INTERVAL_MS

    @property
    def cfg(self) -> Any:
        return self.m.config

    # --- persistence ------------------------------------------------------------------------

    def _topic_id_or_none(self, name: str) -> uuid.UUID | None:
        tid = self.topic_ids(name)
        return tid if isinstance(tid, uuid.UUID) else None

    def persist(self, g: ConsumerGroup, extra: list[tuple[bytes, bytes | None]] | None = None) -> None:
        """Write what changed in ``g`` since the last write (raises if the write fails)."""
        new = group_records(g, self._topic_id_or_none)
        records = list(extra or []) + diff_records(g.persisted, new)
        if records:
            self.m.writer(g.partition, records)
        g.persisted = new

    def _persist_quietly(self, g: ConsumerGroup) -> None:
        try:
            self.persist(g)
        except Exception:
            log.exception("failed to persist consumer group %(group_id)s", {"group_id": g.group_id})

    # Hooks called by the manager while loading a partition.
    def replay(self, partition: int, key: bytes, value: bytes | None) -> None:
        """Collect one KIP-848 record (last write per key wins); groups are built by finish_loading."""
        k = cr.decode_consumer_key(key)
        if k is None:
            return
        self._loading.setdefault(partition, {})[(k.type, k.group, k.member)] = value

    def finish_loading(self, partition: int) -> None:
        recs = self._loading.pop(partition, {})
        by_group: dict[str, dict[tuple[int, str | None], bytes]] = {}
        for (kind, gid, mid), value in recs.items():
            if value is not None:
                by_group.setdefault(gid, {})[(kind, mid)] = value
        for gid, items in by_group.items():
            if (cr.GROUP_METADATA, None) not in items:
                continue
            try:
                g = self._build_group(gid, partition, items)
            except Exception as e:  # a bad record must not stop loading
                log.warning("skipping undecodable consumer group %(group_id)s: %(error)s",
                            {"group_id": gid, "error": e})
                continue
            if gid in self.m.groups:
                log.warning("group %(group_id)s has both classic and consumer records; using the consumer group",
                            {"group_id": gid})
            self.m.groups[gid] = g
            # Kafka keeps the resolutions in ConsumerGroupRegularExpression records; pykbroker does not
            # write those yet, so it resolves at load, before any heartbeat, and the persisted target
            # (computed with the resolutions) stays valid.
            self._resolve_regexes(g)
            for m in g.members.values():
                self._schedule_session(g, m)
                if m.state == UNREVOKED:
                    self._schedule_revocation(g, m)
            log.info("loaded consumer group %(group_id)s: epoch %(group_epoch)d, %(members)d member(s)",
                     {"group_id": gid, "group_epoch": g.group_epoch, "members": len(g.members)})

    def _build_group(self, gid: str, partition: int, items: dict[tuple[int, str | None], bytes]) -> ConsumerGroup:
        g = ConsumerGroup(gid, partition, state_timestamp=self.m.clock(), assignor=self.cfg.consumer_assignors[0])
        g.group_epoch = cr.decode_group_metadata(items[(cr.GROUP_METADATA, None)])
        if (cr.TARGET_METADATA, None) in items:
            g.assignment_epoch = cr.decode_target_metadata(items[(cr.TARGET_METADATA, None)])
        if (cr.PARTITION_METADATA, None) in items:
            _e, topics = cr.decode_partition_metadata(items[(cr.PARTITION_METADATA, None)])
            g.topic_snapshot = {name: n for _tid, name, n in topics}
        for (kind, mid), value in items.items():
            if kind != cr.MEMBER_METADATA or mid is None:
                continue
            md = cr.decode_member_metadata(value)
            m = ConsumerMember(mid, md.instance_id, md.rack_id, md.client_id, md.client_host,
                               md.rebalance_timeout_ms if md.rebalance_timeout_ms > 0 else 300_000,
                               list(md.subscribed_names), md.subscribed_regex, md.server_assignor, classic=md.classic)
            cur = items.get((cr.CURRENT_ASSIGNMENT, mid))
            if cur is not None:
                ca = cr.decode_current_assignment(cur)
                m.member_epoch, m.previous_epoch, m.state = ca.member_epoch, ca.previous_epoch, ca.state
                m.assigned, m.pending_revocation = ca.assigned, ca.pending_revocation
            g.members[mid] = m
            if m.instance_id is not None:
                g.static_members[m.instance_id] = mid
            tgt = items.get((cr.TARGET_MEMBER, mid))
            if tgt is not None:
                g.target[mid] = cr.decode_target_member(tgt)
        votes: dict[str, int] = {}
        for m in g.members.values():
            if m.server_assignor:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if votes:
            g.assignor = max(votes, key=lambda a: (votes[a], a))
        g.persisted = group_records(g, self._topic_id_or_none)
        return g

    def unload_group(self, g: ConsumerGroup) -> None:
        self.m.timers.cancel(("cregex", g.group_id))
        for mid in g.members:
            self.m.timers.cancel(("chb", g.group_id, mid))
            self.m.timers.cancel(("crev", g.group_id, mid))

    def can_convert_to_classic(self, g: ConsumerGroup) -> bool:
        return g.is_empty()

    def delete_for_conversion(self, g: ConsumerGroup) -> None:
        """An empty consumer group makes way for a classic one (its records are tombstoned)."""
        tombstones = g.tombstones()
        if tombstones:
            self.m.writer(g.partition, tombstones)
        self.m.groups.pop(g.group_id, None)

    def on_topic_change(self, name: str, rec: TopicRecord | None) -> None:
        """A topic was created, changed or deleted: groups subscribed to it rebalance; regexes that
        could now match more are resolved again at the groups' next heartbeats (as Kafka does when
        the metadata image has new topics)."""
        self.metadata_version += 1
        if rec is not None:
            self.new_topics_version = self.metadata_version
        for g in self.m.groups.values():
            if isinstance(g, ConsumerGroup) and g.members and (name in g.topic_snapshot or g.is_subscribed_to(name)):
                g.group_epoch += 1
                self.m.rebalances["consumer"] += 1

    def validate_commit(self, g: ConsumerGroup, member_id: str, epoch: int) -> ErrorCode | None:
        if epoch < 0 and not member_id:
            return None if g.is_empty() else ErrorCode.unknown_member_id
        m = g.members.get(member_id)
        if m is None:
            return ErrorCode.unknown_member_id
        if m.classic is not None:
            # A classic member commits with its generation, which is its member epoch.
            return ErrorCode.illegal_generation if epoch != m.member_epoch else None
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

    def _apply(self, gid: str, fn: Callable[[], R]) -> R:
        """Run ``fn`` (which changes group ``gid``), then persist; on any failure undo its changes."""
        before = self.m.groups.get(gid)
        snapshot = copy.deepcopy(before) if isinstance(before, ConsumerGroup) else None

        def rollback() -> None:
            if before is None:
                self.m.groups.pop(gid, None)
            else:
                self.m.groups[gid] = snapshot if snapshot is not None else before

        try:
            result = fn()
        except BaseException:
            rollback()
            raise
        g = self.m.groups.get(gid)
        extra: list[tuple[bytes, bytes | None]] = []
        if before is not None and before is not g and not isinstance(before, ConsumerGroup) \
                and getattr(before, "persisted", False):
            extra.append((encode_group_key(gid), None))  # the classic group this one replaces
        try:
            if isinstance(g, ConsumerGroup):
                self.persist(g, extra)
            elif g is not before and isinstance(before, ConsumerGroup):
                self.m.writer(before.partition, before.tombstones() + self.m.classic_records(g))
        except Exception:
            log.exception("failed to persist group %(group_id)s", {"group_id": gid})
            # Memory never runs ahead of the log: undo the changes.
            rollback()
            raise HeartbeatError(ErrorCode.coordinator_not_available) from None
        return result

    def heartbeat(self, req: Any, client_id: str, client_host: str) -> ConsumerGroupHeartbeatResponse:
        try:
            return self._apply(req.group_id, lambda: self._heartbeat(req, client_id, client_host))
        except HeartbeatError as e:
            return {"throttle_time": 0, "error_code": e.code, "error_message": e.message,
                    "member_id": req.member_id or None, "member_epoch": -1, "heartbeat_interval": 0,
                    "assignment": None}

    def _topics(self) -> Topics:
        out: Topics = {}
        for name in self.topic_names():
            tid = self.topic_ids(name)
            n = self.m.topic_partitions(name)
            if tid is not None and n:
                out[name] = (tid, n)
        return out

    def _heartbeat(self, req: Any, client_id: str, client_host: str) -> ConsumerGroupHeartbeatResponse:
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
                raise HeartbeatError(
                    ErrorCode.invalid_regular_expression,
                    f"SubscribedTopicRegex `{regex}` is not a valid regular expression: {e}.") from None
        g = self.m.groups.get(gid)
        if isinstance(g, ClassicGroup):
            if g.state == GroupState.EMPTY and not g.members:
                self.m.groups.pop(gid)  # Kafka converts an empty classic group
                g = None
            elif epoch == 0 and self._can_upgrade(g):
                g = self._convert_from_classic(g)
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
                # Like Kafka, a new member bumps the group epoch through its subscription (below), not
                # by joining: one that subscribes only to a regex not resolved yet waits for it.
                m = ConsumerMember(member_id, instance_id)
                g.members[member_id] = m
                if instance_id is not None:
                    g.static_members[instance_id] = member_id
                created = True
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
                    owned is not None and assignment_minus(owned, m.assigned))):
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
        # Kafka's consumerGroupHeartbeat: new topic names bump the group epoch; a new regex does so
        # only if the group has already resolved it, otherwise it is resolved off the heartbeat path
        # and this heartbeat is answered from what the member subscribes to without it.
        bump = g.group_epoch == 0
        if req.subscribed_topic_names is not None and sorted(req.subscribed_topic_names) != sorted(
                m.subscribed_names):
            m.subscribed_names = list(req.subscribed_topic_names)
            bump = True
        last_refresh = g.last_regex_refresh_ms()
        new_regex = False
        if regex is not None and (regex or None) != m.subscribed_regex:
            new = regex or None
            counts = g.subscribed_regexes()
            new_regex = new is not None and counts.get(new, 0) == 0
            if new is not None and new in g.resolved and not new_regex:
                bump = True  # Kafka's REGEX_UPDATED_AND_RESOLVED
            elif new is None:
                # Kafka 4.0 does not bump here (nothing is left to resolve), so the partitions of the
                # dropped regex stay in this member's target, which it must give up, while other members
                # subscribed to them wait for an unrelated rebalance; bump so they move now.
                bump = True
            m.subscribed_regex = new
            g.prune_resolved()
        if req.server_assignor is not None and req.server_assignor != m.server_assignor:
            m.server_assignor = req.server_assignor
            bump = True
        if bump:
            g.group_epoch += 1
            self.m.rebalances["consumer"] += 1
        if created:
            log.info("member %(member_id)s joined consumer group %(group_id)s (group epoch %(group_epoch)d)",
                     {"member_id": member_id, "group_id": gid, "group_epoch": g.group_epoch})
        self._maybe_refresh_regexes(g, new_regex, last_refresh, now)

        self._update_target(g)

        owned = self._owned(req)
        self._reconcile(g, m, owned)
        self._schedule_session(g, m)

        resp: ConsumerGroupHeartbeatResponse = {
            "throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "member_id": member_id,
            "member_epoch": m.member_epoch,
            "heartbeat_interval": int(self.group_configs(gid).get(
                "consumer.heartbeat.interval.ms", self.cfg.consumer_heartbeat_interval_ms)),
            "assignment": None}
        if m.last_sent is None or m.last_sent != m.assigned or epoch == 0 or (owned is not None and owned != \
                m.assigned):
            m.last_sent = assignment_copy(m.assigned)
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

    def _leave(self, g: ConsumerGroup, member_id: str, instance_id: str | None, epoch: int
               ) -> ConsumerGroupHeartbeatResponse:
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
            self._remove(g, m, "left the group", persist=False)
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "member_id": member_id,
                "member_epoch": epoch, "heartbeat_interval": 0, "assignment": None}

    def _remove(self, g: ConsumerGroup, m: ConsumerMember, why: str, persist: bool = True) -> None:
        g.members.pop(m.member_id, None)
        g.target.pop(m.member_id, None)
        g.prune_resolved()
        if m.instance_id is not None and g.static_members.get(m.instance_id) == m.member_id:
            del g.static_members[m.instance_id]
        for kind in ("chb", "crev", "cjoin", "csync"):
            self.m.timers.cancel((kind, g.group_id, m.member_id))
        g.group_epoch += 1
        self.m.rebalances["consumer"] += 1
        g.state_timestamp = self.m.clock()
        log.info("member %(member_id)s %(why)s consumer group %(group_id)s (group epoch %(group_epoch)d)",
                 {"member_id": m.member_id, "why": why, "group_id": g.group_id, "group_epoch": g.group_epoch})
        if m.classic is None and self._maybe_downgrade(g):
            if persist:
                cg = self.m.groups[g.group_id]
                try:
                    self.m.writer(g.partition, g.tombstones() + self.m.classic_records(cg))
                except Exception:
                    log.exception("failed to persist the downgrade of group %(group_id)s", {"group_id": g.group_id})
            return
        if persist:
            self._persist_quietly(g)

    # --- regular expressions ----------------------------------------------------------------------

    def _maybe_refresh_regexes(self, g: ConsumerGroup, new_regex: bool, last_refresh: int | None, now: int) -> None:
        """Kafka's maybeUpdateRegularExpressions: whether this heartbeat asks for the group's regexes to be
        resolved again.  ``last_refresh`` is the group's last resolution as it stood before this heartbeat."""
        regexes = g.subscribed_regexes()
        if not regexes:
            return
        key = ("cregex", g.group_id)
        if self.m.timers.is_scheduled(key):
            return  # one resolution at a time per group
        if last_refresh is not None and now <= last_refresh + self.regex_refresh_min_interval_ms:
            return  # batch the refreshes of a group
        if not (new_regex or any(rx not in g.resolved for rx in regexes)
                or g.regex_version() < self.new_topics_version
                or last_refresh is None or now > last_refresh + self.regex_refresh_interval_ms):
            return
        gid = g.group_id
        self.m._schedule(key, 0, lambda: self._refresh_regexes(gid))

    def _resolve_regexes(self, g: ConsumerGroup) -> bool:
        """Resolve every regex the group subscribes to against the topics now; True if any resolution changed."""
        now, version = self.m.clock(), self.metadata_version
        names = self.topic_names()
        changed = False
        for rx in g.subscribed_regexes():
            try:
                pattern = re.compile(rx)
            except re.error:  # validated when a member sent it; should not happen
                log.error("group %(group_id)s: cannot compile regular expression %(regex)r; it matches nothing",
                          {"group_id": g.group_id, "regex": rx})
                topics: frozenset[str] = frozenset()
            else:
                topics = frozenset(t for t in names if pattern.fullmatch(t))
            old = g.resolved.get(rx)
            if old is None or old.topics != topics:
                changed = True
            g.resolved[rx] = ResolvedRegex(topics, version, now)
        g.prune_resolved()
        return changed

    def _refresh_regexes(self, gid: str) -> None:
        """The asynchronous resolution (a timer, run by the I/O edge's next tick): store the new resolutions
        and bump the group epoch if what the group subscribes to changed (Kafka's
        handleRegularExpressionsResult); members get the new target on their next heartbeat."""
        g = self.m.groups.get(gid)
        if not isinstance(g, ConsumerGroup) or self.m.coordinator_error(gid) is not None:
            return

        def run() -> None:
            grp = self.m.groups[gid]
            assert isinstance(grp, ConsumerGroup)
            if self._resolve_regexes(grp):
                grp.group_epoch += 1
                self.m.rebalances["consumer"] += 1
                log.info("consumer group %(group_id)s: regular expressions resolved to %(resolved)s; group epoch "
                         "%(group_epoch)d",
                         {"group_id": gid, "resolved": {rx: sorted(r.topics) for rx, r in grp.resolved.items()},
                          "group_epoch": grp.group_epoch})

        try:
            self._apply(gid, run)
        except HeartbeatError:
            log.warning("consumer group %(group_id)s: could not persist the resolution of its regular expressions",
                        {"group_id": gid})

    def _schedule_session(self, g: ConsumerGroup, m: ConsumerMember) -> None:
        gid, mid = g.group_id, m.member_id

        def expire() -> None:
            grp = self.m.groups.get(gid)
            if isinstance(grp, ConsumerGroup) and mid in grp.members:
                self._remove(grp, grp.members[mid], "expired from (session timeout)")

        timeout = m.classic.session_timeout_ms if m.classic is not None else int(self.group_configs(gid).get(
            "consumer.session.timeout.ms", self.cfg.consumer_session_timeout_ms))
        self.m._schedule(("chb", gid, mid), timeout, expire)

    def _update_target(self, g: ConsumerGroup) -> None:
        """Bump the group epoch if subscribed topics changed, and compute the target if it is stale."""
        topics = self._topics()
        subscribed = g.subscribed_topics(list(topics))
        snapshot = {t: topics[t][1] for t in subscribed if t in topics}
        if snapshot != g.topic_snapshot:
            g.group_epoch = max(g.group_epoch, g.assignment_epoch + 1)
        if g.group_epoch > g.assignment_epoch:
            self._compute_target(g, topics)
            g.topic_snapshot = snapshot

    def _schedule_revocation(self, g: ConsumerGroup, m: ConsumerMember) -> None:
        gid, mid = g.group_id, m.member_id

        def revocation_timeout() -> None:
            grp = self.m.groups.get(gid)
            if isinstance(grp, ConsumerGroup) and mid in grp.members and grp.members[mid].state == UNREVOKED:
                self._remove(grp, grp.members[mid], "was fenced: it did not revoke partitions in time")

        self.m._schedule(("crev", gid, mid), m.rebalance_timeout_ms, revocation_timeout)

    def _compute_target(self, g: ConsumerGroup, topics: Topics) -> None:
        votes: dict[str, int] = {}
        for m in g.members.values():
            if m.server_assignor:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if votes:
            g.assignor = max(votes, key=lambda a: (votes[a], a))
        fn = ASSIGNORS.get(g.assignor, uniform_assign)
        current = {mid: g.target.get(mid, m.assigned) for mid, m in g.members.items()}
        g.target = fn(g.members, topics, current, {mid: g.member_topics(m) for mid, m in g.members.items()})
        g.assignment_epoch = g.group_epoch
        log.info("computed target assignment of consumer group %(group_id)s at epoch %(assignment_epoch)d with "
                 "%(assignor)s",
                 {"group_id": g.group_id, "assignment_epoch": g.assignment_epoch, "assignor": g.assignor})

    def _reconcile(self, g: ConsumerGroup, m: ConsumerMember, owned: Assignment | None) -> None:
        # As Kafka's CurrentAssignmentBuilder: topics the member no longer subscribes to are not part of its
        # target, even before a new target is computed (a regex it left, while its new one is unresolved).
        subscribed = {self._topic_id_or_none(t) for t in g.member_topics(m)}
        target = {t: ps for t, ps in g.target.get(m.member_id, {}).items() if t in subscribed}
        if m.state == UNREVOKED:
            # Still waiting for the member to give up partitions?
            if owned is not None and not assignment_and(owned, m.pending_revocation):
                m.pending_revocation = {}
                self.m.timers.cancel(("crev", g.group_id, m.member_id))
                m.state = STABLE
            else:
                return
        if m.member_epoch == g.assignment_epoch and m.state == STABLE and m.assigned == assignment_copy(target):
            return
        revoke = assignment_minus(m.assigned, target)
        if revoke and owned is not None and not assignment_and(owned, revoke):
            # The member already gave them up (an eager classic member rejoining): move on at once.
            m.assigned = assignment_and(m.assigned, target)
            revoke = {}
        if revoke:
            m.assigned = assignment_and(m.assigned, target)
            m.pending_revocation = revoke
            m.state = UNREVOKED
            self._schedule_revocation(g, m)
            return
        owners = g.owner_map(m.member_id)
        new = assignment_copy(m.assigned)
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

    # --- migration between the classic and the consumer protocol (Kafka 4.0) ---------------------

    @property
    def _policy(self) -> str:
        return str(getattr(self.cfg, "consumer_migration_policy", "bidirectional")).lower()

    def _can_upgrade(self, cg: Any) -> bool:
        """Kafka's validateOnlineUpgrade: policy, a live group of the consumer protocol, room for one more."""
        if self._policy not in ("upgrade", "bidirectional"):
            log.info("cannot upgrade classic group %(group_id)s: migration policy %(policy)s",
                     {"group_id": cg.group_id, "policy": self._policy})
            return False
        if cg.state == GroupState.DEAD or cg.protocol_type != "consumer":
            return False
        return bool(len(cg.members) < self.cfg.consumer_max_size)

    def _names_to_ids(self, parts: dict[str, list[int]]) -> Assignment:
        out: Assignment = {}
        for name, ps in parts.items():
            tid = self._topic_id_or_none(name)
            if tid is not None and ps:
                out.setdefault(tid, set()).update(ps)
        return out

    def _ids_to_names(self, a: Assignment) -> dict[str, list[int]]:
        names = {tid: name for name, (tid, _n) in self._topics().items()}
        return {names[t]: sorted(ps) for t, ps in a.items() if t in names and ps}

    def _convert_from_classic(self, cg: Any) -> ConsumerGroup:
        """Kafka's ConsumerGroup.fromClassicGroup: members keep their assignment at epoch = generation."""
        gen = cg.generation_id
        g = ConsumerGroup(cg.group_id, cg.partition, group_epoch=gen, assignment_epoch=gen,
                          state_timestamp=self.m.clock(), assignor=self.cfg.consumer_assignors[0])
        for cm in cg.members.values():
            md = cm.metadata(cg.protocol_name) if cg.protocol_name else (cm.protocols[0][1] if cm.protocols else b"")
            sub = decode_consumer_subscription(md)
            asg = decode_consumer_assignment(cm.assignment)
            if sub is None or asg is None:
                raise HeartbeatError(ErrorCode.group_id_not_found,
                                     f"Cannot upgrade classic group {cg.group_id} to consumer group because the "
                                     "embedded consumer protocol is malformed.")
            assigned = self._names_to_ids(asg)
            m = ConsumerMember(cm.member_id, cm.group_instance_id, None, cm.client_id, cm.client_host,
                               cm.rebalance_timeout_ms, sorted(sub.topics), member_epoch=gen, previous_epoch=gen,
                               assigned=assigned, classic=ClassicMetadata(cm.session_timeout_ms, list(cm.protocols)))
            g.members[m.member_id] = m
            if m.instance_id is not None:
                g.static_members[m.instance_id] = m.member_id
            g.target[m.member_id] = assignment_copy(assigned)
        topics = self._topics()
        g.topic_snapshot = {t: topics[t][1] for t in g.subscribed_topics(list(topics)) if t in topics}
        # Pending JoinGroup/SyncGroup calls learn that another rebalance is under way.
        for cm in cg.members.values():
            self.m._respond_join(cm, self.m.join_error(ErrorCode.rebalance_in_progress, cm.member_id))
            self.m._respond_sync(cm, {"error_code": ErrorCode.rebalance_in_progress, "assignment": b""})
        self.m.groups[g.group_id] = g
        for m in g.members.values():
            self._schedule_session(g, m)
        log.info("upgraded classic group %(group_id)s (generation %(generation_id)d, %(members)d member(s)) to a "
                 "consumer group",
                 {"group_id": g.group_id, "generation_id": gen, "members": len(g.members)})
        return g

    def _maybe_downgrade(self, g: ConsumerGroup) -> bool:
        """Kafka's validateOnlineDowngrade: the last consumer-protocol member left and classic ones remain."""
        if not g.members or any(m.classic is None for m in g.members.values()):
            return False
        if self._policy not in ("downgrade", "bidirectional"):
            log.info("cannot downgrade consumer group %(group_id)s: migration policy %(policy)s",
                     {"group_id": g.group_id, "policy": self._policy})
            return False
        if len(g.members) > self.cfg.max_size:
            return False
        members = [(m.member_id, m.instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                    m.classic.session_timeout_ms if m.classic else 0, list(m.classic.protocols) if m.classic else [],
                    encode_consumer_assignment(self._ids_to_names(m.assigned)))
                   for m in g.members.values()]
        for m in g.members.values():
            for kind in ("chb", "crev", "cjoin", "csync"):
                self.m.timers.cancel((kind, g.group_id, m.member_id))
        self.m.downgrade_to_classic(g.group_id, g.partition, g.group_epoch, members)
        log.info("downgraded consumer group %(group_id)s to a classic group (%(members)d member(s))",
                 {"group_id": g.group_id, "members": len(members)})
        return True

    # --- classic members inside a consumer group --------------------------------------------------

    def classic_join(self, g: ConsumerGroup, req: Any, cb: Callable[[JoinGroupResponse], None]) -> None:
        try:
            resp = self._apply(g.group_id, lambda: self._classic_join(req))
        except HeartbeatError as e:
            resp = self.m.join_error(e.code, req.member_id)
        cb(resp)

    def _classic_join(self, req: Any) -> JoinGroupResponse:
        gid = req.group_id
        g = self.m.groups[gid]
        assert isinstance(g, ConsumerGroup)
        if req.protocol_type != "consumer" or not req.protocols:
            raise HeartbeatError(ErrorCode.inconsistent_group_protocol)
        sub = decode_consumer_subscription(req.protocols[0][1])
        if sub is None:
            raise HeartbeatError(ErrorCode.inconsistent_group_protocol)
        member_id, instance = req.member_id, req.group_instance_id
        if instance is None:
            if not member_id:
                member_id = str(uuid.uuid4())
                if req.require_known_member_id:
                    return self.m.join_error(ErrorCode.member_id_required, member_id)
            m = g.members.get(member_id)
            if m is not None and m.classic is None:
                raise HeartbeatError(ErrorCode.unknown_member_id)
        else:
            existing = g.static_members.get(instance)
            if member_id and existing is None:
                raise HeartbeatError(ErrorCode.unknown_member_id)
            if member_id and existing != member_id:
                raise HeartbeatError(ErrorCode.fenced_instance_id)
            if not member_id:
                member_id = str(uuid.uuid4())
                old = g.members.get(existing) if existing is not None else None
                if old is not None:
                    # A static member replacing its predecessor takes over its assignment.
                    del g.members[old.member_id]
                    for kind in ("chb", "crev", "cjoin", "csync"):
                        self.m.timers.cancel((kind, gid, old.member_id))
                    if old.member_id in g.target:
                        g.target[member_id] = g.target.pop(old.member_id)
                    old.member_id = member_id
                    if old.member_epoch == STATIC_LEAVE_EPOCH:
                        old.member_epoch = max(old.previous_epoch, 0)
                    g.members[member_id] = old
                    g.static_members[instance] = member_id
            m = g.members.get(member_id)
        created = False
        if m is None:
            if len(g.members) >= self.cfg.consumer_max_size:
                raise HeartbeatError(ErrorCode.group_max_size_reached)
            m = ConsumerMember(member_id, instance)
            g.members[member_id] = m
            if instance is not None:
                g.static_members[instance] = member_id
            g.group_epoch += 1
            self.m.rebalances["consumer"] += 1
            created = True
            log.info("classic member %(member_id)s joined consumer group %(group_id)s (group epoch %(group_epoch)d)",
                     {"member_id": member_id, "group_id": gid, "group_epoch": g.group_epoch})
        m.client_id, m.client_host = req.client_id, req.client_host
        m.rebalance_timeout_ms = req.rebalance_timeout_ms
        m.classic = ClassicMetadata(req.session_timeout_ms, list(req.protocols))
        topics = sorted(sub.topics)
        if topics != sorted(m.subscribed_names):
            m.subscribed_names = topics
            if not created:
                g.group_epoch += 1
                self.m.rebalances["consumer"] += 1
        self._update_target(g)
        self._reconcile(g, m, self._names_to_ids(sub.owned))
        g.state_timestamp = self.m.clock()
        self.m.timers.cancel(("cjoin", gid, member_id))
        self._schedule_session(g, m)
        self._schedule_classic_timeout(g, m, "csync", "did not send SyncGroup in time")
        return {"error_code": ErrorCode.none, "generation_id": m.member_epoch, "protocol_type": "consumer",
                "protocol_name": req.protocols[0][0], "leader": "", "skip_assignment": False,
                "member_id": member_id, "members": []}

    def _schedule_classic_timeout(self, g: ConsumerGroup, m: ConsumerMember, kind: str, why: str) -> None:
        gid, mid = g.group_id, m.member_id

        def fire() -> None:
            grp = self.m.groups.get(gid)
            if isinstance(grp, ConsumerGroup) and mid in grp.members:
                self._remove(grp, grp.members[mid], why)

        self.m._schedule((kind, gid, mid), m.rebalance_timeout_ms, fire)

    def _classic_member(self, g: ConsumerGroup, member_id: str, instance: str | None) -> ConsumerMember:
        m = g.members.get(member_id)
        if instance is not None:
            existing = g.static_members.get(instance)
            if existing is None:
                raise HeartbeatError(ErrorCode.unknown_member_id)
            if existing != member_id:
                raise HeartbeatError(ErrorCode.fenced_instance_id)
        if m is None or m.classic is None:
            raise HeartbeatError(ErrorCode.unknown_member_id)
        return m

    def classic_sync(self, g: ConsumerGroup, generation: int, member_id: str, instance: str | None,
                     protocol_type: str | None, protocol_name: str | None) -> SyncGroupResponse:
        try:
            m = self._classic_member(g, member_id, instance)
            if generation != m.member_epoch:
                raise HeartbeatError(ErrorCode.illegal_generation)
            names = [n for n, _ in m.classic.protocols] if m.classic else []
            if (protocol_type is not None and protocol_type != "consumer") or (
                    protocol_name is not None and protocol_name not in names):
                raise HeartbeatError(ErrorCode.inconsistent_group_protocol)
        except HeartbeatError as e:
            return {"error_code": e.code, "protocol_type": None, "protocol_name": None, "assignment": b""}
        self.m.timers.cancel(("csync", g.group_id, member_id))
        self._schedule_session(g, m)
        m.last_sent = assignment_copy(m.assigned)
        return {"error_code": ErrorCode.none, "protocol_type": "consumer",
                "protocol_name": protocol_name or (names[0] if names else None),
                "assignment": encode_consumer_assignment(self._ids_to_names(m.assigned))}

    def _waiting_on_unreleased(self, g: ConsumerGroup, m: ConsumerMember) -> bool:
        owners = g.owner_map(m.member_id)
        missing = assignment_minus(g.target.get(m.member_id, {}), m.assigned)
        return any((t, p) in owners for t, ps in missing.items() for p in ps)

    def classic_heartbeat(self, g: ConsumerGroup, generation: int, member_id: str, instance: str | None
                          ) -> ErrorCode:
        try:
            m = self._classic_member(g, member_id, instance)
        except HeartbeatError as e:
            return e.code
        if generation != m.member_epoch:
            return ErrorCode.illegal_generation
        self._schedule_session(g, m)
        # Kafka rejoins a classic member when the group moved on, it must revoke, or what it waits for is free.
        if (m.member_epoch < g.group_epoch or m.state == UNREVOKED
                or (m.state == UNRELEASED and not self._waiting_on_unreleased(g, m))):
            if not self.m.timers.is_scheduled(("cjoin", g.group_id, member_id)):
                self._schedule_classic_timeout(g, m, "cjoin", "did not rejoin in time")
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def classic_leave(self, g: ConsumerGroup, members: list[tuple[str, str | None]]) -> list[ErrorCode]:
        out: list[ErrorCode] = []

        def run() -> None:
            for member_id, instance in members:
                if not member_id and instance is not None:
                    member_id = g.static_members.get(instance, "")
                try:
                    m = self._classic_member(g, member_id, instance) if member_id else None
                except HeartbeatError as e:
                    out.append(e.code)
                    continue
                if m is None:
                    out.append(ErrorCode.unknown_member_id)
                    continue
                self._remove(g, m, "left the group", persist=False)
                out.append(ErrorCode.none)

        try:
            self._apply(g.group_id, run)
        except HeartbeatError as e:
            return [e.code for _ in members]
        return out

    # --- describe ---------------------------------------------------------------------------------

    def describe(self, gid: str, topic_name: Callable[[uuid.UUID], str | None]
                 ) -> ConsumerGroupDescribeDescribedGroup:
        out: ConsumerGroupDescribeDescribedGroup = {
            "error_code": ErrorCode.none, "error_message": None, "group_id": gid, "group_state": "Dead",
            "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "", "members": [],
            "authorized_operations": -2147483648}
        err = self.m.coordinator_error(gid)
        if err is not None:
            out["error_code"] = err
            return out
        g = self.m.groups.get(gid)
        if not isinstance(g, ConsumerGroup):
            out["error_code"] = ErrorCode.group_id_not_found
            out["error_message"] = f"Group {gid} not found." if g is None else f"Group {gid} is not a consumer group."
            return out

        def asg(a: Assignment) -> ConsumerGroupDescribeAssignment:
            return {"topic_partitions": [{"topic_id": t, "topic_name": topic_name(t) or "", "partitions": sorted(p)}
                                         for t, p in a.items()]}

        out.update({"group_state": g.state_name(), "group_epoch": g.group_epoch,
                    "assignment_epoch": g.assignment_epoch, "assignor_name": g.assignor})
        out["members"] = [{
            "member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
            "member_epoch": m.member_epoch, "client_id": m.client_id, "client_host": m.client_host,
            "subscribed_topic_names": m.subscribed_names, "subscribed_topic_regex": m.subscribed_regex,
            "assignment": asg(m.assigned), "target_assignment": asg(g.target.get(m.member_id, {})),
            "member_type": 0 if m.classic is not None else 1,
        } for m in g.members.values()]
        return out
