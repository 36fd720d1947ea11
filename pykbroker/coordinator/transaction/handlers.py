"""The transaction APIs: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
WriteTxnMarkers, TxnOffsetCommit, DescribeTransactions, ListTransactions, DescribeProducers."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.group.handlers import commit_entries, partition_errors
from pykbroker.coordinator.internal_topic import min_insync_replicas, wait_replicated
from pykbroker.coordinator.services import CoordinatorServices
from pykbroker.coordinator.transaction.state import STATE_BY_NAME, TxnState
from pykbroker.metadata.store import StoreUnavailable
from pykbroker.protocol.responses.transaction import (
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnResponse,
    AddPartitionsToTxnResult,
    AddPartitionsToTxnTopicResult,
    DescribeProducersResponse,
    DescribeTransactionsResponse,
    DescribeTransactionsTransactionState,
    EndTxnResponse,
    InitProducerIdResponse,
    ListTransactionsResponse,
    PartitionResponse,
    TopicResponse,
    TxnOffsetCommitResponse,
    WritableTxnMarkerPartitionResult,
    WritableTxnMarkerResult,
    WritableTxnMarkerTopicResult,
    WriteTxnMarkersResponse,
)
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.authz import allowed, cluster_allowed, denied_names
from pykbroker.security.request import RequestContext

if TYPE_CHECKING:
    from pykbroker.coordinator.transaction.service import TransactionCoordinator

INTERNAL = ("__consumer_offsets", "__transaction_state")


def _ms(v: Any) -> int:
    if isinstance(v, datetime.timedelta):
        return int(v / datetime.timedelta(milliseconds=1))
    return int(v)


def _tc(svc: CoordinatorServices) -> TransactionCoordinator:
    tc = getattr(svc, "txn_coordinator", None)
    assert tc is not None, "the transaction coordinator is not running"
    return tc


def _compat(code: ErrorCode, version: int, fenced_since: int) -> ErrorCode:
    """PRODUCER_FENCED is new in Kafka 2.7; older request versions get INVALID_PRODUCER_EPOCH."""
    if code == ErrorCode.producer_fenced and version < fenced_since:
        return ErrorCode.invalid_producer_epoch
    return code


def abortable_compat(code: ErrorCode, version: int, abortable_since: int) -> ErrorCode:
    """TRANSACTION_ABORTABLE (KIP-890, Kafka 3.8) goes only to versions that know it; older ones get
    INVALID_TXN_STATE, the code Kafka 3.6-3.7 answered in its place."""
    if code == ErrorCode.transaction_abortable and version < abortable_since:
        return ErrorCode.invalid_txn_state
    return code


def _writable(tc: TransactionCoordinator, txn_id: str) -> ErrorCode:
    """COORDINATOR_NOT_AVAILABLE/NOT_COORDINATOR when the transaction log cannot take an acks=all write now
    (checked only where this broker coordinates the id: other answers come from the state machine)."""
    return tc.writable(txn_id) if tc.sm.coordinator_error(txn_id) is None else ErrorCode.none


# --- InitProducerId -----------------------------------------------------------------------------

def _txn_write_allowed(ctx: RequestContext, txn_id: str) -> bool:
    return allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id)


def _init_producer_id_refusal(ctx: RequestContext, txn_id: str | None) -> ErrorCode | None:
    """WRITE on the transactional id; without one (idempotence), IDEMPOTENT_WRITE on the cluster or WRITE on
    some topic (KIP-679: any producer allowed to write may be idempotent)."""
    auth = ctx.authorizer
    if auth is None:
        return None
    if txn_id is not None:
        return None if _txn_write_allowed(ctx, txn_id) else ErrorCode.transactional_id_authorization_failed
    if cluster_allowed(ctx, AclOperation.IDEMPOTENT_WRITE, log_denial=False):
        return None
    if auth.authorize_by_resource_type(ctx.session.principal, ctx.session.client_host, AclOperation.WRITE,
                                       ResourceType.TOPIC):
        return None
    return ErrorCode.cluster_authorization_failed


async def handle_init_producer_id(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> InitProducerIdResponse:
    txn_id = req.transactional_id
    refusal = _init_producer_id_refusal(ctx, txn_id)
    if refusal is not None:
        return {"throttle_time": 0, "error_code": refusal, "producer_id": -1, "producer_epoch": -1}
    tc = _tc(svc)
    try:
        await tc.producer_ids.ensure_available()  # a ZooKeeper round trip, off the event loop
    except StoreUnavailable:
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available, "producer_id": -1,
                "producer_epoch": -1}
    refused = _writable(tc, txn_id) if txn_id else ErrorCode.none
    if refused != ErrorCode.none:
        return {"throttle_time": 0, "error_code": refused, "producer_id": -1, "producer_epoch": -1}
    result = tc.sm.init_producer_id(txn_id, _ms(req.transaction_timeout),
                                    int(getattr(req, "producer_id", -1)), int(getattr(req, "producer_epoch", -1)))
    if txn_id:
        if result.error == ErrorCode.none or result.job is not None:
            code = await tc.flush(txn_id)
            if code != ErrorCode.none and result.error == ErrorCode.none:  # the client retries; the bump is kept
                return {"throttle_time": 0, "error_code": code, "producer_id": -1, "producer_epoch": -1}
        if result.job is not None:
            await tc.finish(result.job)
    return {"throttle_time": 0, "error_code": _compat(result.error, ctx.version, 4),
            "producer_id": result.producer_id, "producer_epoch": result.producer_epoch}


# --- AddPartitionsToTxn / AddOffsetsToTxn -------------------------------------------------------------

def _txn_partitions(svc: CoordinatorServices, topics: list[tuple[str, list[int]]], from_client: bool
                    ) -> tuple[list[tuple[str, int]], dict[tuple[str, int], ErrorCode]]:
    """Split a transaction's partitions into those that exist and the per-partition errors of the rest.

    Versions 0-3 come from producers, which may not write to internal topics (Kafka's write check
    leaves them out: TOPIC_AUTHORIZATION_FAILED); versions 4+ come from partition leaders, which
    also verify ``__consumer_offsets`` partitions.
    """
    bad: dict[tuple[str, int], ErrorCode] = {}
    wanted: list[tuple[str, int]] = []
    for name, parts in topics:
        rec = svc.store.topic(name)
        for p in parts:
            if from_client and name in INTERNAL:
                bad[(name, p)] = ErrorCode.topic_authorization_failed
            elif rec is None or p not in rec.partitions:
                bad[(name, p)] = ErrorCode.unknown_topic_or_partition
            else:
                wanted.append((name, p))
    return wanted, bad


def _topic_results(topics: list[tuple[str, list[int]]], codes: dict[tuple[str, int], ErrorCode]
                   ) -> list[AddPartitionsToTxnTopicResult]:
    return [{"name": name, "results_by_partition": [
        {"partition_index": p, "partition_error_code": codes[(name, p)]} for p in ps]} for name, ps in topics]


async def _add_or_verify(tc: TransactionCoordinator, svc: CoordinatorServices, version: int, txn_id: str,
                         producer_id: int, epoch: int, topics: list[tuple[str, list[int]]], verify_only: bool,
                         ctx: RequestContext | None = None) -> dict[tuple[str, int], ErrorCode]:
    """One transaction of an AddPartitionsToTxn request: every partition's error code."""
    everything = [(name, p) for name, ps in topics for p in ps]
    if version < 4 and ctx is not None and ctx.authorizer is not None:  # from a producer: WRITE on id and topics
        if not _txn_write_allowed(ctx, txn_id):
            return dict.fromkeys(everything, ErrorCode.transactional_id_authorization_failed)
        denied = denied_names(ctx, AclOperation.WRITE, ResourceType.TOPIC,
                              (name for name, _ in topics if name not in INTERNAL))
        if denied:
            topics_ok = [(n, ps) for n, ps in topics if n not in denied]
            _w, bad = _txn_partitions(svc, topics_ok, from_client=True)
            for name, ps in topics:
                if name in denied:
                    bad.update(dict.fromkeys(((name, p) for p in ps), ErrorCode.topic_authorization_failed))
            return {tp: bad.get(tp, ErrorCode.operation_not_attempted) for tp in everything}
    wanted, bad = _txn_partitions(svc, topics, from_client=version < 4)
    if bad:  # one failed partition fails the transaction; the others were not attempted
        return {tp: bad.get(tp, ErrorCode.operation_not_attempted) for tp in everything}
    if verify_only:
        codes = tc.sm.verify_partitions(txn_id, producer_id, epoch, wanted)
    else:
        code = _writable(tc, txn_id)
        if code == ErrorCode.none:
            code = tc.sm.add_partitions(txn_id, producer_id, epoch, wanted)
        if code == ErrorCode.none:
            code = await tc.flush(txn_id)
        codes = dict.fromkeys(everything, code)
    return {tp: abortable_compat(_compat(c, version, 2), version, 5) for tp, c in codes.items()}


