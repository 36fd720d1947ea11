"""Response bodies of ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch, ShareAcknowledge, ReadShareGroupState,
WriteShareGroupState, DeleteShareGroupState, DescribeShareGroupOffsets, AlterShareGroupOffsets,
DeleteShareGroupOffsets: kio's field names, over every version pykbroker answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import NotRequired, TypeAlias, TypedDict

from pykbroker.protocol.file_range import FileRange

# A record set: bytes, or a FileRange the network edge sends from its segment file.
Records: TypeAlias = bytes | FileRange


class ShareGroupHeartbeatResponse(TypedDict):
    """ShareGroupHeartbeatResponse (API key 76), versions 1-1."""

    throttle_time: int
    error_code: int
    error_message: NotRequired[str | None]
    member_id: NotRequired[str | None]
    member_epoch: int
    heartbeat_interval: int
    assignment: NotRequired[ShareGroupHeartbeatAssignment | None]


class ShareGroupHeartbeatAssignment(TypedDict):
    topic_partitions: Sequence[ShareGroupHeartbeatTopicPartitions]


class ShareGroupHeartbeatTopicPartitions(TypedDict):
    topic_id: uuid.UUID | None
    partitions: NotRequired[Sequence[int]]


class ShareGroupDescribeResponse(TypedDict):
    """ShareGroupDescribeResponse (API key 77), versions 1-1."""

    throttle_time: int
    groups: Sequence[DescribedGroup]


class DescribedGroup(TypedDict):
    error_code: int
    error_message: NotRequired[str | None]
    group_id: str
    group_state: str
    group_epoch: int
    assignment_epoch: int
    assignor_name: str
    members: Sequence[Member]
    authorized_operations: NotRequired[int]


class Member(TypedDict):
    member_id: str
    rack_id: NotRequired[str | None]
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: NotRequired[Sequence[str]]
    assignment: ShareGroupDescribeAssignment


class ShareGroupDescribeAssignment(TypedDict):
    topic_partitions: Sequence[ShareGroupDescribeTopicPartitions]


class ShareGroupDescribeTopicPartitions(TypedDict):
    topic_id: uuid.UUID | None
    topic_name: str
    partitions: NotRequired[Sequence[int]]


class ShareFetchResponse(TypedDict):
    """ShareFetchResponse (API key 78), versions 1-2."""

    throttle_time: int
    error_code: int
    error_message: NotRequired[str | None]
    acquisition_lock_timeout: int
    responses: Sequence[ShareFetchableTopicResponse]
    node_endpoints: Sequence[NodeEndpoint]


class NodeEndpoint(TypedDict):
    node_id: int
    host: str
    port: int
    rack: NotRequired[str | None]


class ShareFetchableTopicResponse(TypedDict):
    topic_id: uuid.UUID | None
    partitions: Sequence[ShareFetchPartitionData]


class ShareFetchPartitionData(TypedDict):
    partition_index: int
    error_code: int
    error_message: NotRequired[str | None]
    acknowledge_error_code: int
    acknowledge_error_message: NotRequired[str | None]
    current_leader: LeaderIdAndEpoch
    records: Records
    acquired_records: Sequence[AcquiredRecords]


class AcquiredRecords(TypedDict):
    first_offset: int
    last_offset: int
    delivery_count: int


class LeaderIdAndEpoch(TypedDict):
    leader_id: int
    leader_epoch: int


class ShareAcknowledgeResponse(TypedDict):
    """ShareAcknowledgeResponse (API key 79), versions 1-2."""

    throttle_time: int
    error_code: int
    error_message: NotRequired[str | None]
    responses: Sequence[ShareAcknowledgeTopicResponse]
    node_endpoints: Sequence[NodeEndpoint]
    acquisition_lock_timeout: NotRequired[int]


class ShareAcknowledgeTopicResponse(TypedDict):
    topic_id: uuid.UUID | None
    partitions: Sequence[ShareAcknowledgePartitionData]


class ShareAcknowledgePartitionData(TypedDict):
    partition_index: int
    error_code: int
    error_message: NotRequired[str | None]
    current_leader: LeaderIdAndEpoch


class ReadShareGroupStateResponse(TypedDict):
    """ReadShareGroupStateResponse (API key 84), versions 0-0."""

    results: Sequence[ReadStateResult]


class ReadStateResult(TypedDict):
    topic_id: uuid.UUID | None
    partitions: Sequence[ReadShareGroupStatePartitionResult]


class ReadShareGroupStatePartitionResult(TypedDict):
    partition: int
    error_code: int
    error_message: NotRequired[str | None]
    state_epoch: int
    start_offset: int
    state_batches: Sequence[StateBatch]


class StateBatch(TypedDict):
    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int


class WriteShareGroupStateResponse(TypedDict):
    """WriteShareGroupStateResponse (API key 85), versions 0-0."""

    results: Sequence[WriteStateResult]


class WriteStateResult(TypedDict):
    topic_id: uuid.UUID | None
    partitions: Sequence[WriteShareGroupStatePartitionResult]


class WriteShareGroupStatePartitionResult(TypedDict):
    partition: int
    error_code: int
    error_message: NotRequired[str | None]


class DeleteShareGroupStateResponse(TypedDict):
    """DeleteShareGroupStateResponse (API key 86), versions 0-0."""

    results: Sequence[DeleteStateResult]


class DeleteStateResult(TypedDict):
    topic_id: uuid.UUID | None
    partitions: Sequence[WriteShareGroupStatePartitionResult]


class DescribeShareGroupOffsetsResponse(TypedDict):
    """DescribeShareGroupOffsetsResponse (API key 90), versions 0-1."""

    throttle_time: int
    groups: Sequence[DescribeShareGroupOffsetsResponseGroup]


class DescribeShareGroupOffsetsResponseGroup(TypedDict):
    group_id: str
    topics: Sequence[DescribeShareGroupOffsetsResponseTopic]
    error_code: int
    error_message: NotRequired[str | None]


class DescribeShareGroupOffsetsResponseTopic(TypedDict):
    topic_name: str
    topic_id: uuid.UUID | None
    partitions: Sequence[DescribeShareGroupOffsetsResponsePartition]


class DescribeShareGroupOffsetsResponsePartition(TypedDict):
    partition_index: int
    start_offset: int
    leader_epoch: int
    error_code: int
    error_message: NotRequired[str | None]
    lag: NotRequired[int]


class AlterShareGroupOffsetsResponse(TypedDict):
    """AlterShareGroupOffsetsResponse (API key 91), versions 0-0."""

    throttle_time: int
    error_code: int
    error_message: NotRequired[str | None]
    responses: Sequence[AlterShareGroupOffsetsResponseTopic]


class AlterShareGroupOffsetsResponseTopic(TypedDict):
    topic_name: str
    topic_id: uuid.UUID | None
    partitions: Sequence[AlterShareGroupOffsetsResponsePartition]


class AlterShareGroupOffsetsResponsePartition(TypedDict):
    partition_index: int
    error_code: int
    error_message: NotRequired[str | None]


class DeleteShareGroupOffsetsResponse(TypedDict):
    """DeleteShareGroupOffsetsResponse (API key 92), versions 0-0."""

    throttle_time: int
    error_code: int
    error_message: NotRequired[str | None]
    responses: Sequence[DeleteShareGroupOffsetsResponseTopic]


class DeleteShareGroupOffsetsResponseTopic(TypedDict):
    topic_name: str
    topic_id: uuid.UUID | None
    error_code: int
    error_message: NotRequired[str | None]
