"""Record formats of ``__consumer_offsets`` and of the consumer protocol's embedded bytes.

The keys and values follow Kafka's own schemas (``OffsetCommitKey``/``OffsetCommitValue``,
``GroupMetadataKey``/``GroupMetadataValue`` in Kafka's group-coordinator module), so the
topic reads the same with Kafka's tools: a key starts with an int16 record type (0/1 offset
commit, 2 group metadata), a value with an int16 schema version.  A null value is a tombstone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pykbroker.coordinator.serde_primitives import Reader, Writer
from pykbroker.coordinator.serde_primitives import SerdeError as SerdeError

OFFSET_COMMIT_KEY_TYPE = 1
GROUP_METADATA_KEY_TYPE = 2
OFFSET_VALUE_VERSION = 3
OFFSET_VALUE_VERSION_WITH_EXPIRE = 1
GROUP_VALUE_VERSION = 3


# --- keys ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


def encode_offset_key(group: str, topic: str, partition: int) -> bytes:
    return Writer().i16(OFFSET_COMMIT_KEY_TYPE).string(group).string(topic).i32(partition).done()


def encode_group_key(group: str) -> bytes:
    return Writer().i16(GROUP_METADATA_KEY_TYPE).string(group).done()


def decode_key(data: bytes) -> OffsetKey | GroupKey | None:
    """None for record types this coordinator does not know (KIP-848 records etc.)."""
    r = Reader(data)
    kind = r.i16()
    if kind in (0, 1):
        return OffsetKey(r.string() or "", r.string() or "", r.i32())
    if kind == GROUP_METADATA_KEY_TYPE:
        return GroupKey(r.string() or "")
    return None


# --- values ----------------------------------------------------------------------------------

@dataclass(slots=True)
class OffsetValue:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = 0
    expire_timestamp: int = -1


def encode_offset_value(v: OffsetValue) -> bytes:
    if v.expire_timestamp >= 0:
        return (Writer().i16(OFFSET_VALUE_VERSION_WITH_EXPIRE).i64(v.offset).string(v.metadata)
                .i64(v.commit_timestamp).i64(v.expire_timestamp).done())
    return (Writer().i16(OFFSET_VALUE_VERSION).i64(v.offset).i32(v.leader_epoch).string(v.metadata)
            .i64(v.commit_timestamp).done())


def decode_offset_value(data: bytes) -> OffsetValue:
    r = Reader(data)
    version = r.i16()
    if version < 0 or version > 4:
        raise SerdeError(f"unknown offset commit value version {version}")
    if version >= 4:
        raise SerdeError("flexible offset commit values are not supported")
    offset = r.i64()
    epoch = r.i32() if version >= 3 else -1
    metadata = r.string() or ""
    ts = r.i64()
    expire = r.i64() if version == 1 else -1
    return OffsetValue(offset, epoch, metadata, ts, expire)


@dataclass(slots=True)
class MemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: list[MemberRecord] = field(default_factory=list)


def encode_group_value(v: GroupValue) -> bytes:
    w = (Writer().i16(GROUP_VALUE_VERSION).string(v.protocol_type).i32(v.generation).string(v.protocol)
         .string(v.leader).i64(v.current_state_timestamp).i32(len(v.members)))
    for m in v.members:
        (w.string(m.member_id).string(m.group_instance_id).string(m.client_id).string(m.client_host)
         .i32(m.rebalance_timeout).i32(m.session_timeout).bytes_(m.subscription).bytes_(m.assignment))
    return w.done()


def decode_group_value(data: bytes) -> GroupValue:
    r = Reader(data)
    version = r.i16()
    if version < 0 or version > 3:
        raise SerdeError(f"unsupported group metadata value version {version}")
    protocol_type = r.string() or ""
    generation = r.i32()
    protocol = r.string()
    leader = r.string()
    ts = r.i64() if version >= 2 else -1
    members = []
    for _ in range(r.i32()):
        member_id = r.string() or ""
        instance = r.string() if version >= 3 else None
        client_id = r.string() or ""
        client_host = r.string() or ""
        rebalance_timeout = r.i32() if version >= 1 else -1
        session_timeout = r.i32()
        subscription = r.bytes_() or b""
        assignment = r.bytes_() or b""
        if rebalance_timeout < 0:
            rebalance_timeout = session_timeout
        members.append(MemberRecord(member_id, instance, client_id, client_host, rebalance_timeout,
                                    session_timeout, subscription, assignment))
    return GroupValue(protocol_type, generation, protocol, leader, ts, members)


# --- the consumer protocol's subscription and assignment bytes --------------------------------

def subscribed_topics(metadata: bytes) -> set[str] | None:
    """Topics of a ``ConsumerProtocolSubscription``; None when it cannot be parsed."""
    try:
        r = Reader(metadata)
        version = r.i16()
        if version < 0:
            return None
        n = r.i32()
        if n < 0 or n > 1_000_000:
            return None
        return {r.string() or "" for _ in range(n)}
    except (SerdeError, UnicodeDecodeError):
        return None


@dataclass(slots=True)
class ConsumerSubscription:
    topics: list[str]
    owned: dict[str, list[int]] = field(default_factory=dict)
    generation: int = -1


def decode_consumer_subscription(metadata: bytes) -> ConsumerSubscription | None:
    """A ``ConsumerProtocolSubscription`` (v0-v3): topics, and owned partitions from v1; None if malformed."""
    try:
        r = Reader(metadata)
        version = r.i16()
        if version < 0:
            return None
        n = r.i32()
        if n < 0 or n > 1_000_000:
            return None
        topics = [r.string() or "" for _ in range(n)]
        r.bytes_()  # user data
        owned: dict[str, list[int]] = {}
        generation = -1
        if version >= 1 and r.remaining:
            for _ in range(r.i32()):
                t = r.string() or ""
                owned.setdefault(t, []).extend(r.i32() for _ in range(r.i32()))
            if version >= 2 and r.remaining >= 4:
                generation = r.i32()
        return ConsumerSubscription(topics, owned, generation)
    except (SerdeError, UnicodeDecodeError):
        return None


def encode_consumer_subscription_v1(topics: list[str], owned: dict[str, list[int]]) -> bytes:
    """A v1 ``ConsumerProtocolSubscription`` with owned partitions (cooperative members; for tests)."""
    w = Writer().i16(1).i32(len(topics))
    for t in topics:
        w.string(t)
    w.bytes_(None).i32(len(owned))
    for t, ps in owned.items():
        w.string(t).i32(len(ps))
        for p in ps:
            w.i32(p)
    return w.done()


def encode_consumer_assignment(partitions: dict[str, list[int]], version: int = 0) -> bytes:
    """A ``ConsumerProtocolAssignment`` (used by tests and by KIP-848 conversions)."""
    w = Writer().i16(version).i32(len(partitions))
    for topic, parts in sorted(partitions.items()):
        w.string(topic).i32(len(parts))
        for p in parts:
            w.i32(p)
    w.bytes_(None)
    return w.done()


def decode_consumer_assignment(data: bytes) -> dict[str, list[int]] | None:
    if not data:
        return {}
    try:
        r = Reader(data)
        r.i16()
        out: dict[str, list[int]] = {}
        for _ in range(r.i32()):
            topic = r.string() or ""
            out[topic] = [r.i32() for _ in range(r.i32())]
        return out
    except (SerdeError, UnicodeDecodeError):
        return None


def encode_consumer_subscription(topics: list[str], version: int = 0) -> bytes:
    w = Writer().i16(version).i32(len(topics))
    for t in topics:
        w.string(t)
    w.bytes_(None)
    return w.done()
