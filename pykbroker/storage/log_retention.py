"""Which of a log's oldest segments may go: Kafka's deleteOldSegments rules (retention time, retention size,
the log start offset) as plain functions over the segment list, so the rules read and test apart from files."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

from pykbroker.storage.segment import Segment

# Whether a segment (given the one after it, None for the last) is to be deleted.
SegmentPredicate = Callable[[Segment, Segment | None], bool]


class LogStartOffsetIncrementReason(enum.Enum):
    """Why a log's start offset moved up (Kafka's LogStartOffsetIncrementReason), for its log line."""

    CLIENT_RECORD_DELETION = "DeleteRecords"
    LEADER_OFFSET_INCREMENTED = "following the leader's log start offset"
    SEGMENT_DELETION = "segment deletion"


def deletable_segments(segments: Sequence[Segment], log_end_offset: int, high_watermark: int,
                       predicate: SegmentPredicate) -> list[Segment]:
    """The oldest segments, in order, that ``predicate`` picks and that lie wholly below the high watermark,
    up to the first that does not qualify; never an empty last segment (the log keeps one to append to)."""
    out: list[Segment] = []
    for i, seg in enumerate(segments):
        nxt = segments[i + 1] if i + 1 < len(segments) else None
        upper = nxt.base_offset if nxt is not None else log_end_offset
        last_and_empty = nxt is None and seg.size == 0
        if high_watermark >= upper and not last_and_empty and predicate(seg, nxt):
            out.append(seg)
        else:
            break
    return out


def below_log_start(log_start_offset: int) -> SegmentPredicate:
    """A segment whose records are all below the log start offset (the next segment starts at or below it)."""
    return lambda seg, nxt: nxt is not None and nxt.base_offset <= log_start_offset


def retention_time_breach(now_ms: int, retention_ms: int) -> SegmentPredicate:
    """A segment whose newest record is older than retention.ms."""
    return lambda seg, nxt: now_ms - seg.largest_timestamp > retention_ms


def retention_size_breach(segments: Sequence[Segment], retention_bytes: int) -> SegmentPredicate | None:
    """The oldest segments whose deletion brings the log to retention.bytes or below, or None if it is under."""
    size = sum(s.size for s in segments)
    if size < retention_bytes:
        return None
    excess = [size - retention_bytes]

    def oversize(seg: Segment, nxt: Segment | None) -> bool:
        if excess[0] - seg.size >= 0:
            excess[0] -= seg.size
            return True
        return False

    return oversize
