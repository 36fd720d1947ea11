"""Share group APIs (KIP-932): ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch, ShareAcknowledge, the
share group offsets admin APIs, and the share coordinator's inter-broker Read/Write/DeleteShareGroupState.

The state machines are in :mod:`pykbroker.coordinator.share`; this module turns requests into calls on
the broker's :class:`ShareCoordinator` and its answers into Kafka's responses.  With
``group.share.enable=false`` the APIs are not advertised and answer UNSUPPORTED_VERSION.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.internal_topic import now_ms
from pykbroker.coordinator.share import serde
from pykbroker.coordinator.share.persister import batches_body, batches_from
from pykbroker.coordinator.share.service import ShareCoordinator, SpKey
from pykbroker.coordinator.share.session import FINAL_EPOCH, INITIAL_EPOCH, TopicIdPartition
from pykbroker.protocol.responses.share import (
    AlterShareGroupOffsetsResponse,
    AlterShareGroupOffsetsResponsePartition,
    AlterShareGroupOffsetsResponseTopic,
    DeleteShareGroupOffsetsResponse,
    DeleteShareGroupOffsetsResponseTopic,
    DeleteShareGroupStateResponse,
    DescribedGroup,
    DescribeShareGroupOffsetsResponse,
    DescribeShareGroupOffsetsResponseGroup,
    DescribeShareGroupOffsetsResponsePartition,
    DescribeShareGroupOffsetsResponseTopic,
    LeaderIdAndEpoch,
    ReadShareGroupStatePartitionResult,
    ReadShareGroupStateResponse,
    ReadStateResult,
    ShareAcknowledgePartitionData,
    ShareAcknowledgeResponse,
    ShareFetchPartitionData,
    ShareFetchResponse,
    ShareGroupDescribeResponse,
    ShareGroupHeartbeatAssignment,
    ShareGroupHeartbeatResponse,
    WriteShareGroupStateResponse,
    WriteStateResult,
)
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.authz import allowed, cluster_allowed, denied_names
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services


def _shares(svc: Services) -> ShareCoordinator | None:
    return svc.shares


def _client_host(ctx: RequestContext) -> str:
    return "/" + (ctx.peer.rsplit(":", 1)[0] if ctx.peer else "")


def _not_coordinator(svc: Services, group_id: str) -> bool:
    gc = svc.groups
    if gc is None:
        return False
    node = gc.coordinator_node(group_id)
    return node is not None and node != svc.broker_id


def _coordinator_error(svc: Services, group_id: str) -> ErrorCode:
    """NOT_COORDINATOR unless this broker leads the group's offsets partition and has replayed it
    (COORDINATOR_LOAD_IN_PROGRESS meanwhile): share groups live with the group coordinator, as in Kafka."""
    gc = svc.groups
    if gc is None:
        return ErrorCode.none
    if gc.coordinator_node(group_id) != svc.broker_id:
        return ErrorCode.not_coordinator
    state = gc.manager.partitions.get(gc.partition_for(group_id))
    if state is None:
        return ErrorCode.not_coordinator
    return ErrorCode.none if state == "active" else ErrorCode.coordinator_load_in_progress


def _is_coordinator(svc: Services, group_id: str) -> bool:
    return _coordinator_error(svc, group_id) == ErrorCode.none


async def _write_group_records(svc: Services, shares: ShareCoordinator) -> None:
    """Membership changed: persist the share groups' epochs in __consumer_offsets before answering."""
    gc = svc.groups
    for gid in shares.write_group_records():
        if gc is not None:
            await gc.flush(gid)


# --- ShareGroupHeartbeat / ShareGroupDescribe ----------------------------------------------------------

def _hb_error(code: ErrorCode, message: str | None = None) -> ShareGroupHeartbeatResponse:
    return {"throttle_time": 0, "error_code": code, "error_message": message, "member_id": None,
            "member_epoch": -1, "heartbeat_interval": 0, "assignment": None}


