"""Fetch: serve whole batches from the log, long-polling until min_bytes or max_wait.

Waiting fetches register on the partitions they read and are woken by the high
watermark move that gives them data (see FetchWaiters), not by a timer loop.  Clients
that ask for a fetch session (KIP-227, epoch 0) get one when the cache has room; their
incremental requests are read through it (pykbroker.server.fetch_session).

In a cluster a fetch with a replica id is a follower's: it reads up to the log end offset
(consumers only up to the high watermark), is checked for a diverging epoch (KIP-320), waits
for appends rather than HW movement, and tells the leader how far the follower has come.

Record sets are read with ``Log.read_slice``: a long one stays in its segment file as a
``FileRange`` that the network edge sends with sendfile (pykbroker.server.transmit); only
down-conversion for old fetch versions reads it into memory.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.protocol.file_range import FileRange
from pykbroker.protocol.message_format import down_convert, first_message_size
from pykbroker.protocol.records import InvalidRecords
from pykbroker.protocol.responses.fetch import FetchableTopicResponse, FetchResponse, PartitionData
from pykbroker.replica.replica_manager import ArmedWait, FetchWaiters, Partition
from pykbroker.replication.rules import diverging_epoch
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.authz import cluster_allowed, denied_names
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services
from pykbroker.server.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    FetchSession,
    FetchSessionError,
    PartitionKey,
    SessionTopic,
    next_epoch,
)
from pykbroker.server.parked import Parked
from pykbroker.storage.log import KafkaStorageError, OffsetOutOfRange

READ_UNCOMMITTED = 0
READ_COMMITTED = 1
_ZERO_UUID = uuid.UUID(int=0)


class _Plan:
    """One pass over the requested partitions; re-run after a wake-up."""

    __slots__ = ("bytes", "errors", "topics")

    def __init__(self) -> None:
        self.topics: list[FetchableTopicResponse] = []
        self.bytes = 0
        self.errors = False


def replica_id_of(req: Any, version: int) -> int:
    """The fetching follower's broker id (v15+: in replica_state), -1 for a consumer."""
    if version >= 15:
        state = getattr(req, "replica_state", None)
        return int(state.replica_id) if state is not None else -1
    return int(getattr(req, "replica_id", -1))


