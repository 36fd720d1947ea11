"""KIP-848 consumer-group records of ``__consumer_offsets``, in Kafka 4.0's formats.

Keys are Kafka's non-flexible coordinator keys: an int16 record type, then the group id
(and member id) as int16-length strings.  Values start with an int16 version (0) followed
by Kafka's *flexible* encoding: compact strings/arrays (unsigned-varint length + 1), 16-byte
UUIDs, and a tagged-field section at the end of every struct.  Unknown tagged fields are
skipped on read, so records written by newer Kafka versions (4.1's ``MetadataHash``,
4.3's ``AssignmentEpochs``...) still load.

Record types (Kafka's ``apiKey`` of each coordinator record):

====  ======================================  =====================================
type  key                                     value
====  ======================================  =====================================
3     ConsumerGroupMetadataKey(group)         ConsumerGroupMetadataValue
4     ConsumerGroupPartitionMetadataKey(group) ConsumerGroupPartitionMetadataValue
5     ConsumerGroupMemberMetadataKey(g, m)    ConsumerGroupMemberMetadataValue
6     ConsumerGroupTargetAssignmentMetadataKey ConsumerGroupTargetAssignmentMetadataValue
7     ConsumerGroupTargetAssignmentMemberKey  ConsumerGroupTargetAssignmentMemberValue
8     ConsumerGroupCurrentMemberAssignmentKey ConsumerGroupCurrentMemberAssignmentValue
====  ======================================  =====================================
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from pykbroker.coordinator.serde_primitives import Reader, SerdeError, Writer

GROUP_METADATA = 3
PARTITION_METADATA = 4
MEMBER_METADATA = 5
TARGET_METADATA = 6
TARGET_MEMBER = 7
CURRENT_ASSIGNMENT = 8
CONSUMER_RECORD_TYPES = frozenset(range(3, 9))

# Kafka's MemberState codes.
MEMBER_STATE_CODES = {"stable": 0, "unrevoked_partitions": 1, "unreleased_partitions": 2}
MEMBER_STATE_NAMES = {v: k for k, v in MEMBER_STATE_CODES.items()}

Assignment = dict[uuid.UUID, set[int]]


def _value_reader(data: bytes) -> Reader:
    r = Reader(data)
    version = r.i16()
    if version != 0:
        raise SerdeError(f"unsupported consumer group record value version {version}")
    return r


# --- keys --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ConsumerKey:
    type: int
    group: str
    member: str | None = None


def encode_key(kind: int, group: str, member: str | None = None) -> bytes:
    w = Writer().i16(kind).string(group)
    if kind in (MEMBER_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT):
        w.string(member or "")
    return w.done()


def decode_consumer_key(data: bytes) -> ConsumerKey | None:
    """The key of a KIP-848 record, or None for another record type."""
    r = Reader(data)
    kind = r.i16()
    if kind not in CONSUMER_RECORD_TYPES:
        return None
    group = r.string() or ""
    member = (r.string() or "") if kind in (MEMBER_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT) else None
    return ConsumerKey(kind, group, member)


# --- values ------------------------------------------------------------------------------------

def _write_partitions(w: Writer, a: Assignment) -> None:
    items = sorted(((t, ps) for t, ps in a.items() if ps), key=lambda x: str(x[0]))
    w.array_len(len(items))
    for t, ps in items:
        w.uuid(t).array_len(len(ps))
        for p in sorted(ps):
            w.i32(p)
        w.no_tags()


def _read_partitions(r: Reader) -> Assignment:
    out: Assignment = {}
    for _ in range(r.array_len()):
        t = r.uuid()
        ps = {r.i32() for _ in range(r.array_len())}
        r.tags()
        if ps:
            out.setdefault(t, set()).update(ps)
    return out


def encode_group_metadata(epoch: int) -> bytes:
    return Writer().i16(0).i32(epoch).no_tags().done()


def decode_group_metadata(data: bytes) -> int:
    return _value_reader(data).i32()


def encode_partition_metadata(epoch: int, topics: list[tuple[uuid.UUID, str, int]]) -> bytes:
    w = Writer().i16(0).i32(epoch).array_len(len(topics))
    for tid, name, n in topics:
        w.uuid(tid).cstring(name).i32(n).array_len(0).no_tags()
    return w.no_tags().done()


def decode_partition_metadata(data: bytes) -> tuple[int, list[tuple[uuid.UUID, str, int]]]:
    r = _value_reader(data)
    epoch = r.i32()
    topics = []
    for _ in range(r.array_len()):
        tid = r.uuid()
        name = r.cstring() or ""
        n = r.i32()
        for _ in range(r.array_len()):  # PartitionRacks
            r.i32()
            for _ in range(r.array_len()):
                r.cstring()
            r.tags()
        r.tags()
        topics.append((tid, name, n))
    return epoch, topics


@dataclass(slots=True)
class ClassicMetadata:
    """How a member using the classic protocol inside a consumer group joined (KIP-848 migration)."""

    session_timeout_ms: int
    protocols: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class MemberMetadata:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_names: list[str]
    subscribed_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    classic: ClassicMetadata | None = None


def encode_member_metadata(m: MemberMetadata) -> bytes:
    w = (Writer().i16(0).cstring(m.instance_id).cstring(m.rack_id).cstring(m.client_id).cstring(m.client_host)
         .array_len(len(m.subscribed_names)))
    for t in m.subscribed_names:
        w.cstring(t)
    w.cstring(m.subscribed_regex).i32(m.rebalance_timeout_ms).cstring(m.server_assignor)
    if m.classic is None:
        return w.no_tags().done()
    c = Writer().i32(m.classic.session_timeout_ms).array_len(len(m.classic.protocols))
    for name, md in m.classic.protocols:
        c.cstring(name).cbytes(md).no_tags()
    # A nullable struct field: a leading 1 marks it present.
    tagged = Writer().i8(1).raw(c.no_tags().done()).done()
    return w.uvarint(1).uvarint(0).uvarint(len(tagged)).raw(tagged).done()


def _decode_classic(data: bytes) -> ClassicMetadata | None:
    r = Reader(data)
    if r.i8() < 0:
        return None
    session = r.i32()
    protocols = []
    for _ in range(r.array_len()):
        name = r.cstring() or ""
        md = r.cbytes() or b""
        r.tags()
        protocols.append((name, md))
    return ClassicMetadata(session, protocols)


def decode_member_metadata(data: bytes) -> MemberMetadata:
    r = _value_reader(data)
    instance = r.cstring()
    rack = r.cstring()
    client_id = r.cstring() or ""
    client_host = r.cstring() or ""
    names = [r.cstring() or "" for _ in range(r.array_len())]
    regex = r.cstring()
    rebalance = r.i32()
    assignor = r.cstring()
    tags = r.tags()
    classic = _decode_classic(tags[0]) if 0 in tags else None
    return MemberMetadata(instance, rack, client_id, client_host, names, regex, rebalance, assignor, classic)


def encode_target_metadata(assignment_epoch: int) -> bytes:
    return Writer().i16(0).i32(assignment_epoch).no_tags().done()


def decode_target_metadata(data: bytes) -> int:
    return _value_reader(data).i32()


def encode_target_member(a: Assignment) -> bytes:
    w = Writer().i16(0)
    _write_partitions(w, a)
    return w.no_tags().done()


def decode_target_member(data: bytes) -> Assignment:
    return _read_partitions(_value_reader(data))


@dataclass(slots=True)
class CurrentAssignment:
    member_epoch: int
    previous_epoch: int
    state: str
    assigned: Assignment
    pending_revocation: Assignment


def encode_current_assignment(c: CurrentAssignment) -> bytes:
    w = Writer().i16(0).i32(c.member_epoch).i32(c.previous_epoch).i8(MEMBER_STATE_CODES.get(c.state, 127))
    _write_partitions(w, c.assigned)
    _write_partitions(w, c.pending_revocation)
    return w.no_tags().done()


def decode_current_assignment(data: bytes) -> CurrentAssignment:
    r = _value_reader(data)
    epoch = r.i32()
    previous = r.i32()
    state = MEMBER_STATE_NAMES.get(r.i8(), "stable")
    assigned = _read_partitions(r)
    pending = _read_partitions(r)
    return CurrentAssignment(epoch, previous, state, assigned, pending)
