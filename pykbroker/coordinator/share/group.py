"""Share group membership and assignment (KIP-932), sans-I/O.

Share groups have no revocation step: the coordinator computes the assignment whenever membership or
subscriptions change (bumping the group epoch) and each member takes its new partitions with its next
heartbeat, its member epoch becoming the group epoch.  Partitions are shared: the simple assignor gives
each partition to one member while there are at least as many partitions as members, and once members
outnumber a topic's partitions every member still gets one, so several members consume a partition.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from pykbroker.protocol.responses.group import ListedGroup

# What the assignment talks about: (topic id, partition).
Assignment = dict[uuid.UUID, list[int]]
# topic name -> (topic id, partition count), or None when the topic does not exist.
TopicLookup = Callable[[str], tuple[uuid.UUID, int] | None]


@dataclass
class ShareMember:
    member_id: str
    member_epoch: int = 0
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed: tuple[str, ...] = ()
    assignment: Assignment = field(default_factory=dict)
    deadline: int = 0  # session expiry, ms
    sent_epoch: int = -1  # the member epoch whose assignment the member was last sent


@dataclass
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """Kafka's ShareGroup states: Empty or Stable (assignment is immediate, so never Assigning here)."""
        return "Stable" if self.members else "Empty"

    def subscribed_topics(self) -> set[str]:
        out: set[str] = set()
        for m in self.members.values():
            out.update(m.subscribed)
        return out


@dataclass(frozen=True)
class HeartbeatResult:
    error: ErrorCode
    member_epoch: int = -1
    assignment: Assignment | None = None  # None: unchanged since the member last heard it
    message: str | None = None


def simple_assign(members: list[ShareMember], lookup: TopicLookup) -> dict[str, Assignment]:
    """Spread each subscribed topic's partitions over its subscribers: round-robin while partitions
    are at least as many as members, else every member gets one partition and partitions are shared."""
    out: dict[str, Assignment] = {m.member_id: {} for m in members}
    topics: set[str] = set()
    for m in members:
        topics.update(m.subscribed)
    for topic in sorted(topics):
        info = lookup(topic)
        if info is None or info[1] <= 0:
            continue
        topic_id, count = info
        subs = sorted(m.member_id for m in members if topic in m.subscribed)
        if not subs:
            continue
        if count >= len(subs):
            for p in range(count):
                out[subs[p % len(subs)]].setdefault(topic_id, []).append(p)
        else:
            for i, mid in enumerate(subs):
                out[mid].setdefault(topic_id, []).append(i % count)
    return out


