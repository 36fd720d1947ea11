"""Response bodies of InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, WriteTxnMarkers, TxnOffsetCommit,
DescribeProducers, DescribeTransactions, ListTransactions: kio's field names, over every version pykbroker answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict


class InitProducerIdResponse(TypedDict):
    """InitProducerIdResponse (API key 22), versions 0-5."""

    throttle_time: int
    error_code: int
    producer_id: NotRequired[int]
    producer_epoch: int
    ongoing_txn_producer_id: NotRequired[int]
    ongoing_txn_producer_epoch: NotRequired[int]


class AddPartitionsToTxnResponse(TypedDict):
    """AddPartitionsToTxnResponse (API key 24), versions 0-5."""

    throttle_time: int
    results_by_topic_v3_and_below: NotRequired[Sequence[AddPartitionsToTxnTopicResult]]
    error_code: NotRequired[int]
    results_by_transaction: NotRequired[Sequence[AddPartitionsToTxnResult]]


class AddPartitionsToTxnTopicResult(TypedDict):
    name: str
    results_by_partition: Sequence[AddPartitionsToTxnPartitionResult]


class AddPartitionsToTxnResult(TypedDict):
    transactional_id: str
    topic_results: Sequence[AddPartitionsToTxnTopicResult]


class AddPartitionsToTxnPartitionResult(TypedDict):
    partition_index: int
    partition_error_code: int


class AddOffsetsToTxnResponse(TypedDict):
    """AddOffsetsToTxnResponse (API key 25), versions 0-4."""

    throttle_time: int
    error_code: int


class EndTxnResponse(TypedDict):
    """EndTxnResponse (API key 26), versions 0-4."""

    throttle_time: int
    error_code: int
    producer_id: NotRequired[int]
    producer_epoch: NotRequired[int]


class WriteTxnMarkersResponse(TypedDict):
    """WriteTxnMarkersResponse (API key 27), versions 0-1."""

    markers: Sequence[WritableTxnMarkerResult]


class WritableTxnMarkerResult(TypedDict):
    producer_id: int
    topics: Sequence[WritableTxnMarkerTopicResult]


class WritableTxnMarkerTopicResult(TypedDict):
    name: str
    partitions: Sequence[WritableTxnMarkerPartitionResult]


class WritableTxnMarkerPartitionResult(TypedDict):
    partition_index: int
    error_code: int


class TxnOffsetCommitResponse(TypedDict):
    """TxnOffsetCommitResponse (API key 28), versions 0-4."""

    throttle_time: int
    topics: Sequence[TxnOffsetCommitResponseTopic]


class TxnOffsetCommitResponseTopic(TypedDict):
    name: str
    partitions: Sequence[TxnOffsetCommitResponsePartition]


class TxnOffsetCommitResponsePartition(TypedDict):
    partition_index: int
    error_code: int


class DescribeProducersResponse(TypedDict):
    """DescribeProducersResponse (API key 61), versions 0-0."""

    throttle_time: int
    topics: Sequence[TopicResponse]


class TopicResponse(TypedDict):
    name: str
    partitions: Sequence[PartitionResponse]


class PartitionResponse(TypedDict):
    partition_index: int
    error_code: int
    error_message: NotRequired[str | None]
    active_producers: Sequence[ProducerState]


class ProducerState(TypedDict):
    producer_id: int
    producer_epoch: int
    last_sequence: NotRequired[int]
    last_timestamp: NotRequired[int]
    coordinator_epoch: int
    current_txn_start_offset: NotRequired[int]


class DescribeTransactionsResponse(TypedDict):
    """DescribeTransactionsResponse (API key 65), versions 0-0."""

    throttle_time: int
    transaction_states: Sequence[DescribeTransactionsTransactionState]


class DescribeTransactionsTransactionState(TypedDict):
    error_code: int
    transactional_id: str
    transaction_state: str
    transaction_timeout: int
    transaction_start_time: int
    producer_id: int
    producer_epoch: int
    topics: Sequence[TopicData]


class TopicData(TypedDict):
    topic: str
    partitions: NotRequired[Sequence[int]]


class ListTransactionsResponse(TypedDict):
    """ListTransactionsResponse (API key 66), versions 0-1."""

    throttle_time: int
    error_code: int
    unknown_state_filters: NotRequired[Sequence[str]]
    transaction_states: Sequence[ListTransactionsTransactionState]


class ListTransactionsTransactionState(TypedDict):
    transactional_id: str
    producer_id: int
    transaction_state: str
