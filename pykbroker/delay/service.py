"""Delayed delivery on the event loop: divert delayed records at produce time, deliver them when due.

Produce (:meth:`DelayService.divert`, called by the produce handler with ``pykbroker.delay.enable``):
records of a validated batch that carry a delay header, or belong to a topic with a default delay,
are appended as entries to ``__delayed_records`` (the partition chosen by hashing the target
topic-partition) instead of the target; the rest of the batch goes on to the target as usual. The
produce is acknowledged only after that append, so it is the scheduled log that is durable.

Delivery (:meth:`DelayService.run`): one task sleeps until the earliest due time (woken early when an
earlier entry arrives), then for each target partition appends the due entries, in ``(due, uid)``
order, as one batch, and writes their tombstones. Exactly once across kill -9 rests on three writes
in this order, all on the one event loop:

1. an *intent* in ``__delayed_records``: the entries' uids, the target's log end offset before the
   append, and the batch's sequence;
2. the batch on the target, stamped with a broker-owned producer id and that sequence;
3. the entries' tombstones.

After a restart an intent whose entries have no tombstones is settled by looking at the target: the
batch at ``offset_before`` carries our producer id and the intent's sequence if the append happened
(else the target's producer state, when retention already removed that batch). Appended: the
tombstones are written now; not appended: the entries are delivered again like any due entry.

In a ZooKeeper cluster (see :mod:`pykbroker.delay.delivery` and docs/queues.md) each broker keeps and
delivers the entries of the ``__delayed_records`` partitions it leads: it replays one when it becomes its
leader and forgets it when it stops leading it. A target's leader forwards delayed records whose
partition another broker leads there (an acks=-1 Produce on the inter-broker listener); deliveries wait
for their intent to reach the ISR, and go to remote targets as idempotent acks=-1 Produce requests.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import defaultdict
from collections.abc import Callable

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.coordinator.internal_topic import (
    PartitionLoader,
    append_records,
    coordinator_node,
    ensure_internal_topic,
    ensure_internal_topic_async,
    min_insync_replicas,
    partition_for,
    read_records,
    wait_replicated,
)
from pykbroker.coordinator.serde_primitives import SerdeError
from pykbroker.delay.delivery import DELIVERED, FENCED, Delivery, Ownership, forward_error, outcome
from pykbroker.delay.forward import ProduceClients
from pykbroker.delay.schedule import HEADER_PREFIX, Schedule, due_times
from pykbroker.delay.serde import (
    Entry,
    EntryKey,
    Intent,
    ProducerSequence,
    SequenceKey,
    decode_entry,
    decode_intent,
    decode_key,
    decode_sequence,
    entry_key,
    entry_value,
    intent_key,
    intent_value,
    sequence_key,
    sequence_value,
)
from pykbroker.metadata.store import MetadataStore, TopicRecord
from pykbroker.protocol.record_validator import CODECS
from pykbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    COMPRESSION_NONE,
    INVALID_RECORD,
    BatchHeader,
    InvalidRecords,
    _decompress,
    build_batch,
    decode_records,
    iter_batches,
    validate_for_append,
)
from pykbroker.replica.append_hooks import AppendHook, ForwardFirst, InternalAppender
from pykbroker.replica.replica_manager import Partition, ReplicaManager
from pykbroker.replica.topics import TopicManager
from pykbroker.security.authorizer import AclOperation
from pykbroker.security.authz import cluster_allowed
from pykbroker.security.request import RequestContext
from pykbroker.storage.log import KafkaStorageError, OffsetOutOfRange
from pykbroker.storage.producer_state import ProducerStateError

log = logging.getLogger("pykbroker.delay")

DELAYED_TOPIC = "__delayed_records"
DELAYED_PARTITIONS = 8
# Deliveries are stamped with this producer id (plus the broker id) and epoch 0. Producer ids handed to
# clients come from blocks counted up from 0, so this range is never given out.
DELIVERY_PRODUCER_ID_BASE = 1 << 62
DELIVERY_EPOCH = 0
MAX_BATCH_RECORDS = 1000  # entries per delivered batch
MAX_ROUND_ENTRIES = 20_000  # entries taken off the heap per round, so one backlog does not starve the loop
RETRY_S = 1.0  # after a failed delivery (partition offline, not leader)
_SEQ_MOD = 1 << 31
_UID_BROKER_BITS = 11  # cluster: uids end with the broker id (mod 2048), so two brokers never make the same


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class DelayUnavailable(ProducerStateError):
    """The records cannot be scheduled now (no loaded leader of their ``__delayed_records`` partition):
    answered with a code producers retry, nothing appended anywhere."""


class DelayForward(Exception):
    """Raised by :meth:`DelayService.divert` in a cluster when another broker leads the records'
    ``__delayed_records`` partition: the handler awaits :meth:`DelayService.forward`, then appends what is
    left (``buf``/``batches``, empty when the whole batch was scheduled) to the target."""

    def __init__(self, dp_index: int, leader: int, records: list[tuple[bytes, bytes | None]],
                 sequence: ProducerSequence | None, buf: bytearray, batches: list[BatchHeader]) -> None:
        super().__init__(f"{DELAYED_TOPIC}-{dp_index} is led by broker {leader}")
        self.dp_index, self.leader, self.records, self.sequence = dp_index, leader, records, sequence
        self.buf, self.batches = buf, batches


class DelayService(PartitionLoader, AppendHook):
    load_topic = DELAYED_TOPIC

    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager,
                 topics: TopicManager) -> None:
        super().__init__(config, store, replicas, topics)
        self.schedule = Schedule()
        self.producer_id = DELIVERY_PRODUCER_ID_BASE + max(0, config.broker_id)
        self.default_delay_ms = int(config["pykbroker.delay.ms"])
        self.max_delay_ms = int(config["pykbroker.delay.max.ms"])
        self.loaded = False
        self.delivered = 0  # records appended to their targets since start
        self.dropped = 0  # records whose target partition no longer exists
        self._last_uid = 0
        self._wake = anyio.Event()
        self._diverted: Partition | None = None
        # Cluster mode: the __delayed_records partitions led here, loaded or being loaded.
        self.cluster = store.is_cluster()
        self.owned: dict[int, Ownership] = {}
        self._uid_suffix = max(0, config.broker_id) % (1 << _UID_BROKER_BITS) if self.cluster else -1
        timeout_ms = int(config["request.timeout.ms"])
        self._produce_timeout_ms = min(timeout_ms, 15_000)
        self._busy: set[tuple[str, int]] = set()  # targets a delivery task is working on
        self._retry_at: dict[tuple[str, int], float] = {}  # targets whose last attempt failed: not before
        self._forwards: ProduceClients | None = None  # to __delayed_records leaders (produce path)
        self._deliveries: ProduceClients | None = None  # to target leaders (timer task)
        self._inter_broker_listener = config.inter_broker_listener
        if self.cluster:
            store.add_listener(self._on_metadata_change)

    def set_cluster(self, endpoint_of: Callable[[int], tuple[str, int] | None]) -> None:
        """Cluster mode: where the other brokers' inter-broker listeners are."""
        timeout_s = self._produce_timeout_ms / 1000 + 5
        self._forwards = ProduceClients(endpoint_of, client_id=f"broker-{self.config.broker_id}-delay-forward",
                                        timeout_s=timeout_s)
        self._deliveries = ProduceClients(endpoint_of, client_id=f"broker-{self.config.broker_id}-delay-delivery",
                                          timeout_s=timeout_s)

    # --- the scheduled log -----------------------------------------------------------------------

    def _topic_configs(self, rf: int) -> dict[str, str | None]:
        return {"cleanup.policy": "compact", "compression.type": "producer",
                "min.insync.replicas": str(min(rf, int(self.config["pykbroker.delay.topic.min.isr"])))}

    def startup(self) -> None:
        """Embedded metadata: create ``__delayed_records`` (this broker leads every partition) and replay it.
        Cluster: load the partitions led here (the topic is created by :meth:`run` once enough brokers are
        live; each partition is replayed when this broker becomes its leader)."""
        if self.cluster:
            self._on_metadata_change(DELAYED_TOPIC, self.store.topic(DELAYED_TOPIC))
            return
        ensure_internal_topic(self.store, self.topics, DELAYED_TOPIC, DELAYED_PARTITIONS,
                              int(self.config["pykbroker.delay.topic.replication.factor"]), self._topic_configs)
        self.load()

    def min_isr(self) -> int:
        return min_insync_replicas(self.store, DELAYED_TOPIC, int(self.config["min.insync.replicas"]))

    def _dp_index(self, topic: str, partition: int) -> int:
        rec = self.store.topic(DELAYED_TOPIC)
        n = len(rec.partitions) if rec is not None and rec.partitions else DELAYED_PARTITIONS
        return partition_for(f"{topic}-{partition}", n)

    def _delayed_partition(self, topic: str, partition: int) -> Partition:
        index = self._dp_index(topic, partition)
        p = self.replicas.partition(DELAYED_TOPIC, index)
        if p is None or p.leader_id != self.replicas.broker_id:
            raise KafkaStorageError(f"{DELAYED_TOPIC}-{index} is not available on this broker")
        if p.offline:
            raise KafkaStorageError(f"{DELAYED_TOPIC}-{index} is offline")
        return p

    def _next_uid(self) -> int:
        # Microseconds of wall clock, kept increasing: unique across restarts even before the replay.
        if self._uid_suffix >= 0:  # cluster: unique among brokers too (entries of one target may move leaders)
            t = max((self._last_uid >> _UID_BROKER_BITS) + 1, time.time_ns() // 1000)
            uid = (t << _UID_BROKER_BITS) | self._uid_suffix
        else:
            uid = max(self._last_uid + 1, time.time_ns() // 1000)
        self._last_uid = uid
        return uid

    # --- produce ---------------------------------------------------------------------------------

    def _default_delay(self, topic: str) -> int:
        rec = self.store.topic(topic)
        raw = rec.configs.get("pykbroker.delay.ms") if rec is not None else None
        return int(raw) if raw is not None else self.default_delay_ms

    def divert(self, p: Partition, buf: bytearray, batches: list[BatchHeader], now: int
               ) -> tuple[bytearray, list[BatchHeader]]:
        """Move the records of a validated client batch that are due later into ``__delayed_records``.

        Returns what is left for the target (``batches`` empty when nothing is). Costs a dict lookup
        and one ``bytes.find`` per uncompressed batch without delayed records; a compressed batch is
        decompressed to look at its headers. Raises InvalidRecords for a bad delay header, or for
        delayed records in an idempotent or transactional batch (see docs/queues.md).
        """
        self._diverted = None
        header = batches[0]
        default = self._default_delay(p.topic)
        start, end = header.position, header.position + header.size
        if default <= 0:
            if header.compression == COMPRESSION_NONE:
                if buf.find(HEADER_PREFIX, start + BATCH_HEADER_SIZE, end) < 0:
                    return buf, batches
            else:  # validation decompressed it already, but did not keep the result: once more, in C
                with memoryview(buf) as view:
                    plain = _decompress(header.compression, bytes(view[start + BATCH_HEADER_SIZE:end]))
                if plain.find(HEADER_PREFIX) < 0:
                    return buf, batches
        with memoryview(buf) as view:
            records = decode_records(view[start:end])
        dues = due_times(records, default_delay_ms=default, now_ms=now, log_append_time=p.log.config.log_append_time,
                         max_delay_ms=self.max_delay_ms)
        delayed = [i for i, d in enumerate(dues) if d is not None]
        if not delayed:
            return buf, batches
        sequence: ProducerSequence | None = None
        if header.has_producer_id:
            if header.producer_id >= DELIVERY_PRODUCER_ID_BASE:  # a delivery from another broker: due already
                return buf, batches
            if header.is_transactional:
                raise InvalidRecords(
                    INVALID_RECORD, "delayed records cannot be produced in a transaction",
                    [(i, "delayed record in a transactional batch") for i in delayed])
            # Idempotent: the whole batch is scheduled (undelayed records due now), and the target's
            # producer state records its sequences as if appended, so retries dedup and the next batch
            # is in sequence. A retry of it is answered here, scheduling nothing.
            if p.log.producer_state.check(header) is not None:
                # ... once it is durable: the handler waits for (flushes) its __delayed_records partition again.
                dp = self.replicas.partition(DELAYED_TOPIC, self._dp_index(p.topic, p.index))
                self._diverted = dp if dp is not None and dp.is_leader else None
                return buf, []
            dues = [now if d is None else d for d in dues]
            delayed = list(range(len(records)))
            sequence = ProducerSequence(header.producer_id, p.topic, p.index, header.producer_epoch,
                                        header.base_sequence, header.last_offset_delta, header.max_timestamp)
        entries = []
        for i in delayed:
            r = records[i]
            due = dues[i]
            assert due is not None
            entries.append(Entry(due, self._next_uid(), p.topic, p.index, r.timestamp, r.key, r.value,
                                 tuple(r.headers)))
        out_records: list[tuple[bytes, bytes | None]] = [(entry_key(e), entry_value(e)) for e in entries]
        if sequence is not None:
            out_records.append((sequence_key(sequence), sequence_value(sequence)))
        rest = [r for r, d in zip(records, dues, strict=True) if d is None]
        out_buf, out_batches = buf, []
        if rest:
            out_buf = bytearray(build_batch([(r.key, r.value, r.headers) for r in rest],
                                            timestamp_ms=rest[0].timestamp, timestamps=[r.timestamp for r in rest],
                                            compression=header.compression))
            out_batches = validate_for_append(out_buf, max_batch_bytes=max(len(out_buf),
                                                                           p.log.config.max_message_bytes),
                                              now_ms=now, timestamp_type=0, from_client=False)
        if self.cluster:
            dp = self._owned_partition(p.topic, p.index, out_records, sequence, out_buf, out_batches)
            if sequence is not None and self.owned[dp.index].is_duplicate(sequence):
                # A retry reaching a new leader of the target, which did not know the batch: scheduled once.
                self._apply_sequence(p, sequence)
                self._diverted = dp
                return buf, []
        else:
            dp = self._delayed_partition(p.topic, p.index)
        append_records(self.replicas, DELAYED_TOPIC, dp.index, out_records)
        if sequence is not None:
            self._apply_sequence(p, sequence)
            if self.cluster:
                self.owned[dp.index].record_sequence(sequence)
        self._diverted = dp
        if self.schedule.add_all(entries):
            self._wake.set()
        return out_buf, out_batches

    def _owned_partition(self, topic: str, partition: int, records: list[tuple[bytes, bytes | None]],
                         sequence: ProducerSequence | None, buf: bytearray, batches: list[BatchHeader]) -> Partition:
        """Cluster: the loaded ``__delayed_records`` partition for this target, led here; raises DelayForward
        when another broker leads it, DelayUnavailable when none does or it is still loading."""
        index = self._dp_index(topic, partition)
        owner = self.owned.get(index)
        if owner is None:
            leader = coordinator_node(self.store, DELAYED_TOPIC, index)
            if leader is None or leader == self.replicas.broker_id:
                raise DelayUnavailable(ErrorCode.not_enough_replicas,
                                       f"{DELAYED_TOPIC}-{index} has no leader yet (delayed delivery)")
            raise DelayForward(index, leader, records, sequence, buf, batches)
        p = self.replicas.partition(DELAYED_TOPIC, index)
        if not owner.loaded or p is None or p.offline or not p.is_leader:
            raise DelayUnavailable(ErrorCode.not_enough_replicas, f"{DELAYED_TOPIC}-{index} is loading")
        if len(p.isr) < self.min_isr():
            raise DelayUnavailable(ErrorCode.not_enough_replicas,
                                   f"{DELAYED_TOPIC}-{index} has {len(p.isr)} in-sync replica(s), fewer than "
                                   f"its min.insync.replicas {self.min_isr()}")
        return p

    # --- cluster: forwarding to the leader of __delayed_records ----------------------------------

    async def forward(self, p: Partition, f: DelayForward) -> ErrorCode:
        """Append a client's delayed records on their ``__delayed_records`` leader (acks=-1); the code the
        producer gets (a retriable one on failure: nothing of the batch reaches the target then)."""
        assert self._forwards is not None
        buf = build_batch([(k, v, ()) for k, v in f.records], timestamp_ms=_now_ms())
        code = await self._forwards.produce(f.leader, DELAYED_TOPIC, f.dp_index, buf, self._produce_timeout_ms)
        if code != ErrorCode.none:
            log.info("could not forward %(records)d delayed record(s) for %(topic)s-%(partition)d to broker "
                     "%(leader)d: %(error)s",
                     {"records": len(f.records), "topic": p.topic, "partition": p.index, "leader": f.leader,
                      "error": code.name if code is not None else 'unreachable'})
            return forward_error(code)
        if f.sequence is not None and self.replicas.partition(p.topic, p.index) is p and p.is_leader:
            self._apply_sequence(p, f.sequence)
        return ErrorCode.none

    def accepts_forward(self, ctx: RequestContext) -> bool:
        """Produce to ``__delayed_records`` is for brokers: on the inter-broker listener, with CLUSTER_ACTION."""
        if not self.cluster or ctx.listener != self._inter_broker_listener:
            return False
        if ctx.authorizer is None:
            return True
        return cluster_allowed(ctx, AclOperation.CLUSTER_ACTION)

    def accept_forwarded(self, p: Partition, records: bytes, now: int) -> int:
        """Append records another broker forwarded and schedule them; the base offset (-1: a retry of an
        idempotent batch scheduled already). Raises DelayUnavailable / InvalidRecords."""
        owner = self.owned.get(p.index)
        if owner is None or not owner.loaded or p.offline or not p.is_leader or p.leader_epoch != owner.leader_epoch:
            raise DelayUnavailable(ErrorCode.not_enough_replicas, f"{DELAYED_TOPIC}-{p.index} is not loaded here")
        buf = bytearray(records)
        batches = validate_for_append(buf, max_batch_bytes=max(len(buf), p.log.config.max_message_bytes),
                                      now_ms=now, timestamp_type=0, from_client=False)
        entries: list[Entry] = []
        sequences: list[ProducerSequence] = []
        with memoryview(buf) as view:
            for h in batches:
                for r in decode_records(view[h.position:h.position + h.size]):
                    try:
                        key = decode_key(r.key or b"")
                        if isinstance(key, EntryKey) and r.value is not None:
                            entries.append(decode_entry(key, r.value))
                        elif isinstance(key, SequenceKey) and r.value is not None:
                            sequences.append(decode_sequence(key, r.value))
                        else:
                            raise SerdeError("only entries and producer sequences are forwarded")
                    except SerdeError as e:
                        raise InvalidRecords(INVALID_RECORD, f"bad forwarded {DELAYED_TOPIC} record: {e}") from None
        targets = [(x.topic, x.partition) for x in entries] + [(x.topic, x.partition) for x in sequences]
        if any(self._dp_index(t, i) != p.index for t, i in targets):
            raise InvalidRecords(INVALID_RECORD, f"forwarded records for another {DELAYED_TOPIC} partition")
        if sequences and all(owner.is_duplicate(s) for s in sequences):
            return -1  # a retry whose first attempt was appended (its answer was lost): scheduled once
        result = p.log.append(buf, batches, leader_epoch=p.leader_epoch)
        self.replicas.on_appended(p)
        for s in sequences:
            owner.record_sequence(s)
        if self.schedule.add_all(entries):
            self._wake.set()
        return result.first_offset

    def _apply_sequence(self, p: Partition, seq: ProducerSequence) -> None:
        """Give the target's producer state an idempotent batch that was scheduled, not appended.

        Its offsets are placed below the log (``-1 - last_offset_delta`` .. ``-1``), so the state's
        end offset does not move; a retry is caught by :meth:`divert` before it reaches the log.
        """
        header = BatchHeader(position=0, base_offset=-1 - seq.last_offset_delta, batch_length=0,
                             partition_leader_epoch=-1, magic=2, crc=0, attributes=0,
                             last_offset_delta=seq.last_offset_delta, base_timestamp=seq.timestamp,
                             max_timestamp=seq.timestamp, producer_id=seq.producer_id, producer_epoch=seq.epoch,
                             base_sequence=seq.base_sequence, records_count=seq.last_offset_delta + 1)
        p.log.producer_state.update(header)

    def _replay_sequence(self, seq: ProducerSequence, now: int) -> None:
        """At start: re-apply a scheduled idempotent batch unless the target's state is past it already."""
        p = self.replicas.partition(seq.topic, seq.partition)
        if p is None or not p.is_leader or now - seq.timestamp >= self.config["producer.id.expiration.ms"]:
            return
        entry = p.log.producer_state.last_entry(seq.producer_id)
        if entry is not None:
            if entry.epoch > seq.epoch:
                return
            last = (seq.base_sequence + seq.last_offset_delta) % _SEQ_MOD
            if entry.epoch == seq.epoch and entry.batches and (entry.last_seq - last) % _SEQ_MOD < _SEQ_MOD // 2:
                return
        self._apply_sequence(p, seq)

    # --- the produce path's hook (replica.append_hooks) ---------------------------------------

    def internal_appender(self, ctx: RequestContext, topic: str) -> InternalAppender | None:
        """Another broker's delayed records, forwarded to this leader of their ``__delayed_records`` partition."""
        return self.accept_forwarded if topic == DELAYED_TOPIC and self.accepts_forward(ctx) else None

    def transform(self, p: Partition, buf: bytearray, batches: list[BatchHeader], now: int
                  ) -> tuple[bytearray, list[BatchHeader]]:
        """Records due later go to ``__delayed_records`` instead; in a cluster, to the broker leading their
        partition there first (ForwardFirst), when that is another broker."""
        try:
            return self.divert(p, buf, batches, now)
        except DelayForward as f:
            raise ForwardFirst(f.buf, f.batches, functools.partial(self.forward, p, f),
                               "delayed records could not be scheduled") from None

    def also_written(self) -> tuple[Partition, int] | None:
        dp = self.take_diverted()
        return (dp, self.min_isr()) if dp is not None else None

    def take_diverted(self) -> Partition | None:
        """The ``__delayed_records`` partition the last :meth:`divert` wrote (for log.flush.on.ack)."""
        dp, self._diverted = self._diverted, None
        return dp

    # --- start: replay ---------------------------------------------------------------------------

    def replay(self, records: list[tuple[bytes | None, bytes | None]], owner: Ownership | None = None
               ) -> dict[tuple[str, int], Intent]:
        """Apply one partition's records, oldest first, to the schedule; the last intent per target."""
        intents: dict[tuple[str, int], Intent] = {}
        sequences: dict[tuple[int, str, int], ProducerSequence] = {}
        for k, v in records:
            if k is None:
                continue
            try:
                key = decode_key(k)
                if isinstance(key, EntryKey):
                    if v is None:
                        self.schedule.discard(key.uid)
                    else:
                        self.schedule.add(decode_entry(key, v))
                        self._last_uid = max(self._last_uid, key.uid)
                elif isinstance(key, SequenceKey):
                    if v is not None:
                        sequences[(key.producer_id, key.topic, key.partition)] = decode_sequence(key, v)
                elif v is not None:
                    intents[(key.topic, key.partition)] = decode_intent(key, v)
            except SerdeError as e:
                log.warning("skipping an unreadable %(topic)s record: %(error)s", {"topic": DELAYED_TOPIC, "error": e})
        now = _now_ms()
        for seq in sequences.values():
            self._replay_sequence(seq, now)
            if owner is not None:
                owner.record_sequence(seq)
        return intents

    def _appended(self, it: Intent) -> bool:
        """Did the delivery of this intent reach its target (see the module docstring)?"""
        p = self.replicas.partition(it.topic, it.partition)
        if p is None or it.offset_before < 0:
            return False
        pid = it.producer_id if it.producer_id >= 0 else self.producer_id
        lg = p.log
        if lg.log_end_offset <= it.offset_before:
            return False
        try:
            res = lg.read(it.offset_before, 1, max_offset=lg.log_end_offset)
            for h in iter_batches(res.records):  # the batch holding offset_before: ours starts there
                return (h.base_offset == it.offset_before and h.producer_id == pid
                        and h.base_sequence == it.base_sequence)
        except OffsetOutOfRange:  # retention removed it: ask the producer state
            pass
        entry = lg.producer_state.last_entry(pid)
        if entry is None or not entry.batches:
            return False
        last = (it.base_sequence + len(it.uids) - 1) % _SEQ_MOD
        return (entry.last_seq - last) % _SEQ_MOD < _SEQ_MOD // 2

    def load(self) -> None:
        """Replay every partition of ``__delayed_records``, settle interrupted deliveries.

        Blocking, at start before the listeners open: the producer sequences it restores must be in
        the targets' producer state before any client produces again.
        """
        started = time.monotonic()
        rec = self.store.topic(DELAYED_TOPIC)
        for index in sorted(rec.partitions) if rec is not None else ():
            p = self.replicas.partition(DELAYED_TOPIC, index)
            if p is None or p.offline:
                log.warning("%(topic)s-%(partition)d is not available: its delayed records wait until it is",
                            {"topic": DELAYED_TOPIC, "partition": index})
                continue
            records = read_records(p)
            for it in self.replay(records).values():
                pending = [uid for uid in it.uids if uid in self.schedule]
                if pending and self._appended(it):
                    log.info("delivery of %(pending)d delayed record(s) to %(topic)s-%(partition)d was appended "
                             "before the restart; recording it",
                             {"pending": len(pending), "topic": it.topic, "partition": it.partition})
                    append_records(self.replicas, DELAYED_TOPIC, index,
                                   [(entry_key(e), None) for uid in pending
                                    if (e := self.schedule.discard(uid)) is not None])
        self.loaded = True
        log.info("loaded %(scheduled)d delayed record(s) in %(elapsed_s).2f s; next due at %(next_due)s",
                 {"scheduled": len(self.schedule), "elapsed_s": time.monotonic() - started,
                  "next_due": self.schedule.next_due()})

    # --- delivery --------------------------------------------------------------------------------

    def _next_sequence(self, p: Partition) -> int:
        entry = p.log.producer_state.last_entry(self.producer_id)
        if entry is None or entry.epoch != DELIVERY_EPOCH or not entry.batches:
            return 0
        return (entry.last_seq + 1) % _SEQ_MOD

    def _deliver_batch(self, p: Partition, dp: Partition, entries: list[Entry]) -> None:
        seq = self._next_sequence(p)
        it = Intent(p.topic, p.index, seq, p.log.log_end_offset, tuple(e.uid for e in entries), self.producer_id,
                    DELIVERY_EPOCH)
        append_records(self.replicas, DELAYED_TOPIC, dp.index, [(intent_key(p.topic, p.index), intent_value(it))])
        codec = CODECS.get(p.log.config.compression_type, COMPRESSION_NONE)
        buf = bytearray(build_batch([(e.key, e.value, list(e.headers)) for e in entries],
                                    timestamp_ms=entries[0].timestamp, timestamps=[e.timestamp for e in entries],
                                    producer_id=self.producer_id, producer_epoch=DELIVERY_EPOCH, base_sequence=seq,
                                    compression=codec))
        now = _now_ms()
        batches = validate_for_append(buf, max_batch_bytes=max(len(buf), p.log.config.max_message_bytes),
                                      now_ms=now, timestamp_type=0, from_client=False)
        result = p.log.append(buf, batches, leader_epoch=p.leader_epoch)
        if not result.duplicate:
            self.replicas.on_appended(p)
        self.delivered += len(entries)
        try:
            append_records(self.replicas, DELAYED_TOPIC, dp.index, [(entry_key(e), None) for e in entries])
        except Exception as e:  # delivered, so never put back; the intent settles it at the next start
            log.error("delivered %(entries)d delayed record(s) to %(topic)s-%(partition)d but could not record it: "
                      "%(error)s",
                      {"entries": len(entries), "topic": p.topic, "partition": p.index, "error": e})

    def _drop(self, entries: list[Entry]) -> None:
        """The target partition is gone (topic deleted): the entries' tombstones, and a log line."""
        first = entries[0]
        log.warning("dropping %(entries)d delayed record(s) for %(topic)s-%(partition)d: the partition no longer "
                    "exists",
                    {"entries": len(entries), "topic": first.topic, "partition": first.partition})
        index = self._dp_index(first.topic, first.partition)
        self._tombstones(index, entries)
        self.dropped += len(entries)

    def deliver_due(self, now: int) -> bool:
        """Deliver what is due at ``now``; False when something failed and must be retried later."""
        due = self.schedule.pop_due(now, MAX_ROUND_ENTRIES)
        by_target: dict[tuple[str, int], list[Entry]] = defaultdict(list)
        for e in due:
            by_target[(e.topic, e.partition)].append(e)
        ok = True
        for (topic, index), entries in by_target.items():
            rec = self.store.topic(topic)
            p = self.replicas.partition(topic, index)
            i = 0  # entries[:i] are delivered
            try:
                if rec is None or index not in rec.partitions:
                    self._drop(entries)
                    continue
                if p is None or p.offline or p.leader_id != self.replicas.broker_id:
                    raise KafkaStorageError(f"{topic}-{index} is not available")
                dp = self._delayed_partition(topic, index)
                limit = max(1024, p.log.config.max_message_bytes - 1024)
                while i < len(entries):
                    j, size = i, 0
                    while j < len(entries) and j - i < MAX_BATCH_RECORDS and (j == i or size + entries[j].size < limit):
                        size += entries[j].size
                        j += 1
                    self._deliver_batch(p, dp, entries[i:j])
                    i = j
            except (KafkaStorageError, ProducerStateError, InvalidRecords, RuntimeError) as e:
                # Not delivered (the intent stays unmatched): put back what is left, try again later.
                self.schedule.add_all(entries[i:])
                log.warning("cannot deliver %(entries)d delayed record(s) to %(topic)s-%(partition)d yet: %(error)s",
                            {"entries": len(entries) - i, "topic": topic, "partition": index, "error": e})
                ok = False
        return ok

    # --- cluster: ownership, loading ---------------------------------------------------------------

    def _on_metadata_change(self, name: str, rec: TopicRecord | None) -> None:
        """Own the ``__delayed_records`` partitions led here (in their current leader epoch), no others."""
        if name != DELAYED_TOPIC:
            return
        led = {} if rec is None else {i: a.leader_epoch for i, a in rec.partitions.items()
                                      if a.leader == self.replicas.broker_id}
        for index in list(self.owned):
            if led.get(index) != self.owned[index].leader_epoch:  # led elsewhere, or lost and regained meanwhile
                self._disown(index)
        for index, epoch in led.items():
            if index not in self.owned:
                self.owned[index] = Ownership(index, epoch)
                self._to_load.add(index)
        self._load_wake.set()

    def _disown(self, index: int) -> None:
        owner = self.owned.pop(index)
        self._to_load.discard(index)
        dropped = self.schedule.discard_where(lambda e: self._dp_index(e.topic, e.partition) == index)
        dropped += sum(len(d.entries) for d in owner.inflight.values())
        log.info("no longer leading %(topic)s-%(partition)d (epoch %(leader_epoch)d): forgetting its %(dropped)d "
                 "waiting record(s)",
                 {"topic": DELAYED_TOPIC, "partition": index, "leader_epoch": owner.leader_epoch, "dropped": dropped})

    async def _load(self, index: int) -> None:
        owner = self.owned.get(index)
        if owner is None or owner.loaded:
            return
        p = self.replicas.partition(DELAYED_TOPIC, index)
        if p is None or p.offline or not p.is_leader or p.leader_epoch != owner.leader_epoch:
            # The replica becomes leader on the same metadata change, normally before we get here.
            await anyio.sleep(RETRY_S)
            if self.owned.get(index) is owner:
                self._to_load.add(index)
            return
        started = time.monotonic()
        records = await anyio.to_thread.run_sync(read_records, p)
        if self.owned.get(index) is not owner:
            return
        before = len(self.schedule)
        intents = self.replay(records, owner)
        settled = 0
        for it in intents.values():
            owner.resume(it)
            entries = [e for uid in it.uids if (e := self.schedule.get(uid)) is not None]
            if not entries:
                continue
            for e in entries:
                self.schedule.discard(e.uid)
            target = self.replicas.partition(it.topic, it.partition)
            if target is not None and target.is_leader and self._appended(it):
                self._tombstones(index, entries)
                continue
            if len(entries) != len(it.uids):  # tombstones are written in one batch: cannot happen
                log.warning("intent for %(topic)s-%(partition)d names %(uids)d record(s), %(entries)d are waiting: "
                            "delivering those again",
                            {"topic": it.topic, "partition": it.partition, "uids": len(it.uids),
                             "entries": len(entries)})
                self.schedule.add_all(entries)
                continue
            if it.producer_id < 0:  # written by a single broker (embedded metadata) before
                it = Intent(it.topic, it.partition, it.base_sequence, it.offset_before, it.uids, self.producer_id,
                            DELIVERY_EPOCH)
            owner.settle(it, entries)
            settled += 1
        owner.loaded = True
        self._wake.set()
        log.info("loaded %(topic)s-%(partition)d (leader epoch %(leader_epoch)d): %(waiting)d waiting record(s), "
                 "%(settled)d delivery(ies) to settle, in %(elapsed_s).2f s",
                 {"topic": DELAYED_TOPIC, "partition": index, "leader_epoch": owner.leader_epoch,
                  "waiting": len(self.schedule) - before + sum(len(d.entries) for d in owner.inflight.values()),
                  "settled": settled, "elapsed_s": time.monotonic() - started})

    def _tombstones(self, index: int, entries: list[Entry]) -> None:
        try:
            append_records(self.replicas, DELAYED_TOPIC, index, [(entry_key(e), None) for e in entries])
        except Exception as e:  # delivered; the intent settles it on the next load
            log.warning("could not record the delivery of %(entries)d delayed record(s) in %(topic)s-%(partition)d: "
                        "%(error)s",
                        {"entries": len(entries), "topic": DELAYED_TOPIC, "partition": index, "error": e})

    async def _ensure_topic(self) -> None:
        """Cluster: create ``__delayed_records`` once its replication factor's worth of brokers are live."""
        rf = int(self.config["pykbroker.delay.topic.replication.factor"])
        for _ in range(1_000_000_000):  # until created; one attempt a second
            if await ensure_internal_topic_async(self.store, self.topics, DELAYED_TOPIC, DELAYED_PARTITIONS, rf,
                                                 self._topic_configs):
                return
            await anyio.sleep(RETRY_S)

    # --- cluster: delivery ---------------------------------------------------------------------

    def _owner_of(self, index: int, owner: Ownership) -> bool:
        return self.owned.get(index) is owner

    def _start_deliveries(self, tg: anyio.abc.TaskGroup, now: int) -> bool:
        """Cluster: start a task per target with something to deliver (its delivery in flight first, then
        what is due) unless one is running for it already; True when something waits (busy target, retry
        backoff), so the timer looks again within RETRY_S. Targets do not wait for each other."""
        clock = anyio.current_time()
        jobs: dict[tuple[str, int], tuple[Ownership, Delivery | None, list[Entry]]] = {}
        waiting = set(self._busy)
        for owner in list(self.owned.values()):
            if not owner.loaded:
                continue
            for target, d in owner.inflight.items():
                if target in waiting:
                    continue
                if self._retry_at.get(target, 0.0) > clock:
                    waiting.add(target)
                    continue
                jobs[target] = (owner, d, [])
        put_back: list[Entry] = []
        for e in self.schedule.pop_due(now, MAX_ROUND_ENTRIES):
            target = (e.topic, e.partition)
            if target in waiting:
                put_back.append(e)
                continue
            job = jobs.get(target)
            if job is None:
                found = self.owned.get(self._dp_index(e.topic, e.partition))
                if found is None or not found.loaded:
                    continue  # not ours (any more): dropped with its partition
                job = jobs[target] = (found, None, [])
            if job[1] is not None:
                put_back.append(e)  # after the delivery in flight
            else:
                job[2].append(e)
        self.schedule.add_all(put_back)
        for target, job in jobs.items():
            self._busy.add(target)
            tg.start_soon(self._delivery_task, target, *job)
        return bool(put_back) or bool(waiting - self._busy)

    async def _delivery_task(self, target: tuple[str, int], owner: Ownership, d: Delivery | None,
                             entries: list[Entry]) -> None:
        try:
            ok = await self._deliver_target(owner, d, entries)
        finally:
            self._busy.discard(target)
        if ok:
            self._retry_at.pop(target, None)
            self._wake.set()  # the target's entries that came due meanwhile
        else:
            self._retry_at[target] = anyio.current_time() + RETRY_S

    async def _deliver_target(self, owner: Ownership, d: Delivery | None, entries: list[Entry]) -> bool:
        """One target: finish the delivery in flight, then deliver ``entries`` batch by batch; False when
        something is left for later (entries not sent are back in the schedule, a delivery sent but not
        acknowledged stays in flight)."""
        i = 0  # entries[:i] are delivered, dropped or in the delivery in flight
        try:
            if d is not None and not await self._send(owner, d):
                return False
            while i < len(entries):
                first = entries[i]
                rec = self.store.topic(first.topic)
                if rec is None or first.partition not in rec.partitions:
                    if self._owner_of(owner.index, owner):
                        self._drop(entries[i:])
                    i = len(entries)
                    return True
                local = self.replicas.partition(first.topic, first.partition)
                local = local if local is not None and local.is_leader and not local.offline else None
                limit = max(1024, (local.log.config.max_message_bytes if local is not None
                                   else int(self.config["message.max.bytes"])) - 1024)
                j, size = i, 0
                while j < len(entries) and j - i < MAX_BATCH_RECORDS and (j == i or size + entries[j].size < limit):
                    size += entries[j].size
                    j += 1
                if not self._owner_of(owner.index, owner):
                    i = len(entries)  # forgotten with the partition (a new leadership replays them)
                    return False
                new = owner.begin(first.topic, first.partition, entries[i:j],
                                  local.log.log_end_offset if local is not None else -1)
                try:
                    append_records(self.replicas, DELAYED_TOPIC, owner.index,
                                   [(intent_key(new.topic, new.partition), intent_value(new.intent()))])
                except Exception as e:
                    owner.abort(new)
                    log.warning("cannot write a delivery intent to %(topic)s-%(partition)d: %(error)s",
                                {"topic": DELAYED_TOPIC, "partition": owner.index, "error": e})
                    return False
                i = j
                if not await self._send(owner, new):
                    return False
            return True
        except Exception:  # a bug: keep the broker up and the entries waiting
            log.exception("delivering delayed records failed")
            return False
        finally:
            if i < len(entries) and self._owner_of(owner.index, owner):
                self.schedule.add_all(entries[i:])

    async def _send(self, owner: Ownership, d: Delivery) -> bool:
        """Append ``d`` to its target once its intent is in the ISR; on success its tombstones. True when
        delivered; else it stays in flight and is sent again, exactly as it is, by a later round."""
        timeout_s = self._produce_timeout_ms / 1000
        code = await wait_replicated(self.replicas, DELAYED_TOPIC, owner.index, timeout_s, self.min_isr())
        if code != ErrorCode.none or not self._owner_of(owner.index, owner):
            return False
        rec = self.store.topic(d.topic)
        if rec is None or d.partition not in rec.partitions:
            owner.finish(d)
            self._drop(d.entries)
            return True
        leader = coordinator_node(self.store, d.topic, d.partition)
        codec = CODECS.get(str(rec.configs.get("compression.type", self.config["compression.type"])),
                           COMPRESSION_NONE)
        buf = bytearray(build_batch([(e.key, e.value, list(e.headers)) for e in d.entries],
                                    timestamp_ms=d.entries[0].timestamp, timestamps=[e.timestamp for e in d.entries],
                                    producer_id=d.producer_id, producer_epoch=d.producer_epoch,
                                    base_sequence=d.base_sequence, compression=codec))
        result: ErrorCode | None
        if leader is None:
            result = ErrorCode.leader_not_available
        elif leader == self.replicas.broker_id:
            result = await self._append_local(d, buf)
        else:
            assert self._deliveries is not None
            result = await self._deliveries.produce(leader, d.topic, d.partition, bytes(buf),
                                                    self._produce_timeout_ms)
        if not self._owner_of(owner.index, owner):
            return False
        verdict = outcome(result) if result is not None else "retry"
        if verdict != DELIVERED:
            log.log(logging.WARNING if verdict == FENCED else logging.INFO,
                    "delivery of %d delayed record(s) to %s-%d (leader %s) not done yet: %s", len(d.entries),
                    d.topic, d.partition, leader, result.name if result is not None else "unreachable")
            return False
        owner.finish(d)
        self.delivered += len(d.entries)
        self._tombstones(owner.index, d.entries)
        return True

    async def _append_local(self, d: Delivery, buf: bytearray) -> ErrorCode:
        """A delivery to a target led here: an idempotent append, acknowledged once in the target's ISR."""
        p = self.replicas.partition(d.topic, d.partition)
        if p is None or p.offline or not p.is_leader:
            return ErrorCode.not_leader_or_follower
        try:
            batches = validate_for_append(buf, max_batch_bytes=max(len(buf), p.log.config.max_message_bytes),
                                          now_ms=_now_ms(), timestamp_type=0, from_client=False)
            result = p.log.append(buf, batches, leader_epoch=p.leader_epoch)
        except ProducerStateError as e:
            return ErrorCode(e.error_code)
        except (KafkaStorageError, InvalidRecords) as e:
            log.warning("cannot append delayed records to %(topic)s-%(partition)d: %(error)s",
                        {"topic": d.topic, "partition": d.partition, "error": e})
            return ErrorCode.kafka_storage_error
        if not result.duplicate:
            self.replicas.on_appended(p)
        min_isr = min_insync_replicas(self.store, d.topic, int(self.config["min.insync.replicas"]))
        return await wait_replicated(self.replicas, d.topic, d.partition, self._produce_timeout_ms / 1000, min_isr)

    async def run(self) -> None:
        """One timer: sleep until the next due time or an earlier arrival, deliver, repeat."""
        if self.cluster:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._loader)
                tg.start_soon(self._ensure_topic)
                await self._timer(tg)
        else:
            await self._timer(None)

    async def _timer(self, tg: anyio.abc.TaskGroup | None) -> None:
        while True:
            now = _now_ms()
            ok = self.deliver_due(now) if tg is None else not self._start_deliveries(tg, now)
            next_due = self.schedule.next_due()
            wait = RETRY_S if not ok else None
            if next_due is not None:
                until = max(0.0, (next_due - _now_ms()) / 1000)
                wait = until if wait is None else min(wait, max(until, RETRY_S))
            if wait == 0.0:
                await anyio.sleep(0)  # a backlog: let requests in between rounds
                continue
            self._wake = anyio.Event()
            if wait is None:
                await self._wake.wait()
            else:
                with anyio.move_on_after(wait):
                    await self._wake.wait()
