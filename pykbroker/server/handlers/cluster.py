"""The cluster-shaped APIs, answered as Kafka 3.9 answers them.

DescribeCluster, DescribeTopicPartitions, DescribeLogDirs, AlterReplicaLogDirs,
ElectLeaders, AlterPartitionReassignments, ListPartitionReassignments and
OffsetForLeaderEpoch.  With embedded metadata (one broker) every partition already has its
preferred leader and no reassignment can be in progress, so those APIs mostly report that.
In a ZooKeeper cluster ElectLeaders and AlterPartitionReassignments are written for the
controller to carry out, and the answers come from this broker's metadata cache.
AlterReplicaLogDirs really moves a partition between ``log.dirs``
(:meth:`ReplicaManager.alter_log_dir`, :class:`~pykbroker.storage.log_manager.LogMove`).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.metadata.store import StoreUnavailable, TopicRecord, UnknownTopic, run_store, topic_name_problem
from pykbroker.protocol.responses.cluster import (
    AlterPartitionReassignmentsResponse,
    AlterReplicaLogDirPartitionResult,
    AlterReplicaLogDirsResponse,
    Cursor,
    DescribeClusterBroker,
    DescribeClusterResponse,
    DescribeLogDirsPartition,
    DescribeLogDirsResponse,
    DescribeLogDirsResult,
    DescribeLogDirsTopic,
    DescribeTopicPartitionsResponse,
    DescribeTopicPartitionsResponsePartition,
    DescribeTopicPartitionsResponseTopic,
    ElectLeadersResponse,
    EpochEndOffset,
    ListPartitionReassignmentsResponse,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderTopicResult,
    OngoingPartitionReassignment,
    OngoingTopicReassignment,
    PartitionResult,
    ReassignablePartitionResponse,
    ReassignableTopicResponse,
)
from pykbroker.replica.topics import timeout_ms_of, timeout_s
from pykbroker.security.authorizer import AUTHORIZED_OPERATIONS_OMITTED, AclOperation, ResourceType
from pykbroker.security.authz import (
    CLUSTER_NAME,
    allowed,
    authorized_operations,
    cluster_allowed,
    denied_names,
    maybe_authorized_operations,
)
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services
from pykbroker.server.handlers.metadata import ZERO_UUID, live_endpoints, topic_metadata
from pykbroker.storage.leader_epoch_cache import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET

# DescribeCluster's EndpointType: a broker answers only for brokers.
ENDPOINT_TYPE_BROKER = 1
_ENDPOINT_TYPE_NAMES = {1: "BROKER", 2: "CONTROLLER"}
# Kafka's max.request.partition.size.limit default: the cap on DescribeTopicPartitions' page.
MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000
INVALID_OFFSET_LAG = -1
ELECTION_PREFERRED = 0
ELECTION_UNCLEAN = 1
_ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."
_NO_REASSIGNMENT_MESSAGE = "No partition reassignment is in progress."


# --- DescribeCluster (60) ---------------------------------------------------------------------


async def handle_describe_cluster(svc: Services, ctx: RequestContext, req: Any) -> DescribeClusterResponse:
    endpoint_type = int(getattr(req, "endpoint_type", ENDPOINT_TYPE_BROKER))
    base: DescribeClusterResponse = {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
                                     "endpoint_type": endpoint_type, "cluster_id": svc.store.cluster_id or "",
                                     "controller_id": -1, "brokers": [],
                                     "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}
    if endpoint_type not in _ENDPOINT_TYPE_NAMES:
        base.update({"error_code": ErrorCode.unsupported_endpoint_type,
                     "error_message": f"Unsupported endpoint type {endpoint_type}"})
        return base
    if endpoint_type != ENDPOINT_TYPE_BROKER:
        base.update({"error_code": ErrorCode.mismatched_endpoint_type,
                     "error_message": "The request was sent to an endpoint of type BROKER, but we wanted an endpoint "
                                      f"of type {_ENDPOINT_TYPE_NAMES[endpoint_type]}"})
        return base
    brokers: list[DescribeClusterBroker] = [{"broker_id": broker_id, "host": host, "port": port, "rack": rack}
                                            for broker_id, host, port, rack in live_endpoints(svc, ctx.listener)]
    base.update({
        "brokers": brokers,
        "controller_id": svc.store.controller_id(),
        "cluster_authorized_operations": _cluster_operations(ctx, bool(req.include_cluster_authorized_operations)),
    })
    return base


def _cluster_operations(ctx: RequestContext, requested: bool) -> int:
    """As Kafka: DescribeCluster itself needs no ACL, but its operations field is 0 without DESCRIBE."""
    if requested and not cluster_allowed(ctx, AclOperation.DESCRIBE):
        return 0
    return maybe_authorized_operations(requested, ResourceType.CLUSTER, CLUSTER_NAME, ctx)


# --- DescribeTopicPartitions (75) -------------------------------------------------------------


def _describe_topic_error(name: str, code: ErrorCode) -> DescribeTopicPartitionsResponseTopic:
    return {"error_code": code, "name": name, "topic_id": ZERO_UUID, "is_internal": False, "partitions": [],
            "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}


def _describe_topic(svc: Services, rec: TopicRecord, start: int, limit: int,
                    ctx: RequestContext | None = None) -> tuple[DescribeTopicPartitionsResponseTopic, int]:
    """One topic's partitions from ``start``, at most ``limit``; returns it and the next index or -1."""
    md = topic_metadata(svc, rec)
    count = len(md["partitions"])
    upper = min(count, start + limit)
    parts: list[DescribeTopicPartitionsResponsePartition] = [
        {**p, "eligible_leader_replicas": (), "last_known_elr": ()}
        for p in (md["partitions"][start:upper] if start < count else [])]
    topic: DescribeTopicPartitionsResponseTopic = {
        "error_code": md["error_code"], "name": md["name"], "topic_id": md["topic_id"],
        "is_internal": md["is_internal"], "partitions": parts,
        "topic_authorized_operations": authorized_operations(ResourceType.TOPIC, rec.name, ctx=ctx)}
    return topic, (upper if upper < count else -1)


