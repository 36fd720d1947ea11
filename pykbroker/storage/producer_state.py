"""Per-partition producer state: what makes idempotent and transactional appends safe.

For every producer id that wrote to the partition we keep its epoch, the
sequence and offset ranges of its last five batches (a retried batch is
recognised and answered with its original offsets) and, for a transactional
producer, the first offset of its open transaction (which pins the last stable
offset).  The state is plain data: the log feeds it batch headers on append
and on recovery, and snapshots it at segment roll so recovery only replays the
tail.  No I/O here.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from pykbroker.protocol.records import BatchHeader

NUM_BATCHES_TO_RETAIN = 5
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1


class ProducerStateError(Exception):
    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    coordinator_epoch: int = -1
    last_timestamp: int = -1
    current_txn_first_offset: int | None = None

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


@dataclass(slots=True)
class CompletedTxn:
    """A transaction closed by a control batch: the aborted-transaction index needs the aborted ones."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


def _next_seq(seq: int) -> int:
    return 0 if seq == INT32_MAX else seq + 1


def _last_seq_of(header: BatchHeader) -> int:
    if header.base_sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    return (header.base_sequence + header.last_offset_delta) % (INT32_MAX + 1)


class ProducerStateManager:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        # offset up to which the state reflects the log (exclusive)
        self.map_end_offset = 0

    # --- validation on the produce path -------------------------------------------------------

    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """Validate a client batch against the producer's state.

        Returns the original batch's metadata when this is a retry of one of the last
        five batches (the caller answers with its offsets and appends nothing); raises
        ProducerStateError with Kafka's error code for a fenced epoch or a sequence gap.
        """
        pid = header.producer_id
        if pid < 0:
            return None
        entry = self.producers.get(pid)
        epoch = header.producer_epoch
        first_seq = header.base_sequence
        if entry is None or entry.epoch == NO_PRODUCER_EPOCH:
            # Unknown producer (new, or its state expired): accept, as Kafka has since KIP-360.
            return None
        if epoch < entry.epoch:
            raise ProducerStateError(
                ErrorCode.invalid_producer_epoch,
                f"Epoch of producer {pid} is {epoch}, which is smaller than the last seen epoch {entry.epoch}",
            )
        if header.is_transactional and header.base_sequence == NO_SEQUENCE:
            raise ProducerStateError(ErrorCode.invalid_record, "Transactional batch without a sequence")
        if epoch > entry.epoch:
            if first_seq != 0:
                raise ProducerStateError(
                    ErrorCode.out_of_order_sequence_number,
                    f"Invalid sequence number for new epoch of producer {pid} at offset: {epoch} "
                    f"(request epoch), {first_seq} (seq. number), {entry.epoch} (current producer epoch)",
                )
            return None
        dup = entry.find_duplicate(first_seq, _last_seq_of(header))
        if dup is not None:
            return dup
        current = entry.last_seq
        if current == NO_SEQUENCE:
            # Known epoch but no batches retained (e.g. after a transaction marker): any start is fine.
            return None
        if first_seq != _next_seq(current):
            raise ProducerStateError(
                ErrorCode.out_of_order_sequence_number,
                f"Out of order sequence number for producer {pid} at offset: {first_seq} (incoming seq. "
                f"number), {current} (current end sequence number)",
            )
        return None

    def check_transactional(self, header: BatchHeader) -> None:
        """A transactional write must come from the producer's current epoch (the coordinator fences)."""
        entry = self.producers.get(header.producer_id)
        if entry is not None and header.producer_epoch < entry.epoch:
            raise ProducerStateError(ErrorCode.invalid_producer_epoch, "Producer epoch is fenced")

    # --- updates, from appends and from recovery ----------------------------------------------

    def update(self, header: BatchHeader) -> CompletedTxn | None:
        """Record an appended batch (with its final offsets); returns the completed txn for a marker."""
        pid = header.producer_id
        if header.base_offset + header.last_offset_delta + 1 > self.map_end_offset:
            self.map_end_offset = header.base_offset + header.last_offset_delta + 1
        if pid < 0:
            return None
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerEntry(pid)
        if header.producer_epoch > entry.epoch:
            entry.epoch = header.producer_epoch
            entry.batches.clear()
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        if header.is_control:
            completed = None
            if entry.current_txn_first_offset is not None:
                completed = CompletedTxn(pid, entry.current_txn_first_offset, header.base_offset,
                                         is_aborted=not self._is_commit(header))
            entry.current_txn_first_offset = None
            return completed
        if header.base_sequence != NO_SEQUENCE:
            entry.batches.append(BatchMetadata(
                header.base_sequence, _last_seq_of(header), header.base_offset,
                header.base_offset + header.last_offset_delta, header.max_timestamp,
            ))
        if header.is_transactional and entry.current_txn_first_offset is None:
            entry.current_txn_first_offset = header.base_offset
        return None

    control_type: dict[int, bool] = {}

    @staticmethod
    def _is_commit(header: BatchHeader) -> bool:
        """Control record type lives in the record's key; the log passes it via `control_commit`."""
        return bool(getattr(header, "control_commit", False))

    def bump_epoch(self, producer_id: int, epoch: int) -> None:
        entry = self.producers.setdefault(producer_id, ProducerEntry(producer_id))
        if epoch > entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()

    # --- queries ----------------------------------------------------------------------------------

    def first_unstable_offset(self) -> int | None:
        """The lowest first offset of any open transaction: the last stable offset cannot pass it."""
        offsets = [e.current_txn_first_offset for e in self.producers.values()
                   if e.current_txn_first_offset is not None]
        return min(offsets) if offsets else None

    def ongoing_transactions(self) -> dict[int, int]:
        return {pid: e.current_txn_first_offset for pid, e in self.producers.items()
                if e.current_txn_first_offset is not None}

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        expired = [pid for pid, e in self.producers.items()
                   if e.current_txn_first_offset is None and e.last_timestamp >= 0
                   and now_ms - e.last_timestamp >= expiration_ms]
        for pid in expired:
            del self.producers[pid]
        return expired

    def truncate_and_reset(self) -> None:
        self.producers.clear()
        self.map_end_offset = 0

    # --- snapshots --------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        doc = {
            "version": 1,
            "map_end_offset": self.map_end_offset,
            "producers": [
                {
                    "pid": e.producer_id, "epoch": e.epoch, "coordinator_epoch": e.coordinator_epoch,
                    "last_timestamp": e.last_timestamp, "txn_first_offset": e.current_txn_first_offset,
                    "batches": [[b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp]
                                for b in e.batches],
                }
                for e in self.producers.values()
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_snapshot(cls, data: bytes) -> ProducerStateManager:
        doc = json.loads(data)
        if doc.get("version") != 1:
            raise ValueError("unknown producer snapshot version")
        m = cls()
        m.map_end_offset = int(doc["map_end_offset"])
        for p in doc["producers"]:
            e = ProducerEntry(int(p["pid"]), int(p["epoch"]), coordinator_epoch=int(p["coordinator_epoch"]),
                              last_timestamp=int(p["last_timestamp"]), current_txn_first_offset=p["txn_first_offset"])
            for b in p["batches"]:
                e.batches.append(BatchMetadata(*(int(x) for x in b)))
            m.producers[e.producer_id] = e
        return m