async def handle_share_group_heartbeat(svc: Services, ctx: RequestContext, req: Any
                                       ) -> ShareGroupHeartbeatResponse:
    shares = _shares(svc)
    if shares is None:
        return _hb_error(ErrorCode.unsupported_version)
    if not allowed(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id):
        return _hb_error(ErrorCode.group_authorization_failed)
    names = list(req.subscribed_topic_names or ())
    if names and denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, names):
        return _hb_error(ErrorCode.topic_authorization_failed)
    code = _coordinator_error(svc, req.group_id)
    if code != ErrorCode.none:
        return _hb_error(code)
    if svc.groups is not None and req.group_id in svc.groups.manager.groups:
        return _hb_error(ErrorCode.group_id_not_found, f"Group {req.group_id} is not a share group.")
    g = shares.group_config(req.group_id)
    subscribed = tuple(req.subscribed_topic_names) if req.subscribed_topic_names is not None else None
    res = shares.groups.heartbeat(req.group_id, req.member_id, int(req.member_epoch), req.rack_id, subscribed,
                                  g["share.session.timeout.ms"], ctx.header.client_id or "", _client_host(ctx))
    shares.timers_changed()
    if res.error != ErrorCode.none:
        return _hb_error(res.error, res.message)
    await _write_group_records(svc, shares)
    await shares.flush()  # a leaving member's released records were persisted
    assignment: ShareGroupHeartbeatAssignment | None = None
    if res.assignment is not None:
        assignment = {"topic_partitions": [{"topic_id": tid, "partitions": sorted(parts)}
                                           for tid, parts in sorted(res.assignment.items(), key=lambda x: str(x[0]))]}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "member_id": req.member_id,
            "member_epoch": res.member_epoch, "heartbeat_interval": g["share.heartbeat.interval.ms"],
            "assignment": assignment}


async def handle_share_group_describe(svc: Services, ctx: RequestContext, req: Any) -> ShareGroupDescribeResponse:
    shares = _shares(svc)
    out: list[DescribedGroup] = []
    for gid in req.group_ids:
        entry: DescribedGroup = {"error_code": ErrorCode.none, "error_message": None, "group_id": gid,
                                 "group_state": "Dead", "group_epoch": -1, "assignment_epoch": -1,
                                 "assignor_name": "simple", "members": [], "authorized_operations": -2147483648}
        out.append(entry)
        if shares is None:
            entry["error_code"] = ErrorCode.unsupported_version
            continue
        if not allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, gid):
            entry["error_code"] = ErrorCode.group_authorization_failed
            continue
        code = _coordinator_error(svc, gid)
        if code != ErrorCode.none:
            entry["error_code"] = code
            continue
        g = shares.groups.groups.get(gid)
        if g is None:
            entry["error_code"] = ErrorCode.group_id_not_found
            entry["error_message"] = f"Group {gid} not found."
            continue
        names = {rec.topic_id: name for name, rec in svc.store.topics().items()}
        entry.update({"group_state": g.state, "group_epoch": g.group_epoch, "assignment_epoch": g.assignment_epoch})
        entry["members"] = [
            {"member_id": m.member_id, "rack_id": m.rack_id, "member_epoch": m.member_epoch,
             "client_id": m.client_id, "client_host": m.client_host, "subscribed_topic_names": list(m.subscribed),
             "assignment": {"topic_partitions": [
                 {"topic_id": tid, "topic_name": names.get(tid, ""), "partitions": sorted(parts)}
                 for tid, parts in m.assignment.items() if tid in names]}}
            for m in g.members.values()]
    return {"throttle_time": 0, "groups": out}


# --- ShareFetch / ShareAcknowledge ---------------------------------------------------------------------

def _leader(svc: Services, name: str | None, idx: int) -> LeaderIdAndEpoch:
    p = svc.replicas.partition(name, idx) if name is not None else None
    if p is None:
        return {"leader_id": -1, "leader_epoch": -1}
    return {"leader_id": p.leader_id, "leader_epoch": p.leader_epoch}


def _partition_error(svc: Services, ctx: RequestContext, name: str | None, idx: int) -> ErrorCode:
    if name is None:
        return ErrorCode.unknown_topic_id
    if not allowed(ctx, AclOperation.READ, ResourceType.TOPIC, name):
        return ErrorCode.topic_authorization_failed
    p = svc.replicas.partition(name, idx)
    if p is None:
        return ErrorCode.kafka_storage_error if svc.replicas.is_offline(name, idx) else \
            ErrorCode.unknown_topic_or_partition
    if p.log.offline:
        return ErrorCode.kafka_storage_error
    if p.leader_id != svc.broker_id:
        return ErrorCode.not_leader_or_follower
    return ErrorCode.none


