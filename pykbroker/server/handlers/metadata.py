"""Metadata: topics, partitions, leaders and the brokers' advertised endpoints."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.metadata.store import TopicRecord, topic_name_problem
from pykbroker.server.context import RequestContext, Services
from pykbroker.server.topics import TopicError

AUTHORIZED_OPERATIONS_OMITTED = -2147483648
ZERO_UUID = uuid.UUID(int=0)


def topic_metadata(svc: Services, rec: TopicRecord) -> dict[str, Any]:
    partitions = []
    for index, a in sorted(rec.partitions.items()):
        p = svc.replicas.partition(rec.name, index)
        leader = a.leader
        error = ErrorCode.none
        if leader == svc.broker_id and p is None:
            error = ErrorCode.leader_not_available
        partitions.append({
            "error_code": error,
            "partition_index": index,
            "leader_id": leader,
            "leader_epoch": a.leader_epoch,
            "replica_nodes": tuple(a.replicas),
            "isr_nodes": tuple(a.isr),
            "offline_replicas": (),
        })
    return {
        "error_code": ErrorCode.none,
        "name": rec.name,
        "topic_id": rec.topic_id,
        "is_internal": rec.internal,
        "partitions": partitions,
        "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }


def _error_topic(name: str | None, code: ErrorCode, topic_id: uuid.UUID = ZERO_UUID) -> dict[str, Any]:
    return {"error_code": code, "name": name, "topic_id": topic_id, "is_internal": False, "partitions": []}


async def handle_metadata(svc: Services, ctx: RequestContext, req: Any) -> dict[str, Any]:
    v = ctx.version
    requested = req.topics
    all_topics = requested is None or (v == 0 and len(requested) == 0)
    # Before v4 clients could not say whether they wanted auto-creation; Kafka then allows it.
    allow_auto = True if v < 4 else bool(req.allow_auto_topic_creation)
    topics: list[dict[str, Any]] = []
    if all_topics:
        topics = [topic_metadata(svc, rec) for rec in svc.store.topics().values()]
    else:
        seen: set[str] = set()
        for t in requested:
            name = t.name
            topic_id = getattr(t, "topic_id", None)
            if name is None:
                rec = svc.store.topic_by_id(topic_id) if topic_id and topic_id != ZERO_UUID else None
                if rec is None:
                    topics.append(_error_topic(None, ErrorCode.unknown_topic_id, topic_id or ZERO_UUID))
                else:
                    topics.append(topic_metadata(svc, rec))
                continue
            if name in seen:
                continue
            seen.add(name)
            rec = svc.store.topic(name)
            if rec is None:
                if topic_name_problem(name):
                    topics.append(_error_topic(name, ErrorCode.invalid_topic_exception))
                    continue
                if allow_auto:
                    try:
                        rec = svc.topics.maybe_auto_create(name)
                    except TopicError as e:
                        topics.append(_error_topic(name, e.code))
                        continue
                if rec is None:
                    topics.append(_error_topic(name, ErrorCode.unknown_topic_or_partition))
                    continue
            topics.append(topic_metadata(svc, rec))
    brokers = []
    for broker_id, endpoints in sorted(svc.store.live_brokers().items()):
        for name, host, port in endpoints:
            if name == ctx.listener:
                brokers.append({"node_id": broker_id, "host": host, "port": port, "rack": None})
    return {
        "throttle_time": 0,
        "brokers": brokers,
        "cluster_id": svc.store.cluster_id,
        "controller_id": svc.store.controller_id(),
        "topics": topics,
        "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }
