"""Metadata: topics, partitions, leaders and the brokers' advertised endpoints."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.metadata.store import TopicRecord, topic_name_problem
from pykbroker.server.authorizer import AUTHORIZED_OPERATIONS_OMITTED, ResourceType, maybe_authorized_operations
from pykbroker.server.context import RequestContext, Services
from pykbroker.server.topics import TopicError

ZERO_UUID = uuid.UUID(int=0)


def topic_metadata(svc: Services, rec: TopicRecord, *, include_authorized_operations: bool = False) -> dict[str, Any]:
    partitions = []
    for index, a in sorted(rec.partitions.items()):
        p = svc.replicas.partition(rec.name, index)
        leader = a.leader
        error = ErrorCode.none
        offline: tuple[int, ...] = ()
        if leader == svc.broker_id and svc.replicas.is_offline(rec.name, index):
            # Our replica's log dir failed.  Kafka (3.9, KRaft) then has no leader for a
            # partition whose only replica it was: leader -1, LEADER_NOT_AVAILABLE, the ISR
            # kept, and this broker listed in offline_replicas.
            leader = -1
            error = ErrorCode.leader_not_available
            offline = (svc.broker_id,)
        elif leader == svc.broker_id and p is None:
            error = ErrorCode.leader_not_available
        partitions.append({
            "error_code": error,
            "partition_index": index,
            "leader_id": leader,
            "leader_epoch": a.leader_epoch,
            "replica_nodes": tuple(a.replicas),
            "isr_nodes": tuple(a.isr),
            "offline_replicas": offline,
        })
    return {
        "error_code": ErrorCode.none,
        "name": rec.name,
        "topic_id": rec.topic_id,
        "is_internal": rec.internal,
        "partitions": partitions,
        "topic_authorized_operations": maybe_authorized_operations(
            include_authorized_operations, ResourceType.TOPIC, rec.name),
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
    # v8+ may ask for the operations this principal is allowed (cluster-wide: v8-10 only).
    topic_ops = v >= 8 and bool(req.include_topic_authorized_operations)
    cluster_ops = 8 <= v <= 10 and bool(req.include_cluster_authorized_operations)
    if not all_topics and v < 12 and any(t.name is None for t in requested):
        # v10-11 carry topic ids but cannot answer by id: Kafka fails such a request with
        # INVALID_REQUEST for every topic, a null name sent back as "" (the response is not nullable).
        return {"throttle_time": 0, "brokers": [], "cluster_id": None, "controller_id": -1,
                "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
                "topics": [_error_topic(t.name or "", ErrorCode.invalid_request, t.topic_id or ZERO_UUID)
                           for t in requested]}
    if all_topics:
        topics = [topic_metadata(svc, rec, include_authorized_operations=topic_ops)
                  for rec in svc.store.topics().values()]
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
                    topics.append(topic_metadata(svc, rec, include_authorized_operations=topic_ops))
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
            topics.append(topic_metadata(svc, rec, include_authorized_operations=topic_ops))
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
        "cluster_authorized_operations": maybe_authorized_operations(cluster_ops, ResourceType.CLUSTER,
                                                                     "kafka-cluster"),
    }