def _acks_by_partition(svc: Services, topics: Any) -> dict[TopicIdPartition, list[tuple[int, int, list[int]]]]:
    out: dict[TopicIdPartition, list[tuple[int, int, list[int]]]] = {}
    for t in topics:
        for part in t.partitions:
            batches = [(int(b.first_offset), int(b.last_offset), [int(x) for x in b.acknowledge_types])
                       for b in part.acknowledgement_batches]
            if batches:
                out.setdefault((t.topic_id, int(part.partition_index)), []).extend(batches)
    return out


def _apply_acks(svc: Services, ctx: RequestContext, shares: ShareCoordinator, group_id: str, member_id: str,
                acks: dict[TopicIdPartition, list[tuple[int, int, list[int]]]]) -> dict[TopicIdPartition, ErrorCode]:
    results: dict[TopicIdPartition, ErrorCode] = {}
    for (tid, idx), batches in acks.items():
        rec = svc.store.topic_by_id(tid)
        name = rec.name if rec is not None else None
        code = _partition_error(svc, ctx, name, idx)
        if code == ErrorCode.none and name is not None:
            code = shares.acknowledge(group_id, member_id, name, idx, batches)
        results[(tid, idx)] = code
    return results


def _unwritten(svc: Services, group_id: str, results: dict[TopicIdPartition, ErrorCode],
               failed: dict[SpKey, ErrorCode]) -> None:
    """Acknowledgements whose state did not reach the share coordinator are answered with its error."""
    if not failed:
        return
    for (tid, idx), code in list(results.items()):
        rec = svc.store.topic_by_id(tid)
        err = failed.get((group_id, rec.name, idx)) if rec is not None else None
        if code == ErrorCode.none and err is not None:
            results[(tid, idx)] = err


def _release_session(shares: ShareCoordinator, group_id: str, member_id: str) -> None:
    """A closed share session gives back what its member still holds (KIP-932)."""
    shares.release_member(group_id, member_id)


def _top(code: ErrorCode, message: str | None = None, lock_ms: int = 0) -> ShareFetchResponse:
    """A ShareFetch answer without partitions."""
    return {"throttle_time": 0, "error_code": code, "error_message": message,
            "acquisition_lock_timeout": lock_ms, "responses": [], "node_endpoints": []}


def _ack_top(code: ErrorCode, message: str | None = None, lock_ms: int = 0) -> ShareAcknowledgeResponse:
    """A ShareAcknowledge answer without partitions (the fields of ``_top``'s)."""
    return {"throttle_time": 0, "error_code": code, "error_message": message,
            "acquisition_lock_timeout": lock_ms, "responses": [], "node_endpoints": []}


class _Refused(NamedTuple):
    code: ErrorCode
    message: str | None = None


def _admit(svc: Services, ctx: RequestContext, req: Any) -> tuple[ShareCoordinator, str, str, int] | _Refused:
    """The checks ShareFetch and ShareAcknowledge begin with: share groups served, group and member ids
    given, READ on the group. (coordinator, group id, member id, lock duration), or the refusal."""
    shares = _shares(svc)
    if shares is None:
        return _Refused(ErrorCode.unsupported_version)
    group_id, member_id = req.group_id or "", req.member_id or ""
    if not group_id or not member_id:
        return _Refused(ErrorCode.invalid_request, "GroupId and MemberId must be set.")
    if not allowed(ctx, AclOperation.READ, ResourceType.GROUP, group_id):
        return _Refused(ErrorCode.group_authorization_failed)
    return shares, group_id, member_id, shares.limits(group_id).lock_duration_ms


