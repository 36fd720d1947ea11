"""DescribeClientQuotas and AlterClientQuotas (KIP-546): the quotas clients are throttled by.

Validation and matching follow Kafka's KRaft controller and metadata image, including its
error messages, so admin tools see the answers they expect.  The values are enforced by
``pykbroker.quotas`` (user and client-id entities; ``controller_mutation_rate`` by the topic admin
handlers) and ``pykbroker.server.connection_quotas`` (the ``connection_creation_rate`` of ``ip`` entities).
"""

from __future__ import annotations

import ipaddress
import math
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.metadata.store import QuotaEntity, StoreUnavailable, run_store
from pykbroker.protocol.responses.quotas import (
    AlterClientQuotasResponse,
    DescribeClientQuotasEntryData,
    DescribeClientQuotasResponse,
    EntityData,
)
from pykbroker.security.authorizer import AclOperation
from pykbroker.security.authz import cluster_allowed
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)

MATCH_EXACT = 0
MATCH_DEFAULT = 1
MATCH_SPECIFIED = 2

# Kafka's quota keys and their config types, per entity combination.
_CLIENT_KEYS = {
    "producer_byte_rate": "LONG",
    "consumer_byte_rate": "LONG",
    "request_percentage": "DOUBLE",
    "controller_mutation_rate": "DOUBLE",
}
# A user entity also carries SCRAM credentials in Kafka's config definition; they are strings,
# which Kafka's quota validation answers with UNKNOWN_SERVER_ERROR.
_USER_KEYS = {**_CLIENT_KEYS, "SCRAM-SHA-256": "STRING", "SCRAM-SHA-512": "STRING"}
_IP_KEYS = {"connection_creation_rate": "INT"}