async def handle_add_partitions_to_txn(svc: CoordinatorServices, ctx: RequestContext, req: Any
                                      ) -> AddPartitionsToTxnResponse:
    """Versions 0-3: one producer adding partitions.  Versions 4+ (KIP-890): a batch of transactions, as
    partition leaders send it, each adding partitions or, with ``verify_only``, checking that they were
    added.  Kafka requires CLUSTER_ACTION for 4+; with no authorizer every principal has it."""
    tc = _tc(svc)
    if ctx.version < 4:
        topics = [(t.name, [int(p) for p in t.partitions]) for t in req.v3_and_below_topics]
        codes = await _add_or_verify(tc, svc, ctx.version, req.v3_and_below_transactional_id,
                                     int(req.v3_and_below_producer_id), int(req.v3_and_below_producer_epoch),
                                     topics, verify_only=False, ctx=ctx)
        return {"throttle_time": 0, "results_by_topic_v3_and_below": _topic_results(topics, codes)}
    if not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):  # v4+ come from partition leaders only
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                "results_by_transaction": []}
    results: list[AddPartitionsToTxnResult] = []
    for t in req.transactions:
        topics = [(x.name, [int(p) for p in x.partitions]) for x in t.topics]
        codes = await _add_or_verify(tc, svc, ctx.version, t.transactional_id, int(t.producer_id),
                                     int(t.producer_epoch), topics, verify_only=bool(t.verify_only))
        results.append({"transactional_id": t.transactional_id, "topic_results": _topic_results(topics, codes)})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "results_by_transaction": results}


