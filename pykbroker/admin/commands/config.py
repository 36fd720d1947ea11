"""``pykbroker config get|set|delete`` for brokers, topics and groups (DescribeConfigs, IncrementalAlterConfigs);
``alter`` and ``current`` serve ``topic alter-config`` and ``topic describe`` too."""

from __future__ import annotations

from typing import Any

import click
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from ..connection import check
from ..errors import EXIT_USAGE, AdminError
from ..session import Session, connection_options
from .common import key_values

ENTITY_TYPES = ("broker", "topic", "group", "client-metrics")
BROKER, CLIENT_METRICS = 4, 16  # ConfigResource types
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 44
SET, DELETE = 0, 1  # IncrementalAlterConfigs' operations
# DescribeConfigs' config sources, by Kafka's names.
SOURCES = {0: "UNKNOWN_CONFIG", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
           3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG",
           6: "DYNAMIC_BROKER_LOGGER_CONFIG", 7: "CLIENT_METRICS_CONFIG", 8: "GROUP_CONFIG"}


# The source of a config set on the entity itself (what ``config get`` shows without --all): not the defaults
# of Kafka or of the brokers, nor, for a topic, a cluster-wide default that Kafka 4 reports for some keys.
_OWN_SOURCE = {"topic": "DYNAMIC_TOPIC_CONFIG", "broker": "DYNAMIC_BROKER_CONFIG",
               "default": "DYNAMIC_DEFAULT_BROKER_CONFIG", "group": "GROUP_CONFIG",
               "client-metrics": "CLIENT_METRICS_CONFIG"}


def _wire_resource(entity_type: str, name: str) -> tuple[int, str] | None:
    """The resources served over pykbroker's own codec (wire.py), as (type, name): librdkafka has no
    CLIENT_METRICS resource type (KIP-714) and refuses the empty name of the brokers' default."""
    if entity_type == "client-metrics":
        return CLIENT_METRICS, name
    if entity_type == "broker" and name == "default":
        return BROKER, ""
    return None