class _Invalid(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# The order Kafka's entity maps iterate in (a Java HashMap of these three keys), used wherever an
# entity is written out, so responses and messages read as Kafka's do.
_JAVA_ORDER = {IP: 0, CLIENT_ID: 1, USER: 2}


def _in_java_order(parts: Any) -> list[tuple[str, str | None]]:
    return sorted(parts, key=lambda p: (_JAVA_ORDER.get(p[0], 3), p[0]))


def _entity_str(entity: dict[str, str | None]) -> str:
    # Kafka's ClientQuotaEntity.toString, which its messages embed.
    inner = ", ".join(f"{k}={v}" for k, v in _in_java_order(entity.items()))
    return "ClientQuotaEntity(entries={" + inner + "})"


def _valid_ip_entity(name: str | None) -> bool:
    """An IP literal or the default; Kafka would also resolve a host name, which we do not (no DNS here)."""
    if name is None:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _config_keys(entity: dict[str, str | None]) -> dict[str, str]:
    for entity_type, name in entity.items():
        if entity_type not in ENTITY_TYPES:
            raise _Invalid(ErrorCode.invalid_request, f"Unhandled client quota entity type: {entity_type}")
        if name is not None and name == "":
            raise _Invalid(ErrorCode.invalid_request, f"Empty {entity_type} not supported")
    has_user, has_client, has_ip = USER in entity, CLIENT_ID in entity, IP in entity
    if has_ip and not has_user and not has_client:
        if not _valid_ip_entity(entity[IP]):
            raise _Invalid(ErrorCode.invalid_request, f"{entity[IP]} is not a valid IP or resolvable host.")
        return _IP_KEYS
    if has_user and not has_ip:
        return _USER_KEYS
    if has_client and not has_ip:
        return _CLIENT_KEYS
    raise _Invalid(ErrorCode.invalid_request, "Invalid empty client quota entity")


def _check_value(keys: dict[str, str], key: str, value: float) -> None:
    kind = keys.get(key)
    if kind is None:
        raise _Invalid(ErrorCode.invalid_request, f"Invalid configuration key {key}")
    if kind == "DOUBLE":
        return
    if kind in ("INT", "LONG"):
        epsilon = 1e-6
        if not math.isfinite(value) or abs(float(math.trunc(value + epsilon)) - value) > epsilon:
            raise _Invalid(ErrorCode.invalid_request, f"Configuration {key} must be a Long value")
        return
    raise _Invalid(ErrorCode.unknown_server_error, f"Unexpected config type {kind} should be Long or Double")


def _key(entity: dict[str, str | None]) -> QuotaEntity:
    return tuple(sorted(entity.items()))


def _entity_data(entity: QuotaEntity) -> list[EntityData]:
    return [{"entity_type": t, "entity_name": n} for t, n in _in_java_order(entity)]


async def handle_alter_client_quotas(svc: Services, ctx: RequestContext, req: Any) -> AlterClientQuotasResponse:
    if not cluster_allowed(ctx, AclOperation.ALTER_CONFIGS):  # every entry refused, entities as sent
        return {"throttle_time": 0, "entries": [
            {"error_code": ErrorCode.cluster_authorization_failed, "error_message": "Cluster authorization failed.",
             "entity": [{"entity_type": p.entity_type, "entity_name": p.entity_name} for p in entry.entity]}
            for entry in req.entries]}
    stored = svc.store.client_quotas()
    results: dict[QuotaEntity, tuple[ErrorCode, str | None]] = {}
    changes: dict[QuotaEntity, dict[str, float | None]] = {}
    order: list[QuotaEntity] = []
    for entry in req.entries:
        # As in Kafka, an entity is a map: a repeated type keeps its last name.
        entity: dict[str, str | None] = {}
        for part in entry.entity:
            entity[part.entity_type] = part.entity_name
        key = _key(entity)
        if key not in results:
            order.append(key)
        ops: dict[str, float | None] = {}
        duplicate_key = None
        for op in entry.ops:
            if op.key in ops and duplicate_key is None:
                duplicate_key = op.key
            ops[op.key] = None if op.remove else float(op.value)
        if key in results or duplicate_key is not None:
            # Kafka reports a repeated key, or an entity that appears twice, as a duplicate entity.
            # The first occurrence's changes still apply, as they do in Kafka.
            results[key] = (ErrorCode.invalid_request, f"Ignoring duplicate entity {_entity_str(entity)}")
            continue
        try:
            if not entity:
                raise _Invalid(ErrorCode.invalid_request, "Invalid empty client quota entity")
            keys = _config_keys(entity)
            current = stored.get(key, {})
            # A ZooKeeper store's map is a cache another broker's write may not have reached yet: every
            # operation goes to the store, which edits what ZooKeeper holds (removing an absent key is a
            # no-op there). Only an always-current store lets no-op changes be skipped.
            fresh = not svc.store.blocking
            change: dict[str, float | None] = {}
            for quota_key, value in ops.items():
                if value is None:
                    if quota_key in current or not fresh:
                        change[quota_key] = None
                else:
                    _check_value(keys, quota_key, value)
                    if current.get(quota_key) != value or not fresh:
                        change[quota_key] = value
        except _Invalid as e:
            results[key] = (e.code, e.message)
            continue
        results[key] = (ErrorCode.none, None)
        if change:
            changes[key] = change
    if changes and not req.validate_only:
        try:
            await run_store(svc.store, svc.store.alter_client_quotas, changes)
        except StoreUnavailable as e:
            for key in changes:
                results[key] = (ErrorCode.request_timed_out, f"The metadata store is not reachable: {e}")
            changes = {}
        if svc.quotas is not None and changes:
            svc.quotas.invalidate()  # stores that change their map in place; the next request sees it
    return {
        "throttle_time": 0,
        "entries": [{"error_code": results[k][0], "error_message": results[k][1], "entity": _entity_data(k)}
                    for k in order],
    }


def _describe(stored: dict[QuotaEntity, dict[str, float]], components: Any, strict: bool
              ) -> list[DescribeClientQuotasEntryData]:
    exact: dict[str, str | None] = {}
    typed: set[str] = set()
    for c in components:
        t = c.entity_type
        if not t:
            raise _Invalid(ErrorCode.invalid_request, "Invalid empty entity type.")
        if t in exact or t in typed:
            raise _Invalid(ErrorCode.invalid_request, f"Entity type {t} cannot appear more than once in the filter.")
        if t not in ENTITY_TYPES:
            raise _Invalid(ErrorCode.unsupported_version, f"Unsupported entity type {t}")
        match_type = int(c.match_type)
        if match_type == MATCH_EXACT:
            if c.match is None:
                raise _Invalid(ErrorCode.invalid_request,
                               "Request specified MATCH_TYPE_EXACT, but set match string to null.")
            exact[t] = c.match
        elif match_type == MATCH_DEFAULT:
            if c.match is not None:
                raise _Invalid(ErrorCode.invalid_request,
                               "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.")
            exact[t] = None
        elif match_type == MATCH_SPECIFIED:
            if c.match is not None:
                raise _Invalid(ErrorCode.invalid_request,
                               "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.")
            typed.add(t)
        else:
            raise _Invalid(ErrorCode.invalid_request, f"Unknown match type {match_type}")
    if (IP in exact or IP in typed) and ({USER, CLIENT_ID} & (set(exact) | typed)):
        raise _Invalid(ErrorCode.invalid_request, "Invalid entity filter component combination. IP filter "
                       "component should not be used with user or clientId filter component.")
    out: list[DescribeClientQuotasEntryData] = []
    for entity, values in stored.items():
        parts = dict(entity)
        if strict and len(parts) != len(exact) + len(typed):
            continue
        if not exact and not typed and strict:
            continue
        if any(t not in parts or parts[t] != name for t, name in exact.items()):
            continue
        if any(t not in parts for t in typed):
            continue
        out.append({"entity": _entity_data(entity),
                    "values": [{"key": k, "value": v} for k, v in sorted(values.items())]})
    return out


async def handle_describe_client_quotas(svc: Services, ctx: RequestContext, req: Any
                                        ) -> DescribeClientQuotasResponse:
    if not cluster_allowed(ctx, AclOperation.DESCRIBE_CONFIGS):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                "error_message": "Cluster authorization failed.", "entries": None}
    try:
        entries = _describe(svc.store.client_quotas(), req.components, bool(req.strict))
    except _Invalid as e:
        return {"throttle_time": 0, "error_code": e.code, "error_message": e.message, "entries": None}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "entries": entries}
