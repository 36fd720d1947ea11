"""Produce: validate batches and their records, append, acknowledge per acks.

Every record is checked as Kafka's LogValidator does (a C walk over the records);
offsets are then written into the batch header in place and the bytes go to the
log as they came, unless the topic's compression.type asks for another codec.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.logsetup import fields
from pykbroker.protocol.framing import CloseConnection
from pykbroker.protocol.message_format import is_message_set, up_convert
from pykbroker.protocol.record_validator import validate_records
from pykbroker.protocol.records import InvalidRecords, parse_batch_header, validate_for_append
from pykbroker.protocol.responses.produce import PartitionProduceResponse, ProduceResponse, TopicProduceResponse
from pykbroker.replica import group_commit
from pykbroker.replica.append_hooks import ForwardFirst
from pykbroker.replica.replica_manager import Partition
from pykbroker.security.authorizer import AclOperation, ResourceType
from pykbroker.security.authz import allowed, denied_names
from pykbroker.security.request import RequestContext
from pykbroker.server.context import Services, now_ms
from pykbroker.server.parked import Parked, Settled
from pykbroker.storage.log import KafkaStorageError
from pykbroker.storage.producer_state import ProducerStateError

log = logging.getLogger("pykbroker.produce")

# An acks=all append the HW has not reached yet: (partition, offset to reach, its topic's partition
# responses, the index of its own, min ISR).
Awaiting = tuple[Partition, int, list[PartitionProduceResponse], int, int]


def _partition_error(index: int, code: ErrorCode, message: str | None = None) -> PartitionProduceResponse:
    return {
        "index": index,
        "error_code": code,
        "base_offset": -1,
        "log_append_time": -1,
        "log_start_offset": -1,
        "record_errors": (),
        "error_message": message,
    }


def _invalid_records(index: int, e: InvalidRecords) -> PartitionProduceResponse:
    """The partition response for refused records: Kafka's per-record errors, if any (Produce v8+)."""
    out = _partition_error(index, ErrorCode(e.error_code), str(e))
    if e.record_errors:
        out["record_errors"] = [{"batch_index": i, "batch_index_error_message": m} for i, m in e.record_errors]
    return out


# A connection's pre-append refusals, by partition (Session.extra): see _refused_behind.
_REFUSALS = "produce.refusals"
# The batches of one producer still in flight behind a refused one: an idempotent producer keeps at most five
# requests in flight on a connection (Kafka's limit with enable.idempotence), the refused one among them.
_IN_FLIGHT_BEHIND = 4
_SEQ_SPACE = 2**31
# Refusals before the append that a producer retries, in order, with the same sequence numbers.
_RETRIED_REFUSALS = frozenset({ErrorCode.not_enough_replicas, ErrorCode.not_leader_or_follower,
                               ErrorCode.kafka_storage_error})
_BATCH_IDENTITY = struct.Struct(">qhi")  # producer id, producer epoch, base sequence: bytes 43..57 of a v2 batch


@dataclass(slots=True)
class _Refusal:
    producer_id: int
    producer_epoch: int
    base_sequence: int
    error_code: ErrorCode
    behind: int = _IN_FLIGHT_BEHIND


def _batch_identity(records: bytes) -> tuple[int, int, int] | None:
    """(producer id, epoch, base sequence) of an idempotent v2 batch; None for anything else."""
    if len(records) < 61 or records[16] != 2:
        return None
    pid, epoch, seq = _BATCH_IDENTITY.unpack_from(records, 43)
    return (pid, epoch, seq) if pid >= 0 and seq >= 0 else None


def _remember_refusal(ctx: RequestContext, tp: tuple[str, int], records: bytes | None, code: ErrorCode) -> None:
    """A batch refused before the append with an error its producer retries: the ones behind it are refused
    alike (:func:`_refused_behind`)."""
    if code not in _RETRIED_REFUSALS or not records:
        return
    identity = _batch_identity(records)
    if identity is None:
        return
    refusals: dict[tuple[str, int], _Refusal] = ctx.session.extra.setdefault(_REFUSALS, {})
    known = refusals.get(tp)
    if known is not None and (known.producer_id, known.producer_epoch) == identity[:2] \
            and not _after(known.base_sequence, identity[2]):
        return  # an earlier batch of the producer was refused first: that is where its retries start
    refusals[tp] = _Refusal(*identity, code)