def _resource(entity_type: str, name: str) -> Any:
    if entity_type == "broker":
        # Kafka's --entity-default: the empty name is the cluster-wide default of every broker.
        if name != "default" and not name.isdigit():
            raise AdminError(f"a broker is named by its id or 'default', not {name!r}", EXIT_USAGE)
        return ConfigResource(ResourceType.BROKER, "" if name == "default" else name)
    return ConfigResource({"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}[entity_type], name)


def current(session: Session, entity_type: str, name: str, everything: bool,
            keys: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The configs of one entity: by default those set on it (not Kafka's or the brokers' defaults)."""
    wire = _wire_resource(entity_type, name)
    entries = (_wire_entries(session, wire, entity_type, name) if wire is not None
               else _librdkafka_entries(session, entity_type, name))
    own = _OWN_SOURCE["default" if wire == (BROKER, "") else entity_type]
    out = []
    for key in sorted(entries):
        e = entries[key]
        if keys and key not in keys:
            continue
        if not (everything or keys) and e["source"] != own:
            continue
        out.append(e)
    missing = [k for k in keys if k not in entries]
    if missing:
        raise AdminError(f"{entity_type} {name} has no config {', '.join(missing)}", error="INVALID_CONFIG")
    return out


def _librdkafka_entries(session: Session, entity_type: str, name: str) -> dict[str, dict[str, Any]]:
    admin = session.admin
    resource = _resource(entity_type, name)
    futures = admin.client.describe_configs([resource], request_timeout=admin.timeout)
    entries = admin.wait(next(iter(futures.values())), f"describe configs of {entity_type} {name}")
    return {key: {"name": key, "value": None if e.is_sensitive else e.value,
                  "source": SOURCES.get(int(e.source), str(e.source)), "read_only": bool(e.is_read_only),
                  "sensitive": bool(e.is_sensitive)} for key, e in entries.items()}


def _wire_entries(session: Session, resource: tuple[int, str], entity_type: str,
                  name: str) -> dict[str, dict[str, Any]]:
    body = {"resources": [{"resource_type": resource[0], "resource_name": resource[1],
                           "configuration_keys": None}], "include_synonyms": False, "include_documentation": False}
    _, response = session.wire.any().request(DESCRIBE_CONFIGS, body, minimum=1)
    out: dict[str, dict[str, Any]] = {}
    for r in response.results:
        check(r.error_code, f"describe configs of {entity_type} {name}", r.error_message)
        for c in r.configs:
            sensitive = bool(c.is_sensitive)
            out[str(c.name)] = {"name": str(c.name), "value": None if sensitive else c.value,
                                "source": SOURCES.get(int(c.config_source), str(c.config_source)),
                                "read_only": bool(c.read_only), "sensitive": sensitive}
    return out


def _wire_alter(session: Session, resource: tuple[int, str], entity_type: str, name: str, sets: dict[str, str],
                deletes: list[str]) -> None:
    configs = [{"name": k, "config_operation": SET, "value": v} for k, v in sets.items()]
    configs += [{"name": k, "config_operation": DELETE, "value": None} for k in deletes]
    body = {"resources": [{"resource_type": resource[0], "resource_name": resource[1], "configs": configs}],
            "validate_only": False}
    _, response = session.wire.any().request(INCREMENTAL_ALTER_CONFIGS, body)
    for r in response.responses:
        check(r.error_code, f"alter configs of {entity_type} {name}", r.error_message)


def alter(session: Session, entity_type: str, name: str, sets: dict[str, str], deletes: list[str]) -> None:
    """Set and delete configs of one entity in one IncrementalAlterConfigs, and show what was asked."""
    if not sets and not deletes:
        raise AdminError("nothing to change: give KEY=VALUE to set or KEY to delete", EXIT_USAGE)
    wire = _wire_resource(entity_type, name)
    if wire is not None:
        _wire_alter(session, wire, entity_type, name, sets, deletes)
    else:
        resource = _resource(entity_type, name)
        for key, value in sets.items():
            resource.add_incremental_config(ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET))
        for key in deletes:
            resource.add_incremental_config(ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE))
        admin = session.admin
        futures = admin.client.incremental_alter_configs([resource], request_timeout=admin.timeout)
        admin.wait(next(iter(futures.values())), f"alter configs of {entity_type} {name}")
    changes: list[dict[str, Any]] = [{"name": k, "operation": "set", "value": v} for k, v in sets.items()]
    changes += [{"name": k, "operation": "delete", "value": None} for k in deletes]
    session.out.emit({"entity_type": entity_type, "entity": name, "changes": changes},
                     ["CONFIG", "OPERATION", "VALUE"], [[c["name"], c["operation"], c["value"]] for c in changes])


@click.group("config")
def config() -> None:
    """Configs of brokers (an id, or 'default' for every broker), topics, groups and client-metrics
    subscriptions."""


entity_type_arg = click.argument("entity_type", type=click.Choice(ENTITY_TYPES))


@config.command("get")
@entity_type_arg
@click.argument("name")
@click.argument("keys", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="every config, with its source; not only those set")
@connection_options
def get(entity_type: str, name: str, keys: tuple[str, ...], everything: bool, session: Session) -> None:
    """Show configs (sensitive values are never shown)."""
    rows = current(session, entity_type, name, everything, keys)
    session.out.emit({"entity_type": entity_type, "entity": name, "configs": rows},
                     ["CONFIG", "VALUE", "SOURCE", "READ-ONLY"],
                     [[r["name"], "[hidden]" if r["sensitive"] else r["value"], r["source"], r["read_only"]]
                      for r in rows])


@config.command("set")
@entity_type_arg
@click.argument("name")
@click.argument("pairs", nargs=-1, required=True, metavar="KEY=VALUE...")
@connection_options
def set_(entity_type: str, name: str, pairs: tuple[str, ...], session: Session) -> None:
    """Set configs."""
    alter(session, entity_type, name, key_values(pairs, "config set"), [])


@config.command("delete")
@entity_type_arg
@click.argument("name")
@click.argument("keys", nargs=-1, required=True)
@connection_options
def delete(entity_type: str, name: str, keys: tuple[str, ...], session: Session) -> None:
    """Delete configs: each goes back to its default."""
    alter(session, entity_type, name, {}, list(keys))


COMMANDS = (config,)