async def handle_share_fetch(svc: Services, ctx: RequestContext, req: Any) -> ShareFetchResponse:
    admitted = _admit(svc, ctx, req)
    if isinstance(admitted, _Refused):
        return _top(admitted.code, admitted.message)
    shares, group_id, member_id, lock_ms = admitted

    def top(code: ErrorCode, message: str | None = None) -> ShareFetchResponse:
        return _top(code, message, lock_ms)

    epoch = int(req.share_session_epoch)
    code = shares.sessions.check(group_id, member_id, epoch)
    if code != ErrorCode.none:
        return top(code)
    acks = _acks_by_partition(svc, req.topics)
    if epoch == INITIAL_EPOCH and acks:
        return top(ErrorCode.invalid_request, "Acknowledgements are not allowed when opening a share session.")
    if epoch != FINAL_EPOCH and _is_coordinator(svc, group_id) and not shares.groups.is_member(group_id, member_id):
        # Membership is known where the group is coordinated; other share-partition leaders serve sessions.
        return top(ErrorCode.unknown_member_id)
    requested = [(t.topic_id, int(p.partition_index)) for t in req.topics for p in t.partitions]
    if epoch == INITIAL_EPOCH:
        session = shares.sessions.open(group_id, member_id)
        session.partitions = list(dict.fromkeys(requested))
    else:
        found = shares.sessions.get(group_id, member_id)
        assert found is not None
        session = found
        forgotten = {(t.topic_id, int(p)) for t in req.forgotten_topics_data for p in t.partitions}
        session.partitions = [tp for tp in dict.fromkeys(session.partitions + requested) if tp not in forgotten]
    ack_results = _apply_acks(svc, ctx, shares, group_id, member_id, acks)
    if epoch == FINAL_EPOCH:
        shares.sessions.close(group_id, member_id)
        _release_session(shares, group_id, member_id)
    else:
        shares.sessions.advance(session)
    if ack_results:  # durable before the long poll, not after it
        _unwritten(svc, group_id, ack_results, await shares.flush())
    results: dict[TopicIdPartition, ShareFetchPartitionData] = {}
    max_records = int(req.max_records) if epoch != FINAL_EPOCH else 0
    if max_records > 0:
        await _fetch(svc, ctx, shares, req, group_id, member_id, session.partitions, max_records, results)
    await shares.flush()  # states started or archived while fetching
    if epoch == FINAL_EPOCH:
        shares.evict_if_idle(group_id)
    for tp, c in ack_results.items():
        entry = results.setdefault(tp, _entry(svc, tp, ErrorCode.none))
        entry["acknowledge_error_code"] = c
    by_topic: dict[uuid.UUID, list[ShareFetchPartitionData]] = {}
    for (tid, _), entry in results.items():
        by_topic.setdefault(tid, []).append(entry)
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
            "acquisition_lock_timeout": lock_ms,
            "responses": [{"topic_id": tid, "partitions": parts} for tid, parts in by_topic.items()],
            "node_endpoints": []}


def _entry(svc: Services, tp: TopicIdPartition, code: ErrorCode) -> ShareFetchPartitionData:
    rec = svc.store.topic_by_id(tp[0])
    return {"partition_index": tp[1], "error_code": code, "error_message": None, "acknowledge_error_code": 0,
            "acknowledge_error_message": None, "current_leader": _leader(svc, rec.name if rec else None, tp[1]),
            "records": b"", "acquired_records": []}


async def _fetch(svc: Services, ctx: RequestContext, shares: ShareCoordinator, req: Any, group_id: str,
                 member_id: str, partitions: list[TopicIdPartition], max_records: int,
                 results: dict[TopicIdPartition, ShareFetchPartitionData]) -> None:
    """Acquire records from the session's partitions, long-polling up to max_wait for some to arrive."""
    wait = req.max_wait
    wait_s = wait.total_seconds() if hasattr(wait, "total_seconds") else int(wait) / 1000
    deadline = anyio.current_time() + max(wait_s, 0.0)
    max_bytes = min(max(int(req.max_bytes), 0), svc.config["fetch.max.bytes"])
    while True:
        remaining = max_records
        tps: list[tuple[str, int]] = []
        got_any = False
        for tid, idx in partitions:
            rec = svc.store.topic_by_id(tid)
            name = rec.name if rec is not None else None
            code = _partition_error(svc, ctx, name, idx)
            if code != ErrorCode.none or name is None:
                results[(tid, idx)] = _entry(svc, (tid, idx), code)
                got_any = True
                continue
            p = svc.replicas.partition(name, idx)
            assert p is not None
            tps.append((name, idx))
            if remaining <= 0 or max_bytes <= 0:
                continue
            sp = await shares.share_partition(group_id, name, tid, idx, p)
            if sp is None:
                continue  # its share coordinator cannot answer yet: nothing from this partition this time
            acquired, archived = shares.acquire(group_id, member_id, name, p, sp, remaining, max_bytes)
            if archived:
                shares.after_change(group_id, name, idx, sp, archived)
            if acquired.ranges:
                entry = results.setdefault((tid, idx), _entry(svc, (tid, idx), ErrorCode.none))
                entry["records"] = acquired.records
                entry["acquired_records"] = [{"first_offset": f, "last_offset": last, "delivery_count": c}
                                             for f, last, c in acquired.ranges]
                remaining -= sum(last - f + 1 for f, last, _ in acquired.ranges)
                max_bytes -= len(acquired.records)
                got_any = True
        shares.timers_changed()
        left = deadline - anyio.current_time()
        if got_any or left <= 0 or not tps or svc.shutting_down.is_set():
            return
        event = anyio.Event()
        svc.replicas.fetch_waiters.register(tps, event)
        shares.waiters.register(tps, event)
        try:
            with anyio.move_on_after(left):
                await event.wait()
        finally:
            svc.replicas.fetch_waiters.unregister(tps, event)
            shares.waiters.unregister(tps, event)


