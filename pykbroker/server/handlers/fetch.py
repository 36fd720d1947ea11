"""Fetch: serve whole batches from the log, long-polling until min_bytes or max_wait.

Waiting fetches register on the partitions they read and are woken by the
append that gives them data (see FetchWaiters), not by a timer loop.  Fetch
sessions (KIP-227) are answered sessionless: session id 0 tells clients to keep
sending full requests.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.server.context import RequestContext, Services
from pykbroker.storage.log import OffsetOutOfRange

READ_UNCOMMITTED = 0
READ_COMMITTED = 1
FINAL_EPOCH = -1
INITIAL_EPOCH = 0
_ZERO_UUID = uuid.UUID(int=0)


class _Plan:
    """One pass over the requested partitions; re-run after a wake-up."""

    __slots__ = ("bytes", "errors", "topics")

    def __init__(self) -> None:
        self.topics: list[dict[str, Any]] = []
        self.bytes = 0
        self.errors = False


def _read_all(svc: Services, ctx: RequestContext, req: Any, by_id: bool) -> _Plan:
    plan = _Plan()
    remaining = max(int(req.max_bytes), 0) if ctx.version >= 3 else 1 << 31
    read_committed = int(getattr(req, "isolation_level", 0)) == READ_COMMITTED
    first_with_data = True
    for t in req.topics:
        if by_id:
            rec = svc.store.topic_by_id(t.topic_id)
            name = rec.name if rec is not None else None
            unknown = ErrorCode.unknown_topic_id
        else:
            name = t.topic
            rec = svc.store.topic(name)
            unknown = ErrorCode.unknown_topic_or_partition
        parts: list[dict[str, Any]] = []
        for fp in t.partitions:
            idx = int(fp.partition)
            p = svc.replicas.partition(name, idx) if name is not None else None
            entry: dict[str, Any] = {
                "partition_index": idx,
                "error_code": ErrorCode.none,
                "high_watermark": -1,
                "last_stable_offset": -1,
                "log_start_offset": -1,
                "aborted_transactions": () if read_committed else None,
                "preferred_read_replica": -1,
                # Empty, never null, even with an error: Kafka sends MemoryRecords.EMPTY and
                # librdkafka rejects a null record set (MessageSetSize -1) as a parse failure.
                "records": b"",
            }
            parts.append(entry)
            if rec is None or p is None:
                entry["error_code"] = unknown if rec is None else ErrorCode.unknown_topic_or_partition
                plan.errors = True
                continue
            if p.leader_id != svc.broker_id:
                entry["error_code"] = ErrorCode.not_leader_or_follower
                plan.errors = True
                continue
            leader_epoch = int(getattr(fp, "current_leader_epoch", -1))
            if leader_epoch != -1 and leader_epoch != p.leader_epoch:
                entry["error_code"] = (
                    ErrorCode.fenced_leader_epoch if leader_epoch < p.leader_epoch else ErrorCode.unknown_leader_epoch
                )
                plan.errors = True
                continue
            lg = p.log
            entry["high_watermark"] = p.high_watermark
            entry["last_stable_offset"] = p.last_stable_offset
            entry["log_start_offset"] = lg.log_start_offset
            max_offset = p.last_stable_offset if read_committed else p.high_watermark
            limit = min(int(fp.partition_max_bytes), remaining)
            try:
                result = lg.read(int(fp.fetch_offset), max(limit, 0), max_offset=max_offset,
                                 min_one_message=first_with_data)
            except OffsetOutOfRange:
                entry["error_code"] = ErrorCode.offset_out_of_range
                plan.errors = True
                continue
            data = result.records
            if data and read_committed:  # aborted transactions in the returned range
                entry["aborted_transactions"] = [
                    {"producer_id": pid, "first_offset": first}
                    for pid, first in lg.collect_aborted_transactions(result.first_offset, result.next_offset)]
            if data:
                entry["records"] = bytes(data)
                plan.bytes += len(data)
                remaining -= len(data)
                first_with_data = False
            else:
                entry["records"] = b""
        plan.topics.append({"topic": name, "topic_id": getattr(t, "topic_id", _ZERO_UUID),
                            "partitions": parts})
    return plan


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


async def handle_fetch(svc: Services, ctx: RequestContext, req: Any) -> dict[str, Any]:
    v = ctx.version
    by_id = v >= 13
    session_epoch = int(getattr(req, "session_epoch", FINAL_EPOCH))
    session_id = int(getattr(req, "session_id", 0))
    if session_id != 0 or session_epoch not in (INITIAL_EPOCH, FINAL_EPOCH):
        # We never hand out sessions, so a client naming one is out of step.
        return {"throttle_time": 0, "error_code": ErrorCode.fetch_session_id_not_found, "session_id": 0,
                "responses": ()}

    max_wait_s = req.max_wait.total_seconds()
    min_bytes = int(req.min_bytes)
    deadline = anyio.current_time() + max(max_wait_s, 0.0)
    plan = _read_all(svc, ctx, req, by_id)
    if plan.bytes < min_bytes and not plan.errors and max_wait_s > 0:
        tps = _fetched_partitions(svc, req, by_id)
        while plan.bytes < min_bytes and not plan.errors and not svc.shutting_down.is_set():
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                break
            event = anyio.Event()
            svc.replicas.fetch_waiters.register(tps, event)
            try:
                with anyio.move_on_after(remaining):
                    await event.wait()
            finally:
                svc.replicas.fetch_waiters.unregister(tps, event)
            plan = _read_all(svc, ctx, req, by_id)
    return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": plan.topics}
