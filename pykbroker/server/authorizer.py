"""Which operations a principal may perform on a resource: the seam for a real authorizer.

Kafka answers ``*_authorized_operations`` fields (Metadata, DescribeGroups,
DescribeCluster, DescribeTopicPartitions) with a 32-bit field holding bit
``1 << code`` for each :class:`AclOperation` the principal is allowed on the
resource, out of the operations that apply to its resource type.  When the client
did not ask, the field is ``AUTHORIZED_OPERATIONS_OMITTED`` (``INT32_MIN``).

There is no authentication yet, so there is one allow-all authorizer; the
security work replaces :data:`AUTHORIZER` with one that consults ACLs.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Protocol

__all__ = [
    "ANONYMOUS",
    "AUTHORIZED_OPERATIONS_OMITTED",
    "AUTHORIZER",
    "SUPPORTED_OPERATIONS",
    "AclOperation",
    "AllowAllAuthorizer",
    "Authorizer",
    "ResourceType",
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
    """Decides whether ``principal`` may perform ``operation`` on a resource."""

    def authorize(self, principal: str, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        ...


class AllowAllAuthorizer:
    """No authorizer configured: Kafka then allows everything."""

    def authorize(self, principal: str, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        return True


AUTHORIZER: Authorizer = AllowAllAuthorizer()

ANONYMOUS = "User:ANONYMOUS"  # the principal of a PLAINTEXT connection


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
    principal: str = ANONYMOUS,
    authorizer: Authorizer | None = None,
) -> int:
    """The authorized-operations field for one resource, as Kafka computes it."""
    auth = authorizer if authorizer is not None else AUTHORIZER
    allowed = {op for op in SUPPORTED_OPERATIONS[resource_type] if auth.authorize(principal, op, resource_type, name)}
    return to_bit_field(allowed)


def maybe_authorized_operations(requested: bool, resource_type: ResourceType, name: str) -> int:
    """The field when the client asked for it, else Kafka's 'omitted' marker."""
    if not requested:
        return AUTHORIZED_OPERATIONS_OMITTED
    return authorized_operations(resource_type, name)