async def handle_add_offsets_to_txn(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> AddOffsetsToTxnResponse:
    if not _txn_write_allowed(ctx, req.transactional_id):
        return {"throttle_time": 0, "error_code": ErrorCode.transactional_id_authorization_failed}
    if not allowed(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed}
    tc = _tc(svc)
    groups = getattr(svc, "groups", None)
    if groups is None:
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available}
    tp = ("__consumer_offsets", groups.partition_for(req.group_id))
    code = _writable(tc, req.transactional_id)
    if code == ErrorCode.none:
        code = tc.sm.add_partitions(req.transactional_id, int(req.producer_id), int(req.producer_epoch), [tp])
    if code == ErrorCode.none:
        code = await tc.flush(req.transactional_id)
    return {"throttle_time": 0, "error_code": _compat(code, ctx.version, 2)}


# --- EndTxn / WriteTxnMarkers -------------------------------------------------------------------------

async def handle_end_txn(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> EndTxnResponse:
    if not _txn_write_allowed(ctx, req.transactional_id):
        return {"throttle_time": 0, "error_code": ErrorCode.transactional_id_authorization_failed}
    tc = _tc(svc)
    code = _writable(tc, req.transactional_id)
    if code != ErrorCode.none:
        return {"throttle_time": 0, "error_code": code}
    code, job = tc.sm.end_txn(req.transactional_id, int(req.producer_id), int(req.producer_epoch),
                              bool(req.committed))
    if job is not None:
        # Not replicated: the client retries (CONCURRENT_TRANSACTIONS until the markers are written, by
        # the retry task once the prepared state is replicated, then success).
        code = await tc.flush(req.transactional_id)
        if code == ErrorCode.none:
            await tc.finish(job)
    return {"throttle_time": 0, "error_code": _compat(code, ctx.version, 2)}


async def handle_write_txn_markers(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> WriteTxnMarkersResponse:
    if not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):  # only coordinators write markers
        return {"markers": [{"producer_id": int(m.producer_id), "topics": [
            {"name": t.name, "partitions": [{"partition_index": int(p),
                                             "error_code": ErrorCode.cluster_authorization_failed}
                                            for p in t.partition_indexes]} for t in m.topics]}
            for m in req.markers]}
    tc = _tc(svc)
    markers: list[WritableTxnMarkerResult] = []
    for m in req.markers:
        topics: list[WritableTxnMarkerTopicResult] = []
        for t in m.topics:
            parts: list[WritableTxnMarkerPartitionResult] = []
            for p in t.partition_indexes:
                code = tc.write_one_marker(t.name, int(p), int(m.producer_id), int(m.producer_epoch),
                                           bool(m.transaction_result), int(m.coordinator_epoch))
                if code == ErrorCode.none and svc.store.is_cluster():  # as Kafka: acks=all, the outcome answers
                    min_isr = min_insync_replicas(svc.store, t.name, svc.config["min.insync.replicas"])
                    code = await wait_replicated(svc.replicas, t.name, int(p), svc.config["request.timeout.ms"] / 1000,
                                                 min_isr)
                parts.append({"partition_index": int(p), "error_code": code})
            topics.append({"name": t.name, "partitions": parts})
        markers.append({"producer_id": int(m.producer_id), "topics": topics})
    return {"markers": markers}


# --- TxnOffsetCommit ------------------------------------------------------------------------------------

async def handle_txn_offset_commit(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> TxnOffsetCommitResponse:
    v = ctx.version
    if ctx.authorizer is not None:
        every = frozenset(t.name for t in req.topics)
        if not _txn_write_allowed(ctx, req.transactional_id):
            return {"throttle_time": 0, "topics": partition_errors(
                req.topics, set(), {}, every, ErrorCode.transactional_id_authorization_failed)}
        if not allowed(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id):
            return {"throttle_time": 0, "topics": partition_errors(
                req.topics, set(), {}, every, ErrorCode.group_authorization_failed)}
    denied = denied_names(ctx, AclOperation.READ, ResourceType.TOPIC, (t.name for t in req.topics))
    tc = _tc(svc)
    entries, unknown = commit_entries(svc, req.topics, denied)
    groups = getattr(svc, "groups", None)
    results: dict[tuple[str, int], ErrorCode] = {}
    if groups is None or tc.txn_offsets is None:
        results = {(e.topic, e.partition): ErrorCode.coordinator_not_available for e in entries}
    elif entries:  # as Kafka, nothing reaches the group coordinator when no partition is left
        # The group coordinator answers; the producer is checked by the transaction coordinator
        # (KIP-890 verification), wherever that is, and by the offsets partition's producer state.
        results = await tc.txn_offsets.commit(
            req.transactional_id, req.group_id, int(req.producer_id), int(req.producer_epoch),
            int(getattr(req, "generation_id", -1)), getattr(req, "member_id", "") or "",
            getattr(req, "group_instance_id", None), entries, v)
        if any(c == ErrorCode.none for c in results.values()):
            code = await groups.flush(req.group_id)
            if code != ErrorCode.none:  # not replicated: the producer retries the commit
                results = {tp: code if c == ErrorCode.none else c for tp, c in results.items()}
    if v < 2:  # clients before Kafka 2.0 do not retry COORDINATOR_LOAD_IN_PROGRESS here (KAFKA-7296)
        results = {tp: ErrorCode.coordinator_not_available if c == ErrorCode.coordinator_load_in_progress else c
                   for tp, c in results.items()}
    return {"throttle_time": 0, "topics": partition_errors(req.topics, unknown, results, denied)}


# --- operator APIs --------------------------------------------------------------------------------------

async def handle_describe_transactions(svc: CoordinatorServices, ctx: RequestContext, req: Any
                                      ) -> DescribeTransactionsResponse:
    tc = _tc(svc)
    out: list[DescribeTransactionsTransactionState] = []
    for txn_id in req.transactional_ids:
        entry: DescribeTransactionsTransactionState = {
            "error_code": ErrorCode.none, "transactional_id": txn_id, "transaction_state": "",
            "transaction_timeout": 0, "transaction_start_time": 0, "producer_id": -1, "producer_epoch": -1,
            "topics": []}
        if not allowed(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, txn_id):
            entry["error_code"] = ErrorCode.transactional_id_authorization_failed
            out.append(entry)
            continue
        code, md = tc.sm.describe(txn_id)
        entry["error_code"] = code
        if md is not None:
            by_topic: dict[str, list[int]] = {}
            for t, p in sorted(md.partitions):
                by_topic.setdefault(t, []).append(p)
            # Only the partitions of topics the principal may DESCRIBE.
            hidden = denied_names(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, by_topic)
            entry.update({"transaction_state": md.state.display, "transaction_timeout": md.timeout_ms,
                          "transaction_start_time": md.start_ms, "producer_id": md.producer_id,
                          "producer_epoch": md.producer_epoch,
                          "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items() if t not in hidden]})
        out.append(entry)
    return {"throttle_time": 0, "transaction_states": out}


async def handle_list_transactions(svc: CoordinatorServices, ctx: RequestContext, req: Any) -> ListTransactionsResponse:
    tc = _tc(svc)
    states: set[TxnState] = set()
    unknown: list[str] = []
    for s in req.state_filters:
        st = STATE_BY_NAME.get(s)
        if st is None:
            unknown.append(s)
        else:
            states.add(st)
    if req.state_filters and not states:
        listed = []
    else:
        listed = tc.sm.list(states or None, {int(p) for p in req.producer_id_filters} or None,
                            int(getattr(req, "duration_filter", -1)))
    if ctx.authorizer is not None:  # only the ids the principal may DESCRIBE
        listed = [md for md in listed
                  if allowed(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, md.transactional_id)]
    error = ErrorCode.coordinator_load_in_progress if tc.sm.loading() else ErrorCode.none
    return {"throttle_time": 0, "error_code": error, "unknown_state_filters": unknown,
            "transaction_states": [{"transactional_id": md.transactional_id, "producer_id": md.producer_id,
                                    "transaction_state": md.state.display} for md in listed]}


async def handle_describe_producers(svc: CoordinatorServices, ctx: RequestContext, req: Any
                                   ) -> DescribeProducersResponse:
    topics: list[TopicResponse] = []
    denied = denied_names(ctx, AclOperation.READ, ResourceType.TOPIC, (t.name for t in req.topics))
    for t in req.topics:
        rec = svc.store.topic(t.name)
        parts: list[PartitionResponse] = []
        for idx in t.partition_indexes:
            entry: PartitionResponse = {"partition_index": int(idx), "error_code": ErrorCode.none,
                                        "error_message": None, "active_producers": []}
            p = svc.replicas.partition(t.name, int(idx))
            if denied and t.name in denied:
                entry["error_code"] = ErrorCode.topic_authorization_failed
                entry["error_message"] = "Topic authorization failed."
            elif rec is None or p is None:
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
            elif p.leader_id != svc.broker_id:
                entry["error_code"] = ErrorCode.not_leader_or_follower
            else:
                ps = getattr(p.log, "producer_state", None)
                producers = getattr(ps, "producers", {}) if ps is not None else {}
                entry["active_producers"] = [{
                    "producer_id": e.producer_id, "producer_epoch": e.epoch, "last_sequence": e.last_seq,
                    "last_timestamp": e.last_timestamp, "coordinator_epoch": e.coordinator_epoch,
                    "current_txn_start_offset": -1 if e.current_txn_first_offset is None
                    else e.current_txn_first_offset,
                } for e in producers.values()]
            parts.append(entry)
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
