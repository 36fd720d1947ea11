"""The group APIs: FindCoordinator, Join/Sync/Heartbeat/LeaveGroup, offsets, and group admin."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.classic import ClassicGroup
from pykbroker.coordinator.group.classic_protocol import JoinRequest
from pykbroker.coordinator.group.manager import CommitEntry, GroupManager
from pykbroker.coordinator.services import CoordinatorServices
from pykbroker.coordinator.share.state_store import STATE_TOPIC
from pykbroker.metadata.store import StoreUnavailable
from pykbroker.protocol.responses.group import (
    ConsumerGroupDescribeDescribedGroup,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatResponse,
    Coordinator,
    DeleteGroupsResponse,
    DescribeGroupsDescribedGroup,
    DescribeGroupsResponse,
    FindCoordinatorResponse,
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    ListGroupsResponse,
    MemberResponse,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetDeleteResponse,
    OffsetFetchResponse,
    OffsetFetchResponseGroup,
    OffsetFetchResponsePartitions,
    OffsetFetchResponseTopics,
    SyncGroupResponse,
)
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.authz import allowed, authorized_operations, cluster_allowed, denied_names
from pykbroker.security.request import RequestContext

if TYPE_CHECKING:
    from pykbroker.coordinator.group.service import GroupCoordinator
    from pykbroker.coordinator.share.service import ShareCoordinator

log = logging.getLogger("pykbroker.groups")

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
AUTHORIZED_OPERATIONS_OMITTED = -2147483648
# How long DeleteGroups on a share group waits for __share_group_state's replay after a start.
SHARE_LOAD_WAIT_S = 10.0


def _ms(v: Any) -> int:
    if isinstance(v, datetime.timedelta):
        return int(v / datetime.timedelta(milliseconds=1))
    return int(v)


def _coordinator(svc: CoordinatorServices) -> GroupCoordinator | None:
    return getattr(svc, "groups", None)


def _manager(svc: CoordinatorServices) -> GroupManager:
    gc = _coordinator(svc)
    assert gc is not None, "the group coordinator is not running"
    return gc.manager


def _client_host(ctx: RequestContext) -> str:
    host = ctx.peer.rsplit(":", 1)[0] if ctx.peer else ""
    return "/" + host


R = TypeVar("R")


async def _await_callback(start: Callable[[Callable[[R], None]], None], timeout_s: float, on_timeout: R) -> R:
    box: list[R] = []
    done = anyio.Event()

    def cb(resp: R) -> None:
        if not box:
            box.append(resp)
            done.set()

    start(cb)
    if not box:
        with anyio.move_on_after(timeout_s):
            await done.wait()
    return box[0] if box else on_timeout


def _group_allowed(ctx: RequestContext, op: AclOperation, group_id: str) -> bool:
    return allowed(ctx, op, ResourceType.GROUP, group_id)


def _group_ops(ctx: RequestContext, group_id: str) -> int:
    return authorized_operations(ResourceType.GROUP, group_id, ctx=ctx)


# --- FindCoordinator ------------------------------------------------------------------------

def _log_end(svc: CoordinatorServices, group_id: str) -> int:
    gc = _coordinator(svc)
    return -1 if gc is None else gc.log_end(group_id)


async def _replicated(svc: CoordinatorServices, group_id: str, code: ErrorCode, end_before: int) -> ErrorCode:
    """``code`` once what the request wrote for the group is durable (fsync with log.flush.on.ack, and the
    ISR in a cluster), as Kafka answers only after its acks=all append; else the append's error.  A request
    that wrote nothing (``end_before`` is still the log end) is answered at once."""
    gc = _coordinator(svc)
    if gc is None or code != ErrorCode.none or gc.log_end(group_id) == end_before:
        return code
    return await gc.flush(group_id)


def _find_one(svc: CoordinatorServices, ctx: RequestContext, key: str, key_type: int) -> Coordinator:
    out: Coordinator = {"key": key, "node_id": -1, "host": "", "port": -1, "error_code": ErrorCode.none,
                           "error_message": None}
    if ctx.authorizer is not None and key_type in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
        # Kafka asks first: DESCRIBE on the group, or on the transactional id.
        is_txn = key_type == KEY_TYPE_TRANSACTION
        if not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID if is_txn else ResourceType.GROUP,
                       key):
            out["error_code"] = ErrorCode.transactional_id_authorization_failed if is_txn \
                else ErrorCode.group_authorization_failed
            out["error_message"] = ("Transactional Id authorization failed." if is_txn
                                    else "Group authorization failed.")
            return out
    gc = _coordinator(svc)
    tc = getattr(svc, "txn_coordinator", None)
    if key_type == KEY_TYPE_TRANSACTION and tc is not None and key:
        gc, key_type = tc, KEY_TYPE_GROUP  # same coordinator_node seam
    if key_type != KEY_TYPE_GROUP or gc is None:
        code = ErrorCode.coordinator_not_available if key_type == KEY_TYPE_TRANSACTION else ErrorCode.invalid_request
        out["error_code"] = code
        out["error_message"] = code.name
        return out
    if not key:
        out["error_code"] = ErrorCode.invalid_request
        out["error_message"] = "Group id must not be empty"
        return out
    node = gc.coordinator_node(key)
    endpoints = svc.store.live_brokers().get(node) if node is not None else None
    if node is None or not endpoints:
        out["error_code"] = ErrorCode.coordinator_not_available
        out["error_message"] = "The coordinator is not available."
        return out
    for name, host, port in endpoints:
        if name == ctx.listener:
            out.update({"node_id": node, "host": host, "port": port})
            return out
    out["error_code"] = ErrorCode.coordinator_not_available
    return out


async def _internal_topic_ready(svc: CoordinatorServices, key_type: int) -> bool:
    """Cluster mode: the key type's internal topic exists (created here on first use, as Kafka)."""
    if not svc.store.is_cluster():
        return True
    coordinator = getattr(svc, "txn_coordinator", None) if key_type == KEY_TYPE_TRANSACTION else _coordinator(svc)
    if coordinator is None:
        return True  # _find_one answers for a missing coordinator
    try:
        return bool(await coordinator.ensure_topic_async())
    except StoreUnavailable:
        return False


