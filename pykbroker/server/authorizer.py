"""Which operations a principal may perform on a resource: the seam for a real authorizer.

Kafka answers ``*_authorized_operations`` fields (Metadata, DescribeGroups,
DescribeCluster, DescribeTopicPartitions) with a 32-bit field holding bit
``1 << code`` for each :class:`AclOperation` the principal is allowed on the
resource, out of the operations that apply to its resource type.  When the client
did not ask, the field is ``AUTHORIZED_OPERATIONS_OMITTED`` (``INT32_MIN``).

Without ``authorizer.class.name`` the broker uses :class:`AllowAllAuthorizer` (Kafka then
allows everything); with it, :mod:`pykbroker.security.acl_authorizer` consults ACLs.  Handlers
ask through :func:`authorize` with their request context.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from pykbroker.server.context import RequestContext

log = logging.getLogger("pykbroker.authorizer")


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