def _after(seq: int, than: int) -> bool:
    return 0 < (seq - than) % _SEQ_SPACE < _SEQ_SPACE // 2


def _refused_behind(ctx: RequestContext, tp: tuple[str, int], records: bytes | None
                    ) -> PartitionProduceResponse | None:
    """The refusal of a batch that continues the sequence of one refused before it on this connection.

    Kafka processes a connection's requests one at a time, so the requests a producer pipelined behind a
    refused one are checked right after it, against the same ISR and leadership, and almost always refused
    alike.  Here they are checked as they arrive (a parked produce does not hold them back), and a refusal
    followed by an acceptance would answer the later batch OUT_OF_ORDER_SEQUENCE_NUMBER: a gap the producer
    made no mistake to cause.  librdkafka answers that by bumping its producer epoch and renumbering every
    record it holds, a batch the broker appended but could not acknowledge among them, which it then appends
    a second time.  So such a batch gets the same refusal; the producer retries them all, in order."""
    refusals: dict[tuple[str, int], _Refusal] | None = ctx.session.extra.get(_REFUSALS)
    if not refusals:
        return None
    known = refusals.get(tp)
    if known is None:
        return None
    identity = _batch_identity(records) if records else None
    if identity is None or (known.producer_id, known.producer_epoch) != identity[:2] \
            or not _after(identity[2], known.base_sequence) or known.behind <= 0:
        del refusals[tp]  # the retry of the refused batch (or another producer): checked as any batch
        return None
    known.behind -= 1
    return _partition_error(tp[1], known.error_code,
                            f"Refused as the batch before it (sequence {known.base_sequence}) of producer "
                            f"{known.producer_id} on this connection, which is to be retried first")


def _append(svc: Services, ctx: RequestContext, p: Partition, records: bytes, now: int,
            transactional_id: str | None) -> PartitionProduceResponse:
    lg = p.log
    cfg = lg.config
    log_append = cfg.log_append_time
    # Header checks (magic, sizes, CRC, counts), then every record as Kafka's LogValidator does it.
    batches = validate_for_append(
        records,
        max_batch_bytes=cfg.max_message_bytes,
        now_ms=now,
        timestamp_type=1 if log_append else 0,
        check_timestamps=False,
    )
    hooks = svc.append_hooks
    if hooks.check_batch is not None:
        hooks.check_batch(ctx, p, batches[0], transactional_id)  # e.g. KIP-890 verification
    buf = bytearray(records)
    rebuilt = validate_records(
        buf,
        batches[0],
        topic_partition=f"{p.topic}-{p.index}",
        now_ms=now,
        log_append_time=log_append,
        before_max_ms=cfg.timestamp_before_max_ms,
        after_max_ms=cfg.timestamp_after_max_ms,
        compacted=cfg.compact_enabled,
        compression_type=cfg.compression_type,
        max_message_bytes=cfg.max_message_bytes,
    )
    if rebuilt is not None:  # recompressed to the topic's codec, or offsets renumbered
        buf = rebuilt
        batches = [parse_batch_header(buf, 0)]
    # e.g. delayed delivery: records due later go elsewhere (ForwardFirst: to another broker first)
    if hooks.transform is not None:
        buf, batches = hooks.transform(p, buf, batches, now)
    if not batches:  # every record went elsewhere: no offset in the target yet
        return {**_partition_error(p.index, ErrorCode.none), "log_start_offset": lg.log_start_offset}
    return _append_validated(svc, p, buf, batches, now)