async def handle_share_acknowledge(svc: Services, ctx: RequestContext, req: Any) -> ShareAcknowledgeResponse:
    admitted = _admit(svc, ctx, req)
    if isinstance(admitted, _Refused):
        return _ack_top(admitted.code, admitted.message)
    shares, group_id, member_id, lock_ms = admitted

    def top(code: ErrorCode, message: str | None = None) -> ShareAcknowledgeResponse:
        return _ack_top(code, message, lock_ms)

    epoch = int(req.share_session_epoch)
    if epoch == INITIAL_EPOCH:
        return top(ErrorCode.invalid_share_session_epoch)
    code = shares.sessions.check(group_id, member_id, epoch)
    if code != ErrorCode.none:
        return top(code)
    acks = _acks_by_partition(svc, req.topics)
    results = _apply_acks(svc, ctx, shares, group_id, member_id, acks)
    if epoch == FINAL_EPOCH:
        shares.sessions.close(group_id, member_id)
        _release_session(shares, group_id, member_id)
    else:
        session = shares.sessions.get(group_id, member_id)
        if session is not None:
            shares.sessions.advance(session)
    _unwritten(svc, group_id, results, await shares.flush())
    if epoch == FINAL_EPOCH:
        shares.evict_if_idle(group_id)
    by_topic: dict[uuid.UUID, list[ShareAcknowledgePartitionData]] = {}
    for (tid, idx), c in results.items():
        rec = svc.store.topic_by_id(tid)
        by_topic.setdefault(tid, []).append({"partition_index": idx, "error_code": c, "error_message": None,
                                             "current_leader": _leader(svc, rec.name if rec else None, idx)})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
            "acquisition_lock_timeout": lock_ms,
            "responses": [{"topic_id": tid, "partitions": parts} for tid, parts in by_topic.items()],
            "node_endpoints": []}



# --- DescribeShareGroupOffsets / AlterShareGroupOffsets / DeleteShareGroupOffsets ----------------------

