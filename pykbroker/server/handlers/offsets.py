"""ListOffsets (earliest, latest, by timestamp, max timestamp) and DeleteRecords."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.server.context import RequestContext, Services
from pykbroker.server.replica_manager import Partition
from pykbroker.storage.log import OffsetOutOfRange

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
READ_COMMITTED = 1


def _lookup(p: Partition, timestamp: int, read_committed: bool) -> tuple[int, int]:
    """(timestamp, offset) per ListOffsets semantics; (-1, -1) when nothing matches."""
    lg = p.log
    if timestamp == LATEST:
        return -1, p.last_stable_offset if read_committed else p.high_watermark
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return -1, lg.log_start_offset
    if timestamp == LATEST_TIERED:
        return -1, -1
    if timestamp == MAX_TIMESTAMP:
        found = lg.max_timestamp_and_offset()
        if found is None:
            return -1, -1
        ts, off = found
        return ts, off
    hit = lg.offset_for_timestamp(timestamp)
    if hit is None:
        return -1, -1
    off, ts = hit
    limit = p.last_stable_offset if read_committed else p.high_watermark
    if off >= limit:
        return -1, -1
    return ts, off


async def handle_list_offsets(svc: Services, ctx: RequestContext, req: Any) -> dict[str, Any]:
    read_committed = int(getattr(req, "isolation_level", 0)) == READ_COMMITTED
    topics = []
    seen: set[tuple[str, int]] = set()
    for t in req.topics:
        parts = []
        for rp in t.partitions:
            idx = int(rp.partition_index)
            entry: dict[str, Any] = {"partition_index": idx, "error_code": ErrorCode.none, "timestamp": -1,
                                     "offset": -1, "leader_epoch": -1}
            parts.append(entry)
            if (t.name, idx) in seen:
                entry["error_code"] = ErrorCode.invalid_request
                continue
            seen.add((t.name, idx))
            p = svc.replicas.partition(t.name, idx)
            if p is None:
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
                continue
            epoch = int(getattr(rp, "current_leader_epoch", -1))
            if epoch != -1 and epoch != p.leader_epoch:
                entry["error_code"] = (
                    ErrorCode.fenced_leader_epoch if epoch < p.leader_epoch else ErrorCode.unknown_leader_epoch
                )
                continue
            ts = int(rp.timestamp)
            if (ts == MAX_TIMESTAMP and ctx.version < 7) or ts < LATEST_TIERED:
                entry["error_code"] = ErrorCode.unsupported_version if ts == MAX_TIMESTAMP \
                    else ErrorCode.invalid_request
                continue
            ts_out, offset = _lookup(p, ts, read_committed)
            entry["timestamp"] = ts_out
            entry["offset"] = offset
            entry["leader_epoch"] = p.leader_epoch if offset >= 0 else -1
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}


async def handle_delete_records(svc: Services, ctx: RequestContext, req: Any) -> dict[str, Any]:
    topics = []
    for t in req.topics:
        parts = []
        rec = svc.store.topic(t.name)
        for dp in t.partitions:
            idx = int(dp.partition_index)
            entry: dict[str, Any] = {"partition_index": idx, "low_watermark": -1, "error_code": ErrorCode.none}
            parts.append(entry)
            p = svc.replicas.partition(t.name, idx)
            if p is None or rec is None:
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
                continue
            if "delete" not in p.log.config.cleanup_policy.split(","):
                entry["error_code"] = ErrorCode.policy_violation
                continue
            offset = int(dp.offset)
            if offset == -1:
                offset = p.high_watermark
            if offset < 0 or offset > p.high_watermark:
                entry["error_code"] = ErrorCode.offset_out_of_range
                continue
            try:
                entry["low_watermark"] = p.log.delete_records_before(offset, high_watermark=p.high_watermark)
            except OffsetOutOfRange:
                entry["error_code"] = ErrorCode.offset_out_of_range
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
