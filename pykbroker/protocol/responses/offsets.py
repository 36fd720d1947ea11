"""Response bodies of ListOffsets, DeleteRecords: kio's field names, over every version pykbroker answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict


class ListOffsetsResponse(TypedDict):
    """ListOffsetsResponse (API key 2), versions 0-10."""

    topics: Sequence[ListOffsetsTopicResponse]
    throttle_time: NotRequired[int]


class ListOffsetsTopicResponse(TypedDict):
    name: str
    partitions: Sequence[ListOffsetsPartitionResponse]


class ListOffsetsPartitionResponse(TypedDict):
    partition_index: int
    error_code: int
    old_style_offsets: NotRequired[Sequence[int]]
    timestamp: NotRequired[int]
    offset: NotRequired[int]
    leader_epoch: NotRequired[int]


class DeleteRecordsResponse(TypedDict):
    """DeleteRecordsResponse (API key 21), versions 0-2."""

    throttle_time: int
    topics: Sequence[DeleteRecordsTopicResult]


class DeleteRecordsTopicResult(TypedDict):
    name: str
    partitions: Sequence[DeleteRecordsPartitionResult]


class DeleteRecordsPartitionResult(TypedDict):
    partition_index: int
    low_watermark: int
    error_code: int
