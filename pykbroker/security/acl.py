"""ACL model and matching (sans-I/O): patterns, entries, bindings, filters and CreateAcls validation.

Mirrors Kafka's ``ResourcePattern``/``AccessControlEntry``/``AclBinding`` and their filters: a filter's
``None`` fields match anything, ``ANY`` matches every value, and pattern type ``MATCH`` selects the
literal, wildcard and prefixed patterns that would apply to the filter's resource name.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import IntEnum

from pykbroker.security.authorizer import SUPPORTED_OPERATIONS, AclOperation, ResourceType
from pykbroker.security.principal import KafkaPrincipal

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"

# ResourceType codes 0 (UNKNOWN) and 1 (ANY) only appear in requests and filters.
RESOURCE_UNKNOWN = 0
RESOURCE_ANY = 1


class PatternType(IntEnum):
    """Kafka's PatternType codes."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class PermissionType(IntEnum):
    """Kafka's AclPermissionType codes."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class AclError(ValueError):
    """An ACL (or filter) Kafka would refuse with INVALID_REQUEST; the message is Kafka's reason."""


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    """A concrete pattern an ACL applies to (resource_type is a ResourceType code)."""

    resource_type: int
    name: str
    pattern_type: PatternType

    def matches_name(self, name: str) -> bool:
        """Would this pattern apply to a resource called ``name``?"""
        if self.pattern_type == PatternType.LITERAL:
            return self.name == name or self.name == WILDCARD
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.name)
        return False


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    """Who (``User:alice``/``User:*``), from where (address or ``*``), what operation, ALLOW or DENY."""

    principal: str
    host: str
    operation: AclOperation
    permission: PermissionType


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """A filter as in DescribeAcls/DeleteAcls: ``None`` fields match anything; ANY codes likewise."""

    resource_type: int = RESOURCE_ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: int = AclOperation.ANY
    permission: int = PermissionType.ANY

    def matches_pattern(self, p: ResourcePattern) -> bool:
        if self.resource_type != RESOURCE_ANY and self.resource_type != p.resource_type:
            return False
        if self.pattern_type == PatternType.MATCH:
            if self.name is None:
                return True
            if p.pattern_type == PatternType.LITERAL:
                return p.name == self.name or p.name == WILDCARD
            if p.pattern_type == PatternType.PREFIXED:
                return self.name.startswith(p.name)
            return False
        if self.pattern_type != PatternType.ANY and self.pattern_type != p.pattern_type:
            return False
        return self.name is None or self.name == p.name

    def matches_entry(self, e: AccessControlEntry) -> bool:
        if self.principal is not None and self.principal != e.principal:
            return False
        if self.host is not None and self.host != e.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != e.operation:
            return False
        return self.permission == PermissionType.ANY or self.permission == e.permission

    def matches(self, b: AclBinding) -> bool:
        return self.matches_pattern(b.pattern) and self.matches_entry(b.entry)


def filter_unknown_reason(f: AclBindingFilter) -> str | None:
    """Kafka refuses filters with UNKNOWN elements (INVALID_REQUEST); None if the filter is usable."""
    if f.resource_type == RESOURCE_UNKNOWN or f.resource_type not in _VALID_FILTER_TYPES:
        return "Filter contains UNKNOWN elements"
    if f.pattern_type == PatternType.UNKNOWN or f.operation == AclOperation.UNKNOWN \
            or f.permission == PermissionType.UNKNOWN:
        return "Filter contains UNKNOWN elements"
    if f.operation not in _OP_CODES or f.permission not in _PERM_CODES or f.pattern_type not in _PAT_CODES:
        return "Filter contains UNKNOWN elements"
    return None


_VALID_FILTER_TYPES = {RESOURCE_ANY} | {int(t) for t in ResourceType}
_OP_CODES = {int(o) for o in AclOperation}
_PERM_CODES = {int(p) for p in PermissionType}
_PAT_CODES = {int(p) for p in PatternType}