def _read_all(svc: Services, ctx: RequestContext, req: Any, by_id: bool, replica_id: int = -1,
              first_pass: bool = True, denied: frozenset[str] | bool = frozenset()) -> _Plan:
    """``denied``: topics the consumer may not READ, or True when a replica fetch lacks CLUSTER_ACTION
    (every partition is then refused)."""
    plan = _Plan()
    # fetch.max.bytes caps what a client may ask for (v3+), as in Kafka.
    remaining = min(max(int(req.max_bytes), 0), svc.config["fetch.max.bytes"]) if ctx.version >= 3 else 1 << 31
    read_committed = int(getattr(req, "isolation_level", 0)) == READ_COMMITTED
    first_with_data = True
    hosted = svc.replicas.partitions().get  # one dict lookup per partition: consumers fetch thousands
    no_error = ErrorCode.none
    broker_id = svc.broker_id
    no_aborted: tuple[()] | None = () if read_committed else None
    for t in req.topics:
        if by_id:
            rec = svc.store.topic_by_id(t.topic_id)
            name = rec.name if rec is not None else None
            unknown = ErrorCode.unknown_topic_id
        else:
            name = t.topic
            rec = svc.store.topic(name)
            unknown = ErrorCode.unknown_topic_or_partition
        parts: list[PartitionData] = []
        for fp in t.partitions:
            idx = int(fp.partition)
            p = hosted((name, idx)) if name is not None else None
            error = no_error
            if denied and (denied is True or (name is not None and name in denied)):
                # Kafka refuses before checking existence (an unknown topic id has no name to refuse).
                error = ErrorCode.topic_authorization_failed
            elif rec is None or p is None:
                if rec is not None and name is not None and svc.replicas.is_offline(name, idx):
                    error = ErrorCode.kafka_storage_error
                else:
                    error = unknown if rec is None else ErrorCode.unknown_topic_or_partition
            elif p.log.offline:  # its log dir failed (KIP-112)
                error = ErrorCode.kafka_storage_error
            else:
                # Kafka checks the fetcher's leader epoch before leadership: a stale epoch is fenced
                # on any replica, a newer one is unknown here until the metadata catches up.
                leader_epoch = int(getattr(fp, "current_leader_epoch", -1))
                if leader_epoch != -1 and leader_epoch != p.leader_epoch:
                    error = (ErrorCode.fenced_leader_epoch if leader_epoch < p.leader_epoch
                             else ErrorCode.unknown_leader_epoch)
                elif p.leader_id != broker_id:
                    error = ErrorCode.not_leader_or_follower
            if error is not no_error or p is None or replica_id >= 0:
                entry: PartitionData = {
                    "partition_index": idx,
                    "error_code": error,
                    "high_watermark": -1,
                    "last_stable_offset": -1,
                    "log_start_offset": -1,
                    "aborted_transactions": no_aborted,
                    "preferred_read_replica": -1,
                    # Empty, never null, even with an error: Kafka sends MemoryRecords.EMPTY and
                    # librdkafka rejects a null record set (MessageSetSize -1) as a parse failure.
                    "records": b"",
                }
                parts.append(entry)
                if error is not no_error or p is None:
                    plan.errors = True
                    continue
                _read_for_follower(svc, p, fp, entry, plan, replica_id, first_pass, remaining, first_with_data)
                if entry["records"]:
                    remaining -= len(entry["records"])
                    first_with_data = False
                continue
            # A consumer's partition, led here: the entry is built once with its offsets (most of a
            # consumer's thousands of partitions end at the caught-up check below).
            lg = p.log
            high_watermark = p.high_watermark
            last_stable = p.last_stable_offset
            log_start = lg.log_start_offset
            entry = {
                "partition_index": idx,
                "error_code": no_error,
                "high_watermark": high_watermark,
                "last_stable_offset": last_stable,
                "log_start_offset": log_start,
                "aborted_transactions": no_aborted,
                "preferred_read_replica": -1,
                "records": b"",
            }
            parts.append(entry)
            max_offset = last_stable if read_committed else high_watermark
            fetch_offset = int(fp.fetch_offset)
            if fetch_offset == max_offset and fetch_offset >= log_start:
                # Caught up: nothing to read. The common case for most partitions of a consumer
                # with many of them, so it skips the log's read path entirely.
                continue
            if remaining <= 0 and not first_with_data:
                # The response is full. Kafka still reads, with a limit of 0, which can only give
                # empty records or OFFSET_OUT_OF_RANGE: decided here without touching the log.
                if not log_start <= fetch_offset <= lg.log_end_offset:
                    entry["error_code"] = ErrorCode.offset_out_of_range
                    plan.errors = True
                continue
            limit = min(int(fp.partition_max_bytes), remaining)
            try:
                result = lg.read_slice(fetch_offset, max(limit, 0), max_offset=max_offset,
                                       min_one_message=first_with_data)
                data = result.records
                if data and read_committed:  # aborted transactions in the returned range
                    entry["aborted_transactions"] = [
                        {"producer_id": pid, "first_offset": first}
                        for pid, first in lg.collect_aborted_transactions(result.first_offset, result.next_offset)]
            except OffsetOutOfRange:
                entry["error_code"] = ErrorCode.offset_out_of_range
                plan.errors = True
                continue
            except KafkaStorageError:
                entry["error_code"] = ErrorCode.kafka_storage_error
                entry["aborted_transactions"] = () if read_committed else None
                plan.errors = True
                continue
            if data:
                entry["records"] = data  # bytes, or a FileRange the network edge sends from the segment file
                plan.bytes += len(data)
                remaining -= len(data)
                first_with_data = False
            else:
                entry["records"] = b""
        plan.topics.append({"topic": name, "topic_id": getattr(t, "topic_id", _ZERO_UUID),
                            "partitions": parts})
    return plan


