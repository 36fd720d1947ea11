"""Response bodies of ApiVersions: kio's field names, over every version pykbroker answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict


class ApiVersionsResponse(TypedDict):
    """ApiVersionsResponse (API key 18), versions 0-4."""

    error_code: int
    api_keys: Sequence[ApiVersion]
    throttle_time: NotRequired[int]
    supported_features: NotRequired[Sequence[SupportedFeatureKey]]
    finalized_features_epoch: NotRequired[int]
    finalized_features: NotRequired[Sequence[FinalizedFeatureKey]]
    zk_migration_ready: NotRequired[bool]


class ApiVersion(TypedDict):
    api_key: int
    min_version: int
    max_version: int


class FinalizedFeatureKey(TypedDict):
    name: str
    max_version_level: int
    min_version_level: int


class SupportedFeatureKey(TypedDict):
    name: str
    min_version: int
    max_version: int
