"""The classic group protocol's data: a group, its members, and its states (Kafka's ClassicGroup)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from pykbroker.coordinator.group.serde import subscribed_topics
from pykbroker.protocol.responses.group import JoinGroupResponse, SyncGroupResponse

# How a parked JoinGroup / SyncGroup is answered when its rebalance completes.
JoinCallback = Callable[[JoinGroupResponse], None]
SyncCallback = Callable[[SyncGroupResponse], None]


class GroupState(StrEnum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(eq=False)
class ClassicMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_cb: JoinCallback | None = None
    sync_cb: SyncCallback | None = None
    is_new: bool = False

    def metadata(self, protocol: str | None) -> bytes:
        for name, md in self.protocols:
            if name == protocol:
                return md
        return b""

    def protocol_names(self) -> list[str]:
        return [n for n, _ in self.protocols]

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        for name in self.protocol_names():
            if name in candidates:
                return name
        raise ValueError("member does not support any candidate protocol")


@dataclass(eq=False)
class ClassicGroup:
    group_id: str
    partition: int
    state: GroupState = GroupState.EMPTY
    state_timestamp: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    members: dict[str, ClassicMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)
    pending_members: set[str] = field(default_factory=set)
    pending_sync: set[str] = field(default_factory=set)
    new_member_added: bool = False
    initial_delay_active: bool = False
    subscribed: set[str] | None = None
    # Whether a GroupMetadata record exists for this group (a tombstone is due on deletion).
    persisted: bool = False

    kind = "classic"

    def transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp = now_ms

    @property
    def size(self) -> int:
        return len(self.members)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: ClassicMember) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> ClassicMember | None:
        m = self.members.pop(member_id, None)
        if m is None:
            return None
        if m.group_instance_id is not None and self.static_members.get(m.group_instance_id) == member_id:
            del self.static_members[m.group_instance_id]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return m

    def candidate_protocols(self) -> set[str]:
        it = iter(self.members.values())
        first = next(it, None)
        if first is None:
            return set()
        out = set(first.protocol_names())
        for m in it:
            out &= set(m.protocol_names())
        return out

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        names = {n for n, _ in protocols}
        if self.state == GroupState.EMPTY and not self.members:
            return bool(protocol_type) and bool(names)
        return self.protocol_type == protocol_type and bool(self.candidate_protocols() & names)

    def select_protocol(self) -> str:
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            v = m.vote(candidates)
            votes[v] = votes.get(v, 0) + 1
        # Most votes wins; ties go to the protocol the leader (then members in order) prefers.
        order = {n: i for i, n in enumerate(self._preference_order())}
        return max(votes, key=lambda n: (votes[n], -order.get(n, 1 << 30)))

    def _preference_order(self) -> list[str]:
        out: list[str] = []
        for m in self.members.values():
            for n in m.protocol_names():
                if n not in out:
                    out.append(n)
        return out

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.join_cb is not None for m in self.members.values())

    def static_member_id(self, instance_id: str) -> str | None:
        return self.static_members.get(instance_id)

    def compute_subscriptions(self) -> None:
        if self.protocol_type != "consumer" or self.protocol_name is None:
            self.subscribed = None
            return
        topics: set[str] = set()
        for m in self.members.values():
            t = subscribed_topics(m.metadata(self.protocol_name))
            if t is None:
                self.subscribed = None
                return
            topics |= t
        self.subscribed = topics

    def is_subscribed_to(self, topic: str) -> bool:
        if self.state in (GroupState.EMPTY, GroupState.DEAD):
            return False
        if self.subscribed is None:
            return True
        return topic in self.subscribed
