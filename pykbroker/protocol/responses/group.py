"""Response bodies of OffsetCommit, OffsetFetch, FindCoordinator, JoinGroup, Heartbeat, LeaveGroup, SyncGroup,
DescribeGroups, ListGroups, DeleteGroups, OffsetDelete, ConsumerGroupHeartbeat, ConsumerGroupDescribe: kio's field
names, over every version pykbroker answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import NotRequired, TypedDict


class OffsetCommitResponse(TypedDict):
    """OffsetCommitResponse (API key 8), versions 0-9."""

    topics: Sequence[OffsetCommitResponseTopic]
    throttle_time: NotRequired[int]


class OffsetCommitResponseTopic(TypedDict):
    name: str
    partitions: Sequence[OffsetCommitResponsePartition]
    topic_id: NotRequired[uuid.UUID | None]


class OffsetCommitResponsePartition(TypedDict):
    partition_index: int
    error_code: int


class OffsetFetchResponse(TypedDict):
    """OffsetFetchResponse (API key 9), versions 0-9."""

    topics: NotRequired[Sequence[OffsetFetchResponseTopic]]
    error_code: NotRequired[int]
    throttle_time: NotRequired[int]
    groups: NotRequired[Sequence[OffsetFetchResponseGroup]]


class OffsetFetchResponseGroup(TypedDict):
    group_id: str
    topics: Sequence[OffsetFetchResponseTopics]
    error_code: NotRequired[int]


class OffsetFetchResponseTopic(TypedDict):
    name: str
    partitions: Sequence[OffsetFetchResponsePartition]


class OffsetFetchResponseTopics(TypedDict):
    name: str
    partitions: Sequence[OffsetFetchResponsePartitions]
    topic_id: NotRequired[uuid.UUID | None]


class OffsetFetchResponsePartition(TypedDict):
    partition_index: int
    committed_offset: int
    metadata: str | None
    error_code: int
    committed_leader_epoch: NotRequired[int]


class OffsetFetchResponsePartitions(TypedDict):
    partition_index: int
    committed_offset: int
    committed_leader_epoch: NotRequired[int]
    metadata: str | None
    error_code: int


class FindCoordinatorResponse(TypedDict):
    """FindCoordinatorResponse (API key 10), versions 0-6."""

    error_code: NotRequired[int]
    node_id: NotRequired[int]
    host: NotRequired[str]
    port: NotRequired[int]
    throttle_time: NotRequired[int]
    error_message: NotRequired[str | None]
    coordinators: NotRequired[Sequence[Coordinator]]


class Coordinator(TypedDict):
    key: str
    node_id: int
    host: str
    port: int
    error_code: int
    error_message: str | None


class JoinGroupResponse(TypedDict):
    """JoinGroupResponse (API key 11), versions 0-9."""

    error_code: int
    generation_id: NotRequired[int]
    protocol_name: str | None
    leader: str
    member_id: str
    members: Sequence[JoinGroupResponseMember]
    throttle_time: NotRequired[int]
    protocol_type: NotRequired[str | None]
    skip_assignment: NotRequired[bool]


class JoinGroupResponseMember(TypedDict):
    member_id: str
    metadata: bytes
    group_instance_id: NotRequired[str | None]


class HeartbeatResponse(TypedDict):
    """HeartbeatResponse (API key 12), versions 0-4."""

    error_code: int
    throttle_time: NotRequired[int]


class LeaveGroupResponse(TypedDict):
    """LeaveGroupResponse (API key 13), versions 0-5."""

    error_code: int
    throttle_time: NotRequired[int]
    members: NotRequired[Sequence[MemberResponse]]


class MemberResponse(TypedDict):
    member_id: str
    group_instance_id: str | None
    error_code: int


class SyncGroupResponse(TypedDict):
    """SyncGroupResponse (API key 14), versions 0-5."""

    error_code: int
    assignment: bytes
    throttle_time: NotRequired[int]
    protocol_type: NotRequired[str | None]
    protocol_name: NotRequired[str | None]


class DescribeGroupsResponse(TypedDict):
    """DescribeGroupsResponse (API key 15), versions 0-5."""

    groups: Sequence[DescribeGroupsDescribedGroup]
    throttle_time: NotRequired[int]


class DescribeGroupsDescribedGroup(TypedDict):
    error_code: int
    group_id: str
    group_state: str
    protocol_type: str
    protocol_data: str
    members: Sequence[DescribedGroupMember]
    authorized_operations: NotRequired[int]
    error_message: NotRequired[str | None]


class DescribedGroupMember(TypedDict):
    member_id: str
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes
    group_instance_id: NotRequired[str | None]


class ListGroupsResponse(TypedDict):
    """ListGroupsResponse (API key 16), versions 0-5."""

    error_code: int
    groups: Sequence[ListedGroup]
    throttle_time: NotRequired[int]


class ListedGroup(TypedDict):
    group_id: str
    protocol_type: str
    group_state: NotRequired[str]
    group_type: NotRequired[str]


class DeleteGroupsResponse(TypedDict):
    """DeleteGroupsResponse (API key 42), versions 0-2."""

    throttle_time: int
    results: Sequence[DeletableGroupResult]


class DeletableGroupResult(TypedDict):
    group_id: str
    error_code: int


class OffsetDeleteResponse(TypedDict):
    """OffsetDeleteResponse (API key 47), versions 0-0."""

    error_code: int
    throttle_time: int
    topics: Sequence[OffsetDeleteResponseTopic]


class OffsetDeleteResponseTopic(TypedDict):
    name: str
    partitions: Sequence[OffsetDeleteResponsePartition]


class OffsetDeleteResponsePartition(TypedDict):
    partition_index: int
    error_code: int


class ConsumerGroupHeartbeatResponse(TypedDict):
    """ConsumerGroupHeartbeatResponse (API key 68), versions 0-1."""

    throttle_time: int
    error_code: int
    error_message: NotRequired[str | None]
    member_id: NotRequired[str | None]
    member_epoch: int
    heartbeat_interval: int
    assignment: NotRequired[ConsumerGroupHeartbeatAssignment | None]


class ConsumerGroupHeartbeatAssignment(TypedDict):
    topic_partitions: Sequence[ConsumerGroupHeartbeatTopicPartitions]


class ConsumerGroupHeartbeatTopicPartitions(TypedDict):
    topic_id: uuid.UUID | None
    partitions: NotRequired[Sequence[int]]


class ConsumerGroupDescribeResponse(TypedDict):
    """ConsumerGroupDescribeResponse (API key 69), versions 0-1."""

    throttle_time: int
    groups: Sequence[ConsumerGroupDescribeDescribedGroup]


class ConsumerGroupDescribeDescribedGroup(TypedDict):
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
    instance_id: NotRequired[str | None]
    rack_id: NotRequired[str | None]
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: NotRequired[Sequence[str]]
    subscribed_topic_regex: NotRequired[str | None]
    assignment: ConsumerGroupDescribeAssignment
    target_assignment: ConsumerGroupDescribeAssignment
    member_type: NotRequired[int]


class ConsumerGroupDescribeAssignment(TypedDict):
    topic_partitions: Sequence[ConsumerGroupDescribeTopicPartitions]


class ConsumerGroupDescribeTopicPartitions(TypedDict):
    topic_id: uuid.UUID | None
    topic_name: str
    partitions: NotRequired[Sequence[int]]
