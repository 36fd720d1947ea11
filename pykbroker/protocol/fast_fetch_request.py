"""A focused bounds pre-pass for FetchRequest v4-v17, the consumer's hot request.

librdkafka does not use fetch sessions: every Fetch it sends lists every assigned
partition, so a consumer of 10,000 partitions makes the broker check and decode
10,000 partition entries per request.  The generic pre-pass
(:mod:`pykbroker.protocol.bounds`) walks each entry field by field in Python
(about 0.65 ms per 10,000 entries) before kio's native reader decodes them (about
1.7 ms).  A pure-Python decoder was tried first and lost to kio's native reader
(about 2.8 ms: building 10,000 Python objects from unpacked ints costs more than
kio's whole decode), so kio still decodes; what this replaces is the pre-pass.
A topic's partition entries have a fixed size, so the whole run is checked with
one length comparison, plus, in flexible versions, one scan that every entry's
tagged-field count is zero.

It accepts exactly the bodies the generic pass would accept unchanged, or defers
to it: anything off the common shape (a tagged field other than ``cluster_id`` or
``replica_state`` at the top, any tagged field on a topic or partition, which the
generic pass may have to cut out for kio) returns False.
``tests/unit/test_fast_fetch_request.py`` checks the two passes agree.
"""

from __future__ import annotations

import struct

from pykbroker.protocol.bounds import BoundsError, read_uvarint, truncated

__all__ = ["FIRST_VERSION", "LAST_VERSION", "check_fetch_request"]

FIRST_VERSION = 4
LAST_VERSION = 17

_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from


def _head_size(version: int) -> int:
    """replica_id (before v15), max_wait, min_bytes, max_bytes, isolation_level, session id and epoch (v7+)."""
    return 4 * (version < 15) + 12 + 1 + 8 * (version >= 7)


def _partition_size(version: int) -> int:
    """partition, current_leader_epoch (v9+), fetch_offset, last_fetched_epoch (v12+), log_start_offset
    (v5+), partition_max_bytes, and in flexible versions the tagged-field count (one byte when zero)."""
    return 4 + 4 * (version >= 9) + 8 + 4 * (version >= 12) + 8 * (version >= 5) + 4 + (version >= 12)


_HEAD = {v: _head_size(v) for v in range(FIRST_VERSION, LAST_VERSION + 1)}
_PARTITION = {v: _partition_size(v) for v in range(FIRST_VERSION, LAST_VERSION + 1)}


def _length(buf: bytes, pos: int, end: int, flexible: bool, width: int, what: str) -> tuple[int, int]:
    """An array (width 4) or string (width 2) length; -1 means null."""
    if flexible:
        if pos < end and buf[pos] < 0x80:  # the usual one-byte length, read inline
            return buf[pos] - 1, pos + 1
        n, pos = read_uvarint(buf, pos, end, what)
        return n - 1, pos
    if pos + width > end:
        raise truncated(what, pos, end)
    return (_I32 if width == 4 else _I16)(buf, pos)[0], pos + width


def _skip_string(buf: bytes, pos: int, end: int, flexible: bool, what: str, nullable: bool = False) -> int:
    n, pos = _length(buf, pos, end, flexible, 2, what)
    if n < 0:
        if n == -1 and nullable:
            return pos
        raise BoundsError(f"{what}: length {n} (the field is not nullable)")
    if pos + n > end:
        raise BoundsError(f"{what}: length {n} exceeds the {end - pos} bytes remaining")
    return pos + n


def _count(buf: bytes, pos: int, end: int, flexible: bool, what: str) -> tuple[int, int]:
    n, pos = _length(buf, pos, end, flexible, 4, what)
    if n < 0:
        raise BoundsError(f"{what}: length {n} (the field is not nullable)")
    return n, pos


def _fixed_run(buf: bytes, pos: int, end: int, n: int, size: int, what: str) -> int:
    stop = pos + n * size
    if stop > end:
        raise BoundsError(f"{what}: {n} entries of {size} bytes exceed the {end - pos} bytes remaining")
    return stop