async def handle_describe_share_group_offsets(svc: Services, ctx: RequestContext, req: Any
                                              ) -> DescribeShareGroupOffsetsResponse:
    shares = _shares(svc)
    out: list[DescribeShareGroupOffsetsResponseGroup] = []
    for g in req.groups:
        gid = g.group_id
        topics: list[DescribeShareGroupOffsetsResponseTopic] = []
        entry: DescribeShareGroupOffsetsResponseGroup = {"group_id": gid, "topics": topics,
                                                         "error_code": ErrorCode.none, "error_message": None}
        out.append(entry)
        if shares is None:
            entry["error_code"] = ErrorCode.unsupported_version
            continue
        if not allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, gid):
            entry["error_code"] = ErrorCode.group_authorization_failed
            continue
        code = _coordinator_error(svc, gid)
        if code != ErrorCode.none:
            entry["error_code"] = code
            continue
        if g.topics is None:  # v1: every topic the group has state for
            ids = shares.state_topic_ids(gid)
            wanted = [(rec.name, list(rec.partitions)) for rec in svc.store.topics().values() if rec.topic_id in ids]
        else:
            wanted = [(t.topic_name, [int(p) for p in t.partitions]) for t in g.topics]
        for name, parts in sorted(wanted):
            rec = svc.store.topic(name)
            partitions: list[DescribeShareGroupOffsetsResponsePartition] = []
            topics.append({"topic_name": name, "topic_id": rec.topic_id if rec else uuid.UUID(int=0),
                           "partitions": partitions})
            denied = not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, name)
            for idx in sorted(parts):
                part: DescribeShareGroupOffsetsResponsePartition = {
                    "partition_index": idx, "start_offset": -1, "leader_epoch": -1, "lag": -1,
                    "error_code": ErrorCode.none, "error_message": None}
                partitions.append(part)
                if denied:
                    part["error_code"] = ErrorCode.topic_authorization_failed
                elif rec is None or idx not in rec.partitions:
                    part["error_code"] = ErrorCode.unknown_topic_or_partition
                else:
                    found = await shares.start_offset(gid, name, rec.topic_id, idx)
                    if found is not None:
                        part["start_offset"], part["lag"] = found
                        p = svc.replicas.partition(name, idx)
                        part["leader_epoch"] = p.leader_epoch if p is not None else -1
    return {"throttle_time": 0, "groups": out}


def _admin_refusal(svc: Services, ctx: RequestContext, shares: ShareCoordinator | None, group_id: str,
                   op: AclOperation) -> ErrorCode:
    if shares is None:
        return ErrorCode.unsupported_version
    if not allowed(ctx, op, ResourceType.GROUP, group_id):
        return ErrorCode.group_authorization_failed
    code = _coordinator_error(svc, group_id)
    if code != ErrorCode.none:
        return code
    if svc.groups is not None and group_id in svc.groups.manager.groups:
        return ErrorCode.group_id_not_found  # a classic or consumer group
    if shares.has_members(group_id):
        return ErrorCode.non_empty_group  # Kafka: offsets of a share group change only while it is empty
    return ErrorCode.none


async def handle_alter_share_group_offsets(svc: Services, ctx: RequestContext, req: Any
                                           ) -> AlterShareGroupOffsetsResponse:
    shares = _shares(svc)
    code = _admin_refusal(svc, ctx, shares, req.group_id, AclOperation.READ)
    if code != ErrorCode.none or shares is None:
        return {"throttle_time": 0, "error_code": code, "error_message": None, "responses": []}
    responses: list[AlterShareGroupOffsetsResponseTopic] = []
    for t in req.topics:
        rec = svc.store.topic(t.topic_name)
        denied = not allowed(ctx, AclOperation.READ, ResourceType.TOPIC, t.topic_name)
        parts: list[AlterShareGroupOffsetsResponsePartition] = []
        for pa in t.partitions:
            idx, offset = int(pa.partition_index), int(pa.start_offset)
            c = ErrorCode.none
            p = svc.replicas.partition(t.topic_name, idx)
            if denied:
                c = ErrorCode.topic_authorization_failed
            elif rec is None or p is None:
                c = ErrorCode.unknown_topic_or_partition
            elif not p.log.log_start_offset <= offset <= p.high_watermark:
                c = ErrorCode.invalid_request
            else:
                c = await shares.reset_start(req.group_id, t.topic_name, rec.topic_id, idx, offset)
            parts.append({"partition_index": idx, "error_code": c, "error_message": None})
        responses.append({"topic_name": t.topic_name, "topic_id": rec.topic_id if rec else uuid.UUID(int=0),
                          "partitions": parts})
    await shares.flush()
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "responses": responses}


async def handle_delete_share_group_offsets(svc: Services, ctx: RequestContext, req: Any
                                            ) -> DeleteShareGroupOffsetsResponse:
    shares = _shares(svc)
    code = _admin_refusal(svc, ctx, shares, req.group_id, AclOperation.DELETE)
    if code != ErrorCode.none or shares is None:
        return {"throttle_time": 0, "error_code": code, "error_message": None, "responses": []}
    responses: list[DeleteShareGroupOffsetsResponseTopic] = []
    for t in req.topics:
        rec = svc.store.topic(t.topic_name)
        c = ErrorCode.none
        if not allowed(ctx, AclOperation.READ, ResourceType.TOPIC, t.topic_name):
            c = ErrorCode.topic_authorization_failed
        elif rec is None:
            c = ErrorCode.unknown_topic_or_partition
        else:
            shares.delete_topic_state(req.group_id, t.topic_name, rec.topic_id, len(rec.partitions))
        responses.append({"topic_name": t.topic_name, "topic_id": rec.topic_id if rec else uuid.UUID(int=0),
                          "error_code": c, "error_message": None})
    await shares.flush()
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "responses": responses}


