"""Topic administration APIs: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.config import (
    BROKER_CONFIG_DEFS,
    TOPIC_CONFIG_DEFS,
    TOPIC_CONFIG_SYNONYMS,
    ConfigDef,
    effective_topic_config,
)
from pykbroker.metadata.store import TopicRecord
from pykbroker.server.context import RequestContext, Services
from pykbroker.server.topics import TopicError, TopicSpec

log = logging.getLogger("pykbroker.admin")

ZERO_UUID = uuid.UUID(int=0)

# DescribeConfigs resource types and config sources (Kafka's ConfigResource.Type / ConfigSource).
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_BROKER_LOGGER = 8
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
CONFIG_TYPES = {"bool": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7, "password": 9}


def _duplicates(names: list[str]) -> set[str]:
    return {n for n, c in Counter(names).items() if c > 1}


def describe_topic_configs(
    svc: Services, rec_configs: dict[str, str], keys: set[str] | None, synonyms: bool, documentation: bool
) -> list[dict[str, Any]]:
    effective = effective_topic_config(svc.config, rec_configs)
    out = []
    for key, d in sorted(TOPIC_CONFIG_DEFS.items()):
        if keys is not None and key not in keys:
            continue
        broker_key = TOPIC_CONFIG_SYNONYMS[key]
        value = d.render(effective[key])
        syn: list[dict[str, Any]] = []
        if key in rec_configs:
            source = SOURCE_DYNAMIC_TOPIC
            syn.append({"name": key, "value": rec_configs[key], "source": SOURCE_DYNAMIC_TOPIC})
        elif svc.config.is_explicit(broker_key):
            source = SOURCE_STATIC_BROKER
        else:
            source = SOURCE_DEFAULT
        if svc.config.is_explicit(broker_key):
            syn.append({"name": broker_key, "value": BROKER_CONFIG_DEFS[broker_key].render(svc.config[broker_key]),
                        "source": SOURCE_STATIC_BROKER})
        syn.append({"name": broker_key, "value": value if source == SOURCE_DEFAULT else
                    BROKER_CONFIG_DEFS[broker_key].render(BROKER_CONFIG_DEFS[broker_key].default) or value,
                    "source": SOURCE_DEFAULT})
        out.append(_config_entry(key, value, d, source, read_only=False, synonyms=syn if synonyms else [],
                                 documentation=documentation))
    return out


def _config_entry(key: str, value: str | None, d: ConfigDef, source: int, *, read_only: bool,
                  synonyms: list[dict[str, Any]], documentation: bool) -> dict[str, Any]:
    return {
        "name": key,
        "value": value,
        "read_only": read_only,
        "config_source": source,
        "is_default": source == SOURCE_DEFAULT,
        "is_sensitive": d.type == "password",
        "synonyms": synonyms,
        "config_type": CONFIG_TYPES.get(d.type, 0),
        "documentation": (d.doc or None) if documentation else None,
    }


def describe_broker_configs(svc: Services, keys: set[str] | None, synonyms: bool,
                            documentation: bool) -> list[dict[str, Any]]:
    out = []
    for key, d in sorted(BROKER_CONFIG_DEFS.items()):
        if keys is not None and key not in keys:
            continue
        value = d.render(svc.config[key])
        source = SOURCE_STATIC_BROKER if svc.config.is_explicit(key) else SOURCE_DEFAULT
        syn = [{"name": key, "value": value, "source": source}] if synonyms else []
        out.append(_config_entry(key, value, d, source, read_only=not d.dynamic, synonyms=syn,
                                 documentation=documentation))
    return out


async def handle_create_topics(svc: Services, ctx: RequestContext, req: Any) -> dict[str, Any]:
    v = ctx.version
    dupes = _duplicates([t.name for t in req.topics])
    results = []
    for t in req.topics:
        result: dict[str, Any] = {"name": t.name, "topic_id": ZERO_UUID, "error_code": ErrorCode.none,
                                  "error_message": None, "num_partitions": -1, "replication_factor": -1,
                                  "configs": None}
        results.append(result)
        if t.name in dupes:
            result["error_code"] = ErrorCode.invalid_request
            result["error_message"] = "Create topics request from client contains multiple entries for the " \
                                      f"following topics: {t.name}"
            continue
        spec = TopicSpec(
            name=t.name,
            num_partitions=int(t.num_partitions),
            replication_factor=int(t.replication_factor),
            assignments={int(a.partition_index): [int(b) for b in a.broker_ids] for a in t.assignments} or None,
            configs={c.name: c.value for c in t.configs},
        )
        try:
            rec = svc.topics.create(spec, validate_only=bool(req.validate_only))
        except TopicError as e:
            result["error_code"] = e.code
            result["error_message"] = e.message
            continue
        if v >= 5:
            _fill_created(svc, result, rec)
    return {"throttle_time": 0, "topics": results}


def _fill_created(svc: Services, result: dict[str, Any], rec: TopicRecord) -> None:
    result["topic_id"] = rec.topic_id
    result["num_partitions"] = len(rec.partitions)
    result["replication_factor"] = len(next(iter(rec.partitions.values())).replicas)
    result["configs"] = [
        {"name": c["name"], "value": c["value"], "read_only": c["read_only"],
         "config_source": c["config_source"], "is_sensitive": c["is_sensitive"]}
        for c in describe_topic_configs(svc, rec.configs, None, False, False)
    ]


async def handle_delete_topics(svc: Services, ctx: RequestContext, req: Any) -> dict[str, Any]:
    responses = []
    if ctx.version >= 6:
        targets = [(t.name, t.topic_id) for t in req.topics]
    else:
        targets = [(n, ZERO_UUID) for n in req.topic_names]
    for name, topic_id in targets:
        result: dict[str, Any] = {"name": name, "topic_id": topic_id, "error_code": ErrorCode.none,
                                  "error_message": None}
        responses.append(result)
        if name is None:
            rec = svc.store.topic_by_id(topic_id) if topic_id != ZERO_UUID else None
            if rec is None:
                result["error_code"] = ErrorCode.unknown_topic_id
                continue
            name = rec.name
            result["name"] = name
        rec = svc.store.topic(name)
        if rec is not None and rec.internal:
            result["error_code"] = ErrorCode.invalid_topic_exception
            result["error_message"] = f"Cannot delete internal topic {name}"
            continue
        try:
            deleted = svc.topics.delete(name)
            result["topic_id"] = deleted.topic_id
        except TopicError as e:
            result["error_code"] = e.code
            result["error_message"] = e.message
    return {"throttle_time": 0, "responses": responses}


async def handle_create_partitions(svc: Services, ctx: RequestContext, req: Any) -> dict[str, Any]:
    dupes = _duplicates([t.name for t in req.topics])
    results = []
    for t in req.topics:
        result: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.none, "error_message": None}
        results.append(result)
        if t.name in dupes:
            result["error_code"] = ErrorCode.invalid_request
            result["error_message"] = "Duplicate topic in request."
            continue
        assignments = None if t.assignments is None else [[int(b) for b in a.broker_ids] for a in t.assignments]
        try:
            svc.topics.add_partitions(t.name, int(t.count), assignments, validate_only=bool(req.validate_only))
        except TopicError as e:
            result["error_code"] = e.code
            result["error_message"] = e.message
    return {"throttle_time": 0, "results": results}


async def handle_describe_configs(svc: Services, ctx: RequestContext, req: Any) -> dict[str, Any]:
    synonyms = bool(getattr(req, "include_synonyms", False))
    documentation = bool(getattr(req, "include_documentation", False))
    results = []
    for r in req.resources:
        rtype = int(r.resource_type)
        keys = None if r.configuration_keys is None else set(r.configuration_keys)
        result: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None, "resource_type": rtype,
                                  "resource_name": r.resource_name, "configs": []}
        results.append(result)
        if rtype == RESOURCE_TOPIC:
            rec = svc.store.topic(r.resource_name)
            if rec is None:
                result["error_code"] = ErrorCode.unknown_topic_or_partition
                result["error_message"] = f"Topic '{r.resource_name}' does not exist."
                continue
            result["configs"] = describe_topic_configs(svc, rec.configs, keys, synonyms, documentation)
        elif rtype == RESOURCE_BROKER:
            if r.resource_name not in ("", str(svc.broker_id)):
                result["error_code"] = ErrorCode.invalid_request
                result["error_message"] = f"Unexpected broker id, expected {svc.broker_id}"
                continue
            result["configs"] = describe_broker_configs(svc, keys, synonyms, documentation)
        elif rtype == RESOURCE_BROKER_LOGGER:
            result["configs"] = []
        else:
            result["error_code"] = ErrorCode.invalid_request
            result["error_message"] = f"Unsupported resource type {rtype}"
    return {"throttle_time": 0, "results": results}
