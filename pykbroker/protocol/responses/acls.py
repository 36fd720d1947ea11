"""Response bodies of DescribeAcls, CreateAcls, DeleteAcls: kio's field names, over every version pykbroker answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict


class DescribeAclsResponse(TypedDict):
    """DescribeAclsResponse (API key 29), versions 1-3."""

    throttle_time: int
    error_code: int
    error_message: str | None
    resources: Sequence[DescribeAclsResource]


class DescribeAclsResource(TypedDict):
    resource_type: int
    resource_name: str
    pattern_type: NotRequired[int]
    acls: Sequence[AclDescription]


class AclDescription(TypedDict):
    principal: str
    host: str
    operation: int
    permission_type: int


class CreateAclsResponse(TypedDict):
    """CreateAclsResponse (API key 30), versions 1-3."""

    throttle_time: int
    results: Sequence[AclCreationResult]


class AclCreationResult(TypedDict):
    error_code: int
    error_message: str | None


class DeleteAclsResponse(TypedDict):
    """DeleteAclsResponse (API key 31), versions 1-3."""

    throttle_time: int
    filter_results: Sequence[DeleteAclsFilterResult]


class DeleteAclsFilterResult(TypedDict):
    error_code: int
    error_message: str | None
    matching_acls: Sequence[DeleteAclsMatchingAcl]


class DeleteAclsMatchingAcl(TypedDict):
    error_code: int
    error_message: str | None
    resource_type: int
    resource_name: str
    pattern_type: NotRequired[int]
    principal: str
    host: str
    operation: int
    permission_type: int
