"""Config APIs: DescribeConfigs, AlterConfigs and IncrementalAlterConfigs (KIP-133, KIP-226, KIP-339).

Resources are Kafka's ConfigResource types: TOPIC, BROKER (per broker ``"0"`` and the cluster
default ``""``), GROUP (KIP-848 group configs) and CLIENT_METRICS (KIP-714 subscriptions). Changes
are validated as Kafka 3.9's broker and controller validate them, written to the metadata store,
and applied from its change notifications (``TopicManager``). The describe side reproduces Kafka's
config sources and synonym lists; the functions that compute them take a ``BrokerConfig`` and
plain dicts, so they are tested without a broker.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.config import (
    BROKER_CONFIG_DEFS,
    CLIENT_METRICS_CONFIG_DEFS,
    GROUP_CONFIG_DEFS,
    GROUP_CONFIG_SYNONYMS,
    OP_DELETE,
    TOPIC_CONFIG_DEFS,
    TOPIC_CONFIG_SYNONYMS,
    BrokerConfig,
    ConfigDef,
    ConfigError,
    ConfigRequestError,
    apply_incremental_ops,
    broker_config_synonyms,
    effective_group_config,
    effective_topic_config,
    topic_config_default,
    validate_client_metrics_configs,
    validate_dynamic_broker_configs,
    validate_group_configs,
    validate_topic_configs,
)
from pykbroker.metadata.store import StoreUnavailable, UnknownTopic, run_store, topic_name_problem
from pykbroker.protocol.responses.configs import (
    AlterConfigsResourceResponse,
    AlterConfigsResponse,
    DescribeConfigsResourceResult,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribeConfigsSynonym,
    IncrementalAlterConfigsResponse,
)
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.authz import CLUSTER_NAME, allowed
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services

log = logging.getLogger("pykbroker.admin")

# Kafka's ConfigResource.Type ids.
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_BROKER_LOGGER = 8
RESOURCE_CLIENT_METRICS = 16
RESOURCE_GROUP = 32
# Kafka's DescribeConfigsResponse.ConfigSource ids.
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
SOURCE_DYNAMIC_BROKER_LOGGER = 6
SOURCE_CLIENT_METRICS = 7
SOURCE_GROUP = 8
CONFIG_TYPES = {"bool": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7, "password": 9}


class ResourceError(Exception):
    """A per-resource error of a config request."""

    def __init__(self, code: ErrorCode, message: str | None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --- describe: sources and synonyms, as Kafka's ConfigHelper computes them ---------------------------

def config_synonyms(cfg: BrokerConfig, name: str, names: list[str]) -> list[DescribeConfigsSynonym]:
    """The broker-level synonyms of ``name``: every one of ``names`` set dynamically for this broker,
    as the dynamic cluster default, statically, or with a non-null default, in that order, starting
    from the first entry for ``name`` itself (nothing when ``name`` is set nowhere)."""
    layers: list[tuple[Mapping[str, str | None], int]] = [
        (cfg.dynamic_broker_configs, SOURCE_DYNAMIC_BROKER),
        (cfg.dynamic_default_configs, SOURCE_DYNAMIC_DEFAULT_BROKER),
        (cfg.static_configs, SOURCE_STATIC_BROKER),
        ({n: BrokerConfig.default_string(n) for n in names if n in BROKER_CONFIG_DEFS}, SOURCE_DEFAULT),
    ]
    out: list[DescribeConfigsSynonym] = []
    for layer, source in layers:
        for n in names:
            value = layer.get(n)
            if value is not None:
                out.append({"name": n, "value": value, "source": source})
    while out and out[0]["name"] != name:
        out.pop(0)
    return out


def _entry(name: str, value: str | None, d: ConfigDef | None, source: int, *, read_only: bool,
           synonyms: list[DescribeConfigsSynonym], documentation: bool) -> DescribeConfigsResourceResult:
    sensitive = d is not None and d.type == "password"
    return {
        "name": name,
        "value": None if sensitive else value,
        "read_only": read_only,
        "config_source": source,
        "is_default": source == SOURCE_DEFAULT,
        "is_sensitive": sensitive,
        "synonyms": synonyms,
        "config_type": CONFIG_TYPES.get(d.type, 0) if d is not None else 0,
        "documentation": ((d.doc or None) if d is not None else None) if documentation else None,
    }


def _wanted(keys: list[str] | None) -> Callable[[str], bool]:
    if not keys:  # null or empty: every config
        return lambda _name: True
    chosen = set(keys)
    return lambda name: name in chosen


def describe_topic_configs(cfg: BrokerConfig, overrides: Mapping[str, str], keys: list[str] | None = None,
                           synonyms: bool = False, documentation: bool = False) -> list[DescribeConfigsResourceResult]:
    """A topic's configs: the override (DYNAMIC_TOPIC_CONFIG), else the broker synonyms' source."""
    effective = effective_topic_config(cfg, overrides)
    wanted = _wanted(keys)
    out: list[DescribeConfigsResourceResult] = []
    for key, d in sorted(TOPIC_CONFIG_DEFS.items()):
        if not wanted(key):
            continue
        value = d.render(effective[key])
        broker_key = TOPIC_CONFIG_SYNONYMS[key]
        syn = config_synonyms(cfg, broker_key, broker_config_synonyms(broker_key))
        if key in overrides:
            syn.insert(0, {"name": key, "value": value, "source": SOURCE_DYNAMIC_TOPIC})
        source = syn[0]["source"] if syn else SOURCE_DEFAULT
        out.append(_entry(key, value, d, source, read_only=False, synonyms=syn if synonyms else [],
                          documentation=documentation))
    return out


def describe_broker_configs(cfg: BrokerConfig, per_broker: bool, keys: list[str] | None = None,
                            synonyms: bool = False, documentation: bool = False) -> list[DescribeConfigsResourceResult]:
    """Every broker config for ``"<id>"``; for the cluster default ``""`` only those set there."""
    wanted = _wanted(keys)
    out: list[DescribeConfigsResourceResult] = []
    names = sorted(BROKER_CONFIG_DEFS) if per_broker else sorted(cfg.dynamic_default_configs)
    for key in names:
        if not wanted(key):
            continue
        d = BROKER_CONFIG_DEFS[key]
        value = d.render(cfg[key]) if per_broker else cfg.dynamic_default_configs[key]
        syn = config_synonyms(cfg, key, broker_config_synonyms(key))
        if not per_broker:
            syn = [s for s in syn if s["source"] == SOURCE_DYNAMIC_DEFAULT_BROKER]
        source = syn[0]["source"] if syn else SOURCE_DEFAULT
        out.append(_entry(key, value, d, source, read_only=not d.dynamic, synonyms=syn if synonyms else [],
                          documentation=documentation))
    return out


def describe_group_configs(cfg: BrokerConfig, overrides: Mapping[str, str], keys: list[str] | None = None,
                           synonyms: bool = False, documentation: bool = False) -> list[DescribeConfigsResourceResult]:
    """A group's configs (Kafka 4): the group's own value (GROUP_CONFIG) or the broker's default."""
    effective = effective_group_config(cfg, overrides)
    wanted = _wanted(keys)
    out: list[DescribeConfigsResourceResult] = []
    for key, d in sorted(GROUP_CONFIG_DEFS.items()):
        if not wanted(key):
            continue
        value = str(effective[key])
        source = SOURCE_GROUP if key in overrides else SOURCE_DEFAULT
        syn: list[DescribeConfigsSynonym] = [{"name": key, "value": value, "source": source}]
        out.append(_entry(key, value, d, source, read_only=False, synonyms=syn if synonyms else [],
                          documentation=documentation))
    return out


