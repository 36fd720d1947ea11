"""Share group records in ``__consumer_offsets``: the group and its epoch survive a restart.

Kafka 4.x's group coordinator writes a ShareGroupMetadata record (key type 11) for each share group next to
the consumer groups' records, so ListGroups and ShareGroupDescribe show the group after a restart or a
coordinator failover before any member rejoins.  pykbroker writes that record (group epoch) whenever the
epoch changes and a tombstone when the group is deleted; and, under Kafka's ShareGroupStatePartitionMetadata
key (type 15, with pykbroker's own value: topic ids and names), the topics the group has ever subscribed to,
so that DeleteGroups deletes the group's state on every share coordinator, not only on those this broker
leads; members are not persisted (after a restart they
are told UNKNOWN_MEMBER_ID and rejoin, keeping their member ids, with a higher group epoch).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pykbroker.coordinator.serde_primitives import Reader, SerdeError, Writer

SHARE_GROUP_METADATA = 11  # Kafka's ShareGroupMetadataKey record type
# Kafka's ShareGroupStatePartitionMetadataKey record type: which topics the group has share state on, so that
# deleting the group can delete that state wherever its share coordinators are.
SHARE_GROUP_STATE_PARTITION_METADATA = 15
VALUE_VERSION = 0


def encode_key(group_id: str) -> bytes:
    return Writer().i16(SHARE_GROUP_METADATA).string(group_id).done()


def decode_key(data: bytes) -> str | None:
    """The group id of a ShareGroupMetadata key; None for other record types."""
    r = Reader(data)
    if r.i16() != SHARE_GROUP_METADATA:
        return None
    group = r.string()
    if group is None:
        raise SerdeError("null group id in a share group key")
    return group


def encode_value(epoch: int) -> bytes:
    """ShareGroupMetadataValue v0 (flexible): epoch, metadata hash (0: pykbroker keeps none), no tags."""
    return Writer().i16(VALUE_VERSION).i32(epoch).i64(0).no_tags().done()


def decode_value(data: bytes) -> int:
    r = Reader(data)
    version = r.i16()
    if version != VALUE_VERSION:
        raise SerdeError(f"unknown share group metadata value version {version}")
    return r.i32()


def encode_state_topics_key(group_id: str) -> bytes:
    return Writer().i16(SHARE_GROUP_STATE_PARTITION_METADATA).string(group_id).done()


def encode_state_topics(topics: dict[uuid.UUID, str]) -> bytes:
    """The topics a share group may hold state on: (topic id, name) pairs, pykbroker's own value (v0)."""
    w = Writer().i16(VALUE_VERSION).i32(len(topics))
    for topic_id, name in sorted(topics.items(), key=lambda t: t[1]):
        w.uuid(topic_id).string(name)
    return w.done()


def decode_state_topics(data: bytes) -> dict[uuid.UUID, str]:
    r = Reader(data)
    version = r.i16()
    if version != VALUE_VERSION:
        raise SerdeError(f"unknown share group state topics value version {version}")
    out: dict[uuid.UUID, str] = {}
    for _ in range(r.i32()):
        topic_id = r.uuid()
        name = r.string()
        out[topic_id] = name or ""
    return out


@dataclass
class Replayed:
    """What an offsets partition's share group records leave: each group's epoch and state topics."""

    epochs: dict[str, int] = field(default_factory=dict)
    state_topics: dict[str, dict[uuid.UUID, str]] = field(default_factory=dict)


def replay(records: Iterable[tuple[bytes | None, bytes | None]]) -> Replayed:
    """The last record per key wins; a tombstone removes it."""
    out = Replayed()
    for key, value in records:
        if key is None:
            continue
        try:
            r = Reader(key)
            kind = r.i16()
            group = r.string() if kind in (SHARE_GROUP_METADATA, SHARE_GROUP_STATE_PARTITION_METADATA) else None
        except (SerdeError, UnicodeDecodeError, IndexError, ValueError):
            continue
        if group is None:
            continue
        table: dict[str, Any] = out.epochs if kind == SHARE_GROUP_METADATA else out.state_topics
        if value is None:
            table.pop(group, None)
            continue
        try:
            table[group] = decode_value(value) if kind == SHARE_GROUP_METADATA else decode_state_topics(value)
        except (SerdeError, IndexError, ValueError, UnicodeDecodeError):
            continue
    return out
