"""Share group records in ``__consumer_offsets``: the group and its epoch survive a restart.

Kafka 4.x's group coordinator writes a ShareGroupMetadata record (key type 11) for each share group next to
the consumer groups' records, so ListGroups and ShareGroupDescribe show the group after a restart or a
coordinator failover before any member rejoins.  pykbroker writes that record (group epoch) whenever the
epoch changes and a tombstone when the group is deleted; members are not persisted (after a restart they
are told UNKNOWN_MEMBER_ID and rejoin, keeping their member ids, with a higher group epoch).
"""

from __future__ import annotations

from collections.abc import Iterable

from pykbroker.coordinator.serde_primitives import Reader, SerdeError, Writer

SHARE_GROUP_METADATA = 11  # Kafka's ShareGroupMetadataKey record type
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


def replay(records: Iterable[tuple[bytes | None, bytes | None]]) -> dict[str, int]:
    """Group id -> epoch of the share groups a partition's records leave (the last record per key wins)."""
    out: dict[str, int] = {}
    for key, value in records:
        if key is None:
            continue
        try:
            group = decode_key(key)
        except (SerdeError, UnicodeDecodeError, IndexError, ValueError):
            continue
        if group is None:
            continue
        if value is None:
            out.pop(group, None)
            continue
        try:
            out[group] = decode_value(value)
        except (SerdeError, IndexError, ValueError):
            continue
    return out