async def handle_describe_topic_partitions(svc: Services, ctx: RequestContext, req: Any
                                           ) -> DescribeTopicPartitionsResponse:
    cursor = req.cursor
    requested = [t.name for t in req.topics]
    fetch_all = not requested
    if cursor is not None and (cursor.partition_index < 0 or (not fetch_all and cursor.topic_name not in requested)):
        # Kafka throws InvalidRequestException; its error response carries the code for every topic.
        return {"throttle_time": 0, "next_cursor": None,
                "topics": [_describe_topic_error(n, ErrorCode.invalid_request) for n in sorted(set(requested))]}
    names = sorted(svc.store.topics()) if fetch_all else sorted(set(requested))
    if cursor is not None:
        names = [n for n in names if n >= cursor.topic_name]
    remaining = min(int(req.response_partition_limit), MAX_REQUEST_PARTITION_SIZE_LIMIT)
    topics: list[DescribeTopicPartitionsResponseTopic] = []
    refused: list[DescribeTopicPartitionsResponseTopic] = []  # Kafka lists them after the described topics
    next_cursor: Cursor | None = None
    enforced = ctx.authorizer is not None
    for name in names:
        if remaining <= 0:
            # The page is full at a topic boundary: the next page starts with this topic.
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        if enforced and not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, name, log_denial=not fetch_all):
            # Refused before existence is checked (no disclosure); silently left out of a listing of all.
            if not fetch_all:
                refused.append(_describe_topic_error(name, ErrorCode.topic_authorization_failed))
            continue
        rec = svc.store.topic(name)
        if rec is None:
            if not fetch_all:
                code = ErrorCode.invalid_topic_exception if topic_name_problem(name) else \
                    ErrorCode.unknown_topic_or_partition
                topics.append(_describe_topic_error(name, code))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        md, nxt = _describe_topic(svc, rec, start, remaining, ctx)
        topics.append(md)
        if nxt != -1:
            next_cursor = {"topic_name": name, "partition_index": nxt}
            break
        remaining -= len(md["partitions"])
    topics.extend(refused)
    return {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor}


# --- DescribeLogDirs (35) ---------------------------------------------------------------------


def _disk_space(path: Path) -> tuple[int, int]:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def _cluster_refused_message(ctx: RequestContext) -> str:
    return f"Request {ctx.api_name} is not authorized."