class _OffShape(Exception):
    """Valid as far as seen, but not the shape checked here: the generic pass decides."""


def _no_tags(buf: bytes, pos: int, end: int, what: str) -> int:
    if pos >= end:
        raise truncated(what, pos, end)
    if buf[pos]:
        raise _OffShape(what)
    return pos + 1


def check_fetch_request(version: int, buf: bytes, offset: int) -> bool:
    """True when the FetchRequest body at ``offset`` fits in ``buf`` and kio may decode it as it is;
    False when the generic pre-pass must decide (a version or tagged field not covered here).
    Raises :class:`BoundsError` where the generic pass would.  Bytes after the body are allowed."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        return False
    try:
        _walk(version, buf, offset, len(buf))
    except _OffShape:
        return False
    return True


def _skip_topic(buf: bytes, pos: int, end: int, by_id: bool, flexible: bool) -> int:
    """A topic named by its 16-byte id (v13+) or by its name."""
    if by_id:
        pos += 16
        if pos > end:
            raise truncated("topic_id", end, end)
        return pos
    return _skip_string(buf, pos, end, flexible, "topic")


def _walk(version: int, buf: bytes, pos: int, end: int) -> None:
    flexible = version >= 12
    by_id = version >= 13
    pos += _HEAD[version]
    if pos > end:
        raise truncated("FetchRequest", end, end)
    size = _PARTITION[version]
    n_topics, pos = _count(buf, pos, end, flexible, "topics")
    for _ in range(n_topics):
        pos = _skip_topic(buf, pos, end, by_id, flexible)
        n, pos = _count(buf, pos, end, flexible, "partitions")
        stop = _fixed_run(buf, pos, end, n, size, "partitions")
        if flexible and buf[pos + size - 1:stop:size].count(0) != n:
            raise _OffShape("tagged fields on a partition")
        pos = stop
        if flexible:
            pos = _no_tags(buf, pos, end, "topic tagged fields")
    if version >= 7:
        n_forgotten, pos = _count(buf, pos, end, flexible, "forgotten_topics_data")
        for _ in range(n_forgotten):
            pos = _skip_topic(buf, pos, end, by_id, flexible)
            n, pos = _count(buf, pos, end, flexible, "forgotten partitions")
            pos = _fixed_run(buf, pos, end, n, 4, "forgotten partitions")
            if flexible:
                pos = _no_tags(buf, pos, end, "forgotten topic tagged fields")
    if version >= 11:
        pos = _skip_string(buf, pos, end, flexible, "rack_id")
    if flexible:
        _top_tags(version, buf, pos, end)


def _top_tags(version: int, buf: bytes, pos: int, end: int) -> None:
    """cluster_id (tag 0) and, from v15, replica_state (tag 1), each filling exactly its size."""
    if pos < end and buf[pos] == 0:
        return
    n, pos = read_uvarint(buf, pos, end, "tagged fields")
    last = -1
    for _ in range(n):
        tag, pos = read_uvarint(buf, pos, end, "tag")
        size, pos = read_uvarint(buf, pos, end, "tag size")
        if tag <= last or tag > 1 or (tag == 1 and version < 15):
            raise _OffShape(f"tag {tag}")
        last = tag
        stop = pos + size
        if stop > end:
            raise BoundsError(f"tag {tag}: size {size} exceeds the {end - pos} bytes remaining")
        if tag == 0:
            pos = _skip_string(buf, pos, stop, True, "cluster_id", nullable=True)
        else:  # replica_state: replica_id, replica_epoch, its own tagged fields
            pos = _no_tags(buf, _fixed_run(buf, pos, stop, 1, 12, "replica_state"), stop, "replica_state tags")
        if pos != stop:
            raise _OffShape(f"tag {tag}: value does not fill its {size} bytes")
