"""Topic administration APIs: CreateTopics, DeleteTopics, CreatePartitions (configs APIs: configs.py)."""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.metadata.store import TopicRecord
from pykbroker.protocol.responses.admin import (
    CreatableTopicResult,
    CreatePartitionsResponse,
    CreatePartitionsTopicResult,
    CreateTopicsResponse,
    DeletableTopicResult,
    DeleteTopicsResponse,
)
from pykbroker.quotas import STRICT_SINCE, MutationQuota, ThrottlingQuotaExceeded
from pykbroker.replica.topics import TopicError, TopicSpec, timeout_ms_of, timeout_s
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.authz import cluster_allowed, denied_names
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services
from pykbroker.server.handlers.configs import describe_topic_configs

log = logging.getLogger("pykbroker.admin")

ZERO_UUID = uuid.UUID(int=0)


def _duplicates(names: list[str]) -> set[str]:
    return {n for n, c in Counter(names).items() if c > 1}


def _mutation_quota(svc: Services, ctx: RequestContext) -> MutationQuota | None:
    """The request's controller mutation quota (KIP-599), strict from the versions that know the
    THROTTLING_QUOTA_EXCEEDED error; None when no controller_mutation_rate applies to the client."""
    quotas = svc.quotas
    if quotas is None or not quotas.active():
        return None
    return quotas.controller_mutation(ctx.session.principal.name, ctx.header.client_id or "",
                                      ctx.version >= STRICT_SINCE[ctx.header.api_key], anyio.current_time() * 1000.0)


def _charge_mutations(quota: MutationQuota, partitions: int) -> None:
    """Charge one topic's partitions, after its validation and before its change, as Kafka's controller."""
    try:
        quota.record(partitions, anyio.current_time() * 1000.0)
    except ThrottlingQuotaExceeded as e:
        raise TopicError(ErrorCode.throttling_quota_exceeded, str(e)) from None


def _mutation_throttle(ctx: RequestContext, quota: MutationQuota | None) -> int:
    """The response's throttle time; the connection reads nothing more until it has passed (KIP-219).
    The dispatcher raises both when the request quota asks for longer."""
    if quota is None:
        return 0
    now = anyio.current_time()
    ms = quota.throttle_time_ms(now * 1000.0)
    if ms > 0:
        ctx.session.muted_until = max(ctx.session.muted_until, now + ms / 1000.0)
    return ms


async def handle_create_topics(svc: Services, ctx: RequestContext, req: Any) -> CreateTopicsResponse:
    v = ctx.version
    dupes = _duplicates([t.name for t in req.topics])
    results: list[CreatableTopicResult] = []
    created: list[tuple[CreatableTopicResult, TopicRecord]] = []
    # CREATE on the cluster, else on each topic; DESCRIBE_CONFIGS to be shown the new topic's configs.
    no_create: frozenset[str] = frozenset()
    no_configs: frozenset[str] = frozenset()
    if ctx.authorizer is not None:
        names = [t.name for t in req.topics]
        if not cluster_allowed(ctx, AclOperation.CREATE, log_denial=False):
            no_create = denied_names(ctx, AclOperation.CREATE, ResourceType.TOPIC, names)
        no_configs = denied_names(ctx, AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, names, log_denial=False)
    mutations = _mutation_quota(svc, ctx)
    for t in req.topics:
        result: CreatableTopicResult = {"name": t.name, "topic_id": ZERO_UUID, "error_code": ErrorCode.none,
                                        "error_message": None, "num_partitions": -1, "replication_factor": -1,
                                        "configs": None, "topic_config_error_code": ErrorCode.none}
        results.append(result)
        if t.name in dupes:
            result["error_code"] = ErrorCode.invalid_request
            result["error_message"] = "Create topics request from client contains multiple entries for the " \
                                      f"following topics: {t.name}"
            continue
        if no_create and t.name in no_create:
            result["error_code"] = ErrorCode.topic_authorization_failed
            result["error_message"] = "Authorization failed."
            continue
        spec = TopicSpec(
            name=t.name,
            num_partitions=int(t.num_partitions),
            replication_factor=int(t.replication_factor),
            assignments={int(a.partition_index): [int(b) for b in a.broker_ids] for a in t.assignments} or None,
            configs={c.name: c.value for c in t.configs},
        )
        try:
            if mutations is not None:  # as Kafka's controller: validate, charge, then create (or only validate)
                _charge_mutations(mutations, len((await svc.topics.create_async(spec, validate_only=True)).partitions))
            rec = await svc.topics.create_async(spec, validate_only=bool(req.validate_only))
        except TopicError as e:
            result["error_code"] = e.code
            result["error_message"] = e.message
            continue
        if v >= 5:
            _fill_created(svc, result, rec)
            if no_configs and t.name in no_configs:  # created, but its configs are not this principal's to see
                result["configs"] = []
                result["topic_config_error_code"] = ErrorCode.topic_authorization_failed
        if not req.validate_only:
            created.append((result, rec))
    await _wait_all(svc, timeout_ms_of(req.timeout), created, svc.topics.wait_created)
    return {"throttle_time": _mutation_throttle(ctx, mutations), "topics": results}