async def handle_describe_log_dirs(svc: Services, ctx: RequestContext, req: Any) -> DescribeLogDirsResponse:
    if not cluster_allowed(ctx, AclOperation.DESCRIBE):  # v3+ carry the code; before, an empty answer
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed, "results": []}
    lm = svc.replicas.log_manager
    wanted: set[tuple[str, int]] | None = None
    if req.topics is not None:
        wanted = {(t.topic, p) for t in req.topics for p in t.partitions}
    offline = lm.failure_channel.offline_dirs()
    by_dir = lm.replicas_by_dir()
    results: list[DescribeLogDirsResult] = []
    for d in lm.log_dirs:
        path = str(d.absolute())
        if d in offline:
            results.append({"error_code": ErrorCode.kafka_storage_error, "log_dir": path, "topics": [],
                            "total_bytes": -1, "usable_bytes": -1})
            continue
        try:
            total, usable = _disk_space(d)
        except OSError:
            results.append({"error_code": ErrorCode.kafka_storage_error, "log_dir": path, "topics": [],
                            "total_bytes": -1, "usable_bytes": -1})
            continue
        by_topic: dict[str, list[DescribeLogDirsPartition]] = {}
        for r in by_dir.get(d, []):
            topic, index = r.tp
            # As Kafka: a topic with a log here is listed even when none of its partitions was asked for.
            parts = by_topic.setdefault(topic, [])
            if wanted is not None and r.tp not in wanted:
                continue
            parts.append({"partition_index": index, "partition_size": r.size,
                          "offset_lag": _offset_lag(svc, topic, index, r.log_end_offset, r.is_future),
                          "is_future_key": r.is_future})
        topics: list[DescribeLogDirsTopic] = [{"name": t, "partitions": sorted(by_topic[t], key=_by_partition_index)}
                                              for t in sorted(by_topic)]
        results.append({"error_code": ErrorCode.none, "log_dir": path, "topics": topics,
                        "total_bytes": total, "usable_bytes": usable})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "results": results}


def _by_partition_index(entry: DescribeLogDirsPartition) -> int:
    return int(entry["partition_index"])


def _offset_lag(svc: Services, topic: str, index: int, log_end_offset: int, is_future: bool) -> int:
    p = svc.replicas.partition(topic, index)
    if p is None or p.offline:
        return INVALID_OFFSET_LAG
    if is_future:
        return p.log.log_end_offset - log_end_offset
    return max(p.high_watermark - log_end_offset, 0)


# --- AlterReplicaLogDirs (34) -----------------------------------------------------------------


async def handle_alter_replica_log_dirs(svc: Services, ctx: RequestContext, req: Any
                                        ) -> AlterReplicaLogDirsResponse:
    if not cluster_allowed(ctx, AclOperation.ALTER):  # every partition of the request refused, as sent
        return {"throttle_time": 0, "results": [
            {"topic_name": t.name, "partitions": [{"partition_index": int(i),
                                                   "error_code": ErrorCode.cluster_authorization_failed}
                                                  for i in t.partitions]}
            for d in req.dirs for t in d.topics]}
    lm = svc.replicas.log_manager
    # Like Kafka, a partition named under several dirs goes to the last one.
    targets: dict[tuple[str, int], str] = {}
    for d in req.dirs:
        for t in d.topics:
            for index in t.partitions:
                targets.pop((t.name, index), None)
                targets[(t.name, index)] = d.path
    results: dict[str, list[AlterReplicaLogDirPartitionResult]] = {}
    for (topic, index), path in targets.items():
        target = lm.find_log_dir(path)
        code = ErrorCode.log_dir_not_found if target is None else svc.replicas.alter_log_dir(topic, index, target)
        results.setdefault(topic, []).append({"partition_index": index, "error_code": code})
    return {"throttle_time": 0,
            "results": [{"topic_name": t, "partitions": ps} for t, ps in results.items()]}


# --- ElectLeaders (43) ------------------------------------------------------------------------


def _elect(svc: Services, topic: str, index: int, election_type: int) -> tuple[ErrorCode, str | None]:
    rec = svc.store.topic(topic)
    if rec is None:
        return ErrorCode.unknown_topic_or_partition, f"No such topic as {topic}"
    a = rec.partitions.get(index)
    if a is None:
        return ErrorCode.unknown_topic_or_partition, f"No such partition as {topic}-{index}"
    has_leader = a.leader >= 0 and not (a.leader == svc.broker_id and svc.replicas.is_offline(topic, index))
    if election_type == ELECTION_PREFERRED and has_leader and a.replicas and a.leader == a.replicas[0]:
        return ErrorCode.election_not_needed, _ELECTION_NOT_NEEDED_MESSAGE
    if election_type == ELECTION_UNCLEAN and has_leader:
        return ErrorCode.election_not_needed, _ELECTION_NOT_NEEDED_MESSAGE
    # The only replica is this broker: its dir is offline, so no replica can lead.
    if election_type == ELECTION_PREFERRED:
        return ErrorCode.preferred_leader_not_available, "The preferred leader was not available."
    return ErrorCode.eligible_leaders_not_available, "Eligible topic partition leaders are not available."


