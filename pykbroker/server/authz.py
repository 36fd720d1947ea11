"""Request-level authorization helpers shared by the API handlers (Kafka's AuthHelper).

Every handler asks through these so that a broker without an authorizer (``ctx.authorizer is None``)
pays one attribute test per request and nothing per partition or record.
"""

from __future__ import annotations

from collections.abc import Iterable

from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.server.authorizer import authorize
from pykbroker.server.context import RequestContext

__all__ = ["CLUSTER_NAME", "allowed", "cluster_allowed", "denied_names", "enforced"]

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
