"""Response bodies of Produce: kio's field names, over every version pykbroker answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import NotRequired, TypedDict


class ProduceResponse(TypedDict):
    """ProduceResponse (API key 0), versions 0-11."""

    responses: Sequence[TopicProduceResponse]
    throttle_time: NotRequired[int]
    node_endpoints: NotRequired[Sequence[NodeEndpoint]]


class NodeEndpoint(TypedDict):
    node_id: int
    host: str
    port: int
    rack: NotRequired[str | None]


class TopicProduceResponse(TypedDict):
    name: str
    partition_responses: Sequence[PartitionProduceResponse]
    topic_id: NotRequired[uuid.UUID | None]


class PartitionProduceResponse(TypedDict):
    index: int
    error_code: int
    base_offset: int
    log_append_time: NotRequired[int | None]
    log_start_offset: NotRequired[int]
    record_errors: NotRequired[Sequence[BatchIndexAndErrorMessage]]
    error_message: NotRequired[str | None]
    current_leader: NotRequired[LeaderIdAndEpoch]


class LeaderIdAndEpoch(TypedDict):
    leader_id: NotRequired[int]
    leader_epoch: NotRequired[int]


class BatchIndexAndErrorMessage(TypedDict):
    batch_index: int
    batch_index_error_message: NotRequired[str | None]
