"""Response bodies of GetTelemetrySubscriptions, PushTelemetry, ListConfigResources: kio's field names, over every
version pykbroker answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import NotRequired, TypedDict


class GetTelemetrySubscriptionsResponse(TypedDict):
    """GetTelemetrySubscriptionsResponse (API key 71), versions 0-0."""

    throttle_time: int
    error_code: int
    client_instance_id: uuid.UUID | None
    subscription_id: int
    accepted_compression_types: NotRequired[Sequence[int]]
    push_interval: int
    telemetry_max_bytes: int
    delta_temporality: bool
    requested_metrics: NotRequired[Sequence[str]]


class PushTelemetryResponse(TypedDict):
    """PushTelemetryResponse (API key 72), versions 0-0."""

    throttle_time: int
    error_code: int


class ListConfigResourcesResponse(TypedDict):
    """ListConfigResourcesResponse (API key 74), versions 0-0."""

    throttle_time: int
    error_code: int
    config_resources: Sequence[ConfigResource]


class ConfigResource(TypedDict):
    resource_name: str
    resource_type: NotRequired[int]
