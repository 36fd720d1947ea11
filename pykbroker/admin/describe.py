"""DescribeAcls and DescribeUserScramCredentials over pykbroker's own wire client, for the CLI and the console.

librdkafka 2.16 mishandles both refusals: it answers a refused DescribeAcls with an empty list (which reads as
"no ACLs") and crashes its process ("free(): invalid size") on a refused DescribeUserScramCredentials, which
inside the broker (the console) would end the broker. Over the wire the refusal is Kafka's error code."""

from __future__ import annotations

from typing import Any

from .connection import check
from .errors import AdminError, error_name
from .wire import Wire

DESCRIBE_ACLS, DESCRIBE_USER_SCRAM_CREDENTIALS = 29, 50
# Kafka's codes, by the names the CLI uses.
RESOURCE_CODES = {"any": 1, "topic": 2, "group": 3, "cluster": 4, "transactional-id": 5, "delegation-token": 6,
                  "user": 7}
PATTERN_CODES = {"any": 1, "match": 2, "literal": 3, "prefixed": 4}
OPERATION_CODES = {"any": 1, "all": 2, "read": 3, "write": 4, "create": 5, "delete": 6, "alter": 7, "describe": 8,
                   "cluster-action": 9, "describe-configs": 10, "alter-configs": 11, "idempotent-write": 12,
                   "create-tokens": 13, "describe-tokens": 14}
PERMISSION_CODES = {"any": 1, "deny": 2, "allow": 3}
MECHANISM_NAMES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}


def _names(codes: dict[str, int]) -> dict[int, str]:
    return {code: name for name, code in codes.items()}


def describe_acls(wire: Wire, resource_type: str = "any", name: str | None = None, pattern: str = "any",
                  principal: str | None = None, host: str | None = None, operation: str = "any",
                  permission: str = "any") -> list[dict[str, Any]]:
    """The ACL bindings matching the filter (None and "any" match anything), one document per binding."""
    body = {"resource_type_filter": RESOURCE_CODES[resource_type], "resource_name_filter": name,
            "pattern_type_filter": PATTERN_CODES[pattern], "principal_filter": principal, "host_filter": host,
            "operation": OPERATION_CODES[operation], "permission_type": PERMISSION_CODES[permission]}
    _, response = wire.any().request(DESCRIBE_ACLS, body, minimum=1)
    check(response.error_code, "describe ACLs", response.error_message)
    kinds, patterns = _names(RESOURCE_CODES), _names(PATTERN_CODES)
    operations, permissions = _names(OPERATION_CODES), _names(PERMISSION_CODES)
    return [{"principal": acl.principal, "host": acl.host, "operation": operations.get(int(acl.operation), "unknown"),
             "permission": permissions.get(int(acl.permission_type), "unknown"),
             "resource_type": kinds.get(int(r.resource_type), "unknown"), "resource_name": r.resource_name,
             "pattern": patterns.get(int(r.pattern_type), "unknown")}
            for r in response.resources for acl in r.acls]


def describe_scram_users(wire: Wire, names: list[str] | None) -> dict[str, list[dict[str, Any]] | AdminError]:
    """Each user's SCRAM credentials (mechanism and iterations), or the AdminError of a user the cluster refused
    (RESOURCE_NOT_FOUND, ...); ``names`` None: every user."""
    body = {"users": None if names is None else [{"name": n} for n in names]}
    _, response = wire.any().request(DESCRIBE_USER_SCRAM_CREDENTIALS, body)
    check(response.error_code, "describe users", response.error_message)
    out: dict[str, list[dict[str, Any]] | AdminError] = {}
    for r in response.results:
        if int(r.error_code) != 0:
            code = error_name(int(r.error_code))
            detail = f": {r.error_message}" if r.error_message else ""
            out[r.user] = AdminError(f"describe user {r.user}: {code}{detail}", error=code)
        else:
            out[r.user] = [{"mechanism": MECHANISM_NAMES.get(int(c.mechanism), f"UNKNOWN-{c.mechanism}"),
                            "iterations": int(c.iterations)} for c in r.credential_infos]
    return out
