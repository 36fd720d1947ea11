"""A KIP-848 consumer group and its members, as the coordinator keeps them, and as Kafka's records.

:class:`ConsumerGroup` holds the group epoch, the target assignment and each member's epoch and
reconciliation state; :func:`group_records` is the full set of Kafka's consumer-group records that
describe it (written to ``__consumer_offsets``), :func:`diff_records` what to write for a change.
The state machine that moves them is :mod:`.consumer`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from pykbroker.coordinator.group import consumer_records as cr
from pykbroker.coordinator.group.consumer_records import ClassicMetadata
from pykbroker.protocol.responses.group import DescribedGroupMember

__all__ = [
    "LEAVE_EPOCH",
    "STABLE",
    "STATIC_LEAVE_EPOCH",
    "UNRELEASED",
    "UNREVOKED",
    "Assignment",
    "ConsumerGroup",
    "ConsumerMember",
    "ResolvedRegex",
    "assignment_and",
    "assignment_copy",
    "assignment_minus",
    "diff_records",
    "group_records",
]

Assignment = dict[uuid.UUID, set[int]]
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

# A member's reconciliation state (Kafka's MemberState).
STABLE = "stable"
UNREVOKED = "unrevoked_partitions"
UNRELEASED = "unreleased_partitions"


@dataclass(frozen=True, slots=True)
class ResolvedRegex:
    """Kafka's ResolvedRegularExpression: the topics a regex matched, as of which metadata and when."""

    topics: frozenset[str]
    version: int
    timestamp: int


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
    # Set for a member that uses the classic protocol (JoinGroup/SyncGroup) inside this group.
    classic: ClassicMetadata | None = None


def assignment_copy(a: Assignment) -> Assignment:
    return {t: set(p) for t, p in a.items() if p}


def assignment_minus(a: Assignment, b: Assignment) -> Assignment:
    return {t: ps - b.get(t, set()) for t, ps in a.items() if ps - b.get(t, set())}


def assignment_and(a: Assignment, b: Assignment) -> Assignment:
    return {t: ps & b.get(t, set()) for t, ps in a.items() if ps & b.get(t, set())}


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
    # Regex -> its last resolution; only regexes some member subscribes to (Kafka's resolvedRegularExpressions).
    resolved: dict[str, ResolvedRegex] = field(default_factory=dict)
    # The records last written for this group (key -> value), to write only what changed.
    persisted: dict[bytes, bytes] = field(default_factory=dict)

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

    def member_topics(self, m: ConsumerMember) -> set[str]:
        """What ``m`` subscribes to: its literal names plus what its regex resolved to (nothing until then)."""
        out = set(m.subscribed_names)
        if m.subscribed_regex:
            r = self.resolved.get(m.subscribed_regex)
            if r is not None:
                out |= r.topics
        return out

    def subscribed_topics(self, all_topics: list[str]) -> set[str]:
        """Topics the group subscribes to, among ``all_topics``."""
        out: set[str] = set()
        for m in self.members.values():
            out |= self.member_topics(m)
        return out & set(all_topics)

    def is_subscribed_to(self, topic: str) -> bool:
        return any(topic in m.subscribed_names for m in self.members.values()) or any(
            topic in self.resolved[rx].topics for rx in self.subscribed_regexes() if rx in self.resolved)

    def subscribed_regexes(self) -> dict[str, int]:
        """Regex -> how many members subscribe to it."""
        out: dict[str, int] = {}
        for m in self.members.values():
            if m.subscribed_regex:
                out[m.subscribed_regex] = out.get(m.subscribed_regex, 0) + 1
        return out

    def last_regex_refresh_ms(self) -> int | None:
        """When the regexes were last resolved (they are resolved together), None if none is."""
        return max((r.timestamp for r in self.resolved.values()), default=None)

    def regex_version(self) -> int:
        """The topic-metadata version of the last resolution (0 if none)."""
        return min((r.version for r in self.resolved.values()), default=0)

    def prune_resolved(self) -> None:
        """Forget resolutions of regexes no member subscribes to any more (Kafka tombstones them)."""
        subscribed = self.subscribed_regexes()
        for rx in [rx for rx in self.resolved if rx not in subscribed]:
            del self.resolved[rx]

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
        """Tombstones for every record of this group, in Kafka's deletion order."""
        return [(k, None) for k in sorted(self.persisted, key=_delete_order)]

    def describe_as_classic(self) -> tuple[str, list[DescribedGroupMember]]:
        """The group's state and members as DescribeGroups shows them (its protocol type is "consumer")."""
        return self.state_name(), [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                                    "client_id": m.client_id, "client_host": m.client_host,
                                    "member_metadata": b"", "member_assignment": b""} for m in self.members.values()]