def _elect_in_cluster(svc: Services, topic: str, index: int, election_type: int
                      ) -> tuple[ErrorCode, str | None] | None:
    """What ZooKeeper-mode Kafka answers without electing, or None when the controller must elect."""
    rec = svc.store.topic(topic)
    if rec is None:
        return ErrorCode.unknown_topic_or_partition, f"No such topic as {topic}"
    a = rec.partitions.get(index)
    if a is None:
        return ErrorCode.unknown_topic_or_partition, f"No such partition as {topic}-{index}"
    live = svc.store.live_brokers()
    if election_type == ELECTION_PREFERRED:
        preferred = a.replicas[0] if a.replicas else -1
        if a.leader == preferred and preferred in live:
            return ErrorCode.election_not_needed, _ELECTION_NOT_NEEDED_MESSAGE
        if preferred not in live or preferred not in a.isr:
            return ErrorCode.preferred_leader_not_available, (
                f"Failed to elect leader for partition {topic}-{index} under strategy "
                "PreferredReplicaPartitionLeaderElectionStrategy")
        return None
    if a.leader in live:
        return ErrorCode.election_not_needed, _ELECTION_NOT_NEEDED_MESSAGE
    if not any(b in live for b in a.replicas):
        return ErrorCode.eligible_leaders_not_available, (
            f"Failed to elect leader for partition {topic}-{index} under strategy "
            "UncleanPartitionLeaderElectionStrategy")
    return None


def _elected(svc: Services, topic: str, index: int, election_type: int) -> bool:
    rec = svc.store.topic(topic)
    a = rec.partitions.get(index) if rec is not None else None
    if a is None:
        return True  # deleted meanwhile: nothing left to wait for
    live = svc.store.live_brokers()
    if election_type == ELECTION_PREFERRED:
        return bool(a.replicas) and a.leader == a.replicas[0] and a.leader in live
    return a.leader in live


async def _elect_leaders_in_cluster(svc: Services, req: Any, election_type: int) -> ElectLeadersResponse:
    """Precompute the answers Kafka gives without an election, ask the controller for the rest
    (``/pykbroker/elections``) and wait, within the request's timeout, until this broker sees them."""
    results: dict[str, list[PartitionResult]] = {}
    todo: list[tuple[str, int, PartitionResult]] = []
    if req.topic_partitions is None:
        wanted = [(name, index) for name, rec in sorted(svc.store.topics().items()) for index in sorted(rec.partitions)]
    else:
        wanted = [(t.topic, int(index)) for t in req.topic_partitions for index in t.partitions]
    for topic, index in wanted:
        answer = _elect_in_cluster(svc, topic, index, election_type)
        entry: PartitionResult = {"partition_id": index, "error_code": ErrorCode.none, "error_message": None}
        if answer is not None:
            if req.topic_partitions is None and answer[0] == ErrorCode.election_not_needed:
                continue  # as Kafka: "all partitions" lists only those it tried
            entry["error_code"], entry["error_message"] = answer
        else:
            todo.append((topic, index, entry))
        results.setdefault(topic, []).append(entry)
    if todo:
        try:
            await run_store(svc.store, svc.store.request_election,  # type: ignore[attr-defined]
                            [(t, i) for t, i, _ in todo], election_type)
        except StoreUnavailable:
            for _, _, entry in todo:
                entry["error_code"], entry["error_message"] = ErrorCode.request_timed_out, None
            todo = []
        deadline = time.monotonic() + timeout_s(timeout_ms_of(req.timeout))
        for topic, index, entry in todo:
            if not await svc.topics.wait_until(functools.partial(_elected, svc, topic, index, election_type),
                                               deadline - time.monotonic()):
                entry["error_code"], entry["error_message"] = ErrorCode.request_timed_out, None
    return {"throttle_time": 0, "error_code": ErrorCode.none,
            "replica_election_results": [{"topic": t, "partition_result": r} for t, r in results.items()]}


