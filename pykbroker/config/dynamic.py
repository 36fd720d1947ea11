"""Configs changed at run time: dynamic broker configs (KIP-226), group configs (KIP-848), client
metrics subscriptions (KIP-714), and IncrementalAlterConfigs' operations.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pykbroker.config.broker import BrokerConfig, unknown_key_hint
from pykbroker.config.definitions import BROKER_CONFIG_DEFS
from pykbroker.config.parsing import (
    ConfigDef,
    ConfigError,
    ConfigRequestError,
    at_least,
    check_supported,
    one_of,
    valid_topic_name_or_empty,
)
from pykbroker.config.topic import refuse_nulls
from pykbroker.hints import NOT_IMPLEMENTED_HINT

_D = ConfigDef


# Keys Kafka can change at runtime but that pykbroker reads only at start: altering them is refused
# rather than stored without effect (README "Settings not implemented").
BROKER_DYNAMIC_NOT_APPLIED: dict[str, str] = {
    k: "pykbroker applies it only at start; change it in server.properties and restart"
    for k in ("max.connections", "max.connections.per.ip", "max.connections.per.ip.overrides",
              "max.connection.creation.rate", "listeners", "advertised.listeners",
              "listener.security.protocol.map", "log.cleaner.backoff.ms")
}
# Kafka accepts these only per broker (resource name = the broker id), not as the cluster default.
_PER_BROKER_ONLY = frozenset({"listeners", "advertised.listeners", "listener.security.protocol.map"})
_THREAD_POOLS = ("num.io.threads", "num.network.threads", "num.replica.fetchers",
                 "num.recovery.threads.per.data.dir")


def _kafka_set(names: Iterable[str]) -> str:
    return "Set(" + ", ".join(sorted(names)) + ")"


def validate_dynamic_broker_configs(broker: BrokerConfig, props: Mapping[str, str | None],
                                    per_broker: bool) -> dict[str, str]:
    """Check a broker's (or the cluster default's) whole dynamic config as Kafka's DynamicBrokerConfig
    does; returns the normalised strings. Raises ConfigRequestError where Kafka answers INVALID_REQUEST
    (its KAFKA-13609), and ConfigError (INVALID_CONFIG, the code of a rejected config) for a key pykbroker
    does not implement, which Kafka would store.
    """
    nulls = [k for k, v in props.items() if v is None]
    if nulls:
        raise ConfigRequestError(f"Null value not supported for : {', '.join(nulls)}")
    unknown = [k for k in props if k not in BROKER_CONFIG_DEFS]
    if unknown:  # Kafka stores any key; pykbroker refuses what it cannot honour, as Kafka refuses a bad config
        key = sorted(unknown)[0]
        raise ConfigError(f"Unknown broker config {key}{unknown_key_hint(key)}: pykbroker stores no "
                          "broker config it does not implement")
    static = [k for k in props if not BROKER_CONFIG_DEFS[k].dynamic and k not in BROKER_DYNAMIC_NOT_APPLIED]
    if static:
        raise ConfigRequestError(f"Cannot update these configs dynamically: {_kafka_set(static)}")
    not_applied = [k for k in props if k in BROKER_DYNAMIC_NOT_APPLIED]
    if not_applied:
        k = sorted(not_applied)[0]
        raise ConfigRequestError(f"{k} cannot be updated dynamically on pykbroker yet: "
                                 f"{BROKER_DYNAMIC_NOT_APPLIED[k]} ({NOT_IMPLEMENTED_HINT})")
    if not per_broker:
        per = [k for k in props if k in _PER_BROKER_ONLY]
        if per:
            raise ConfigRequestError("Cannot update these configs at default cluster level, broker id must be "
                                     f"specified: {_kafka_set(per)}")
    out: dict[str, str] = {}
    for key, value in props.items():
        d = BROKER_CONFIG_DEFS[key]
        assert value is not None
        try:
            parsed = d.parse(value)
        except ValueError as e:
            raise ConfigRequestError(f"Invalid value {value} for configuration {key}: {e}") from None
        try:
            check_supported(d, parsed)
        except ConfigError as e:
            raise ConfigRequestError(str(e)) from None
        if key in _THREAD_POOLS and parsed != broker[key]:
            current = broker[key]
            what = f"Dynamic thread count update validation failed for {key}={value}"
            if parsed < current / 2:
                raise ConfigRequestError(f"{what}, value should be at least half the current value {current}")
            if parsed > current * 2:
                raise ConfigRequestError(f"{what}, value should not be greater than double the current value "
                                         f"{current}")
        rendered = d.render(parsed)
        assert rendered is not None
        out[key] = rendered
    return out


# --- group configs (KIP-848: ConfigResource type GROUP) ----------------------------------------------

# Group config -> the broker config that supplies its default.
GROUP_CONFIG_SYNONYMS: dict[str, str] = {
    "consumer.session.timeout.ms": "group.consumer.session.timeout.ms",
    "consumer.heartbeat.interval.ms": "group.consumer.heartbeat.interval.ms",
    "share.session.timeout.ms": "group.share.session.timeout.ms",
    "share.heartbeat.interval.ms": "group.share.heartbeat.interval.ms",
    "share.record.lock.duration.ms": "group.share.record.lock.duration.ms",
    "share.delivery.count.limit": "group.share.delivery.count.limit",
}
GROUP_CONFIG_DEFS: dict[str, ConfigDef] = {
    "consumer.session.timeout.ms": _D(
        "consumer.session.timeout.ms", "int", None,
        "The timeout to detect client failures when using the consumer group protocol.", at_least(1)),
    "consumer.heartbeat.interval.ms": _D(
        "consumer.heartbeat.interval.ms", "int", None,
        "The heartbeat interval given to the members.", at_least(1)),
    # Share groups (KIP-932, docs/queues.md).
    "share.session.timeout.ms": _D(
        "share.session.timeout.ms", "int", None, "The timeout to detect share group member failures.", at_least(1)),
    "share.heartbeat.interval.ms": _D(
        "share.heartbeat.interval.ms", "int", None, "The heartbeat interval given to share group members.",
        at_least(1)),
    "share.record.lock.duration.ms": _D(
        "share.record.lock.duration.ms", "int", None, "The record acquisition lock duration.", at_least(1)),
    "share.delivery.count.limit": _D(
        "share.delivery.count.limit", "int", None, "Deliveries after which a record is archived.", at_least(1)),
    "share.auto.offset.reset": _D(
        "share.auto.offset.reset", "string", "latest", "Where a share group starts on a partition with no "
        "state: latest or earliest.", one_of("latest", "earliest")),
    "share.isolation.level": _D(
        "share.isolation.level", "string", "read_uncommitted", "read_committed acquires records up to the last "
        "stable offset only, and never records of aborted transactions.",
        one_of("read_uncommitted", "read_committed")),
    "pykbroker.share.dlq.topic": _D(
        "pykbroker.share.dlq.topic", "string", "", "pykbroker extension: the dead-letter topic that rejected "
        "records and records past the delivery count limit are appended to (docs/queues.md); empty: the "
        "topic's pykbroker.dlq.topic, if any.", valid_topic_name_or_empty),
}


def effective_group_config(broker: BrokerConfig, overrides: Mapping[str, str]) -> dict[str, Any]:
    """Each group config's value for a group: its own, else the broker's synonym, else the default."""
    out: dict[str, Any] = {}
    for k, d in GROUP_CONFIG_DEFS.items():
        if k in overrides:
            out[k] = d.parse(overrides[k])
        elif k in GROUP_CONFIG_SYNONYMS:
            out[k] = broker[GROUP_CONFIG_SYNONYMS[k]]
        else:
            out[k] = d.default
    return out


def validate_group_configs(broker: BrokerConfig, configs: Mapping[str, str | None]) -> dict[str, str]:
    """Kafka's GroupConfig.validate; ConfigError (INVALID_CONFIG) with Kafka's messages."""
    refuse_nulls(configs, "group")
    out: dict[str, str] = {}
    for key, value in configs.items():
        d = GROUP_CONFIG_DEFS.get(key)
        if d is None:
            raise ConfigError(f"Unknown group config name: {key}")
        assert value is not None
        try:
            out[key] = str(d.parse(value))
        except ValueError as e:
            raise ConfigError(f"Invalid value {value} for configuration {key}: {e}") from None
        problem = d.validator(d.parse(value)) if d.validator is not None else None
        if problem:
            raise ConfigError(f"Invalid value {value} for configuration {key}: {problem}")
    eff = effective_group_config(broker, out)
    hb, session = eff["consumer.heartbeat.interval.ms"], eff["consumer.session.timeout.ms"]
    for ms, key, lo_key, hi_key in (
            (hb, "consumer.heartbeat.interval.ms", "group.consumer.min.heartbeat.interval.ms",
             "group.consumer.max.heartbeat.interval.ms"),
            (session, "consumer.session.timeout.ms", "group.consumer.min.session.timeout.ms",
             "group.consumer.max.session.timeout.ms")):
        if ms < broker[lo_key]:
            raise ConfigError(f"{key} must be greater than or equal to {lo_key}")
        if ms > broker[hi_key]:
            raise ConfigError(f"{key} must be less than or equal to {hi_key}")
    if session <= hb:
        raise ConfigError("consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms")
    if eff["share.session.timeout.ms"] <= eff["share.heartbeat.interval.ms"]:
        raise ConfigError("share.session.timeout.ms must be greater than share.heartbeat.interval.ms")
    return out


# --- client metrics subscriptions (KIP-714: ConfigResource type CLIENT_METRICS) ----------------------

CLIENT_METRICS_CONFIG_DEFS: dict[str, ConfigDef] = {
    "metrics": _D("metrics", "list", [], "Subscription metrics list"),
    "interval.ms": _D("interval.ms", "int", 300000, "Push interval in milliseconds"),
    "match": _D("match", "list", [], "Client match pattern list"),
}
CLIENT_MATCH_PARAMS = frozenset({"client_instance_id", "client_id", "client_software_name",
                                 "client_software_version", "client_source_address", "client_source_port"})


def validate_client_metrics_configs(name: str, configs: Mapping[str, str | None]) -> dict[str, str]:
    """Kafka's ClientMetricsConfigs.validate: ConfigRequestError (INVALID_REQUEST) or ConfigError."""
    if not name:
        raise ConfigRequestError("Subscription name can't be empty")
    for key in configs:
        if key not in CLIENT_METRICS_CONFIG_DEFS:
            raise ConfigRequestError(f"Unknown client metrics configuration: {key}")
    out: dict[str, str] = {}
    for key, value in configs.items():
        if value is None:
            raise ConfigError(f"Null value not supported for client metrics configs: {key}")
        d = CLIENT_METRICS_CONFIG_DEFS[key]
        try:
            parsed = d.parse(value)
        except ValueError as e:
            raise ConfigError(f"Invalid value {value} for configuration {key}: {e}") from None
        if key == "interval.ms" and not 100 <= parsed <= 3600000:
            raise ConfigRequestError(f"Invalid value {parsed} for interval.ms, interval must be between 100 and "
                                     "3600000 (1 hour)")
        if key == "match":
            for pattern in parsed:
                parts = pattern.split("=")
                if len(parts) != 2 or parts[0].strip() not in CLIENT_MATCH_PARAMS:
                    raise ConfigError(f"Illegal client matching pattern: {pattern}")
                try:
                    re.compile(parts[1].strip())
                except re.error:
                    raise ConfigError(f"Illegal client matching pattern: {pattern}") from None
        out[key] = value
    return out