_DELETE_ORDER = {cr.CURRENT_ASSIGNMENT: 0, cr.TARGET_MEMBER: 1, cr.TARGET_METADATA: 2, cr.MEMBER_METADATA: 3,
                 cr.PARTITION_METADATA: 4, cr.GROUP_METADATA: 5}
_UPSERT_ORDER = {cr.MEMBER_METADATA: 0, cr.GROUP_METADATA: 1, cr.PARTITION_METADATA: 2, cr.TARGET_MEMBER: 3,
                 cr.TARGET_METADATA: 4, cr.CURRENT_ASSIGNMENT: 5}


def _delete_order(key: bytes) -> int:
    return _DELETE_ORDER.get(int.from_bytes(key[:2], "big", signed=True), 9)


def group_records(g: ConsumerGroup, topic_id: Callable[[str], uuid.UUID | None]) -> dict[bytes, bytes]:
    """The full set of Kafka records describing ``g`` (key -> value)."""
    gid = g.group_id
    out: dict[bytes, bytes] = {}
    for mid, m in g.members.items():
        out[cr.encode_key(cr.MEMBER_METADATA, gid, mid)] = cr.encode_member_metadata(cr.MemberMetadata(
            m.instance_id, m.rack_id, m.client_id, m.client_host, list(m.subscribed_names), m.subscribed_regex,
            m.rebalance_timeout_ms, m.server_assignor, m.classic))
    out[cr.encode_key(cr.GROUP_METADATA, gid)] = cr.encode_group_metadata(g.group_epoch)
    topics = []
    for name, n in sorted(g.topic_snapshot.items()):
        tid = topic_id(name)
        if tid is not None:
            topics.append((tid, name, n))
    out[cr.encode_key(cr.PARTITION_METADATA, gid)] = cr.encode_partition_metadata(g.group_epoch, topics)
    for mid in g.members:
        out[cr.encode_key(cr.TARGET_MEMBER, gid, mid)] = cr.encode_target_member(g.target.get(mid, {}))
    out[cr.encode_key(cr.TARGET_METADATA, gid)] = cr.encode_target_metadata(g.assignment_epoch)
    for mid, m in g.members.items():
        out[cr.encode_key(cr.CURRENT_ASSIGNMENT, gid, mid)] = cr.encode_current_assignment(cr.CurrentAssignment(
            m.member_epoch, m.previous_epoch, m.state, m.assigned, m.pending_revocation))
    return out


def diff_records(old: dict[bytes, bytes], new: dict[bytes, bytes]) -> list[tuple[bytes, bytes | None]]:
    """Tombstones for what went away (deletion order), then what changed (Kafka's write order)."""
    gone = sorted((k for k in old if k not in new), key=_delete_order)
    changed = [k for k, v in new.items() if old.get(k) != v]
    changed.sort(key=lambda k: _UPSERT_ORDER.get(int.from_bytes(k[:2], "big", signed=True), 9))
    out: list[tuple[bytes, bytes | None]] = [(k, None) for k in gone]
    out += [(k, new[k]) for k in changed]
    return out
