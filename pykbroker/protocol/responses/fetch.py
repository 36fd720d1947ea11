"""Response bodies of Fetch: kio's field names, over every version pykbroker answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import NotRequired, TypeAlias, TypedDict

from pykbroker.protocol.file_range import FileRange

# A record set: bytes, or a FileRange the network edge sends from its segment file.
Records: TypeAlias = bytes | FileRange


class FetchResponse(TypedDict):
    """FetchResponse (API key 1), versions 0-17."""

    responses: Sequence[FetchableTopicResponse]
    throttle_time: NotRequired[int]
    error_code: NotRequired[int]
    session_id: NotRequired[int]
    node_endpoints: NotRequired[Sequence[NodeEndpoint]]


class NodeEndpoint(TypedDict):
    node_id: int
    host: str
    port: int
    rack: NotRequired[str | None]


class FetchableTopicResponse(TypedDict):
    topic: NotRequired[str | None]  # None: an unknown topic id (v13+, which carry no name)
    partitions: Sequence[PartitionData]
    topic_id: NotRequired[uuid.UUID | None]


class PartitionData(TypedDict):
    partition_index: int
    error_code: int
    high_watermark: int
    records: Records | None
    last_stable_offset: NotRequired[int]
    aborted_transactions: NotRequired[Sequence[AbortedTransaction] | None]
    log_start_offset: NotRequired[int]
    preferred_read_replica: NotRequired[int]
    diverging_epoch: NotRequired[EpochEndOffset]
    current_leader: NotRequired[LeaderIdAndEpoch]
    snapshot_id: NotRequired[SnapshotId]


class AbortedTransaction(TypedDict):
    producer_id: int
    first_offset: int


class LeaderIdAndEpoch(TypedDict):
    leader_id: NotRequired[int]
    leader_epoch: NotRequired[int]


class EpochEndOffset(TypedDict):
    epoch: NotRequired[int]
    end_offset: NotRequired[int]


class SnapshotId(TypedDict):
    end_offset: NotRequired[int]
    epoch: NotRequired[int]