async def handle_elect_leaders(svc: Services, ctx: RequestContext, req: Any) -> ElectLeadersResponse:
    if not cluster_allowed(ctx, AclOperation.ALTER):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                "replica_election_results": [
                    {"topic": t.topic, "partition_result": [
                        {"partition_id": int(i), "error_code": ErrorCode.cluster_authorization_failed,
                         "error_message": None} for i in t.partitions]}
                    for t in req.topic_partitions or ()]}
    election_type = int(getattr(req, "election_type", ELECTION_PREFERRED)) if ctx.version >= 1 else ELECTION_PREFERRED
    if election_type not in (ELECTION_PREFERRED, ELECTION_UNCLEAN):
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request, "replica_election_results": []}
    if svc.store.is_cluster():
        return await _elect_leaders_in_cluster(svc, req, election_type)
    results: dict[str, list[PartitionResult]] = {}
    if req.topic_partitions is None:
        # Every partition; those that already have the desired leader are left out, as in Kafka.
        for name, rec in sorted(svc.store.topics().items()):
            for index in sorted(rec.partitions):
                code, message = _elect(svc, name, index, election_type)
                if code != ErrorCode.election_not_needed:
                    results.setdefault(name, []).append(
                        {"partition_id": index, "error_code": code, "error_message": message})
    else:
        for t in req.topic_partitions:
            for index in t.partitions:
                code, message = _elect(svc, t.topic, index, election_type)
                results.setdefault(t.topic, []).append(
                    {"partition_id": index, "error_code": code, "error_message": message})
    return {"throttle_time": 0, "error_code": ErrorCode.none,
            "replica_election_results": [{"topic": t, "partition_result": r} for t, r in results.items()]}


# --- AlterPartitionReassignments (45) / ListPartitionReassignments (46) ------------------------


def _reassign(svc: Services, topic: str, index: int, replicas: tuple[int, ...] | None, *,
             cluster: bool = False) -> tuple[ErrorCode, str | None]:
    rec = svc.store.topic(topic)
    if rec is None:
        return ErrorCode.unknown_topic_or_partition, f"Unable to find a topic named {topic}."
    a = rec.partitions.get(index)
    if a is None:
        return ErrorCode.unknown_topic_or_partition, f"Unable to find partition {topic}:{index}."
    if replicas is None:
        # Nothing can be in progress on one broker; a cluster may be adding or removing replicas.
        if cluster and (a.adding_replicas or a.removing_replicas):
            return ErrorCode.none, None
        return ErrorCode.no_reassignment_in_progress, _NO_REASSIGNMENT_MESSAGE
    if not replicas:
        return ErrorCode.invalid_replica_assignment, \
            "The manual partition assignment includes an empty replica list."
    live = svc.store.live_brokers()
    previous: int | None = None
    for b in sorted(replicas):  # Kafka checks in broker id order: registered, then not repeated
        if b not in live:
            return ErrorCode.invalid_replica_assignment, \
                f"The manual partition assignment includes broker {b}, but no such broker is registered."
        if b == previous:
            return ErrorCode.invalid_replica_assignment, \
                f"The manual partition assignment includes the broker {b} more than once."
        previous = b
    # One broker: the target is the current assignment, nothing to move. A cluster writes it.
    return ErrorCode.none, None


async def handle_alter_partition_reassignments(svc: Services, ctx: RequestContext, req: Any
                                               ) -> AlterPartitionReassignmentsResponse:
    if not cluster_allowed(ctx, AclOperation.ALTER):
        refused = _cluster_refused_message(ctx)
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed, "error_message": refused,
                "responses": [{"name": t.name, "partitions": [
                    {"partition_index": int(p.partition_index), "error_code": ErrorCode.cluster_authorization_failed,
                     "error_message": refused} for p in t.partitions]} for t in req.topics]}
    cluster = svc.store.is_cluster()
    responses: list[ReassignableTopicResponse] = []
    moves: dict[tuple[str, int], list[int] | None] = {}
    accepted: list[ReassignablePartitionResponse] = []
    for t in req.topics:
        parts: list[ReassignablePartitionResponse] = []
        for p in t.partitions:
            index = int(p.partition_index)
            target = None if p.replicas is None else tuple(int(b) for b in p.replicas)
            code, message = _reassign(svc, t.name, index, target, cluster=cluster)
            entry: ReassignablePartitionResponse = {"partition_index": index, "error_code": code,
                                                    "error_message": message}
            parts.append(entry)
            if cluster and code == ErrorCode.none:
                moves[(t.name, index)] = None if target is None else list(target)
                accepted.append(entry)
        responses.append({"name": t.name, "partitions": parts})
    if moves:
        try:
            await run_store(svc.store, svc.store.alter_reassignments, moves)  # type: ignore[attr-defined]
        except StoreUnavailable:
            for entry in accepted:
                entry["error_code"], entry["error_message"] = ErrorCode.request_timed_out, None
        except (UnknownTopic, KeyError) as e:  # deleted between the check and the write
            for entry in accepted:
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
                entry["error_message"] = f"Unable to find a topic named {e}."
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "responses": responses}


