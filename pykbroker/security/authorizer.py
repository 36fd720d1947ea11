"""Kafka's authorization vocabulary: ACL operations, resource types, the operations each type supports,
and the Authorizer seam a real authorizer fills (:mod:`pykbroker.security.acl_authorizer`).  Value types
live here, with security, so that the ACL store and the request handlers both build on them."""

from __future__ import annotations

from enum import IntEnum
from typing import Protocol

from pykbroker.security.principal import ANONYMOUS as ANONYMOUS_PRINCIPAL
from pykbroker.security.principal import KafkaPrincipal

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


def to_bit_field(operations: set[AclOperation] | frozenset[AclOperation]) -> int:
    """Kafka's Utils.to32BitField: bit ``1 << code`` per operation, as a signed int32."""
    field = 0
    for op in operations:
        field |= 1 << int(op)
    return field - (1 << 32) if field >= 1 << 31 else field