def _append_validated(svc: Services, p: Partition, buf: bytearray, batches: list[Any], now: int
                      ) -> PartitionProduceResponse:
    lg = p.log
    log_append = lg.config.log_append_time
    # A retried idempotent batch (result.duplicate) appends nothing and reports its original offsets.
    result = lg.append(buf, batches, log_append_time_ms=now if log_append else None)
    if not result.duplicate:
        svc.replicas.on_appended(p)
        svc.stats.appended(p.topic, result.last_offset - result.first_offset + 1, len(buf))
    return {
        "index": p.index,
        "error_code": ErrorCode.none,
        "base_offset": result.first_offset,
        "log_append_time": result.log_append_time_ms,
        "log_start_offset": lg.log_start_offset,
        "record_errors": (),
        "error_message": None,
    }


async def _append_after_forward(svc: Services, p: Partition, f: ForwardFirst, now: int) -> PartitionProduceResponse:
    """A hook sent part of the batch elsewhere first (e.g. delayed records to the broker leading their
    ``__delayed_records`` partition, acks=-1); only then is the rest appended here."""
    code = await f.send()
    if code != ErrorCode.none:
        return _partition_error(p.index, code, f.error_message)
    if not f.batches:
        return {**_partition_error(p.index, ErrorCode.none), "log_start_offset": p.log.log_start_offset}
    if svc.replicas.partition(p.topic, p.index) is not p or not p.is_leader:
        return _partition_error(p.index, ErrorCode.not_leader_or_follower)
    return _append_validated(svc, p, f.buf, f.batches, now)


def _fail_unflushed(responses: list[TopicProduceResponse], p: Partition, message: str) -> None:
    for r in responses:
        if r["name"] == p.topic:
            parts = cast("list[PartitionProduceResponse]", r["partition_responses"])  # handle_produce's list
            for i, part in enumerate(parts):
                if part["index"] == p.index and part["error_code"] == ErrorCode.none:
                    parts[i] = _partition_error(p.index, ErrorCode.kafka_storage_error, message)


def _replication_outcome(svc: Services, p: Partition, required: int, min_isr: int) -> ErrorCode | None:
    """Kafka's delayed-produce check: None while waiting, else the partition's answer."""
    if svc.replicas.partition(p.topic, p.index) is not p or not p.is_leader:
        return ErrorCode.not_leader_or_follower
    if p.log.offline:
        return ErrorCode.kafka_storage_error
    if p.high_watermark >= required:
        if len(p.isr) < min_isr:
            _min_isr_refused(svc, p, ErrorCode.not_enough_replicas_after_append, min_isr)
            return ErrorCode.not_enough_replicas_after_append
        if svc.stats.min_isr.logged:
            svc.stats.min_isr.accepted(p.topic, p.index)
        return ErrorCode.none
    return None


def _min_isr_refused(svc: Services, p: Partition, code: ErrorCode, min_isr: int) -> None:
    """Count a NOT_ENOUGH_REPLICAS(_AFTER_APPEND) answer; log it once per partition, cause and ISR, with the
    ISR this leader saw (a producer retries these many times a second)."""
    isr = tuple(sorted(p.isr))
    if svc.stats.min_isr.refused(p.topic, p.index, code.name.upper(), isr):
        log.warning(
            "%(error)s for %(topic)s-%(partition)d: the ISR %(isr)s this leader has (leader epoch "
            "%(leader_epoch)d, replicas %(replicas)s) is smaller than min.insync.replicas=%(min_isr)d%(cause)s",
            {"error": code.name.upper(), "topic": p.topic, "partition": p.index, "isr": list(isr),
             "leader_epoch": p.leader_epoch, "replicas": list(p.replicas), "min_isr": min_isr,
             "cause": "" if code == ErrorCode.not_enough_replicas
             else " after the append (the ISR shrank while the request waited for it)"})