def _not_available(key: str) -> Coordinator:
    return {"key": key, "node_id": -1, "host": "", "port": -1, "error_code": ErrorCode.coordinator_not_available,
            "error_message": "The coordinator is not available."}


async def handle_find_coordinator(svc: CoordinatorServices, ctx: RequestContext, req: Any
                                  ) -> FindCoordinatorResponse:
    key_type = int(getattr(req, "key_type", 0))
    ready = await _internal_topic_ready(svc, key_type)
    if ctx.version >= 4:
        return {"throttle_time": 0,
                "coordinators": [_find_one(svc, ctx, k, key_type) if ready or not k else _not_available(k)
                                 for k in req.coordinator_keys]}
    one = _find_one(svc, ctx, req.key, key_type) if ready or not req.key else _not_available(req.key)
    return {"throttle_time": 0, "node_id": one["node_id"], "host": one["host"], "port": one["port"],
            "error_code": one["error_code"], "error_message": one["error_message"]}


# --- JoinGroup / SyncGroup / Heartbeat / LeaveGroup -----------------------------------------------

async def handle_join_group(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> JoinGroupResponse:
    v = ctx.version
    if not _group_allowed(ctx, AclOperation.READ, req.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "generation_id": -1,
                "protocol_type": None, "protocol_name": None if v >= 7 else "", "leader": "", "member_id": "",
                "skip_assignment": False, "members": []}
    mgr = _manager(svc)
    session = _ms(req.session_timeout)
    rebalance = _ms(req.rebalance_timeout) if v >= 1 else session
    if rebalance < 0:
        rebalance = session
    jr = JoinRequest(
        group_id=req.group_id, member_id=req.member_id or "",
        group_instance_id=req.group_instance_id if v >= 5 else None,
        protocol_type=req.protocol_type, protocols=[(p.name, bytes(p.metadata)) for p in req.protocols],
        session_timeout_ms=session, rebalance_timeout_ms=rebalance,
        client_id=ctx.header.client_id or "", client_host=_client_host(ctx),
        require_known_member_id=v >= 4, reason=getattr(req, "reason", None),
    )
    timeout_s = (rebalance + mgr.config.initial_rebalance_delay_ms) / 1000 + 5
    resp = await _await_callback(lambda cb: mgr.join_group(jr, cb), timeout_s,
                                 mgr.join_error(ErrorCode.rebalance_in_progress, jr.member_id))
    resp = resp.copy()
    if v < 7 and resp.get("protocol_name") is None:
        resp["protocol_name"] = ""
    if v < 9:
        resp["skip_assignment"] = False
    resp["throttle_time"] = 0
    return resp


async def handle_sync_group(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> SyncGroupResponse:
    v = ctx.version
    if not _group_allowed(ctx, AclOperation.READ, req.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "protocol_type": None,
                "protocol_name": None, "assignment": b""}
    mgr = _manager(svc)
    gc = _coordinator(svc)
    assignments = {a.member_id: bytes(a.assignment) for a in req.assignments}
    g = mgr.groups.get(req.group_id)
    bound = (g.rebalance_timeout_ms() if isinstance(g, ClassicGroup) else 60_000) / 1000 + 5
    resp: SyncGroupResponse = await _await_callback(
        lambda cb: mgr.sync_group(req.group_id, int(req.generation_id), req.member_id,
                                  req.group_instance_id if v >= 3 else None,
                                  getattr(req, "protocol_type", None), getattr(req, "protocol_name", None),
                                  assignments, cb),
        bound, {"error_code": ErrorCode.rebalance_in_progress, "assignment": b""})
    if gc is not None and resp.get("error_code") == ErrorCode.none:
        code = await gc.flush(req.group_id)  # the group's assignment must survive a coordinator failover
        if code != ErrorCode.none:
            resp = {"error_code": code, "assignment": b""}
    return {"throttle_time": 0, "error_code": resp["error_code"], "protocol_type": resp.get("protocol_type"),
            "protocol_name": resp.get("protocol_name"), "assignment": resp.get("assignment") or b""}


async def handle_heartbeat(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> HeartbeatResponse:
    if not _group_allowed(ctx, AclOperation.READ, req.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed}
    instance = req.group_instance_id if ctx.version >= 3 else None
    code = _manager(svc).heartbeat(req.group_id, int(req.generation_id), req.member_id, instance)
    return {"throttle_time": 0, "error_code": code}


async def handle_leave_group(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> LeaveGroupResponse:
    if not _group_allowed(ctx, AclOperation.READ, req.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "members": []}
    mgr = _manager(svc)
    if ctx.version < 3:
        before = _log_end(svc, req.group_id)
        top, errs = mgr.leave_group(req.group_id, [(req.member_id, None)])
        top = await _replicated(svc, req.group_id, top, before)
        return {"throttle_time": 0, "error_code": top if top != ErrorCode.none or not errs else errs[0]}
    identities = [(m.member_id or "", m.group_instance_id) for m in req.members]
    before = _log_end(svc, req.group_id)
    top, errs = mgr.leave_group(req.group_id, identities)
    top = await _replicated(svc, req.group_id, top, before)
    members: list[MemberResponse] = []
    if top == ErrorCode.none:
        members = [{"member_id": mid, "group_instance_id": inst, "error_code": e}
                   for (mid, inst), e in zip(identities, errs, strict=True)]
    return {"throttle_time": 0, "error_code": top, "members": members}


# --- offsets ----------------------------------------------------------------------------------

def commit_entries(svc: CoordinatorServices, topics: Any, denied: frozenset[str] = frozenset()
                   ) -> tuple[list[CommitEntry], set[tuple[str, int]]]:
    """The offsets of an OffsetCommit/TxnOffsetCommit request, and its partitions that do not exist
    (``denied`` topics, refused by the authorizer, are neither)."""
    entries: list[CommitEntry] = []
    unknown: set[tuple[str, int]] = set()
    for t in topics:
        if denied and t.name in denied:
            continue
        rec = svc.store.topic(t.name)
        for p in t.partitions:
            tp = (t.name, int(p.partition_index))
            if rec is None or tp[1] not in rec.partitions:
                unknown.add(tp)
                continue
            entries.append(CommitEntry(t.name, tp[1], int(p.committed_offset),
                                       int(getattr(p, "committed_leader_epoch", -1)), p.committed_metadata))
    return entries, unknown


def partition_errors(topics: Any, unknown: set[tuple[str, int]],
                     results: dict[tuple[str, int], ErrorCode],
                     denied: frozenset[str] = frozenset(),
                     denied_code: ErrorCode = ErrorCode.topic_authorization_failed
                     ) -> list[OffsetCommitResponseTopic]:
    """Per-partition error codes for the request's topics (``unknown`` ones: UNKNOWN_TOPIC_OR_PARTITION,
    ``denied`` ones: TOPIC_AUTHORIZATION_FAILED)."""
    out: list[OffsetCommitResponseTopic] = []
    for t in topics:
        parts: list[OffsetCommitResponsePartition] = []
        refused = bool(denied) and t.name in denied
        for p in t.partitions:
            tp = (t.name, int(p.partition_index))
            code = denied_code if refused else \
                ErrorCode.unknown_topic_or_partition if tp in unknown else results.get(tp, ErrorCode.none)
            parts.append({"partition_index": tp[1], "error_code": code})
        out.append({"name": t.name, "partitions": parts})
    return out


async def handle_offset_commit(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> OffsetCommitResponse:
    v = ctx.version
    mgr = _manager(svc)
    gc = _coordinator(svc)
    retention = -1
    if 2 <= v <= 4:
        retention = _ms(req.retention_time)
    if not _group_allowed(ctx, AclOperation.READ, req.group_id):
        return {"throttle_time": 0, "topics": partition_errors(
            req.topics, set(), {}, frozenset(t.name for t in req.topics), ErrorCode.group_authorization_failed)}
    denied = denied_names(ctx, AclOperation.READ, ResourceType.TOPIC, (t.name for t in req.topics))
    entries, unknown = commit_entries(svc, req.topics, denied)
    refused = gc.writable(req.group_id) if gc is not None and entries else ErrorCode.none
    if refused != ErrorCode.none:  # Kafka appends offsets with acks=all: nothing is committed
        return {"throttle_time": 0, "topics": partition_errors(
            req.topics, unknown, {(e.topic, e.partition): refused for e in entries}, denied)}
    results, written = mgr.prepare_commit(req.group_id, int(req.generation_id_or_member_epoch),
                                          req.member_id or "", req.group_instance_id if v >= 7 else None, entries,
                                          retention)
    if gc is not None and entries and any(c == ErrorCode.none for c in results.values()):
        code = await gc.flush(req.group_id)
        if code != ErrorCode.none:  # not replicated: the client retries (Kafka's mapping of the append error)
            results = {tp: code if c == ErrorCode.none else c for tp, c in results.items()}
            written = {}
    mgr.complete_commit(req.group_id, written)  # visible to OffsetFetch only once durable
    return {"throttle_time": 0, "topics": partition_errors(req.topics, unknown, results, denied)}


def _fetch_group(mgr: GroupManager, group_id: str, topics: Any, member_id: str | None, member_epoch: int,
                 version: int, require_stable: bool = False, ctx: RequestContext | None = None
                 ) -> tuple[ErrorCode, list[OffsetFetchResponseTopics]]:
    requested = None if topics is None else [(t.name, int(p)) for t in topics for p in t.partition_indexes]
    denied: frozenset[str] = frozenset()
    if ctx is not None and ctx.authorizer is not None:
        if not _group_allowed(ctx, AclOperation.DESCRIBE, group_id):
            code = ErrorCode.group_authorization_failed
            if version < 2 and requested is not None:  # no top-level error before v2: every partition has it
                return code, _offset_rows_by_topic([(tp, None) for tp in requested], code)
            return code, []
        if topics is not None:  # offsets of topics the principal may not DESCRIBE are refused, not read
            denied = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (t.name for t in topics))
            requested = [tp for tp in requested or () if tp[0] not in denied]
    code, rows = mgr.fetch_offsets(group_id, requested, member_id, member_epoch)
    if ctx is not None and ctx.authorizer is not None and code == ErrorCode.none:
        if topics is None:  # all the group's offsets: silently only the topics it may DESCRIBE
            hidden = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, (tp[0] for tp, _ in rows),
                                  log_denial=False)
            rows = [r for r in rows if r[0][0] not in hidden]
        elif denied:
            code2, out = _fetch_rows(mgr, group_id, rows, code, require_stable, version, requested)
            for t in topics:
                if t.name in denied:
                    out.append({"name": t.name, "partitions": [
                        {"partition_index": int(p), "committed_offset": -1, "committed_leader_epoch": -1,
                         "metadata": "", "error_code": ErrorCode.topic_authorization_failed}
                        for p in t.partition_indexes]})
            return code2, out
    return _fetch_rows(mgr, group_id, rows, code, require_stable, version, requested)


def _offset_rows_by_topic(rows: Any, code: ErrorCode) -> list[OffsetFetchResponseTopics]:
    by_topic: dict[str, list[OffsetFetchResponsePartitions]] = {}
    for (topic, part), _v in rows:
        by_topic.setdefault(topic, []).append({"partition_index": part, "committed_offset": -1,
                                               "committed_leader_epoch": -1, "metadata": "", "error_code": code})
    return [{"name": t, "partitions": ps} for t, ps in by_topic.items()]


def _fetch_rows(mgr: GroupManager, group_id: str, rows: Any, code: ErrorCode, require_stable: bool, version: int,
                requested: list[tuple[str, int]] | None) -> tuple[ErrorCode, list[OffsetFetchResponseTopics]]:
    # KIP-447: with require_stable, a partition with a pending transactional commit is UNSTABLE_OFFSET_COMMIT.
    unstable = mgr.unstable_offsets(group_id) if require_stable and code == ErrorCode.none else set()
    if code != ErrorCode.none:
        if version < 2 and requested is not None:
            # No top-level error before v2: every partition carries it.
            rows = [(tp, None) for tp in requested]
        else:
            return code, []
    by_topic: dict[str, list[OffsetFetchResponsePartitions]] = {}
    for (topic, part), v in rows:
        if (topic, part) in unstable:
            by_topic.setdefault(topic, []).append({
                "partition_index": part, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "",
                "error_code": ErrorCode.unstable_offset_commit})
            continue
        by_topic.setdefault(topic, []).append({
            "partition_index": part,
            "committed_offset": -1 if v is None else v.offset,
            "committed_leader_epoch": -1 if v is None else v.leader_epoch,
            "metadata": "" if v is None else v.metadata,
            "error_code": code,
        })
    return code, [{"name": t, "partitions": ps} for t, ps in by_topic.items()]


async def handle_offset_fetch(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> OffsetFetchResponse:
    v = ctx.version
    mgr = _manager(svc)
    if v >= 8:
        groups: list[OffsetFetchResponseGroup] = []
        for g in req.groups:
            code, topics = _fetch_group(mgr, g.group_id, g.topics, getattr(g, "member_id", None),
                                        int(getattr(g, "member_epoch", -1)), v,
                                        bool(getattr(req, "require_stable", False)), ctx)
            groups.append({"group_id": g.group_id, "topics": topics, "error_code": code})
        return {"throttle_time": 0, "groups": groups}
    code, topics = _fetch_group(mgr, req.group_id, req.topics, None, -1, v,
                                bool(getattr(req, "require_stable", False)) if v >= 7 else False, ctx)
    return {"throttle_time": 0, "topics": topics, "error_code": code}


async def handle_offset_delete(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> OffsetDeleteResponse:
    mgr = _manager(svc)
    if not _group_allowed(ctx, AclOperation.DELETE, req.group_id):
        return {"error_code": ErrorCode.group_authorization_failed, "throttle_time": 0, "topics": []}
    denied = denied_names(ctx, AclOperation.READ, ResourceType.TOPIC, (t.name for t in req.topics))
    wanted = [(t.name, int(p.partition_index)) for t in req.topics for p in t.partitions
              if not (denied and t.name in denied)]
    unknown = {tp for tp in wanted if (rec := svc.store.topic(tp[0])) is None or tp[1] not in rec.partitions}
    gc = _coordinator(svc)
    refused = gc.writable(req.group_id) if gc is not None else ErrorCode.none
    if refused != ErrorCode.none:  # tombstones are appended with acks=all: nothing is deleted
        return {"error_code": refused, "throttle_time": 0, "topics": []}
    before = _log_end(svc, req.group_id)
    code, results = mgr.delete_offsets(req.group_id, [tp for tp in wanted if tp not in unknown])
    code = await _replicated(svc, req.group_id, code, before)
    topics = partition_errors(req.topics, unknown, results, denied) if code == ErrorCode.none else []
    return {"error_code": code, "throttle_time": 0, "topics": topics}


# --- admin ------------------------------------------------------------------------------------

async def handle_list_groups(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> ListGroupsResponse:
    mgr = _manager(svc)
    states = {s.lower() for s in getattr(req, "states_filter", ()) or ()} or None
    types = {s.lower() for s in getattr(req, "types_filter", ()) or ()} or None
    error = ErrorCode.none
    if any(st == "loading" for st in mgr.partitions.values()):
        error = ErrorCode.coordinator_load_in_progress
    groups = mgr.list_groups(states, types)
    if svc.shares is not None:  # share groups (KIP-932) live beside the others, keyed the same way
        groups += svc.shares.groups.listed(states, types)
    if ctx.authorizer is not None and not cluster_allowed(ctx, AclOperation.DESCRIBE, log_denial=False):
        # Without DESCRIBE on the cluster, only the groups the principal may DESCRIBE (silently).
        groups = [g for g in groups if allowed(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, g["group_id"],
                                               log_denial=False)]
    return {"throttle_time": 0, "error_code": error, "groups": groups}


async def handle_describe_groups(svc: CoordinatorServices, ctx: RequestContext, req: Any
                                 ) -> DescribeGroupsResponse:
    mgr = _manager(svc)
    groups: list[DescribeGroupsDescribedGroup] = []
    include_ops = ctx.version >= 3 and bool(req.include_authorized_operations)
    for gid in req.groups:
        if not _group_allowed(ctx, AclOperation.DESCRIBE, gid):
            groups.append({"error_code": ErrorCode.group_authorization_failed, "error_message": None,
                           "group_id": gid, "group_state": "", "protocol_type": "", "protocol_data": "",
                           "members": [], "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED})
            continue
        d = mgr.describe_group(gid)
        if svc.shares is not None and gid in svc.shares.groups.groups and ctx.version >= 6:
            d["error_message"] = f"Group {gid} is not a classic group."  # Kafka 4.x, KIP-1043
        if d["error_code"] == ErrorCode.group_id_not_found and ctx.version < 6:
            # Before v6 (KIP-1043) an unknown group is described as Dead with no error.
            d["error_code"] = ErrorCode.none
        if include_ops and d["error_code"] == ErrorCode.none:
            d["authorized_operations"] = _group_ops(ctx, gid)
        groups.append(d)
    return {"throttle_time": 0, "groups": groups}


def _is_share_group(shares: ShareCoordinator, group_id: str) -> bool:
    """A share group is known by its membership (replayed from ``__consumer_offsets`` after a restart) or by
    share-partition state in ``__share_group_state``."""
    return group_id in shares.groups.groups or bool(shares.state_topic_ids(group_id))


def _share_state_loading(shares: ShareCoordinator) -> bool:
    """Whether a ``__share_group_state`` partition this broker leads is still being replayed: until it is,
    the topics a group has state for are not all known, and a deleted group would leave state behind."""
    rec = shares.store.topic(STATE_TOPIC)
    if rec is None:
        return False
    me = shares.replicas.broker_id
    return any(a.leader == me and i not in shares.state.states for i, a in rec.partitions.items())


async def _share_state_loaded(shares: ShareCoordinator, timeout_s: float = SHARE_LOAD_WAIT_S) -> bool:
    """Wait (bounded) for the replay after a start; polled, as the state store exposes no event for it."""
    with anyio.move_on_after(timeout_s):
        while _share_state_loading(shares):
            await anyio.sleep(0.05)
    return not _share_state_loading(shares)


def _delete_share_group(shares: ShareCoordinator, group_id: str) -> ErrorCode:
    """DeleteGroups on a share group, as Kafka 4.2: NON_EMPTY_GROUP while it has members; otherwise its
    membership goes (the coordinator's next flush writes its tombstone to ``__consumer_offsets``) and every
    share-partition state it has is queued for deletion in ``__share_group_state``.

    Composed of the share coordinator's own calls (``ShareGroups.delete``, ``state_topic_ids``,
    ``delete_topic_state``); the caller awaits ``shares.flush()`` before answering."""
    if shares.has_members(group_id):
        return ErrorCode.non_empty_group
    topic_ids = shares.state_topic_ids(group_id)
    if group_id in shares.groups.groups:
        code = shares.groups.delete(group_id)
        if code != ErrorCode.none:
            return code
    for topic_id in topic_ids:
        rec = shares.store.topic_by_id(topic_id)
        shares.delete_topic_state(group_id, rec.name if rec is not None else "", topic_id)
    log.info("deleted share group %(group_id)s (state on %(topic_ids)d topic(s))",
             {"group_id": group_id, "topic_ids": len(topic_ids)})
    return ErrorCode.none


async def handle_delete_groups(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> DeleteGroupsResponse:
    mgr = _manager(svc)
    gc = _coordinator(svc)
    refused = {g: gc.writable(g) for g in req.groups_names} if gc is not None else {}
    for g in denied_names(ctx, AclOperation.DELETE, ResourceType.GROUP, req.groups_names):
        refused[g] = ErrorCode.group_authorization_failed
    before = {g: _log_end(svc, g) for g in req.groups_names}
    allowed_ids = [g for g in req.groups_names if refused.get(g, ErrorCode.none) == ErrorCode.none]
    shares = svc.shares
    share_ids = [g for g in allowed_ids if shares is not None and g not in mgr.groups and _is_share_group(shares, g)]
    results = mgr.delete_groups([g for g in allowed_ids if g not in share_ids])
    if shares is not None and share_ids and not await _share_state_loaded(shares):
        results.update({g: ErrorCode.coordinator_load_in_progress for g in share_ids})
    elif shares is not None and share_ids:
        results.update({g: _delete_share_group(shares, g) for g in share_ids})
        for (g, _topic, _partition), code in (await shares.flush()).items():
            if g in share_ids and results[g] == ErrorCode.none:
                results[g] = code  # a state tombstone not written (kept queued; the timer retries it)
    results.update({g: c for g, c in refused.items() if c != ErrorCode.none})
    for g, c in list(results.items()):
        results[g] = await _replicated(svc, g, c, before.get(g, -1))
    return {"throttle_time": 0,
            "results": [{"group_id": g, "error_code": results[g]} for g in req.groups_names]}


# --- KIP-848 ----------------------------------------------------------------------------------

async def handle_consumer_group_heartbeat(svc: CoordinatorServices, ctx: RequestContext, req: Any
                                          ) -> ConsumerGroupHeartbeatResponse:
    mgr = _manager(svc)
    gc = _coordinator(svc)
    if mgr.consumer is None or gc is None or not gc.consumer_protocol_enabled:
        return {"throttle_time": 0, "error_code": ErrorCode.unsupported_version, "error_message": None,
                "member_id": None, "member_epoch": -1, "heartbeat_interval": 0, "assignment": None}
    if ctx.authorizer is not None:
        refusal = _heartbeat_refusal(ctx, req)
        if refusal is not None:
            return refusal
    before = _log_end(svc, req.group_id)
    resp = mgr.consumer.heartbeat(req, ctx.header.client_id or "", _client_host(ctx))
    if resp.get("error_code") == ErrorCode.none:
        code = await _replicated(svc, req.group_id, ErrorCode.none, before)
        if code != ErrorCode.none:  # the member's new epoch/assignment is not durable: the client retries
            resp = {"throttle_time": 0, "error_code": code, "error_message": None, "member_id": None,
                    "member_epoch": -1, "heartbeat_interval": 0, "assignment": None}
    return resp


def _heartbeat_refusal(ctx: RequestContext, req: Any) -> ConsumerGroupHeartbeatResponse | None:
    """READ on the group, then DESCRIBE on every subscribed topic (as Kafka 4: a subscription may not
    reveal topics the member could not see in Metadata)."""
    code, message = None, None
    if not _group_allowed(ctx, AclOperation.READ, req.group_id):
        code = ErrorCode.group_authorization_failed
    else:
        names = list(req.subscribed_topic_names or ())
        if names:
            denied = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, names)
            if denied:
                code = ErrorCode.topic_authorization_failed
                message = "The group is subscribed to topics it is not authorized to describe: " + \
                    ", ".join(sorted(denied))
    if code is None:
        return None
    return {"throttle_time": 0, "error_code": code, "error_message": message, "member_id": None,
            "member_epoch": 0, "heartbeat_interval": 0, "assignment": None}


async def handle_consumer_group_describe(svc: CoordinatorServices, ctx: RequestContext, req: Any
                                         ) -> ConsumerGroupDescribeResponse:
    mgr = _manager(svc)

    def name_of(topic_id: Any) -> str | None:
        rec = svc.store.topic_by_id(topic_id)
        return None if rec is None else rec.name

    groups: list[ConsumerGroupDescribeDescribedGroup] = []
    if mgr.consumer is not None:
        include_ops = bool(getattr(req, "include_authorized_operations", False))
        for gid in req.group_ids:
            if not _group_allowed(ctx, AclOperation.DESCRIBE, gid):
                groups.append({"error_code": ErrorCode.group_authorization_failed, "error_message": None,
                               "group_id": gid, "group_state": "", "group_epoch": 0, "assignment_epoch": 0,
                               "assignor_name": "", "members": [],
                               "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED})
                continue
            d = mgr.consumer.describe(gid, name_of)
            if include_ops and d["error_code"] == ErrorCode.none:
                d["authorized_operations"] = _group_ops(ctx, gid)
            groups.append(d)
    return {"throttle_time": 0, "groups": groups}