def _read_for_follower(svc: Services, p: Partition, fp: Any, entry: PartitionData, plan: _Plan, replica_id: int,
                       first_pass: bool, remaining: int, first_with_data: bool) -> None:
    """A follower's fetch: up to the LEO (not the HW), with the diverging-epoch check (KIP-320).

    Its fetch offset tells us what it has: the first pass records that, which may add it to
    the ISR and advance the HW.
    """
    lg = p.log
    if replica_id not in p.replicas:  # Kafka: not a known follower of the partition
        entry["error_code"] = ErrorCode.not_leader_or_follower
        plan.errors = True
        return
    fetch_offset = int(fp.fetch_offset)
    last_fetched_epoch = int(getattr(fp, "last_fetched_epoch", -1))
    diverging = diverging_epoch(last_fetched_epoch, fetch_offset,
                                lg.end_offset_for_epoch(last_fetched_epoch) if last_fetched_epoch >= 0 else None)
    if diverging is not None:
        entry["diverging_epoch"] = {"epoch": diverging[0], "end_offset": diverging[1]}
        entry["high_watermark"] = p.high_watermark
        entry["last_stable_offset"] = p.last_stable_offset
        entry["log_start_offset"] = lg.log_start_offset
        plan.errors = True  # answer at once
        return
    if lg.log_start_offset <= fetch_offset <= lg.log_end_offset and first_pass:
        svc.replicas.on_follower_fetch(p, replica_id, fetch_offset, int(getattr(fp, "log_start_offset", -1)))
    entry["high_watermark"] = p.high_watermark
    entry["last_stable_offset"] = p.last_stable_offset
    entry["log_start_offset"] = lg.log_start_offset
    try:
        result = lg.read_slice(fetch_offset, max(min(int(fp.partition_max_bytes), remaining), 0),
                               min_one_message=first_with_data)
    except OffsetOutOfRange:
        entry.update({"error_code": ErrorCode.offset_out_of_range, "high_watermark": -1, "last_stable_offset": -1,
                      "log_start_offset": -1})
        plan.errors = True
        return
    except KafkaStorageError:
        entry.update({"error_code": ErrorCode.kafka_storage_error, "high_watermark": -1, "last_stable_offset": -1,
                      "log_start_offset": -1})
        plan.errors = True
        return
    if result.records:
        entry["records"] = result.records
        plan.bytes += len(result.records)


def _request_topic_names(svc: Services, req: Any, by_id: bool) -> list[str | None]:
    if not by_id:
        return [t.topic for t in req.topics]
    out: list[str | None] = []
    for t in req.topics:
        rec = svc.store.topic_by_id(t.topic_id)
        out.append(rec.name if rec is not None else None)
    return out


def _fetched_partitions(svc: Services, req: Any, by_id: bool) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for t in req.topics:
        if by_id:
            rec = svc.store.topic_by_id(t.topic_id)
            if rec is None:
                continue
            name = rec.name
        else:
            name = t.topic
        out.extend((name, int(fp.partition)) for fp in t.partitions)
    return out


class _SessionRequest:
    """An incremental request seen through its session: every partition the session holds."""

    __slots__ = ("isolation_level", "max_bytes", "topics")

    def __init__(self, req: Any, topics: list[SessionTopic]) -> None:
        self.max_bytes = req.max_bytes
        self.isolation_level = getattr(req, "isolation_level", READ_UNCOMMITTED)
        self.topics = topics


def _keep_changed(source: _SessionRequest, plan: _Plan, session: FetchSession) -> None:
    """An incremental response carries only the partitions with news (KIP-227); the ones that
    returned records are read last next time."""
    returned: list[PartitionKey] = []
    kept_topics = []
    for st, topic in zip(source.topics, plan.topics, strict=True):
        kept: list[PartitionData] = []
        for cp, entry in zip(st.partitions, topic["partitions"], strict=True):
            if cp.must_respond(entry):
                kept.append(entry)
                if entry["records"]:
                    returned.append((cp.topic_id if session.by_id else cp.topic or "", cp.partition))
        if kept:
            topic["partitions"] = kept
            kept_topics.append(topic)
    plan.topics = kept_topics
    session.rotate(returned)


