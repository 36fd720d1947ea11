"""Response bodies of Metadata: kio's field names, over every version pykbroker answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import NotRequired, TypedDict


class MetadataResponse(TypedDict):
    """MetadataResponse (API key 3), versions 0-12."""

    brokers: Sequence[MetadataResponseBroker]
    topics: Sequence[MetadataResponseTopic]
    controller_id: NotRequired[int]
    cluster_id: NotRequired[str | None]
    throttle_time: NotRequired[int]
    cluster_authorized_operations: NotRequired[int]
    error_code: NotRequired[int]


class MetadataResponseBroker(TypedDict):
    node_id: int
    host: str
    port: int
    rack: NotRequired[str | None]


class MetadataResponseTopic(TypedDict):
    error_code: int
    name: str | None
    partitions: Sequence[MetadataResponsePartition]
    is_internal: NotRequired[bool]
    topic_authorized_operations: NotRequired[int]
    topic_id: NotRequired[uuid.UUID | None]


class MetadataResponsePartition(TypedDict):
    error_code: int
    partition_index: int
    leader_id: int
    replica_nodes: NotRequired[Sequence[int]]
    isr_nodes: NotRequired[Sequence[int]]
    offline_replicas: NotRequired[Sequence[int]]
    leader_epoch: NotRequired[int]