def describe_client_metrics(configs: Mapping[str, str], keys: list[str] | None = None
                           ) -> list[DescribeConfigsResourceResult]:
    """A subscription's configs: only those set, CLIENT_METRICS_CONFIG, no type (as Kafka)."""
    wanted = _wanted(keys)
    return [_entry(k, v, None, SOURCE_CLIENT_METRICS, read_only=False, synonyms=[], documentation=False)
            for k, v in configs.items() if wanted(k)]


def _broker_name(svc: Services, name: str, *, describe: bool) -> None:
    try:
        broker_id = int(name)
    except ValueError:
        what = "Broker" if describe else "Node"
        raise ResourceError(ErrorCode.invalid_request, f"{what} id must be an integer, but it is: {name}") from None
    if broker_id != svc.broker_id:
        expected = f"{svc.broker_id} or empty string," if describe else f"{svc.broker_id},"
        raise ResourceError(ErrorCode.invalid_request,
                            f"Unexpected broker id, expected {expected} but received {name}")


def _describe_one(svc: Services, rtype: int, name: str, keys: list[str] | None, synonyms: bool,
                  documentation: bool) -> list[DescribeConfigsResourceResult]:
    cfg = svc.config
    if rtype == RESOURCE_TOPIC:
        problem = topic_name_problem(name)
        if problem:
            raise ResourceError(ErrorCode.invalid_topic_exception, problem)
        rec = svc.store.topic(name)
        if rec is None:
            raise ResourceError(ErrorCode.unknown_topic_or_partition, None)
        return describe_topic_configs(cfg, rec.configs, keys, synonyms, documentation)
    if rtype == RESOURCE_BROKER:
        if name:
            _broker_name(svc, name, describe=True)
        return describe_broker_configs(cfg, bool(name), keys, synonyms, documentation)
    if rtype == RESOURCE_BROKER_LOGGER:
        if not name:
            raise ResourceError(ErrorCode.invalid_request, "Broker id must not be empty")
        _broker_name(svc, name, describe=True)
        return []
    if rtype == RESOURCE_CLIENT_METRICS:
        if not name:
            raise ResourceError(ErrorCode.invalid_request, "Client metrics subscription name must not be empty")
        return describe_client_metrics(svc.store.configs_of(RESOURCE_CLIENT_METRICS, name), keys)
    if rtype == RESOURCE_GROUP:
        if not name:
            raise ResourceError(ErrorCode.invalid_request, "Group name must not be empty")
        return describe_group_configs(cfg, svc.store.configs_of(RESOURCE_GROUP, name), keys, synonyms,
                                      documentation)
    raise ResourceError(ErrorCode.invalid_request, f"Unsupported resource type: {_type_name(rtype)}")