async def _wait_all(svc: Services, timeout_ms: int,
                    pending: Sequence[tuple[CreatableTopicResult | DeletableTopicResult, TopicRecord]],
                    wait: Callable[[TopicRecord, float], Awaitable[bool]]) -> None:
    """Cluster mode: wait, within the request's timeout, until this broker's metadata shows each change.

    As Kafka's delayed admin operations: a change not seen in time answers REQUEST_TIMED_OUT (it
    still happens); a timeout of 0 or less answers at once.
    """
    if not svc.store.is_cluster() or timeout_ms <= 0 or not pending:
        return
    deadline = time.monotonic() + timeout_s(timeout_ms)
    for result, rec in pending:
        if not await wait(rec, deadline - time.monotonic()):
            result["error_code"] = ErrorCode.request_timed_out
            result["error_message"] = None


def _fill_created(svc: Services, result: CreatableTopicResult, rec: TopicRecord) -> None:
    result["topic_id"] = rec.topic_id
    result["num_partitions"] = len(rec.partitions)
    result["replication_factor"] = len(next(iter(rec.partitions.values())).replicas)
    result["configs"] = [
        {"name": c["name"], "value": c["value"], "read_only": c["read_only"],
         "config_source": c["config_source"], "is_sensitive": c["is_sensitive"]}
        for c in describe_topic_configs(svc.config, rec.configs)
    ]


async def handle_delete_topics(svc: Services, ctx: RequestContext, req: Any) -> DeleteTopicsResponse:
    responses: list[DeletableTopicResult] = []
    if ctx.version >= 6:
        targets = [(t.name, t.topic_id) for t in req.topics]
    else:
        targets = [(n, ZERO_UUID) for n in req.topic_names]
    pending: list[tuple[DeletableTopicResult, TopicRecord]] = []
    enforced = ctx.authorizer is not None
    mutations = _mutation_quota(svc, ctx)
    for name, topic_id in targets:
        result: DeletableTopicResult = {"name": name, "topic_id": topic_id, "error_code": ErrorCode.none,
                                        "error_message": None}
        responses.append(result)
        if name is None:
            rec = svc.store.topic_by_id(topic_id) if topic_id != ZERO_UUID else None
            if rec is None:
                result["error_code"] = ErrorCode.unknown_topic_id
                continue
            name = rec.name
            if enforced and denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (name,)):
                # Named by id and not describable: refused without disclosing the name.
                result["error_code"] = ErrorCode.topic_authorization_failed
                continue
            result["name"] = name
        if enforced and denied_names(ctx, AclOperation.DELETE, ResourceType.TOPIC, (name,)):
            result["error_code"] = ErrorCode.topic_authorization_failed
            continue
        rec = svc.store.topic(name)
        if rec is not None and rec.internal:
            result["error_code"] = ErrorCode.invalid_topic_exception
            result["error_message"] = f"Cannot delete internal topic {name}"
            continue
        try:
            if mutations is not None and rec is not None and svc.config["delete.topic.enable"]:
                _charge_mutations(mutations, len(rec.partitions))
            deleted = await svc.topics.delete(name)
            result["topic_id"] = deleted.topic_id
            pending.append((result, deleted))
        except TopicError as e:
            result["error_code"] = e.code
            result["error_message"] = e.message
    await _wait_all(svc, timeout_ms_of(req.timeout), pending, svc.topics.wait_deleted)
    return {"throttle_time": _mutation_throttle(ctx, mutations), "responses": responses}


async def handle_create_partitions(svc: Services, ctx: RequestContext, req: Any) -> CreatePartitionsResponse:
    dupes = _duplicates([t.name for t in req.topics])
    denied = denied_names(ctx, AclOperation.ALTER, ResourceType.TOPIC,
                          (t.name for t in req.topics if t.name not in dupes))
    results: list[CreatePartitionsTopicResult] = []
    grown: list[tuple[CreatePartitionsTopicResult, TopicRecord, range]] = []
    mutations = _mutation_quota(svc, ctx)
    for t in req.topics:
        result: CreatePartitionsTopicResult = {"name": t.name, "error_code": ErrorCode.none, "error_message": None}
        results.append(result)
        if t.name in dupes:
            result["error_code"] = ErrorCode.invalid_request
            result["error_message"] = "Duplicate topic in request."
            continue
        if denied and t.name in denied:
            result["error_code"] = ErrorCode.topic_authorization_failed
            result["error_message"] = "The topic authorization is failed."
            continue
        assignments = None if t.assignments is None else [[int(b) for b in a.broker_ids] for a in t.assignments]
        try:
            if mutations is not None:
                planned = await svc.topics.add_partitions(t.name, int(t.count), assignments, validate_only=True)
                _charge_mutations(mutations, len(planned))
            added = await svc.topics.add_partitions(t.name, int(t.count), assignments,
                                                    validate_only=bool(req.validate_only))
        except TopicError as e:
            result["error_code"] = e.code
            result["error_message"] = e.message
            continue
        rec = svc.store.topic(t.name)
        if rec is not None and not req.validate_only:
            grown.append((result, rec, added))
    timeout_ms = timeout_ms_of(req.timeout)
    if svc.store.is_cluster() and timeout_ms > 0 and grown:
        deadline = time.monotonic() + timeout_s(timeout_ms)
        for result, rec, added in grown:
            def done(name: str = rec.name, new: range = added) -> bool:
                cur = svc.store.topic(name)
                return cur is not None and len(cur.partitions) >= new.stop and \
                    svc.topics.has_leaders(name, lambda i: i in new)
            if not await svc.topics.wait_until(done, deadline - time.monotonic()):
                result["error_code"] = ErrorCode.request_timed_out
                result["error_message"] = None
    return {"throttle_time": _mutation_throttle(ctx, mutations), "results": results}
