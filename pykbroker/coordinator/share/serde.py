"""``__share_group_state`` records: one snapshot of a share-partition's state per key.

Kafka's share coordinator writes ShareSnapshot (key version 0) and ShareUpdate (key version 1) records
keyed by (group id, topic id, partition).  pykbroker writes only snapshots, each carrying the whole state
(start offset and the in-flight runs, which ``group.share.partition.max.record.locks`` bounds): with one
record type per key, log compaction keeping the latest record per key is exactly what replay needs, and no
update can be compacted away before the snapshot that supersedes it.  The layouts follow Kafka's
ShareSnapshotKey/ShareSnapshotValue (flexible, version 0); a value of null is a tombstone (the group's state
for that partition was deleted).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from pykbroker.coordinator.serde_primitives import Reader, SerdeError, Writer
from pykbroker.coordinator.share.partition import RecordState, StateBatch

SNAPSHOT_KEY_VERSION = 0
SNAPSHOT_VALUE_VERSION = 0


@dataclass(frozen=True)
class StateKey:
    group_id: str
    topic_id: uuid.UUID
    partition: int

    def coordinator_key(self) -> str:
        """Kafka's share coordinator key, hashed onto a ``__share_group_state`` partition."""
        return f"{self.group_id}:{self.topic_id}:{self.partition}"


@dataclass(frozen=True)
class Snapshot:
    state_epoch: int  # Kafka's state epoch: bumped when an admin resets the state (AlterShareGroupOffsets)
    leader_epoch: int  # the share-partition leader's epoch that wrote or last read it
    start_offset: int
    batches: tuple[StateBatch, ...]
    write_timestamp: int = 0
    snapshot_epoch: int = 0  # counts the leader's changes (SharePartition.state_epoch)


def encode_key(key: StateKey) -> bytes:
    w = Writer().i16(SNAPSHOT_KEY_VERSION)
    w.cstring(key.group_id).uuid(key.topic_id).i32(key.partition).no_tags()
    return w.done()


def decode_key(data: bytes) -> StateKey | None:
    """None for a key of another record type (Kafka's ShareUpdate): pykbroker never writes one."""
    r = Reader(data)
    version = r.i16()
    if version != SNAPSHOT_KEY_VERSION:
        return None
    group = r.cstring()
    if group is None:
        raise SerdeError("null group id in a share state key")
    topic_id = r.uuid()
    partition = r.i32()
    r.tags()
    return StateKey(group, topic_id, partition)


def encode_value(s: Snapshot) -> bytes:
    w = Writer().i16(SNAPSHOT_VALUE_VERSION)
    w.i32(s.snapshot_epoch)
    w.i32(s.state_epoch).i32(s.leader_epoch).i64(s.start_offset)
    w.i64(s.write_timestamp).i64(s.write_timestamp)  # create and write timestamps
    w.array_len(len(s.batches))
    for b in s.batches:
        w.i64(b.first_offset).i64(b.last_offset).i8(int(b.state)).i16(b.delivery_count).no_tags()
    w.no_tags()
    return w.done()


def decode_value(data: bytes) -> Snapshot:
    r = Reader(data)
    version = r.i16()
    if version != SNAPSHOT_VALUE_VERSION:
        raise SerdeError(f"unknown share snapshot value version {version}")
    snapshot_epoch = r.i32()
    state_epoch, leader_epoch, start_offset = r.i32(), r.i32(), r.i64()
    r.i64()
    written = r.i64()
    n = r.array_len()
    if n < 0:
        raise SerdeError("null state batches")
    batches = []
    for _ in range(n):
        first, last, state, count = r.i64(), r.i64(), r.i8(), r.i16()
        r.tags()
        if last < first:
            raise SerdeError(f"state batch {first}-{last} is empty")
        batches.append(StateBatch(first, last, RecordState(state), count))
    r.tags()
    return Snapshot(state_epoch, leader_epoch, start_offset, tuple(batches), written, snapshot_epoch)