async def _describe_topic_from_zookeeper(svc: Services, name: str, keys: list[str] | None, synonyms: bool,
                                         documentation: bool) -> list[DescribeConfigsResourceResult]:
    """A topic's configs as ZooKeeper has them now, as ZooKeeper-mode Kafka answers DescribeConfigs: another
    broker may have just created the topic or changed its overrides, and this broker's cache may not show it
    yet (a client sends its next DescribeConfigs to any broker)."""
    overrides = await _read_uncached_topic(svc, name, None, fresh=True)
    return describe_topic_configs(svc.config, overrides, keys, synonyms, documentation)


async def _read_uncached_topic(svc: Services, name: str, message: str | None, *,
                              fresh: bool = False) -> dict[str, str]:
    try:
        overrides = await run_store(svc.store, functools.partial(svc.store.read_topic_configs, fresh=fresh), name)
    except StoreUnavailable as e:
        raise ResourceError(ErrorCode.unknown_server_error, str(e)) from None
    if overrides is None:
        raise ResourceError(ErrorCode.unknown_topic_or_partition, message)
    return overrides


def _type_name(rtype: int) -> str:
    return {0: "UNKNOWN", 2: "TOPIC", 4: "BROKER", 8: "BROKER_LOGGER", 16: "CLIENT_METRICS",
            32: "GROUP"}.get(rtype, "UNKNOWN")