async def _await_replication(svc: Services, awaiting: list[Awaiting], timeout_ms: int) -> None:
    """Delayed produce: wait (up to the request's timeout) until the HW covers each append."""
    deadline = anyio.current_time() + max(timeout_ms, 0) / 1000
    # Appends whose answer is already an error (fsync failed) wait for nothing.
    pending = [item for item in awaiting if item[2][item[3]]["error_code"] == ErrorCode.none]
    waiters = svc.replicas.produce_waiters
    for _ in range(1_000_000):  # bounded: each round is woken by an HW or ISR change, or times out
        still = []
        for item in pending:
            p, required, parts, i, min_isr = item
            outcome = _replication_outcome(svc, p, required, min_isr)
            if outcome is None:
                still.append(item)
            elif outcome != ErrorCode.none:
                parts[i] = _partition_error(p.index, outcome)
        pending = still
        remaining = deadline - anyio.current_time()
        if not pending or remaining <= 0 or svc.shutting_down.is_set():
            break
        await waiters.wait([p.tp for p, *_ in pending], remaining)
    for p, _required, parts, i, _min_isr in pending:
        parts[i] = _partition_error(p.index, ErrorCode.request_timed_out)


def _has_transactional_batch(req: Any) -> bool:
    """Does any partition carry a transactional v2 batch?  (attributes bit 4; magic at byte 16)"""
    for topic in req.topic_data or ():
        for pd in topic.partition_data:
            r = pd.records
            if r is not None and len(r) > 22 and r[16] == 2 and r[22] & 0x10:
                return True
    return False


def _whole_request_error(req: Any, code: ErrorCode) -> ProduceResponse:
    """Kafka's ProduceRequest.getErrorResponse: the one error on every partition."""
    return {"responses": [{"name": t.name, "partition_responses": [_partition_error(int(pd.index), code)
                                                                     for pd in t.partition_data]}
                          for t in req.topic_data or ()],
            "throttle_time": 0}


