"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31): the ACL admin APIs.

Without an authorizer Kafka answers SECURITY_DISABLED; DescribeAcls needs DESCRIBE on the cluster,
Create/DeleteAcls need ALTER on it.  Validation errors are per creation / per filter, as Kafka.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.metadata.store import run_store
from pykbroker.protocol.responses.acls import (
    AclCreationResult,
    CreateAclsResponse,
    DeleteAclsFilterResult,
    DeleteAclsMatchingAcl,
    DeleteAclsResponse,
    DescribeAclsResource,
    DescribeAclsResponse,
)
from pykbroker.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclError,
    PatternType,
    ResourcePattern,
    filter_unknown_reason,
    validate_binding,
)
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.authz import authorize
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services

NO_AUTHORIZER = "No Authorizer is configured on the broker"
CLUSTER = "kafka-cluster"


def _filter(f: Any) -> AclBindingFilter:
    return AclBindingFilter(int(f.resource_type_filter), f.resource_name_filter,
                            PatternType(int(f.pattern_type_filter))
                            if int(f.pattern_type_filter) in PatternType._value2member_map_ else PatternType.UNKNOWN,
                            f.principal_filter, f.host_filter, int(f.operation), int(f.permission_type))


async def handle_describe_acls(svc: Services, ctx: RequestContext, req: Any) -> DescribeAclsResponse:
    def fail(code: int, message: str | None) -> DescribeAclsResponse:
        return {"throttle_time": 0, "error_code": code, "error_message": message, "resources": []}

    if svc.authorizer is None:
        return fail(ErrorCode.security_disabled, NO_AUTHORIZER)
    if not authorize(ctx, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER):
        return fail(ErrorCode.cluster_authorization_failed, None)
    flt = _filter(req)
    reason = filter_unknown_reason(flt)
    if reason is not None:
        return fail(ErrorCode.invalid_request, reason)
    grouped: dict[ResourcePattern, list[AclBinding]] = {}
    for b in svc.store.acls():
        if flt.matches(b):
            grouped.setdefault(b.pattern, []).append(b)
    resources: list[DescribeAclsResource] = [
        {"resource_type": p.resource_type, "resource_name": p.name, "pattern_type": int(p.pattern_type),
         "acls": [{"principal": b.entry.principal, "host": b.entry.host,
                   "operation": int(b.entry.operation), "permission_type": int(b.entry.permission)}
                  for b in bs]}
        for p, bs in grouped.items()]
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "resources": resources}


async def handle_create_acls(svc: Services, ctx: RequestContext, req: Any) -> CreateAclsResponse:
    creations = list(req.creations)
    if svc.authorizer is None:
        return {"throttle_time": 0, "results": [
            {"error_code": ErrorCode.security_disabled, "error_message": NO_AUTHORIZER} for _ in creations]}
    if not authorize(ctx, AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER):
        return {"throttle_time": 0, "results": [
            {"error_code": ErrorCode.cluster_authorization_failed, "error_message": None} for _ in creations]}
    results: list[AclCreationResult] = []
    valid: list[AclBinding] = []
    for c in creations:
        try:
            valid.append(validate_binding(int(c.resource_type), c.resource_name, int(c.resource_pattern_type),
                                          c.principal, c.host, int(c.operation), int(c.permission_type)))
            results.append({"error_code": ErrorCode.none, "error_message": None})
        except AclError as e:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": str(e)})
    if valid:
        try:
            await run_store(svc.store, svc.store.create_acls, valid)
        except Exception as e:  # the store is down
            return {"throttle_time": 0, "results": [
                {"error_code": ErrorCode.unknown_server_error, "error_message": f"cannot store ACLs: {e}"}
                for _ in creations]}
    return {"throttle_time": 0, "results": results}


def _matching(b: AclBinding) -> DeleteAclsMatchingAcl:
    return {"error_code": ErrorCode.none, "error_message": None, "resource_type": b.pattern.resource_type,
            "resource_name": b.pattern.name, "pattern_type": int(b.pattern.pattern_type),
            "principal": b.entry.principal, "host": b.entry.host, "operation": int(b.entry.operation),
            "permission_type": int(b.entry.permission)}


async def handle_delete_acls(svc: Services, ctx: RequestContext, req: Any) -> DeleteAclsResponse:
    filters = list(req.filters)

    def all_fail(code: int, message: str | None) -> DeleteAclsResponse:
        return {"throttle_time": 0, "filter_results": [
            {"error_code": code, "error_message": message, "matching_acls": []} for _ in filters]}

    if svc.authorizer is None:
        return all_fail(ErrorCode.security_disabled, NO_AUTHORIZER)
    if not authorize(ctx, AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER):
        return all_fail(ErrorCode.cluster_authorization_failed, None)
    parsed = [_filter(f) for f in filters]
    usable = [f for f in parsed if filter_unknown_reason(f) is None]
    try:
        matched = iter(await run_store(svc.store, svc.store.delete_acls, usable) if usable else [])
    except Exception as e:  # the store is down
        return all_fail(ErrorCode.unknown_server_error, f"cannot delete ACLs: {e}")
    out: list[DeleteAclsFilterResult] = []
    for f in parsed:
        reason = filter_unknown_reason(f)
        if reason is not None:
            out.append({"error_code": ErrorCode.invalid_request, "error_message": reason, "matching_acls": []})
        else:
            out.append({"error_code": ErrorCode.none, "error_message": None,
                        "matching_acls": [_matching(b) for b in next(matched)]})
    return {"throttle_time": 0, "filter_results": out}
