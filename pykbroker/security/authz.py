"""Request-level authorization (Kafka's AuthHelper and the authorizer logger): may this request's
principal do an operation on a resource, the ``*_authorized_operations`` fields, and the filters the
API handlers apply per name.

Kafka answers ``*_authorized_operations`` fields (Metadata, DescribeGroups, DescribeCluster,
DescribeTopicPartitions) with a 32-bit field holding bit ``1 << code`` for each :class:`AclOperation`
the principal is allowed on the resource, out of the operations that apply to its resource type.  When
the client did not ask, the field is ``AUTHORIZED_OPERATIONS_OMITTED`` (``INT32_MIN``).  Without
``authorizer.class.name`` (``ctx.authorizer is None``) every check is one attribute test per request and
nothing per partition or record.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pykbroker.logsetup import fields
from pykbroker.security.authorizer import (
    AUTHORIZED_OPERATIONS_OMITTED,
    AUTHORIZER,
    SUPPORTED_OPERATIONS,
    AclOperation,
    ResourceType,
    to_bit_field,
)
from pykbroker.security.principal import ANONYMOUS as ANONYMOUS_PRINCIPAL
from pykbroker.security.request import RequestContext

log = logging.getLogger("pykbroker.authorizer")

# The one cluster resource's name, as in Kafka (ResourcePattern for CLUSTER).
CLUSTER_NAME = "kafka-cluster"


def enforced(ctx: RequestContext) -> bool:
    """True when an authorizer decides; False means every principal may do everything."""
    return ctx.authorizer is not None


def allowed(ctx: RequestContext, op: AclOperation, rtype: ResourceType, name: str, *,
            log_denial: bool = True) -> bool:
    """One check; free when no authorizer is configured."""
    if ctx.authorizer is None:
        return True
    return authorize(ctx, op, rtype, name, log_denial=log_denial)


def cluster_allowed(ctx: RequestContext, op: AclOperation, *, log_denial: bool = True) -> bool:
    """``op`` on the cluster resource."""
    return allowed(ctx, op, ResourceType.CLUSTER, CLUSTER_NAME, log_denial=log_denial)


def denied_names(ctx: RequestContext, op: AclOperation, rtype: ResourceType, names: Iterable[str | None], *,
                 log_denial: bool = True) -> frozenset[str]:
    """The distinct names ``op`` is refused on (Kafka's filterByAuthorized, inverted: each name is
    asked once however many partitions name it).  Empty without an authorizer."""
    if ctx.authorizer is None:
        return frozenset()
    out: set[str] = set()
    seen: set[str] = set()
    for n in names:
        if n is None or n in seen:
            continue
        seen.add(n)
        if not authorize(ctx, op, rtype, n, log_denial=log_denial):
            out.add(n)
    return frozenset(out)


def authorize(ctx: RequestContext, operation: AclOperation, resource_type: ResourceType, name: str,
              *, log_denial: bool = True) -> bool:
    """May the request's principal do ``operation`` on the resource?  Denials are logged as Kafka's
    authorizer logger does (principal, host, operation, resource), at INFO."""
    auth = ctx.authorizer if ctx.authorizer is not None else AUTHORIZER
    session = ctx.session
    ok = auth.authorize(session.principal, session.client_host, operation, resource_type, name)
    if not ok and log_denial:
        log.info("Denied operation", extra=fields(
            principal=str(session.principal), operation=operation.name, host=session.client_host,
            resource_type=resource_type.name.title().replace("_", ""), pattern_type="LITERAL", resource_name=name,
            request=ctx.api_name))
    return ok


def authorized_operations(
    resource_type: ResourceType,
    name: str,
    *,
    ctx: RequestContext | None = None,
) -> int:
    """The authorized-operations field for one resource, as Kafka computes it (no denial logged)."""
    if ctx is None:
        auth, principal, host = AUTHORIZER, ANONYMOUS_PRINCIPAL, ""
    else:
        auth = ctx.authorizer if ctx.authorizer is not None else AUTHORIZER
        principal, host = ctx.session.principal, ctx.session.client_host
    allowed = {op for op in SUPPORTED_OPERATIONS[resource_type]
               if auth.authorize(principal, host, op, resource_type, name)}
    return to_bit_field(allowed)


def maybe_authorized_operations(requested: bool, resource_type: ResourceType, name: str,
                                ctx: RequestContext | None = None) -> int:
    """The field when the client asked for it, else Kafka's 'omitted' marker."""
    if not requested:
        return AUTHORIZED_OPERATIONS_OMITTED
    return authorized_operations(resource_type, name, ctx=ctx)