class ShareGroups:
    """Every share group this coordinator holds, driven by heartbeats and a clock."""

    def __init__(self, lookup: TopicLookup, now: Callable[[], int], max_size: int = 200) -> None:
        self.groups: dict[str, ShareGroup] = {}
        self.lookup = lookup
        self.now = now
        self.max_size = max_size
        # Called with (group id, member id) when a member leaves or expires: its acquired records go back.
        self.on_member_removed: Callable[[str, str], None] = lambda g, m: None

    def heartbeat(self, group_id: str, member_id: str, member_epoch: int, rack_id: str | None,
                  subscribed: tuple[str, ...] | None, session_timeout_ms: int, client_id: str = "",
                  client_host: str = "") -> HeartbeatResult:
        if not group_id:
            return HeartbeatResult(ErrorCode.invalid_request, message="GroupId can't be empty.")
        if not member_id:
            return HeartbeatResult(ErrorCode.invalid_request, message="MemberId can't be empty.")
        group = self.groups.get(group_id)
        if member_epoch == -1:  # leave
            if group is not None and member_id in group.members:
                self._remove(group, member_id)
            return HeartbeatResult(ErrorCode.none, member_epoch=-1)
        if member_epoch == 0:
            if subscribed is None:
                return HeartbeatResult(ErrorCode.invalid_request,
                                       message="SubscribedTopicNames must be set in first request.")
            if group is None:
                group = self.groups[group_id] = ShareGroup(group_id)
            member = group.members.get(member_id)
            if member is None:
                if len(group.members) >= self.max_size:
                    return HeartbeatResult(ErrorCode.group_max_size_reached,
                                           message=f"The share group has reached its maximum size {self.max_size}.")
                member = group.members[member_id] = ShareMember(member_id)
            member.sent_epoch = -1  # a (re)join is told its assignment
        else:
            member = group.members.get(member_id) if group is not None else None
            if group is None or member is None:
                return HeartbeatResult(ErrorCode.unknown_member_id,
                                       message=f"Member {member_id} is not a member of group {group_id}.")
            if member_epoch != member.member_epoch:
                return HeartbeatResult(ErrorCode.fenced_member_epoch,
                                       message=f"The share group member has a stale epoch {member_epoch}.")
        member.deadline = self.now() + session_timeout_ms
        member.client_id, member.client_host = client_id, client_host
        if rack_id is not None:
            member.rack_id = rack_id
        if subscribed is not None and tuple(sorted(set(subscribed))) != member.subscribed:
            member.subscribed = tuple(sorted(set(subscribed)))
            group.group_epoch += 1
        elif member_epoch == 0 and member.member_epoch == 0:
            group.group_epoch += 1  # a new member changes the assignment
        self._maybe_reassign(group)
        member.member_epoch = group.assignment_epoch
        changed = member.sent_epoch != member.member_epoch
        member.sent_epoch = member.member_epoch
        return HeartbeatResult(ErrorCode.none, member.member_epoch, dict(member.assignment) if changed else None)

    def _maybe_reassign(self, group: ShareGroup) -> None:
        if group.assignment_epoch == group.group_epoch:
            return
        result = simple_assign(list(group.members.values()), self.lookup)
        for mid, a in result.items():
            m = group.members[mid]
            if a != m.assignment:
                m.assignment = a
        group.assignment_epoch = group.group_epoch

    def on_topics_changed(self) -> None:
        """Partitions were added or topics created/deleted: every group re-assigns on its next heartbeat."""
        for g in self.groups.values():
            if g.members:
                g.group_epoch += 1
                self._maybe_reassign(g)

    def _remove(self, group: ShareGroup, member_id: str) -> None:
        del group.members[member_id]
        group.group_epoch += 1
        self._maybe_reassign(group)
        self.on_member_removed(group.group_id, member_id)

    def expire(self) -> list[tuple[str, str]]:
        """Remove members whose session timed out; returns (group, member) removed."""
        now = self.now()
        gone: list[tuple[str, str]] = []
        for g in list(self.groups.values()):
            for mid, m in list(g.members.items()):
                if m.deadline <= now:
                    self._remove(g, mid)
                    gone.append((g.group_id, mid))
        return gone

    def listed(self, states: set[str] | None = None, types: set[str] | None = None) -> list[ListedGroup]:
        """ListGroups entries as Kafka 4.x lists share groups (protocol type and group type "share")."""
        if types and "share" not in types:
            return []
        return [{"group_id": gid, "protocol_type": "share", "group_state": g.state, "group_type": "share"}
                for gid, g in sorted(self.groups.items()) if not states or g.state.lower() in states]

    def is_member(self, group_id: str, member_id: str) -> bool:
        g = self.groups.get(group_id)
        return g is not None and member_id in g.members

    def assigned(self, group_id: str, member_id: str, topic_id: uuid.UUID, partition: int) -> bool:
        g = self.groups.get(group_id)
        m = g.members.get(member_id) if g is not None else None
        return m is not None and partition in m.assignment.get(topic_id, [])

    def delete(self, group_id: str) -> ErrorCode:
        g = self.groups.get(group_id)
        if g is None:
            return ErrorCode.group_id_not_found
        if g.members:
            return ErrorCode.non_empty_group
        del self.groups[group_id]
        return ErrorCode.none
