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
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import anyio

from pykbroker.config import BrokerConfig
from pykbroker.coordinator.internal_topic import append_records, ensure_internal_topic, partition_for, read_records
from pykbroker.coordinator.serde_primitives import SerdeError
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
from pykbroker.metadata.store import MetadataStore
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
from pykbroker.server.replica_manager import Partition, ReplicaManager
from pykbroker.server.topics import TopicManager
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


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class DelayService:
    def __init__(self, config: BrokerConfig, store: MetadataStore, replicas: ReplicaManager,
                 topics: TopicManager) -> None:
        self.config = config
        self.store = store
        self.replicas = replicas
        self.topics = topics
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

    # --- the scheduled log -----------------------------------------------------------------------

    def startup(self) -> None:
        """Create ``__delayed_records`` (embedded metadata: this broker leads every partition), replay it."""
        ensure_internal_topic(self.store, self.topics, DELAYED_TOPIC, DELAYED_PARTITIONS, 1,
                              lambda _rf: {"cleanup.policy": "compact", "compression.type": "producer"})
        self.load()

    def _delayed_partition(self, topic: str, partition: int) -> Partition:
        rec = self.store.topic(DELAYED_TOPIC)
        n = len(rec.partitions) if rec is not None and rec.partitions else DELAYED_PARTITIONS
        index = partition_for(f"{topic}-{partition}", n)
        p = self.replicas.partition(DELAYED_TOPIC, index)
        if p is None or p.leader_id != self.replicas.broker_id:
            raise KafkaStorageError(f"{DELAYED_TOPIC}-{index} is not available on this broker")
        if p.offline:
            raise KafkaStorageError(f"{DELAYED_TOPIC}-{index} is offline")
        return p

    def _next_uid(self) -> int:
        # Microseconds of wall clock, kept increasing: unique across restarts even before the replay.
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
            if header.is_transactional:
                raise InvalidRecords(
                    INVALID_RECORD, "delayed records cannot be produced in a transaction",
                    [(i, "delayed record in a transactional batch") for i in delayed])
            # Idempotent: the whole batch is scheduled (undelayed records due now), and the target's
            # producer state records its sequences as if appended, so retries dedup and the next batch
            # is in sequence. A retry of it is answered here, scheduling nothing.
            if p.log.producer_state.check(header) is not None:
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
        dp = self._delayed_partition(p.topic, p.index)
        out_records: list[tuple[bytes, bytes | None]] = [(entry_key(e), entry_value(e)) for e in entries]
        if sequence is not None:
            out_records.append((sequence_key(sequence), sequence_value(sequence)))
        append_records(self.replicas, DELAYED_TOPIC, dp.index, out_records)
        if sequence is not None:
            self._apply_sequence(p, sequence)
        self._diverted = dp
        if self.schedule.add_all(entries):
            self._wake.set()
        rest = [r for r, d in zip(records, dues, strict=True) if d is None]
        if not rest:
            return buf, []
        out = bytearray(build_batch([(r.key, r.value, r.headers) for r in rest], timestamp_ms=rest[0].timestamp,
                                    timestamps=[r.timestamp for r in rest], compression=header.compression))
        return out, validate_for_append(out, max_batch_bytes=max(len(out), p.log.config.max_message_bytes),
                                        now_ms=now, timestamp_type=0, from_client=False)

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
        if p is None or now - seq.timestamp >= self.config["producer.id.expiration.ms"]:
            return
        entry = p.log.producer_state.last_entry(seq.producer_id)
        if entry is not None:
            if entry.epoch > seq.epoch:
                return
            last = (seq.base_sequence + seq.last_offset_delta) % _SEQ_MOD
            if entry.epoch == seq.epoch and entry.batches and (entry.last_seq - last) % _SEQ_MOD < _SEQ_MOD // 2:
                return
        self._apply_sequence(p, seq)

    def take_diverted(self) -> Partition | None:
        """The ``__delayed_records`` partition the last :meth:`divert` wrote (for log.flush.on.ack)."""
        dp, self._diverted = self._diverted, None
        return dp

    # --- start: replay ---------------------------------------------------------------------------

    def replay(self, records: list[tuple[bytes | None, bytes | None]]) -> dict[tuple[str, int], Intent]:
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
                log.warning("skipping an unreadable %s record: %s", DELAYED_TOPIC, e)
        now = _now_ms()
        for seq in sequences.values():
            self._replay_sequence(seq, now)
        return intents

    def _appended(self, it: Intent) -> bool:
        """Did the delivery of this intent reach its target (see the module docstring)?"""
        p = self.replicas.partition(it.topic, it.partition)
        if p is None:
            return False
        lg = p.log
        if lg.log_end_offset <= it.offset_before:
            return False
        try:
            res = lg.read(it.offset_before, 1, max_offset=lg.log_end_offset)
            for h in iter_batches(res.records):  # the batch holding offset_before: ours starts there
                return (h.base_offset == it.offset_before and h.producer_id == self.producer_id
                        and h.base_sequence == it.base_sequence)
        except OffsetOutOfRange:  # retention removed it: ask the producer state
            pass
        entry = lg.producer_state.last_entry(self.producer_id)
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
                log.warning("%s-%d is not available: its delayed records wait until it is", DELAYED_TOPIC, index)
                continue
            records = read_records(p)
            for it in self.replay(records).values():
                pending = [uid for uid in it.uids if uid in self.schedule]
                if pending and self._appended(it):
                    log.info("delivery of %d delayed record(s) to %s-%d was appended before the restart; "
                             "recording it", len(pending), it.topic, it.partition)
                    append_records(self.replicas, DELAYED_TOPIC, index,
                                   [(entry_key(e), None) for uid in pending
                                    if (e := self.schedule.discard(uid)) is not None])
        self.loaded = True
        log.info("loaded %d delayed record(s) in %.2f s; next due at %s", len(self.schedule),
                 time.monotonic() - started, self.schedule.next_due())

    # --- delivery --------------------------------------------------------------------------------

    def _next_sequence(self, p: Partition) -> int:
        entry = p.log.producer_state.last_entry(self.producer_id)
        if entry is None or entry.epoch != DELIVERY_EPOCH or not entry.batches:
            return 0
        return (entry.last_seq + 1) % _SEQ_MOD

    def _deliver_batch(self, p: Partition, dp: Partition, entries: list[Entry]) -> None:
        seq = self._next_sequence(p)
        it = Intent(p.topic, p.index, seq, p.log.log_end_offset, tuple(e.uid for e in entries))
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
            log.error("delivered %d delayed record(s) to %s-%d but could not record it: %s", len(entries),
                      p.topic, p.index, e)

    def _drop(self, entries: list[Entry]) -> None:
        """The target partition is gone (topic deleted): the entries' tombstones, and a log line."""
        first = entries[0]
        log.warning("dropping %d delayed record(s) for %s-%d: the partition no longer exists", len(entries),
                    first.topic, first.partition)
        dp = self._delayed_partition(first.topic, first.partition)
        append_records(self.replicas, DELAYED_TOPIC, dp.index, [(entry_key(e), None) for e in entries])
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
                log.warning("cannot deliver %d delayed record(s) to %s-%d yet: %s", len(entries) - i, topic, index,
                            e)
                ok = False
        return ok

    async def run(self) -> None:
        """One timer: sleep until the next due time or an earlier arrival, deliver, repeat."""
        while True:
            ok = self.deliver_due(_now_ms())
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