async def handle_produce(svc: Services, ctx: RequestContext, req: Any
                         ) -> ProduceResponse | Parked[ProduceResponse | None] | None:
    """Check and append every partition in request order; a ``Parked`` answer when it must then wait for
    an fsync (log.flush.on.ack) or for the ISR (acks=all)."""
    acks = int(req.acks)
    now = now_ms()
    denied: frozenset[str] = frozenset()
    if ctx.authorizer is not None:  # once per request; nothing per partition without an authorizer
        if _has_transactional_batch(req):
            txn_id = getattr(req, "transactional_id", None)
            if not txn_id or not allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id):
                if acks == 0:
                    raise CloseConnection("acks=0 produce failed authorization; closing the connection as Kafka does")
                return _whole_request_error(req, ErrorCode.transactional_id_authorization_failed)
        denied = denied_names(ctx, AclOperation.WRITE, ResourceType.TOPIC, (t.name for t in req.topic_data or ()))
    responses: list[TopicProduceResponse] = []
    appended: list[Partition] = []
    awaiting: list[Awaiting] = []
    for topic in req.topic_data or ():  # null is refused by the bounds pre-pass; never iterate None
        name = topic.name
        rec = svc.store.topic(name)
        parts: list[PartitionProduceResponse] = []
        for pd in topic.partition_data:
            idx = int(pd.index)
            if denied and name in denied:  # before existence: no leak of which topics exist
                parts.append(_partition_error(idx, ErrorCode.topic_authorization_failed))
                continue
            if acks not in (-1, 0, 1):
                parts.append(_partition_error(idx, ErrorCode.invalid_required_acks))
                continue
            if rec is None or idx not in rec.partitions:
                parts.append(_partition_error(idx, ErrorCode.unknown_topic_or_partition))
                continue
            # An internal topic takes appends only through a hook that owns them (e.g. delayed records
            # forwarded by another broker).
            internal_appender = svc.append_hooks.internal_appender(ctx, name) if rec.internal else None
            if rec.internal and internal_appender is None:
                parts.append(_partition_error(idx, ErrorCode.invalid_topic_exception,
                                              f"Cannot append to internal topic {name}"))
                continue
            p = svc.replicas.partition(name, idx)
            if p is None and svc.replicas.is_offline(name, idx):  # its log dir failed, maybe before start
                _remember_refusal(ctx, (name, idx), pd.records, ErrorCode.kafka_storage_error)
                parts.append(_partition_error(idx, ErrorCode.kafka_storage_error))
                continue
            if p is None or p.leader_id != svc.broker_id:
                _remember_refusal(ctx, (name, idx), pd.records, ErrorCode.not_leader_or_follower)
                parts.append(_partition_error(idx, ErrorCode.not_leader_or_follower))
                continue
            behind = _refused_behind(ctx, (name, idx), pd.records)
            if behind is not None:
                log.debug("produce refused", extra=fields(
                    topic=name, partition=idx, client_id=ctx.header.client_id,
                    error=ErrorCode(behind["error_code"]).name, reason=behind["error_message"]))
                parts.append(behind)
                continue
            min_isr = 1
            if acks == -1:
                min_isr = int(rec.configs.get("min.insync.replicas", svc.config["min.insync.replicas"]))
                if len(p.isr) < min_isr:
                    _min_isr_refused(svc, p, ErrorCode.not_enough_replicas, min_isr)
                    _remember_refusal(ctx, (name, idx), pd.records, ErrorCode.not_enough_replicas)
                    parts.append(_partition_error(
                        idx, ErrorCode.not_enough_replicas,
                        f"The size of the current ISR {len(p.isr)} is insufficient to satisfy the min.isr "
                        f"requirement of {min_isr} for partition {name}-{idx}"))
                    continue
                if svc.stats.min_isr.logged:
                    svc.stats.min_isr.accepted(name, idx)
            records = pd.records
            if records is None or len(records) == 0:
                parts.append(_partition_error(idx, ErrorCode.invalid_request, "Produce request has no records"))
                continue
            txn_id = getattr(req, "transactional_id", None)
            wait = None if svc.append_hooks.before_append is None else \
                svc.append_hooks.before_append(ctx, p, records, txn_id)  # e.g. asks a transaction coordinator
            if wait is not None:
                await wait
                if svc.replicas.partition(name, idx) is not p or p.leader_id != svc.broker_id:  # moved meanwhile
                    _remember_refusal(ctx, (name, idx), records, ErrorCode.not_leader_or_follower)
                    parts.append(_partition_error(idx, ErrorCode.not_leader_or_follower))
                    continue
            try:
                if ctx.version < 3 and is_message_set(records):  # a client from before Kafka 0.11
                    records = up_convert(records, topic_partition=f"{name}-{idx}",
                                         compression_type=p.log.config.compression_type,
                                         max_message_bytes=p.log.config.max_message_bytes)
                if internal_appender is not None:
                    parts.append({**_partition_error(idx, ErrorCode.none), "log_start_offset": p.log.log_start_offset,
                                  "base_offset": internal_appender(p, records, now)})
                else:
                    try:
                        parts.append(_append(svc, ctx, p, records, now, txn_id))
                    except ForwardFirst as f:
                        parts.append(await _append_after_forward(svc, p, f, now))
                appended.append(p)
                for other, other_min_isr in (svc.append_hooks.also_written() if svc.append_hooks.writes_elsewhere
                                             else ()):  # e.g. the scheduled records
                    appended.append(other)  # log.flush.on.ack: that log is what must be durable
                    if acks != 0 and svc.store.is_cluster() and \
                            other.high_watermark < other.log.log_end_offset:  # and in its ISR
                        awaiting.append((other, other.log.log_end_offset, parts, len(parts) - 1, other_min_isr))
                if acks == -1 and p.high_watermark < p.log.log_end_offset:  # followers must have it first
                    awaiting.append((p, p.log.log_end_offset, parts, len(parts) - 1, min_isr))
            except InvalidRecords as e:
                log.warning("produce rejected", extra=fields(
                    topic=name, partition=idx, client_id=ctx.header.client_id, error=ErrorCode(e.error_code).name,
                    reason=str(e)))
                parts.append(_invalid_records(idx, e))
            except ProducerStateError as e:  # fenced epochs, sequence gaps, txn state
                log.info("produce rejected", extra=fields(
                    topic=name, partition=idx, client_id=ctx.header.client_id, error=ErrorCode(e.error_code).name,
                    reason=str(e)))
                parts.append(_partition_error(idx, ErrorCode(e.error_code), str(e)))
            except KafkaStorageError as e:  # the log dir failed (KIP-112); nothing was appended
                _remember_refusal(ctx, (name, idx), pd.records, ErrorCode.kafka_storage_error)
                parts.append(_partition_error(idx, ErrorCode.kafka_storage_error, str(e)))
        responses.append({"name": name, "partition_responses": parts})

    flush = bool(appended) and acks != 0 and bool(svc.config["log.flush.on.ack"])
    # Fault injection (drop_produce_responses): decided here, in request order, and done once acknowledged.
    drop = bool(appended) and svc.drop_produce_responses > 0
    if drop:
        svc.drop_produce_responses -= 1
    if flush or awaiting:
        # Everything left is waiting for an acknowledgement condition: the connection may go on with its
        # next requests meanwhile (pykbroker/server/parked.py).
        timeout = req.timeout
        timeout_ms = int(timeout.total_seconds() * 1000) if hasattr(timeout, "total_seconds") else int(timeout)
        # Each fsync covers what this request appended (offsets taken now, before later requests append).
        to_flush = [(p, p.log.log_end_offset) for p in appended] if flush else []
        settle = None
        if not awaiting:  # only fsyncs to wait for: the answer can go out from their callback
            def settle(done: Settled[ProduceResponse | None]) -> None:
                _acknowledge_when_flushed(responses, to_flush, drop, acks, done)
        return Parked(lambda: _acknowledge(svc, responses, to_flush, awaiting, timeout_ms, drop, acks),
                      replicated=bool(awaiting), settle=settle)
    return _answer(responses, drop, acks)


