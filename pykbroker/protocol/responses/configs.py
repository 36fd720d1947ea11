"""Response bodies of DescribeConfigs, AlterConfigs, IncrementalAlterConfigs: kio's field names, over every version
pykbroker answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict


class DescribeConfigsResponse(TypedDict):
    """DescribeConfigsResponse (API key 32), versions 0-4."""

    throttle_time: int
    results: Sequence[DescribeConfigsResult]


class DescribeConfigsResult(TypedDict):
    error_code: int
    error_message: str | None
    resource_type: int
    resource_name: str
    configs: Sequence[DescribeConfigsResourceResult]


class DescribeConfigsResourceResult(TypedDict):
    name: str
    value: str | None
    read_only: bool
    is_default: NotRequired[bool]
    is_sensitive: bool
    config_source: NotRequired[int]
    synonyms: NotRequired[Sequence[DescribeConfigsSynonym]]
    config_type: NotRequired[int]
    documentation: NotRequired[str | None]


class DescribeConfigsSynonym(TypedDict):
    name: str
    value: str | None
    source: int


class AlterConfigsResponse(TypedDict):
    """AlterConfigsResponse (API key 33), versions 0-2."""

    throttle_time: int
    responses: Sequence[AlterConfigsResourceResponse]


class AlterConfigsResourceResponse(TypedDict):
    error_code: int
    error_message: str | None
    resource_type: int
    resource_name: str


class IncrementalAlterConfigsResponse(TypedDict):
    """IncrementalAlterConfigsResponse (API key 44), versions 0-1."""

    throttle_time: int
    responses: Sequence[AlterConfigsResourceResponse]