def _open_session(svc: Services, req: Any, plan: _Plan, by_id: bool) -> int:
    """A session for a full request with epoch 0, if the cache has room; its id (0: none)."""
    size = sum(len(t.partitions) for t in req.topics)
    session = svc.fetch_sessions.create(by_id, size)
    if session is None:
        return 0
    session.apply(req.topics, (), lambda tid: _topic_name(svc, tid))
    for t, topic in zip(req.topics, plan.topics, strict=True):
        key = t.topic_id if by_id else t.topic
        for entry in topic["partitions"]:
            cp = session.partitions.get((key, entry["partition_index"]))
            if cp is not None:
                cp.remember(entry)
    return session.id


def _topic_name(svc: Services, topic_id: uuid.UUID) -> str | None:
    rec = svc.store.topic_by_id(topic_id)
    return rec.name if rec is not None else None


async def handle_fetch(svc: Services, ctx: RequestContext, req: Any) -> FetchResponse | Parked[FetchResponse | None]:
    v = ctx.version
    by_id = v >= 13
    session_epoch = int(getattr(req, "session_epoch", FINAL_EPOCH))
    session_id = int(getattr(req, "session_id", 0))
    session: FetchSession | None = None
    source: Any = req
    if v >= 7:
        if session_epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id:  # a full request closes the session it names
                svc.fetch_sessions.remove(session_id)
        else:
            try:
                session = svc.fetch_sessions.incremental(session_id, session_epoch)
            except FetchSessionError as e:
                return {"throttle_time": 0, "error_code": e.code, "session_id": 0, "responses": ()}
            session.apply(req.topics, getattr(req, "forgotten_topics_data", ()) or (),
                          lambda tid: _topic_name(svc, tid))
            source = _SessionRequest(req, session.topics())

    max_wait_s = req.max_wait.total_seconds()
    min_bytes = int(req.min_bytes)
    deadline = anyio.current_time() + max(max_wait_s, 0.0)
    # Only a cluster has followers; with embedded metadata a replica id is read as a consumer's, as before.
    replica_id = replica_id_of(req, v) if svc.replicas.replicating else -1
    denied: frozenset[str] | bool = frozenset()
    if ctx.authorizer is not None:  # once per request, per topic name; nothing without an authorizer
        if replica_id_of(req, v) >= 0:  # a follower needs CLUSTER_ACTION, else every partition is refused
            denied = not cluster_allowed(ctx, AclOperation.CLUSTER_ACTION)
        else:
            denied = denied_names(ctx, AclOperation.READ, ResourceType.TOPIC,
                                  _request_topic_names(svc, source, by_id))
    plan = _read_all(svc, ctx, source, by_id, replica_id, denied=denied)
    if plan.bytes < min_bytes and not plan.errors and max_wait_s > 0:
        tps = _fetched_partitions(svc, source, by_id)
        # A follower waits for appends, a consumer for the high watermark to move.
        waiters = svc.replicas.replica_fetch_waiters if replica_id >= 0 else svc.replicas.fetch_waiters
        armed = waiters.arm(tps)  # now, right after the read: an append before the wait starts still wakes it

        async def wait_then_answer() -> FetchResponse:
            waited = await _long_poll(svc, ctx, source, by_id, replica_id, denied, plan, min_bytes, deadline,
                                      waiters, tps, armed)
            return _answer(svc, req, v, session, session_epoch, by_id, source, replica_id, waited)

        if session is None and not (v >= 7 and session_epoch == INITIAL_EPOCH):
            # Sessionless: wait with the connection's next requests processed meanwhile (a fetch answers
            # with what exists when it answers).  A fetch session's state (its epoch, the partitions it
            # remembers) changes with each answer, so those fetches still wait in place.
            parked: Parked[FetchResponse | None] = Parked(wait_then_answer, long_poll=True)
            return parked
        return await wait_then_answer()
    return _answer(svc, req, v, session, session_epoch, by_id, source, replica_id, plan)


