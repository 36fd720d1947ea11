"""Metadata: topics, partitions, leaders and the brokers' advertised endpoints."""

from __future__ import annotations

import uuid
from collections.abc import Container
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.metadata.store import INTERNAL_TOPICS, StoreUnavailable, TopicRecord, topic_name_problem
from pykbroker.protocol.responses.metadata import (
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from pykbroker.replica.topics import TopicError
from pykbroker.security.authorizer import AUTHORIZED_OPERATIONS_OMITTED, AclOperation, ResourceType
from pykbroker.security.authz import (
    CLUSTER_NAME,
    authorized_operations,
    cluster_allowed,
    denied_names,
    maybe_authorized_operations,
)
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services

ZERO_UUID = uuid.UUID(int=0)


def topic_metadata(svc: Services, rec: TopicRecord, *, include_authorized_operations: bool = False,
                   live: Container[int] | None = None, ctx: RequestContext | None = None) -> MetadataResponseTopic:
    """One topic's Metadata entry; ``live`` (the live broker ids) makes it the cluster view."""
    if live is None and svc.store.is_cluster():
        live = svc.store.live_brokers()
    partitions = _cluster_partitions(svc, rec, live) if live is not None else _embedded_partitions(svc, rec)
    return {
        "error_code": ErrorCode.none,
        "name": rec.name,
        "topic_id": rec.topic_id,
        "is_internal": rec.internal,
        "partitions": partitions,
        "topic_authorized_operations": maybe_authorized_operations(
            include_authorized_operations, ResourceType.TOPIC, rec.name, ctx),
    }


def _embedded_partitions(svc: Services, rec: TopicRecord) -> list[MetadataResponsePartition]:
    partitions: list[MetadataResponsePartition] = []
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
    return partitions


def _cluster_partitions(svc: Services, rec: TopicRecord, live: Container[int]) -> list[MetadataResponsePartition]:
    """As ZooKeeper-mode Kafka's metadata cache: a leader that is not live is -1 with LEADER_NOT_AVAILABLE;
    offline replicas are those on dead brokers (and ours when its log dir failed)."""
    me = svc.broker_id
    name = rec.name
    replicas = svc.replicas
    partitions: list[MetadataResponsePartition] = []
    for index, a in sorted(rec.partitions.items()):
        leader = a.leader
        error = ErrorCode.none
        offline = [b for b in a.replicas if b not in live]
        if me in a.replicas and replicas.is_offline(name, index):
            offline.append(me)
            if leader == me:
                leader = -1
        if leader not in live or leader < 0:
            leader = -1
            error = ErrorCode.leader_not_available
        partitions.append({
            "error_code": error,
            "partition_index": index,
            "leader_id": leader,
            "leader_epoch": a.leader_epoch,
            "replica_nodes": tuple(a.replicas),
            "isr_nodes": tuple(a.isr),
            "offline_replicas": tuple(offline),
        })
    return partitions


def live_endpoints(svc: Services, listener: str) -> list[tuple[int, str, int, str | None]]:
    """The live brokers' endpoints on ``listener``: (broker id, host, port, rack), sorted by id."""
    out = []
    for broker_id, endpoints in sorted(svc.store.live_brokers().items()):
        for name, host, port in endpoints:
            if name == listener:
                out.append((broker_id, host, port, svc.store.broker_rack(broker_id)))
    return out


async def _create_internal_topic(svc: Services, name: str) -> ErrorCode:
    """Cluster mode: a client asked for a missing internal topic; the coordinator that owns it creates it."""
    owner = svc.groups if name == "__consumer_offsets" else svc.txn_coordinator
    try:
        created = owner is not None and await owner.ensure_topic_async()
    except StoreUnavailable:
        created = False
    return ErrorCode.leader_not_available if created else ErrorCode.coordinator_not_available


def _error_topic(name: str | None, code: ErrorCode, topic_id: uuid.UUID = ZERO_UUID) -> MetadataResponseTopic:
    return {"error_code": code, "name": name, "topic_id": topic_id, "is_internal": False, "partitions": []}


async def handle_metadata(svc: Services, ctx: RequestContext, req: Any) -> MetadataResponse:
    v = ctx.version
    requested = req.topics
    all_topics = requested is None or (v == 0 and len(requested) == 0)
    # Before v4 clients could not say whether they wanted auto-creation; Kafka then allows it.
    allow_auto = True if v < 4 else bool(req.allow_auto_topic_creation)
    topics: list[MetadataResponseTopic] = []
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
    live = svc.store.live_brokers() if svc.store.is_cluster() else None
    enforced = ctx.authorizer is not None
    if all_topics:
        records = list(svc.store.topics().values())
        if enforced:  # only the topics this principal may DESCRIBE, silently (Kafka logs no denial here)
            hidden = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (r.name for r in records),
                                  log_denial=False)
            records = [r for r in records if r.name not in hidden]
        topics = [topic_metadata(svc, rec, include_authorized_operations=topic_ops, live=live, ctx=ctx)
                  for rec in records]
    else:
        seen: set[str] = set()
        may_create: bool | None = None  # CREATE on the cluster, asked once when needed
        for t in requested:
            name = t.name
            topic_id = getattr(t, "topic_id", None)
            if name is None:
                rec = svc.store.topic_by_id(topic_id) if topic_id and topic_id != ZERO_UUID else None
                if rec is None:
                    topics.append(_error_topic(None, ErrorCode.unknown_topic_id, topic_id or ZERO_UUID))
                elif enforced and denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (rec.name,)):
                    # Topic ids are not secret: refused by id, the name withheld.
                    topics.append(_error_topic(None, ErrorCode.topic_authorization_failed, rec.topic_id))
                else:
                    topics.append(topic_metadata(svc, rec, include_authorized_operations=topic_ops, live=live,
                                                 ctx=ctx))
                continue
            if name in seen:
                continue
            seen.add(name)
            if enforced and denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (name,)):
                # Refused whether or not it exists, so as not to disclose which topics exist.
                topics.append(_error_topic(name, ErrorCode.topic_authorization_failed))
                continue
            rec = svc.store.topic(name)
            if rec is None:
                if enforced and allow_auto and svc.config["auto.create.topics.enable"]:
                    if may_create is None:
                        may_create = cluster_allowed(ctx, AclOperation.CREATE, log_denial=False)
                    if not may_create and denied_names(ctx, AclOperation.CREATE, ResourceType.TOPIC, (name,)):
                        topics.append(_error_topic(name, ErrorCode.topic_authorization_failed))
                        continue
                if topic_name_problem(name):
                    topics.append(_error_topic(name, ErrorCode.invalid_topic_exception))
                    continue
                if allow_auto and live is not None and name in INTERNAL_TOPICS:
                    # As Kafka: created with the coordinator's settings, whatever auto.create.topics.enable says.
                    topics.append(_error_topic(name, await _create_internal_topic(svc, name)))
                    continue
                if allow_auto:
                    try:
                        created = await svc.topics.maybe_auto_create(name)
                    except TopicError as e:
                        topics.append(_error_topic(name, e.code))
                        continue
                    if created:
                        # As Kafka answers a topic this request created: no partitions yet, and a
                        # retriable error, so the client asks again and sees the topic as new.
                        topics.append(_error_topic(name, ErrorCode.leader_not_available))
                        continue
                topics.append(_error_topic(name, ErrorCode.unknown_topic_or_partition))
                continue
            topics.append(topic_metadata(svc, rec, include_authorized_operations=topic_ops, live=live, ctx=ctx))
    brokers: list[MetadataResponseBroker] = [{"node_id": broker_id, "host": host, "port": port, "rack": rack}
                                             for broker_id, host, port, rack in live_endpoints(svc, ctx.listener)]
    return {
        "throttle_time": 0,
        "brokers": brokers,
        "cluster_id": svc.store.cluster_id,
        "controller_id": svc.store.controller_id(),
        "topics": topics,
        "cluster_authorized_operations": _cluster_operations(ctx, cluster_ops),
    }


def _cluster_operations(ctx: RequestContext, requested: bool) -> int:
    """Metadata v8-10's cluster field: Kafka answers 0 to a principal without DESCRIBE on the cluster."""
    if not requested:
        return AUTHORIZED_OPERATIONS_OMITTED
    if not cluster_allowed(ctx, AclOperation.DESCRIBE):
        return 0
    return authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME, ctx=ctx)