async def handle_list_partition_reassignments(svc: Services, ctx: RequestContext, req: Any
                                              ) -> ListPartitionReassignmentsResponse:
    if not cluster_allowed(ctx, AclOperation.DESCRIBE):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                "error_message": _cluster_refused_message(ctx),
                "topics": [{"name": t.name, "partitions": [
                    {"partition_index": int(i), "replicas": [], "adding_replicas": [], "removing_replicas": []}
                    for i in t.partition_indexes]} for t in req.topics or ()]}
    """Reassignments in progress (adding or removing replicas in the assignment); none on one broker."""
    topics: list[OngoingTopicReassignment] = []
    wanted: dict[str, set[int] | None]
    if req.topics is None:
        wanted = dict.fromkeys(sorted(svc.store.topics()))
    else:
        wanted = {t.name: {int(i) for i in t.partition_indexes} for t in req.topics}
    try:
        moving = await run_store(svc.store, svc.store.read_reassignments, list(wanted))
    except StoreUnavailable:
        return {"throttle_time": 0, "error_code": ErrorCode.request_timed_out,
                "error_message": "the metadata store did not answer", "topics": []}
    for name, indexes in wanted.items():
        parts: list[OngoingPartitionReassignment] = [
            {"partition_index": i, "replicas": replicas, "adding_replicas": adding, "removing_replicas": removing}
            for i, (replicas, adding, removing) in sorted(moving.get(name, {}).items())
            if indexes is None or i in indexes]
        if parts:
            topics.append({"name": name, "partitions": parts})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "topics": topics}


# --- OffsetForLeaderEpoch (23) ----------------------------------------------------------------


def _epoch_end_offset(svc: Services, topic: str, index: int, current_leader_epoch: int,
                      leader_epoch: int) -> EpochEndOffset:
    out: EpochEndOffset = {"partition": index, "error_code": ErrorCode.none,
                           "leader_epoch": UNDEFINED_EPOCH, "end_offset": UNDEFINED_EPOCH_OFFSET}
    p = svc.replicas.partition(topic, index)
    if p is None:
        rec = svc.store.topic(topic)
        if svc.replicas.is_offline(topic, index):
            out["error_code"] = ErrorCode.kafka_storage_error
        elif rec is None or index not in rec.partitions:
            out["error_code"] = ErrorCode.unknown_topic_or_partition
        else:
            out["error_code"] = ErrorCode.not_leader_or_follower
        return out
    if p.offline:
        out["error_code"] = ErrorCode.kafka_storage_error
        return out
    if current_leader_epoch != UNDEFINED_EPOCH:
        if current_leader_epoch < p.leader_epoch:
            out["error_code"] = ErrorCode.fenced_leader_epoch
            return out
        if current_leader_epoch > p.leader_epoch:
            out["error_code"] = ErrorCode.unknown_leader_epoch
            return out
    if p.leader_id != svc.broker_id:
        out["error_code"] = ErrorCode.not_leader_or_follower
        return out
    found = p.log.end_offset_for_epoch(leader_epoch)
    if found is not None:
        out["leader_epoch"], out["end_offset"] = found
    return out


async def handle_offset_for_leader_epoch(svc: Services, ctx: RequestContext, req: Any
                                        ) -> OffsetForLeaderEpochResponse:
    topics: list[OffsetForLeaderTopicResult] = []
    denied: frozenset[str] = frozenset()
    # Followers have CLUSTER_ACTION; consumers (KIP-320) need DESCRIBE on each topic.
    if ctx.authorizer is not None and not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION, log_denial=False):
        denied = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (t.topic for t in req.topics))
    for t in req.topics:
        if denied and t.topic in denied:
            topics.append({"topic": t.topic, "partitions": [
                {"partition": int(p.partition), "error_code": ErrorCode.topic_authorization_failed,
                 "leader_epoch": UNDEFINED_EPOCH, "end_offset": UNDEFINED_EPOCH_OFFSET} for p in t.partitions]})
            continue
        parts = [_epoch_end_offset(svc, t.topic, p.partition, int(p.current_leader_epoch), int(p.leader_epoch))
                 for p in t.partitions]
        topics.append({"topic": t.topic, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