# Which ACL resource guards each config resource type, and the code a refusal answers (as Kafka's ConfigHelper).
_CONFIG_ACL: dict[int, tuple[ResourceType, ErrorCode, str]] = {
    RESOURCE_TOPIC: (ResourceType.TOPIC, ErrorCode.topic_authorization_failed, "Topic authorization failed."),
    RESOURCE_GROUP: (ResourceType.GROUP, ErrorCode.group_authorization_failed, "Group authorization failed."),
}
_CLUSTER_REFUSAL = (ResourceType.CLUSTER, ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")


def config_refusal(ctx: RequestContext, op: AclOperation, rtype: int, name: str, *,
                   with_message: bool) -> ResourceError | None:
    """DESCRIBE_CONFIGS/ALTER_CONFIGS on the topic or group, on the cluster for broker, broker-logger and
    client-metrics resources; None when allowed (always without an authorizer)."""
    if ctx.authorizer is None:
        return None
    acl_type, code, message = _CONFIG_ACL.get(rtype, _CLUSTER_REFUSAL)
    if acl_type == ResourceType.CLUSTER:
        name = CLUSTER_NAME
    if allowed(ctx, op, acl_type, name):
        return None
    return ResourceError(code, message if with_message else None)


async def handle_describe_configs(svc: Services, ctx: RequestContext, req: Any) -> DescribeConfigsResponse:
    synonyms = bool(getattr(req, "include_synonyms", False))
    documentation = bool(getattr(req, "include_documentation", False))
    results: list[DescribeConfigsResult] = []
    for r in req.resources:
        rtype = int(r.resource_type)
        result: DescribeConfigsResult = {"error_code": ErrorCode.none, "error_message": None, "resource_type": rtype,
                                         "resource_name": r.resource_name, "configs": []}
        results.append(result)
        keys = None if r.configuration_keys is None else list(r.configuration_keys)
        refusal = config_refusal(ctx, AclOperation.DESCRIBE_CONFIGS, rtype, r.resource_name, with_message=True) \
            if rtype in (RESOURCE_TOPIC, RESOURCE_GROUP, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER,
                         RESOURCE_CLIENT_METRICS) else None
        if refusal is not None:
            result["error_code"] = refusal.code
            result["error_message"] = refusal.message
            continue
        try:
            if rtype == RESOURCE_TOPIC and svc.store.blocking and topic_name_problem(r.resource_name) is None:
                result["configs"] = await _describe_topic_from_zookeeper(svc, r.resource_name, keys, synonyms,
                                                                         documentation)
            else:
                result["configs"] = _describe_one(svc, rtype, r.resource_name, keys, synonyms, documentation)
        except ResourceError as e:
            result["error_code"] = e.code
            result["error_message"] = e.message
    return {"throttle_time": 0, "results": results}


# --- alter: validation and persistence --------------------------------------------------------------

def _definition(rtype: int) -> Callable[[str], ConfigDef | None]:
    table: Mapping[str, ConfigDef] = {
        RESOURCE_TOPIC: TOPIC_CONFIG_DEFS, RESOURCE_BROKER: BROKER_CONFIG_DEFS,
        RESOURCE_CLIENT_METRICS: CLIENT_METRICS_CONFIG_DEFS, RESOURCE_GROUP: GROUP_CONFIG_DEFS,
    }.get(rtype, {})
    return table.get


def _default(rtype: int) -> Callable[[str], str | None]:
    def default(name: str) -> str | None:
        if rtype == RESOURCE_TOPIC:
            return topic_config_default(name) if name in TOPIC_CONFIG_SYNONYMS else None
        if rtype == RESOURCE_BROKER:
            return BrokerConfig.default_string(name) if name in BROKER_CONFIG_DEFS else None
        if rtype == RESOURCE_GROUP and name in GROUP_CONFIG_SYNONYMS:
            return BrokerConfig.default_string(GROUP_CONFIG_SYNONYMS[name])
        d = CLIENT_METRICS_CONFIG_DEFS.get(name) if rtype == RESOURCE_CLIENT_METRICS else None
        return d.render(d.default) if d is not None else None
    return default


def _current(svc: Services, rtype: int, name: str, fresh: dict[str, str] | None = None) -> dict[str, str]:
    if fresh is not None:
        return dict(fresh)
    if rtype == RESOURCE_TOPIC:
        rec = svc.store.topic(name)
        return dict(rec.configs) if rec is not None else {}
    return svc.store.configs_of(rtype, name)


def _check_resource(svc: Services, rtype: int, name: str) -> None:
    """The resource itself, before its configs (Kafka's preprocessing and controller validation)."""
    if rtype == RESOURCE_BROKER:
        if name:
            _broker_name(svc, name, describe=False)
    elif rtype == RESOURCE_TOPIC:
        if not name:
            raise ResourceError(ErrorCode.invalid_request, "Default topic resources are not allowed.")
        problem = topic_name_problem(name)
        if problem:
            raise ResourceError(ErrorCode.invalid_topic_exception, problem)
    elif rtype == RESOURCE_GROUP:
        if not name:
            raise ResourceError(ErrorCode.invalid_request, "Default group resources are not allowed.")
    elif rtype == RESOURCE_BROKER_LOGGER:
        raise ResourceError(ErrorCode.invalid_request,
                            "BROKER_LOGGER resources are not supported yet: pykbroker's log levels are set at "
                            "start (see README 'Settings not implemented')")
    elif rtype != RESOURCE_CLIENT_METRICS:  # a subscription's name is checked with its configs, as in Kafka
        raise ResourceError(ErrorCode.invalid_request, f"Unknown resource type {rtype}")


def validate_resource_configs(svc: Services, rtype: int, name: str, configs: dict[str, str], *,
                              known: bool = False) -> dict[str, str]:
    """Validate a resource's complete new configs; returns them normalised, raises ResourceError.
    `known`: the caller has already seen the resource in the store itself."""
    try:
        if rtype == RESOURCE_BROKER:
            return validate_dynamic_broker_configs(svc.config, configs, per_broker=bool(name))
        if rtype == RESOURCE_TOPIC:
            normalised = validate_topic_configs(configs, svc.config)
            if not known and svc.store.topic(name) is None:
                raise ResourceError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
            return normalised
        if rtype == RESOURCE_GROUP:
            return validate_group_configs(svc.config, configs)
        if rtype == RESOURCE_CLIENT_METRICS:
            return validate_client_metrics_configs(name, configs)
    except ConfigRequestError as e:
        raise ResourceError(ErrorCode.invalid_request, str(e)) from None
    except ConfigError as e:
        raise ResourceError(ErrorCode.invalid_config, str(e)) from None
    raise ResourceError(ErrorCode.invalid_request, f"Unknown resource type {rtype}")


async def store_resource_configs(svc: Services, rtype: int, name: str, configs: dict[str, str]) -> None:
    """Write through the store, off the event loop when it blocks (ZooKeeper)."""
    try:
        if rtype == RESOURCE_TOPIC:
            await run_store(svc.store, svc.store.set_topic_configs, name, configs)
        else:
            await run_store(svc.store, svc.store.set_entity_configs, rtype, name, configs)
    except UnknownTopic:
        raise ResourceError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.") from None
    except StoreUnavailable as e:
        raise ResourceError(ErrorCode.request_timed_out, f"The metadata store is not reachable: {e}") from None
    log.info("altered configs of %(resource_type)s %(name)r: %(configs)s",
             {"resource_type": _type_name(rtype), "name": name, "configs": configs})


def _preflight(resources: list[Any], incremental: bool) -> dict[int, ResourceError]:
    """Kafka's request-level checks per resource: duplicates, duplicate keys, null values."""
    errors: dict[int, ResourceError] = {}
    seen = Counter((int(r.resource_type), r.resource_name) for r in resources)
    for i, r in enumerate(resources):
        if seen[(int(r.resource_type), r.resource_name)] > 1:
            errors[i] = ResourceError(ErrorCode.invalid_request, "Each resource must appear at most once.")
            continue
        names = [c.name for c in r.configs]
        if len(set(names)) != len(names):
            errors[i] = ResourceError(ErrorCode.invalid_request, "Error due to duplicate config keys")
            continue
        nulls = [c.name for c in r.configs if c.value is None
                 and not (incremental and int(c.config_operation) == OP_DELETE)]
        if nulls:
            errors[i] = ResourceError(ErrorCode.invalid_request,
                                      "Null value not supported for : " + ", ".join(nulls))
    return errors


async def _alter(svc: Services, ctx: RequestContext, req: Any, incremental: bool) -> AlterConfigsResponse:
    resources = list(req.resources)
    errors = _preflight(resources, incremental)
    responses: list[AlterConfigsResourceResponse] = []
    for i, r in enumerate(resources):
        rtype, name = int(r.resource_type), r.resource_name
        response: AlterConfigsResourceResponse = {"error_code": ErrorCode.none, "error_message": None,
                                                  "resource_type": rtype, "resource_name": name}
        responses.append(response)
        try:
            if i in errors:
                raise errors[i]
            if rtype in (RESOURCE_TOPIC, RESOURCE_GROUP, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER,
                         RESOURCE_CLIENT_METRICS):
                refusal = config_refusal(ctx, AclOperation.ALTER_CONFIGS, rtype, name, with_message=False)
                if refusal is not None:
                    raise refusal
            _check_resource(svc, rtype, name)
            fresh = None
            if rtype == RESOURCE_TOPIC and svc.store.blocking and (incremental or svc.store.topic(name) is None):
                # Incremental ops build on what the store holds now, not on this broker's cache, which may
                # not have seen another broker's change yet (it would be silently undone).
                fresh = await _read_uncached_topic(svc, name, f"The topic '{name}' does not exist.",
                                                   fresh=incremental)
            elif incremental and svc.store.blocking and rtype in (RESOURCE_BROKER, RESOURCE_GROUP,
                                                                  RESOURCE_CLIENT_METRICS):
                try:
                    fresh = await run_store(svc.store, svc.store.read_entity_configs, rtype, name)
                except StoreUnavailable as e:
                    raise ResourceError(ErrorCode.request_timed_out,
                                        f"The metadata store is not reachable: {e}") from None
            if incremental:
                try:
                    new = apply_incremental_ops(
                        _current(svc, rtype, name, fresh),
                        [(c.name, int(c.config_operation), c.value) for c in r.configs],
                        _definition(rtype), _default(rtype))
                except ConfigRequestError as e:
                    raise ResourceError(ErrorCode.invalid_request, str(e)) from None
                except ConfigError as e:
                    raise ResourceError(ErrorCode.invalid_config, str(e)) from None
            else:
                new = {c.name: c.value for c in r.configs}
            normalised = validate_resource_configs(svc, rtype, name, new, known=fresh is not None)
            if not req.validate_only:
                await store_resource_configs(svc, rtype, name, normalised)
        except ResourceError as e:
            response["error_code"] = e.code
            response["error_message"] = e.message
    return {"throttle_time": 0, "responses": responses}


async def handle_alter_configs(svc: Services, ctx: RequestContext, req: Any) -> AlterConfigsResponse:
    """Legacy AlterConfigs: each resource's configs are replaced by exactly those given."""
    return await _alter(svc, ctx, req, incremental=False)


async def handle_incremental_alter_configs(svc: Services, ctx: RequestContext, req: Any
                                           ) -> IncrementalAlterConfigsResponse:
    """IncrementalAlterConfigs: SET, DELETE, APPEND and SUBTRACT on the stored configs."""
    return await _alter(svc, ctx, req, incremental=True)
