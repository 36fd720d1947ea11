"""Kafka's StandardAuthorizer decision semantics over an in-memory ACL index.

Decisions run per request and per partition on the produce path, so ACLs are indexed by
(resource type, literal name) and, for prefixed ACLs, by resource type and prefix with the set of
prefix lengths in use: a decision costs a handful of dict lookups.  The index is rebuilt from the
metadata store's snapshot whenever ACLs change (:meth:`AclAuthorizer.load`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from pykbroker.security.acl import (
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AccessControlEntry,
    AclBinding,
    PatternType,
    PermissionType,
)
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.principal import KafkaPrincipal

# Kafka's class names accepted for authorizer.class.name (ZooKeeper-era and KRaft-era: same semantics here).
AUTHORIZER_CLASS_NAMES = frozenset({
    "kafka.security.authorizer.AclAuthorizer",
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
})

_O = AclOperation
# An ALLOW of the key also allows these operations (Kafka's implied operations).
_IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    _O.DESCRIBE: frozenset({_O.DESCRIBE, _O.READ, _O.WRITE, _O.DELETE, _O.ALTER, _O.ALL}),
    _O.DESCRIBE_CONFIGS: frozenset({_O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS, _O.ALL}),
}


def parse_super_users(value: str) -> frozenset[str]:
    """``super.users``: semicolon-separated principals (``User:admin;User:broker``)."""
    out = set()
    for raw in value.split(";"):
        text = raw.strip()
        if text:
            out.add(str(KafkaPrincipal.parse(text)))
    return frozenset(out)


class _Index:
    """An immutable snapshot of the ACLs, indexed for decisions (swapped whole on change)."""

    def __init__(self, bindings: Iterable[AclBinding]) -> None:
        self.literal: dict[tuple[int, str], list[AccessControlEntry]] = {}
        self.prefixed: dict[tuple[int, str], list[AccessControlEntry]] = {}
        self.prefix_lengths: dict[int, list[int]] = {}
        self.by_type: dict[int, list[AclBinding]] = {}
        lengths: dict[int, set[int]] = {}
        for b in bindings:
            key = (b.pattern.resource_type, b.pattern.name)
            if b.pattern.pattern_type == PatternType.PREFIXED:
                self.prefixed.setdefault(key, []).append(b.entry)
                lengths.setdefault(b.pattern.resource_type, set()).add(len(b.pattern.name))
            else:
                self.literal.setdefault(key, []).append(b.entry)
            self.by_type.setdefault(b.pattern.resource_type, []).append(b)
        self.prefix_lengths = {t: sorted(ls) for t, ls in lengths.items()}

    def matching(self, rtype: int, name: str) -> list[list[AccessControlEntry]]:
        """The entry lists of every pattern that applies to the resource (literal, wildcard, prefixes)."""
        found = []
        lit = self.literal.get((rtype, name))
        if lit:
            found.append(lit)
        if name != WILDCARD:
            wild = self.literal.get((rtype, WILDCARD))
            if wild:
                found.append(wild)
        for n in self.prefix_lengths.get(rtype, ()):
            if n > len(name):
                break
            pre = self.prefixed.get((rtype, name[:n]))
            if pre:
                found.append(pre)
        return found


class AclAuthorizer:
    """The ``Authorizer`` of pykbroker.security.authorizer backed by ACLs (StandardAuthorizer semantics)."""

    def __init__(self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._index = _Index(())
        self._lock = threading.Lock()

    def load(self, bindings: Iterable[AclBinding]) -> None:
        """Replace the ACLs (the metadata store's listener calls this with its full snapshot)."""
        index = _Index(bindings)
        with self._lock:
            self._index = index

    def authorize(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        who = str(principal)
        if who in self.super_users:
            return True
        lists = self._index.matching(int(resource_type), name)
        if not lists:
            return self.allow_everyone_if_no_acl_found
        allow_ops = _IMPLIED_BY.get(operation, frozenset({operation, _O.ALL}))
        allowed = False
        for entries in lists:
            for e in entries:
                if e.principal != who and e.principal != WILDCARD_PRINCIPAL:
                    continue
                if e.host != host and e.host != WILDCARD:
                    continue
                if e.permission == PermissionType.DENY:
                    if e.operation == operation or e.operation == _O.ALL:
                        return False
                elif e.operation in allow_ops:
                    allowed = True
        return allowed

    def authorize_by_resource_type(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        """Kafka's Authorizer.authorizeByResourceType default: allowed on some resource of the type."""
        # A hard-coded name: super users and allow.everyone.if.no.acl.found win regardless of DENY ACLs.
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True
        who = str(principal)
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow_literal: set[str] = set()
        allow_prefixed: set[str] = set()
        for b in self._index.by_type.get(int(resource_type), ()):
            e = b.entry
            if e.host != host and e.host != WILDCARD:
                continue
            if e.principal != who and e.principal != WILDCARD_PRINCIPAL:
                continue
            if e.operation != operation and e.operation != _O.ALL:
                continue
            prefixed = b.pattern.pattern_type == PatternType.PREFIXED
            if e.permission == PermissionType.DENY:
                if not prefixed and b.pattern.name == WILDCARD:
                    return False
                (deny_prefixed if prefixed else deny_literal).add(b.pattern.name)
            elif e.permission == PermissionType.ALLOW:
                if not prefixed and b.pattern.name == WILDCARD:
                    return True
                (allow_prefixed if prefixed else allow_literal).add(b.pattern.name)
        for literal, names in ((True, allow_literal), (False, allow_prefixed)):
            for n in names:
                if literal and n in deny_literal:
                    continue
                if not any(n[:i] in deny_prefixed for i in range(1, len(n) + 1)):
                    return True
        return False