async def _acknowledge(svc: Services, responses: list[TopicProduceResponse], to_flush: list[tuple[Partition, int]],
                       awaiting: list[Awaiting], timeout_ms: int,
                       drop: bool, acks: int) -> ProduceResponse | None:
    """The parked part of a produce: the fsync (log.flush.on.ack), then the acks=all wait for the ISR."""
    if to_flush:
        flushed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        _flush_all(responses, to_flush, functools.partial(group_commit.settle_future, flushed))
        await flushed
    if awaiting:
        await _await_replication(svc, awaiting, timeout_ms)
    return _answer(responses, drop, acks)


def _acknowledge_when_flushed(responses: list[TopicProduceResponse], to_flush: list[tuple[Partition, int]], drop: bool,
                              acks: int, done: Settled[ProduceResponse | None]) -> None:
    """``_acknowledge`` as a callback, for a produce that waits for fsyncs only: the answer goes to ``done``."""
    def then(failure: BaseException | None) -> None:
        if failure is not None:
            done(None, failure)
            return
        try:
            answer = _answer(responses, drop, acks)
        except CloseConnection as e:
            done(None, e)
            return
        done(answer, None)

    _flush_all(responses, to_flush, then)


def _flush_all(responses: list[TopicProduceResponse], to_flush: list[tuple[Partition, int]],
               then: Callable[[BaseException | None], None]) -> None:
    """Ask group commit for every partition's fsync at once (one fsync in flight per log, shared by every
    request whose appends it covers); a partition whose log dir failed gets KAFKA_STORAGE_ERROR (not durable,
    so not acknowledged).  When the last one ends, ``then(None)``, or ``then`` the first other failure."""
    remaining = len(to_flush)
    failure: list[BaseException] = []

    def flushed(p: Partition, error: BaseException | None) -> None:
        nonlocal remaining
        if isinstance(error, KafkaStorageError):
            _fail_unflushed(responses, p, str(error))
        elif error is not None:
            failure.append(error)
        remaining -= 1
        if not remaining:
            then(failure[0] if failure else None)

    for p, end in to_flush:
        group_commit.flush_then(p.log, end, functools.partial(flushed, p))


def _answer(responses: list[TopicProduceResponse], drop: bool, acks: int) -> ProduceResponse | None:
    if drop:
        raise CloseConnection("fault injection: dropping the connection after the append")
    if acks == 0:
        if any(part["error_code"] for r in responses for part in r["partition_responses"]):
            # The producer reads no response, so Kafka closes the connection to signal the failure.
            raise CloseConnection("acks=0 produce failed; closing the connection as Kafka does")
        return None
    return {"responses": responses, "throttle_time": 0}