# --- ReadShareGroupState / WriteShareGroupState / DeleteShareGroupState (inter-broker) -------------------

def _state_refusal(svc: Services, ctx: RequestContext) -> ErrorCode:
    """Share-partition leaders call these; Kafka requires CLUSTER_ACTION (brokers have it)."""
    if svc.shares is None:
        return ErrorCode.unsupported_version
    if not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):
        return ErrorCode.cluster_authorization_failed
    return ErrorCode.none


def _state_results(req: Any, codes: dict[tuple[uuid.UUID, int], ErrorCode]) -> list[WriteStateResult]:
    return [{"topic_id": t.topic_id, "partitions": [
        {"partition": int(p.partition), "error_code": codes[(t.topic_id, int(p.partition))], "error_message": None}
        for p in t.partitions]} for t in req.topics]


async def handle_read_share_group_state(svc: Services, ctx: RequestContext, req: Any
                                        ) -> ReadShareGroupStateResponse:
    refused = _state_refusal(svc, ctx)
    results: list[ReadStateResult] = []
    for t in req.topics:
        parts: list[ReadShareGroupStatePartitionResult] = []
        for p in t.partitions:
            entry: ReadShareGroupStatePartitionResult = {
                "partition": int(p.partition), "error_code": refused, "error_message": None, "state_epoch": 0,
                "start_offset": -1, "state_batches": []}
            parts.append(entry)
            if refused != ErrorCode.none or svc.shares is None:
                continue
            key = serde.StateKey(req.group_id, t.topic_id, int(p.partition))
            code, snap = await svc.shares.state.read(key, int(p.leader_epoch))
            entry["error_code"] = code
            if snap is not None and code == ErrorCode.none:
                entry.update({"state_epoch": snap.state_epoch, "start_offset": snap.start_offset,
                              "state_batches": batches_body(snap.batches)})
        results.append({"topic_id": t.topic_id, "partitions": parts})
    return {"results": results}


async def handle_write_share_group_state(svc: Services, ctx: RequestContext, req: Any
                                         ) -> WriteShareGroupStateResponse:
    refused = _state_refusal(svc, ctx)
    codes: dict[tuple[uuid.UUID, int], ErrorCode] = {}
    items: list[tuple[serde.StateKey, serde.Snapshot | None]] = []
    for t in req.topics:
        for p in t.partitions:
            codes[(t.topic_id, int(p.partition))] = refused
            if refused == ErrorCode.none:
                try:
                    batches = batches_from(p.state_batches)
                except ValueError:  # an unknown delivery state
                    codes[(t.topic_id, int(p.partition))] = ErrorCode.invalid_request
                    continue
                items.append((serde.StateKey(req.group_id, t.topic_id, int(p.partition)),
                              serde.Snapshot(int(p.state_epoch), int(p.leader_epoch), int(p.start_offset), batches,
                                             now_ms())))
    if items and svc.shares is not None:
        for key, code in (await svc.shares.state.write(items)).items():
            codes[(key.topic_id, key.partition)] = code
    return {"results": _state_results(req, codes)}


async def handle_delete_share_group_state(svc: Services, ctx: RequestContext, req: Any
                                          ) -> DeleteShareGroupStateResponse:
    refused = _state_refusal(svc, ctx)
    codes = {(t.topic_id, int(p.partition)): refused for t in req.topics for p in t.partitions}
    if refused == ErrorCode.none and svc.shares is not None and codes:
        items: list[tuple[serde.StateKey, serde.Snapshot | None]] = [
            (serde.StateKey(req.group_id, tid, idx), None) for tid, idx in codes]
        for key, code in (await svc.shares.state.write(items)).items():
            codes[(key.topic_id, key.partition)] = code
    return {"results": _state_results(req, codes)}
