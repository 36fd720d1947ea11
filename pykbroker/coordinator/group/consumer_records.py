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

import struct
import uuid
from dataclasses import dataclass, field

from pykbroker.coordinator.group.serde import SerdeError

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

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


# --- primitives --------------------------------------------------------------------------------

class _W:
    __slots__ = ("b",)

    def __init__(self) -> None:
        self.b = bytearray()

    def i8(self, v: int) -> _W:
        self.b += _I8.pack(v)
        return self

    def i16(self, v: int) -> _W:
        self.b += _I16.pack(v)
        return self

    def i32(self, v: int) -> _W:
        self.b += _I32.pack(v)
        return self

    def uvarint(self, v: int) -> _W:
        while v >= 0x80:
            self.b.append((v & 0x7F) | 0x80)
            v >>= 7
        self.b.append(v)
        return self

    def string(self, s: str) -> _W:
        """A non-flexible (int16 length) string, for keys."""
        data = s.encode()
        return self.i16(len(data)).raw(data)

    def cstring(self, s: str | None) -> _W:
        if s is None:
            return self.uvarint(0)
        data = s.encode()
        return self.uvarint(len(data) + 1).raw(data)

    def cbytes(self, data: bytes) -> _W:
        return self.uvarint(len(data) + 1).raw(data)

    def uuid(self, u: uuid.UUID) -> _W:
        return self.raw(u.bytes)

    def array_len(self, n: int) -> _W:
        return self.uvarint(n + 1)

    def no_tags(self) -> _W:
        return self.uvarint(0)

    def raw(self, data: bytes) -> _W:
        self.b += data
        return self

    def done(self) -> bytes:
        return bytes(self.b)


class _R:
    __slots__ = ("d", "p")

    def __init__(self, data: bytes) -> None:
        self.d = data
        self.p = 0

    def _take(self, s: struct.Struct) -> int:
        if self.p + s.size > len(self.d):
            raise SerdeError("truncated record")
        (v,) = s.unpack_from(self.d, self.p)
        self.p += s.size
        return int(v)

    def i8(self) -> int:
        return self._take(_I8)

    def i16(self) -> int:
        return self._take(_I16)

    def i32(self) -> int:
        return self._take(_I32)

    def i64(self) -> int:
        return self._take(_I64)

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            if self.p >= len(self.d):
                raise SerdeError("truncated varint")
            b = self.d[self.p]
            self.p += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise SerdeError("varint too long")

    def raw(self, n: int) -> bytes:
        if n < 0 or self.p + n > len(self.d):
            raise SerdeError("truncated record")
        v = self.d[self.p:self.p + n]
        self.p += n
        return bytes(v)

    def string(self) -> str:
        n = self.i16()
        return self.raw(n).decode() if n >= 0 else ""

    def cstring(self) -> str | None:
        n = self.uvarint()
        return None if n == 0 else self.raw(n - 1).decode()

    def cbytes(self) -> bytes | None:
        n = self.uvarint()
        return None if n == 0 else self.raw(n - 1)

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.raw(16))

    def array_len(self) -> int:
        n = self.uvarint() - 1
        if n > len(self.d):
            raise SerdeError("array too long")
        return n

    def tags(self) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            out[tag] = self.raw(self.uvarint())
        return out


def _value_reader(data: bytes) -> _R:
    r = _R(data)
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
    w = _W().i16(kind).string(group)
    if kind in (MEMBER_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT):
        w.string(member or "")
    return w.done()


def decode_consumer_key(data: bytes) -> ConsumerKey | None:
    """The key of a KIP-848 record, or None for another record type."""
    r = _R(data)
    kind = r.i16()
    if kind not in CONSUMER_RECORD_TYPES:
        return None
    group = r.string()
    member = r.string() if kind in (MEMBER_METADATA, TARGET_MEMBER, CURRENT_ASSIGNMENT) else None
    return ConsumerKey(kind, group, member)


# --- values ------------------------------------------------------------------------------------

def _write_partitions(w: _W, a: Assignment) -> None:
    items = sorted(((t, ps) for t, ps in a.items() if ps), key=lambda x: str(x[0]))
    w.array_len(len(items))
    for t, ps in items:
        w.uuid(t).array_len(len(ps))
        for p in sorted(ps):
            w.i32(p)
        w.no_tags()


def _read_partitions(r: _R) -> Assignment:
    out: Assignment = {}
    for _ in range(r.array_len()):
        t = r.uuid()
        ps = {r.i32() for _ in range(r.array_len())}
        r.tags()
        if ps:
            out.setdefault(t, set()).update(ps)
    return out


def encode_group_metadata(epoch: int) -> bytes:
    return _W().i16(0).i32(epoch).no_tags().done()


def decode_group_metadata(data: bytes) -> int:
    return _value_reader(data).i32()


def encode_partition_metadata(epoch: int, topics: list[tuple[uuid.UUID, str, int]]) -> bytes:
    w = _W().i16(0).i32(epoch).array_len(len(topics))
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
    w = (_W().i16(0).cstring(m.instance_id).cstring(m.rack_id).cstring(m.client_id).cstring(m.client_host)
         .array_len(len(m.subscribed_names)))
    for t in m.subscribed_names:
        w.cstring(t)
    w.cstring(m.subscribed_regex).i32(m.rebalance_timeout_ms).cstring(m.server_assignor)
    if m.classic is None:
        return w.no_tags().done()
    c = _W().i32(m.classic.session_timeout_ms).array_len(len(m.classic.protocols))
    for name, md in m.classic.protocols:
        c.cstring(name).cbytes(md).no_tags()
    # A nullable struct field: a leading 1 marks it present.
    tagged = _W().i8(1).raw(c.no_tags().done()).done()
    return w.uvarint(1).uvarint(0).uvarint(len(tagged)).raw(tagged).done()


def _decode_classic(data: bytes) -> ClassicMetadata | None:
    r = _R(data)
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
    return _W().i16(0).i32(assignment_epoch).no_tags().done()


def decode_target_metadata(data: bytes) -> int:
    return _value_reader(data).i32()


def encode_target_member(a: Assignment) -> bytes:
    w = _W().i16(0)
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
    w = _W().i16(0).i32(c.member_epoch).i32(c.previous_epoch).i8(MEMBER_STATE_CODES.get(c.state, 127))
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
