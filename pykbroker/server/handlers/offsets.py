"""ListOffsets (earliest, latest, by timestamp, max timestamp, local and tiered specs) and DeleteRecords.

pykbroker has no tiered storage (KIP-405), so the whole log is local: EARLIEST_LOCAL (-4, v8+) is the
log start offset, and LATEST_TIERED (-5, KIP-1005, v9+) is answered as Kafka answers it for a topic
with nothing in remote storage: offset -1, timestamp -1, leader epoch -1, no error.  v10 (KIP-1075)
adds ``timeout_ms`` for lookups that must read remote storage; none here do, so it bounds nothing.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.protocol.responses.offsets import (
    DeleteRecordsPartitionResult,
    DeleteRecordsResponse,
    DeleteRecordsTopicResult,
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from pykbroker.replica.replica_manager import Partition
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.authz import denied_names
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services
from pykbroker.server.handlers.legacy_offsets import handle_list_offsets_v0
from pykbroker.storage.log import KafkaStorageError, LogStartOffsetIncrementReason, OffsetOutOfRange

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
READ_COMMITTED = 1
CONSUMER_REPLICA_ID, DEBUGGING_REPLICA_ID = -1, -2
# The first version that may ask for each special timestamp, as Kafka 3.9 checks it; any other negative
# timestamp is UNSUPPORTED_VERSION at every version.
_MIN_VERSION = {LATEST: 1, EARLIEST: 1, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9}


def _lookup(p: Partition, timestamp: int, read_committed: bool, replica: bool = False) -> tuple[int, int, int]:
    """(timestamp, offset, leader epoch) per ListOffsets semantics; (-1, -1, -1) when nothing matches.

    ``replica``: asked by another broker (or a debugging tool), which Kafka answers from the whole log,
    the log end offset included, not only up to the high watermark.
    """
    lg = p.log
    if timestamp == LATEST:
        if replica:
            return -1, lg.log_end_offset, p.leader_epoch
        return -1, p.last_stable_offset if read_committed else p.high_watermark, p.leader_epoch
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        # The epoch that wrote the first offset, as Kafka's epoch cache answers (-1 on an empty log).
        start = lg.log_start_offset
        epoch = lg.leader_epoch_cache.epoch_for_offset(start)
        return -1, start, -1 if epoch is None else epoch
    if timestamp == LATEST_TIERED:
        return -1, -1, -1
    # The log answers (offset, timestamp) for both.
    hit = lg.max_timestamp_and_offset() if timestamp == MAX_TIMESTAMP else lg.offset_for_timestamp(timestamp)
    if hit is None:
        return -1, -1, -1
    off, ts = hit
    limit = lg.log_end_offset if replica else p.last_stable_offset if read_committed else p.high_watermark
    if off >= limit:
        return -1, -1, -1
    return ts, off, p.leader_epoch


async def handle_list_offsets(svc: Services, ctx: RequestContext, req: Any) -> ListOffsetsResponse:
    if ctx.version == 0:  # segment offsets, not (timestamp, offset): clients from before Kafka 0.10.1
        return await handle_list_offsets_v0(svc, ctx, req)
    read_committed = int(getattr(req, "isolation_level", 0)) == READ_COMMITTED
    # Cluster mode, as Kafka: a replica id other than the consumer's (-1) reads to the log end, the
    # debugging id (-2) from any replica; with embedded metadata every request is a consumer's, as before.
    replica_id = int(getattr(req, "replica_id", CONSUMER_REPLICA_ID)) if svc.replicas.replicating \
        else CONSUMER_REPLICA_ID
    replica = replica_id != CONSUMER_REPLICA_ID
    if replica:
        read_committed = False
    topics: list[ListOffsetsTopicResponse] = []
    seen: set[tuple[str, int]] = set()
    denied = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (t.name for t in req.topics or ()))
    for t in req.topics or ():  # null never gets past the bounds pre-pass; be safe anyway
        parts: list[ListOffsetsPartitionResponse] = []
        for rp in t.partitions or ():
            idx = int(rp.partition_index)
            entry: ListOffsetsPartitionResponse = {"partition_index": idx, "error_code": ErrorCode.none,
                                                   "timestamp": -1, "offset": -1, "leader_epoch": -1}
            parts.append(entry)
            if denied and t.name in denied:
                entry["error_code"] = ErrorCode.topic_authorization_failed
                continue
            if (t.name, idx) in seen:
                entry["error_code"] = ErrorCode.invalid_request
                continue
            seen.add((t.name, idx))
            p = svc.replicas.partition(t.name, idx)
            if p is None or p.log.offline:
                entry["error_code"] = ErrorCode.kafka_storage_error if svc.replicas.is_offline(t.name, idx) \
                    else _not_hosted(svc, t.name, idx)
                continue
            epoch = int(getattr(rp, "current_leader_epoch", -1))
            if epoch != -1 and epoch != p.leader_epoch:
                entry["error_code"] = (
                    ErrorCode.fenced_leader_epoch if epoch < p.leader_epoch else ErrorCode.unknown_leader_epoch
                )
                continue
            if p.leader_id != svc.broker_id and replica_id != DEBUGGING_REPLICA_ID:  # a follower's replica
                entry["error_code"] = ErrorCode.not_leader_or_follower
                continue
            if not replica and svc.replicas.replicating and p.leader_epoch_start_offset > p.high_watermark:
                # KIP-207: a new leader's high watermark may still trail the old leader's; answering it
                # would move a consumer's "latest" backwards. Retriable until the followers catch up.
                entry["error_code"] = ErrorCode.offset_not_available
                continue
            ts = int(rp.timestamp)
            if ts < 0 and ctx.version < _MIN_VERSION.get(ts, 1 << 15):
                # A spec the request's version does not know, or no spec at all: refused per partition.
                entry["error_code"] = ErrorCode.unsupported_version
                continue
            try:
                ts_out, offset, leader_epoch = _lookup(p, ts, read_committed, replica)
            except KafkaStorageError:
                entry["error_code"] = ErrorCode.kafka_storage_error
                continue
            entry["timestamp"] = ts_out
            entry["offset"] = offset
            entry["leader_epoch"] = leader_epoch if offset >= 0 else -1
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}


def _not_hosted(svc: Services, topic: str, index: int) -> ErrorCode:
    """A partition this broker has no replica of: in a cluster, Kafka tells a partition it knows
    from metadata (another broker leads it) from one that does not exist."""
    if svc.store.is_cluster():
        rec = svc.store.topic(topic)
        if rec is not None and index in rec.partitions:
            return ErrorCode.not_leader_or_follower
    return ErrorCode.unknown_topic_or_partition


async def handle_delete_records(svc: Services, ctx: RequestContext, req: Any) -> DeleteRecordsResponse:
    topics: list[DeleteRecordsTopicResult] = []
    denied = denied_names(ctx, AclOperation.DELETE, ResourceType.TOPIC, (t.name for t in req.topics))
    for t in req.topics:
        parts: list[DeleteRecordsPartitionResult] = []
        rec = svc.store.topic(t.name)
        for dp in t.partitions:
            idx = int(dp.partition_index)
            entry: DeleteRecordsPartitionResult = {"partition_index": idx, "low_watermark": -1,
                                                   "error_code": ErrorCode.none}
            parts.append(entry)
            if denied and t.name in denied:
                entry["error_code"] = ErrorCode.topic_authorization_failed
                continue
            p = svc.replicas.partition(t.name, idx)
            if p is None or rec is None or p.log.offline:
                entry["error_code"] = ErrorCode.kafka_storage_error \
                    if rec is not None and svc.replicas.is_offline(t.name, idx) \
                    else _not_hosted(svc, t.name, idx)
                continue
            if p.leader_id != svc.broker_id:  # a follower's replica (cluster mode)
                entry["error_code"] = ErrorCode.not_leader_or_follower
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
                entry["low_watermark"] = p.log.delete_records_before(
                    offset, reason=LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION,
                    high_watermark=p.high_watermark)
            except OffsetOutOfRange:
                entry["error_code"] = ErrorCode.offset_out_of_range
            except KafkaStorageError:
                entry["error_code"] = ErrorCode.kafka_storage_error
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
