"""ListOffsets v0: the offsets of segment boundaries (Kafka's legacyFetchOffsetsBefore).

v0 predates timestamp indexes: it answers up to ``max_num_offsets`` offsets, newest first,
taken from the base offsets of the segments last modified at or before the timestamp
(plus the log end offset), capped at the high watermark for consumers.  Clients
from before Kafka 0.10.1 use it with -1 (latest) and -2 (earliest) and one offset.
"""

from __future__ import annotations

import os
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.protocol.responses.offsets import (
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from pykbroker.replica.replica_manager import Partition
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.authz import denied_names
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services, now_ms
from pykbroker.storage.log import KafkaStorageError

LATEST = -1
EARLIEST = -2
CONSUMER_REPLICA_ID = -1


def _offsets_before(p: Partition, timestamp: int, max_num_offsets: int, now: int) -> list[int]:
    lg = p.log
    start = lg.log_start_offset
    segments = lg.segments
    pairs: list[tuple[int, int]] = []
    for seg in segments:
        try:
            modified = int(os.stat(seg.log_path).st_mtime * 1000)
        except OSError:  # deleted by retention meanwhile
            continue
        pairs.append((max(seg.base_offset, start), modified))
    if segments and segments[-1].size > 0:
        pairs.append((lg.log_end_offset, now))
    if timestamp == LATEST:
        index = len(pairs) - 1
    elif timestamp == EARLIEST:
        index = 0 if pairs else -1
    else:
        index = -1
        for i, (_offset, modified) in enumerate(pairs):
            if modified <= timestamp:
                index = i
    count = max(0, min(max_num_offsets, index + 1))
    return sorted((pairs[index - j][0] for j in range(count)), reverse=True)


async def handle_list_offsets_v0(svc: Services, ctx: RequestContext, req: Any) -> ListOffsetsResponse:
    from_consumer = int(req.replica_id) == CONSUMER_REPLICA_ID
    denied = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (t.name for t in req.topics or ()))
    topics: list[ListOffsetsTopicResponse] = []
    for t in req.topics or ():
        parts: list[ListOffsetsPartitionResponse] = []
        for rp in t.partitions or ():
            idx = int(rp.partition_index)
            entry: ListOffsetsPartitionResponse = {"partition_index": idx, "error_code": ErrorCode.none,
                                                   "old_style_offsets": []}
            parts.append(entry)
            if denied and t.name in denied:
                entry["error_code"] = ErrorCode.topic_authorization_failed
                continue
            p = svc.replicas.partition(t.name, idx)
            if p is None or p.log.offline:
                entry["error_code"] = ErrorCode.kafka_storage_error if svc.replicas.is_offline(t.name, idx) \
                    else ErrorCode.unknown_topic_or_partition
                continue
            if p.leader_id != svc.broker_id:
                entry["error_code"] = ErrorCode.not_leader_or_follower
                continue
            try:
                offsets = _offsets_before(p, int(rp.timestamp), int(rp.max_num_offsets), now_ms())
            except KafkaStorageError:
                entry["error_code"] = ErrorCode.kafka_storage_error
                continue
            if from_consumer:
                hw = p.high_watermark
                if any(o > hw for o in offsets):
                    offsets = [hw] + [o for o in offsets if o <= hw]
            entry["old_style_offsets"] = offsets
        topics.append({"name": t.name, "partitions": parts})
    return {"topics": topics}