# --- IncrementalAlterConfigs operations ---------------------------------------------------------------

OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}


def apply_incremental_ops(current: Mapping[str, str], ops: Iterable[tuple[str, int, str | None]],
                          definition: Callable[[str], ConfigDef | None],
                          default: Callable[[str], str | None]) -> dict[str, str]:
    """Apply SET/DELETE/APPEND/SUBTRACT to a resource's stored configs, as Kafka's controller does.

    APPEND and SUBTRACT work on LIST configs only (INVALID_CONFIG otherwise) and start from the
    stored value, else the config's default; APPEND skips values already present.
    """
    out = dict(current)
    for name, op, value in ops:
        if op not in _OP_NAMES:
            raise ConfigRequestError(f"Unknown operations type {op}")
        if op == OP_SET:
            assert value is not None
            out[name] = value
        elif op == OP_DELETE:
            out.pop(name, None)
        else:
            d = definition(name)
            if d is None or d.type != "list":
                raise ConfigError(f"Can't {_OP_NAMES[op]} to key {name} because its type is not LIST.")
            old = out.get(name)
            if old is None:
                old = default(name)
            parts = [p for p in (old or "").split(",") if p]
            for item in (value or "").split(","):
                if op == OP_APPEND:
                    if item not in parts:
                        parts.append(item)
                elif item in parts:
                    parts.remove(item)
            out[name] = ",".join(parts)
    return out
