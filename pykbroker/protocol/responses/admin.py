"""Response bodies of CreateTopics, DeleteTopics, CreatePartitions: kio's field names, over every version pykbroker
answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import NotRequired, TypedDict


class CreateTopicsResponse(TypedDict):
    """CreateTopicsResponse (API key 19), versions 0-7."""

    topics: Sequence[CreatableTopicResult]
    throttle_time: NotRequired[int]


class CreatableTopicResult(TypedDict):
    name: str
    error_code: int
    error_message: NotRequired[str | None]
    topic_config_error_code: NotRequired[int]
    num_partitions: NotRequired[int]
    replication_factor: NotRequired[int]
    configs: NotRequired[Sequence[CreatableTopicConfigs] | None]
    topic_id: NotRequired[uuid.UUID | None]


class CreatableTopicConfigs(TypedDict):
    name: str
    value: str | None
    read_only: bool
    config_source: NotRequired[int]
    is_sensitive: bool


class DeleteTopicsResponse(TypedDict):
    """DeleteTopicsResponse (API key 20), versions 0-6."""

    responses: Sequence[DeletableTopicResult]
    throttle_time: NotRequired[int]


class DeletableTopicResult(TypedDict):
    name: str | None
    error_code: int
    error_message: NotRequired[str | None]
    topic_id: NotRequired[uuid.UUID | None]


class CreatePartitionsResponse(TypedDict):
    """CreatePartitionsResponse (API key 37), versions 0-3."""

    throttle_time: int
    results: Sequence[CreatePartitionsTopicResult]


class CreatePartitionsTopicResult(TypedDict):
    name: str
    error_code: int
    error_message: NotRequired[str | None]
