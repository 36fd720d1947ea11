"""Response bodies of OffsetForLeaderEpoch, AlterReplicaLogDirs, DescribeLogDirs, ElectLeaders,
AlterPartitionReassignments, ListPartitionReassignments, DescribeCluster, DescribeTopicPartitions: kio's field
names, over every version pykbroker answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import NotRequired, TypedDict


class OffsetForLeaderEpochResponse(TypedDict):
    """OffsetForLeaderEpochResponse (API key 23), versions 0-4."""

    topics: Sequence[OffsetForLeaderTopicResult]
    throttle_time: NotRequired[int]


class OffsetForLeaderTopicResult(TypedDict):
    topic: str
    partitions: Sequence[EpochEndOffset]


class EpochEndOffset(TypedDict):
    error_code: int
    partition: int
    end_offset: NotRequired[int]
    leader_epoch: NotRequired[int]


class AlterReplicaLogDirsResponse(TypedDict):
    """AlterReplicaLogDirsResponse (API key 34), versions 0-2."""

    throttle_time: int
    results: Sequence[AlterReplicaLogDirTopicResult]


class AlterReplicaLogDirTopicResult(TypedDict):
    topic_name: str
    partitions: Sequence[AlterReplicaLogDirPartitionResult]


class AlterReplicaLogDirPartitionResult(TypedDict):
    partition_index: int
    error_code: int


class DescribeLogDirsResponse(TypedDict):
    """DescribeLogDirsResponse (API key 35), versions 0-4."""

    throttle_time: int
    results: Sequence[DescribeLogDirsResult]
    error_code: NotRequired[int]


class DescribeLogDirsResult(TypedDict):
    error_code: int
    log_dir: str
    topics: Sequence[DescribeLogDirsTopic]
    total_bytes: NotRequired[int]
    usable_bytes: NotRequired[int]
    is_cordoned: NotRequired[bool]


class DescribeLogDirsTopic(TypedDict):
    name: str
    partitions: Sequence[DescribeLogDirsPartition]


class DescribeLogDirsPartition(TypedDict):
    partition_index: int
    partition_size: int
    offset_lag: int
    is_future_key: bool


class ElectLeadersResponse(TypedDict):
    """ElectLeadersResponse (API key 43), versions 0-2."""

    throttle_time: int
    replica_election_results: Sequence[ReplicaElectionResult]
    error_code: NotRequired[int]


class ReplicaElectionResult(TypedDict):
    topic: str
    partition_result: Sequence[PartitionResult]


class PartitionResult(TypedDict):
    partition_id: int
    error_code: int
    error_message: str | None


class AlterPartitionReassignmentsResponse(TypedDict):
    """AlterPartitionReassignmentsResponse (API key 45), versions 0-0."""

    throttle_time: int
    error_code: int
    error_message: str | None
    responses: Sequence[ReassignableTopicResponse]
    allow_replication_factor_change: NotRequired[bool]


class ReassignableTopicResponse(TypedDict):
    name: str
    partitions: Sequence[ReassignablePartitionResponse]


class ReassignablePartitionResponse(TypedDict):
    partition_index: int
    error_code: int
    error_message: str | None


class ListPartitionReassignmentsResponse(TypedDict):
    """ListPartitionReassignmentsResponse (API key 46), versions 0-0."""

    throttle_time: int
    error_code: int
    error_message: str | None
    topics: Sequence[OngoingTopicReassignment]


class OngoingTopicReassignment(TypedDict):
    name: str
    partitions: Sequence[OngoingPartitionReassignment]


class OngoingPartitionReassignment(TypedDict):
    partition_index: int
    replicas: NotRequired[Sequence[int]]
    adding_replicas: NotRequired[Sequence[int]]
    removing_replicas: NotRequired[Sequence[int]]


class DescribeClusterResponse(TypedDict):
    """DescribeClusterResponse (API key 60), versions 0-1."""

    throttle_time: int
    error_code: int
    error_message: NotRequired[str | None]
    cluster_id: str
    controller_id: NotRequired[int]
    brokers: Sequence[DescribeClusterBroker]
    cluster_authorized_operations: NotRequired[int]
    endpoint_type: NotRequired[int]


class DescribeClusterBroker(TypedDict):
    broker_id: int
    host: str
    port: int
    rack: NotRequired[str | None]
    is_fenced: NotRequired[bool]


class DescribeTopicPartitionsResponse(TypedDict):
    """DescribeTopicPartitionsResponse (API key 75), versions 0-0."""

    throttle_time: int
    topics: Sequence[DescribeTopicPartitionsResponseTopic]
    next_cursor: NotRequired[Cursor | None]


class Cursor(TypedDict):
    topic_name: str
    partition_index: int


class DescribeTopicPartitionsResponseTopic(TypedDict):
    error_code: int
    name: str | None
    topic_id: uuid.UUID | None
    is_internal: NotRequired[bool]
    partitions: Sequence[DescribeTopicPartitionsResponsePartition]
    topic_authorized_operations: NotRequired[int]


class DescribeTopicPartitionsResponsePartition(TypedDict):
    error_code: int
    partition_index: int
    leader_id: int
    leader_epoch: NotRequired[int]
    replica_nodes: NotRequired[Sequence[int]]
    isr_nodes: NotRequired[Sequence[int]]
    eligible_leader_replicas: NotRequired[Sequence[int] | None]
    last_known_elr: NotRequired[Sequence[int] | None]
    offline_replicas: NotRequired[Sequence[int]]
