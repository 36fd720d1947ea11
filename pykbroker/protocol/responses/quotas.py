"""Response bodies of DescribeClientQuotas, AlterClientQuotas: kio's field names, over every version pykbroker answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict


class DescribeClientQuotasResponse(TypedDict):
    """DescribeClientQuotasResponse (API key 48), versions 0-1."""

    throttle_time: int
    error_code: int
    error_message: str | None
    entries: Sequence[DescribeClientQuotasEntryData] | None


class DescribeClientQuotasEntryData(TypedDict):
    entity: Sequence[EntityData]
    values: Sequence[ValueData]


class EntityData(TypedDict):
    entity_type: str
    entity_name: str | None


class ValueData(TypedDict):
    key: str
    value: float


class AlterClientQuotasResponse(TypedDict):
    """AlterClientQuotasResponse (API key 49), versions 0-1."""

    throttle_time: int
    entries: Sequence[AlterClientQuotasEntryData]


class AlterClientQuotasEntryData(TypedDict):
    error_code: int
    error_message: str | None
    entity: Sequence[EntityData]