async def _long_poll(svc: Services, ctx: RequestContext, source: Any, by_id: bool, replica_id: int,
                     denied: frozenset[str] | bool, plan: _Plan, min_bytes: int, deadline: float,
                     waiters: FetchWaiters, tps: list[tuple[str, int]], armed: ArmedWait) -> _Plan:
    """Read again each time a fetched partition is notified, until min_bytes or the deadline; the first
    wait is ``armed`` when the first read was made."""
    first: ArmedWait | None = armed
    while plan.bytes < min_bytes and not plan.errors and not svc.shutting_down.is_set():
        remaining = deadline - anyio.current_time()
        if remaining <= 0:
            break
        wait, first = (first or waiters.arm(tps)), None
        if not await wait.wait(remaining):
            # max_wait passed and none of the partitions was notified: no high watermark moved
            # (nor an append, for a follower), no leader changed, no log dir failed, so the
            # first pass still answers.  Only a log start offset moved by retention meanwhile
            # is left for the next fetch.  A consumer of thousands of idle partitions long-polls
            # all the time; this halves what each poll costs.
            break
        plan = _read_all(svc, ctx, source, by_id, replica_id, first_pass=False, denied=denied)
    return plan


def _answer(svc: Services, req: Any, v: int, session: FetchSession | None, session_epoch: int, by_id: bool,
            source: Any, replica_id: int, plan: _Plan) -> FetchResponse:
    """The response from the last read pass; a session remembers what it answered."""
    if v <= 3:  # clients from before Kafka 0.11 read message format v0/v1; never on the modern path
        _down_convert(svc, req, plan.topics, 0 if v <= 1 else 1)
    if plan.bytes:
        _count_bytes_out(svc, plan, replica_id >= 0)
    response_session_id = 0
    if session is not None:
        _keep_changed(source, plan, session)
        session.epoch = next_epoch(session.epoch)
        response_session_id = session.id
    elif v >= 7 and session_epoch == INITIAL_EPOCH:
        response_session_id = _open_session(svc, req, plan, by_id)
    return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": response_session_id,
            "responses": plan.topics}


def _count_bytes_out(svc: Services, plan: _Plan, replication: bool) -> None:
    """BytesOutPerSec (ReplicationBytesOutPerSec for a follower) per topic, for the metrics."""
    stats = svc.stats
    for t in plan.topics:
        n = sum(len(e["records"]) for e in t["partitions"] if e["records"])
        if n and (name := t["topic"]) is not None:  # records come only from a topic hosted here, so named
            c = stats.topic(name)
            if replication:
                c.replication_bytes_out += n
            else:
                c.bytes_out += n
                c.fetch_requests += 1


def _down_convert(svc: Services, req: Any, topics: list[FetchableTopicResponse], magic: int) -> None:
    """Rewrite each partition's batches as ``magic`` messages, as Kafka does for Fetch v0-3.

    With ``message.downconversion.enable`` false (topic, else the broker's
    ``log.message.downconversion.enable``) the partition gets UNSUPPORTED_VERSION instead,
    and a topic stored as zstd UNSUPPORTED_COMPRESSION_TYPE (old formats cannot carry it).
    """
    asked = {(t.topic, int(fp.partition)): fp for t in req.topics for fp in t.partitions}
    broker_enabled = bool(svc.config["log.message.downconversion.enable"])
    for topic in topics:
        rec = svc.store.topic(topic["topic"]) if topic["topic"] is not None else None
        enabled = broker_enabled
        zstd = False
        if rec is not None:
            override = rec.configs.get("message.downconversion.enable")
            if override is not None:
                enabled = str(override).strip().lower() == "true"
            zstd = rec.configs.get("compression.type", svc.config["compression.type"]) == "zstd"
        for entry in topic["partitions"]:
            if entry["error_code"] != ErrorCode.none:
                continue
            error = None if enabled else ErrorCode.unsupported_version
            if error is None and zstd:
                error = ErrorCode.unsupported_compression_type
            if error is None and entry["records"]:
                fp = asked[(topic["topic"], entry["partition_index"])]
                records = entry["records"]
                try:
                    if isinstance(records, FileRange):  # old formats are rewritten in memory
                        records = records.read()
                    converted = down_convert(records, magic, int(fp.fetch_offset))
                except InvalidRecords as e:
                    error = ErrorCode(e.error_code)
                else:
                    # The partition's limit holds for the converted bytes too; a cut message at the end is
                    # allowed (old clients drop it), but never fewer bytes than the first whole message.
                    limit = max(int(fp.partition_max_bytes), first_message_size(converted))
                    entry["records"] = converted[:limit]
            if error is not None:
                entry.update({"error_code": error, "high_watermark": -1, "last_stable_offset": -1,
                              "log_start_offset": -1, "records": b""})
