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
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

from pykbroker.logsetup import fields
from pykbroker.security.principal import ANONYMOUS as ANONYMOUS_PRINCIPAL
from pykbroker.security.principal import KafkaPrincipal

if TYPE_CHECKING:
    from pykbroker.server.context import RequestContext

log = logging.getLogger("pykbroker.authorizer")

__all__ = [
    "ANONYMOUS",
    "AUTHORIZED_OPERATIONS_OMITTED",
    "AUTHORIZER",
    "SUPPORTED_OPERATIONS",
    "AclOperation",
    "AllowAllAuthorizer",
    "Authorizer",
    "ResourceType",
    "authorize",
    "authorized_operations",
    "maybe_authorized_operations",
    "to_bit_field",
]

AUTHORIZED_OPERATIONS_OMITTED = -2147483648


class AclOperation(IntEnum):
    """Kafka's AclOperation codes (the bit positions of the authorized-operations field)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class ResourceType(IntEnum):
    """Kafka's ResourceType codes."""

    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


_O = AclOperation
# The operations an ACL can grant on each resource type (Kafka's AclEntry.supportedOperations);
# ALL and ANY are never reported, only the concrete operations.  Groups have the config operations
# as in Kafka 4 (3.9 lacked them), since group configs (DescribeConfigs/AlterConfigs) exist here.
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset({_O.READ, _O.WRITE, _O.CREATE, _O.DESCRIBE, _O.DELETE, _O.ALTER,
                                   _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({_O.READ, _O.DESCRIBE, _O.DELETE, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS}),
    ResourceType.CLUSTER: frozenset({_O.CREATE, _O.CLUSTER_ACTION, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS,
                                     _O.IDEMPOTENT_WRITE, _O.ALTER, _O.DESCRIBE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({_O.DESCRIBE, _O.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({_O.DESCRIBE}),
    ResourceType.USER: frozenset({_O.CREATE_TOKENS, _O.DESCRIBE_TOKENS}),
}


class Authorizer(Protocol):
    """Decides whether ``principal`` connecting from ``host`` may perform ``operation`` on a resource."""

    def authorize(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        ...

    def authorize_by_resource_type(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        """Kafka's authorizeByResourceType: allowed on at least one resource of the type (by some ALLOW
        ACL not overridden by a DENY), e.g. WRITE on any transactional id for the idempotent producer."""
        ...


class AllowAllAuthorizer:
    """No authorizer configured: Kafka then allows everything."""

    def authorize(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        return True

    def authorize_by_resource_type(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        return True


AUTHORIZER: Authorizer = AllowAllAuthorizer()

ANONYMOUS = str(ANONYMOUS_PRINCIPAL)  # the principal of a PLAINTEXT connection


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


def to_bit_field(operations: set[AclOperation] | frozenset[AclOperation]) -> int:
    """Kafka's Utils.to32BitField: bit ``1 << code`` per operation, as a signed int32."""
    field = 0
    for op in operations:
        field |= 1 << int(op)
    return field - (1 << 32) if field >= 1 << 31 else field


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