def validate_binding(resource_type: int, name: str, pattern_type: int, principal: str, host: str,
                     operation: int, permission: int) -> AclBinding:
    """Build the binding a CreateAcls creation asks for, or raise AclError as Kafka would."""
    if resource_type not in {int(t) for t in ResourceType}:
        raise AclError("Invalid resource type")
    if pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise AclError("Invalid pattern type")
    if operation not in _OP_CODES or operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise AclError("Invalid operation")
    if permission not in (PermissionType.ALLOW, PermissionType.DENY):
        raise AclError("Invalid permission type")
    if not name:
        raise AclError("Resource name should not be empty")
    rtype = ResourceType(resource_type)
    if rtype == ResourceType.CLUSTER and not (name == CLUSTER_NAME and pattern_type == PatternType.LITERAL):
        raise AclError("The only valid name for the CLUSTER resource is kafka-cluster")
    if pattern_type == PatternType.PREFIXED and name == WILDCARD:
        raise AclError("Prefixed ACLs cannot use the wildcard resource name")
    try:
        parsed = KafkaPrincipal.parse(principal)
    except ValueError as e:
        raise AclError(f"Invalid principal: {e}") from None
    if not parsed.name:
        raise AclError("Invalid principal: empty name")
    if host != WILDCARD:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise AclError(f"Invalid host {host!r}: must be an IP address or '*'") from None
    op = AclOperation(operation)
    if op != AclOperation.ALL and op not in _supported(rtype):
        raise AclError(f"Operation {op.name} is not supported on resource type {rtype.name}")
    return AclBinding(ResourcePattern(int(rtype), name, PatternType(pattern_type)),
                      AccessControlEntry(principal, host, op, PermissionType(permission)))


def _supported(rtype: ResourceType) -> frozenset[AclOperation]:
    return SUPPORTED_OPERATIONS[rtype]


# ---- JSON (the embedded store and ZooKeeper's /kafka-acl layout) ----------------------------------

_RTYPE_NAMES = {ResourceType.TOPIC: "Topic", ResourceType.GROUP: "Group", ResourceType.CLUSTER: "Cluster",
                ResourceType.TRANSACTIONAL_ID: "TransactionalId", ResourceType.DELEGATION_TOKEN: "DelegationToken",
                ResourceType.USER: "User"}
_RTYPE_BY_NAME = {v: k for k, v in _RTYPE_NAMES.items()}


def resource_type_name(code: int) -> str:
    """Kafka's ZooKeeper directory name for a resource type (``Topic``, ``TransactionalId``...)."""
    return _RTYPE_NAMES[ResourceType(code)]


def resource_type_from_name(name: str) -> int:
    return int(_RTYPE_BY_NAME[name])


def _camel(op: AclOperation) -> str:
    return "".join(part.title() for part in op.name.split("_"))


_OP_BY_CAMEL = {_camel(o): o for o in AclOperation}


def entry_to_json(e: AccessControlEntry) -> dict[str, str]:
    """One entry as Kafka's AclEntry JSON in ZooKeeper (``{"principal","permissionType","operation","host"}``)."""
    return {"principal": e.principal, "permissionType": e.permission.name.title(),
            "operation": _camel(e.operation), "host": e.host}


def entry_from_json(d: dict[str, str]) -> AccessControlEntry:
    return AccessControlEntry(d["principal"], d["host"], _OP_BY_CAMEL[d["operation"]],
                              PermissionType[d["permissionType"].upper()])


def binding_to_json(b: AclBinding) -> dict[str, object]:
    return {"resourceType": resource_type_name(b.pattern.resource_type), "name": b.pattern.name,
            "patternType": b.pattern.pattern_type.name, **entry_to_json(b.entry)}


def binding_from_json(d: dict[str, str]) -> AclBinding:
    pattern = ResourcePattern(resource_type_from_name(d["resourceType"]), d["name"],
                              PatternType[d["patternType"]])
    return AclBinding(pattern, entry_from_json(d))
