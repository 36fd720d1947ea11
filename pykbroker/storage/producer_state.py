"""Per-partition producer state: what makes idempotent and transactional appends safe.

For every producer id that wrote to the partition we keep its epoch, the
sequence and offset ranges of its last five batches (a retried batch is
recognised and answered with its original offsets) and, for a transactional
producer, the first offset of its open transaction (which pins the last stable
offset).  The state is plain data: the log feeds it batch headers on append
and on recovery, and snapshots it at segment roll so recovery only replays the
tail.  No I/O here.

Semantics follow Kafka's ProducerAppendInfo / ProducerStateEntry:

* ``client`` appends get full validation: duplicate detection against the last
  five batches, producer epoch fencing and sequence continuity;
* ``coordinator`` appends (transaction markers, coordinator writes) get epoch and
  coordinator-epoch checks but no sequence checks;
* ``replication`` appends (and recovery replay) are trusted and only update state.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from kio.schema.errors import ErrorCode

from pykbroker.protocol.records import INVALID_RECORD, BatchHeader, InvalidRecords, decode_records

__all__ = [
    "CONTROL_TYPE_ABORT",
    "CONTROL_TYPE_COMMIT",
    "NUM_BATCHES_TO_RETAIN",
    "AppendOrigin",
    "BatchMetadata",
    "CompletedTxn",
    "EndTxnMarker",
    "ProducerEntry",
    "ProducerStateError",
    "ProducerStateManager",
    "decode_end_txn_markers",
    "end_txn_marker_record",
    "parse_end_txn_marker",
]

AppendOrigin = Literal["client", "coordinator", "replication"]

NUM_BATCHES_TO_RETAIN = 5
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1

CONTROL_TYPE_ABORT = 0
CONTROL_TYPE_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_END_TXN_VALUE = struct.Struct(">hi")  # version, coordinator epoch
_SNAPSHOT_VERSION = 1
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20
_SEQ_MOD = INT32_MAX + 1


class ProducerStateError(Exception):
    """An append rejected by producer state; ``error_code`` is the Kafka partition error."""

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

    def copy(self) -> ProducerEntry:
        return ProducerEntry(
            self.producer_id,
            self.epoch,
            deque(self.batches, maxlen=NUM_BATCHES_TO_RETAIN),
            self.coordinator_epoch,
            self.last_timestamp,
            self.current_txn_first_offset,
        )

    def _set_epoch(self, epoch: int) -> None:
        # Kafka's maybeUpdateProducerEpoch: a new epoch forgets the old epoch's batches.
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches.clear()


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    """The single record of a transaction marker batch (Kafka's EndTransactionMarker)."""

    control_type: int  # CONTROL_TYPE_ABORT or CONTROL_TYPE_COMMIT
    coordinator_epoch: int

    @property
    def is_commit(self) -> bool:
        return self.control_type == CONTROL_TYPE_COMMIT


@dataclass(slots=True)
class CompletedTxn:
    """A transaction closed by a control batch: the aborted-transaction index needs the aborted ones."""

    producer_id: int
    first_offset: int
    last_offset: int  # offset of the marker
    is_aborted: bool


def end_txn_marker_record(commit: bool, coordinator_epoch: int) -> tuple[bytes, bytes, list[tuple[str, bytes | None]]]:
    """(key, value, headers) of a marker record, for ``build_batch(is_control=True, ...)``."""
    key = _CONTROL_KEY.pack(0, CONTROL_TYPE_COMMIT if commit else CONTROL_TYPE_ABORT)
    return key, _END_TXN_VALUE.pack(0, coordinator_epoch), []


def parse_end_txn_marker(batch: bytes | bytearray | memoryview) -> EndTxnMarker | None:
    """Decode the marker of one control batch (whole batch bytes); None for an empty batch.

    Raises InvalidRecords when the batch is not a commit/abort marker.  Decodes records,
    so it is for control batches only (rare), never for data batches.
    """
    records = decode_records(batch)
    if not records:
        return None  # the cleaner removed the marker's record: nothing to complete
    record = records[0]
    key, value = record.key, record.value
    if key is None or len(key) < _CONTROL_KEY.size:
        raise InvalidRecords(INVALID_RECORD, "control record has an invalid key")
    _, control_type = _CONTROL_KEY.unpack_from(key)
    if control_type not in (CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT):
        raise InvalidRecords(INVALID_RECORD, f"control record type {control_type} is not a transaction marker")
    if value is None or len(value) < _END_TXN_VALUE.size:
        raise InvalidRecords(INVALID_RECORD, "transaction marker has an invalid value")
    _, coordinator_epoch = _END_TXN_VALUE.unpack_from(value)
    return EndTxnMarker(control_type, coordinator_epoch)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def _last_seq_of(header: BatchHeader) -> int:
    base = header.base_sequence
    if base == NO_SEQUENCE:
        return NO_SEQUENCE
    return (base + header.last_offset_delta) % _SEQ_MOD


class ProducerStateManager:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        # producer id -> first offset of its open transaction (kept in step with the entries)
        self._ongoing: dict[int, int] = {}
        # offset up to which the state reflects the log (exclusive)
        self.map_end_offset = 0

    def __len__(self) -> int:
        return len(self.producers)

    def last_entry(self, producer_id: int) -> ProducerEntry | None:
        return self.producers.get(producer_id)

    # --- validation on the produce path -------------------------------------------------------

    def check(
        self, header: BatchHeader, origin: AppendOrigin = "client", marker: EndTxnMarker | None = None
    ) -> BatchMetadata | None:
        """Validate one batch against the producer's state (headers only; ``marker`` for control batches).

        Returns the original batch's metadata when a ``client`` batch is a retry of one of the
        last five batches (the caller answers with its offsets and appends nothing); raises
        ProducerStateError with Kafka's error code for a fenced producer or coordinator epoch,
        a sequence gap or a non-transactional write inside an open transaction.
        """
        if header.producer_id < 0 or origin == "replication":
            return None
        return _validate(self.producers.get(header.producer_id), header, origin, marker)

    def check_all(
        self,
        headers: Sequence[BatchHeader],
        origin: AppendOrigin = "client",
        markers: dict[int, EndTxnMarker] | None = None,
    ) -> BatchMetadata | None:
        """:meth:`check` for every batch of one append (``markers`` keyed by batch index).

        A later batch of the same producer is validated against the state as the earlier
        ones would leave it, like Kafka's per-append ProducerAppendInfo.
        """
        if origin == "replication":
            return None
        if len(headers) == 1:
            return self.check(headers[0], origin, markers.get(0) if markers else None)
        pending: dict[int, ProducerEntry] = {}
        for i, header in enumerate(headers):
            pid = header.producer_id
            if pid < 0:
                continue
            marker = markers.get(i) if markers else None
            entry = pending.get(pid) or self.producers.get(pid)
            dup = _validate(entry, header, origin, marker)
            if dup is not None:
                return dup
            staged = entry.copy() if entry is not None else ProducerEntry(pid)
            _apply(staged, header, marker)
            pending[pid] = staged
        return None

    # --- updates, from appends and from recovery ----------------------------------------------

    def update(self, header: BatchHeader, marker: EndTxnMarker | None = None) -> CompletedTxn | None:
        """Record an appended batch (with its final offsets); returns the completed txn for a marker.

        Control batches need their decoded ``marker``; without one (an empty control batch)
        the state is unchanged.  Never validates: call :meth:`check` first on the produce path.
        """
        next_offset = header.base_offset + header.last_offset_delta + 1
        if next_offset > self.map_end_offset:
            self.map_end_offset = next_offset
        pid = header.producer_id
        if pid < 0:
            return None
        if marker is None and header.attributes & _ATTR_CONTROL:
            return None
        entry = self.producers.get(pid)
        if entry is None:
            entry = self.producers[pid] = ProducerEntry(pid)
        completed = _apply(entry, header, marker)
        txn_first = entry.current_txn_first_offset
        if txn_first is not None:
            self._ongoing[pid] = txn_first
        elif self._ongoing:
            self._ongoing.pop(pid, None)
        return completed

    # --- queries ----------------------------------------------------------------------------------

    @property
    def has_ongoing_transactions(self) -> bool:
        return bool(self._ongoing)

    def first_unstable_offset(self) -> int | None:
        """The lowest first offset of any open transaction: the last stable offset cannot pass it."""
        return min(self._ongoing.values()) if self._ongoing else None

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """Kafka's lastStableOffset(completedTxn), to be called after the marker's update()."""
        first_unstable = self.first_unstable_offset()
        return completed.last_offset + 1 if first_unstable is None else first_unstable

    def ongoing_transactions(self) -> dict[int, int]:
        return dict(self._ongoing)

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers idle for ``expiration_ms`` without an open transaction (Kafka's rule)."""
        expired = [
            pid
            for pid, e in self.producers.items()
            if e.current_txn_first_offset is None and now_ms - e.last_timestamp >= expiration_ms
        ]
        for pid in expired:
            del self.producers[pid]
        return expired

    def truncate_and_reset(self, offset: int = 0) -> None:
        self.producers.clear()
        self._ongoing.clear()
        self.map_end_offset = offset

    # --- snapshots --------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        doc = {
            "version": _SNAPSHOT_VERSION,
            "map_end_offset": self.map_end_offset,
            "producers": [
                {
                    "pid": e.producer_id,
                    "epoch": e.epoch,
                    "coordinator_epoch": e.coordinator_epoch,
                    "last_timestamp": e.last_timestamp,
                    "txn_first_offset": e.current_txn_first_offset,
                    "batches": [
                        [b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp] for b in e.batches
                    ],
                }
                for e in self.producers.values()
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_snapshot(cls, data: bytes) -> ProducerStateManager:
        """Inverse of :meth:`snapshot`; raises ValueError for anything malformed."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("version") != _SNAPSHOT_VERSION:
                raise ValueError("unknown producer snapshot version")
            m = cls()
            m.map_end_offset = int(doc["map_end_offset"])
            for p in doc["producers"]:
                txn = p["txn_first_offset"]
                e = ProducerEntry(
                    int(p["pid"]),
                    int(p["epoch"]),
                    coordinator_epoch=int(p["coordinator_epoch"]),
                    last_timestamp=int(p["last_timestamp"]),
                    current_txn_first_offset=None if txn is None else int(txn),
                )
                for b in p["batches"]:
                    first_seq, last_seq, first_offset, last_offset, ts = (int(x) for x in b)
                    e.batches.append(BatchMetadata(first_seq, last_seq, first_offset, last_offset, ts))
                m.producers[e.producer_id] = e
                if e.current_txn_first_offset is not None:
                    m._ongoing[e.producer_id] = e.current_txn_first_offset
            return m
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"malformed producer snapshot: {exc!r}") from exc


# --- the rules, on one entry ------------------------------------------------------------------------


def _validate(
    entry: ProducerEntry | None, header: BatchHeader, origin: AppendOrigin, marker: EndTxnMarker | None
) -> BatchMetadata | None:
    pid = header.producer_id
    epoch = header.producer_epoch
    if entry is None:
        # Unknown producer (new, or its state expired/was deleted): accept, as Kafka does since KIP-360.
        return None
    attributes = header.attributes
    is_control = attributes & _ATTR_CONTROL
    if origin == "client" and not is_control and epoch == entry.epoch and entry.batches:
        dup = entry.find_duplicate(header.base_sequence, _last_seq_of(header))
        if dup is not None:
            return dup
    if epoch < entry.epoch:
        raise ProducerStateError(
            ErrorCode.invalid_producer_epoch,
            f"Epoch of producer {pid} is {epoch}, which is smaller than the last seen epoch {entry.epoch}",
        )
    if is_control:
        if marker is not None and entry.coordinator_epoch > marker.coordinator_epoch:
            raise ProducerStateError(
                ErrorCode.transaction_coordinator_fenced,
                f"Invalid coordinator epoch for producer {pid}: {marker.coordinator_epoch} (zombie), "
                f"{entry.coordinator_epoch} (current)",
            )
        return None
    if origin == "client":
        _check_sequence(entry, header)
    if entry.current_txn_first_offset is not None and not attributes & _ATTR_TRANSACTIONAL:
        raise ProducerStateError(
            ErrorCode.invalid_txn_state,
            f"Expected a transactional write from producer {pid}, which has an open transaction",
        )
    return None


def _check_sequence(entry: ProducerEntry, header: BatchHeader) -> None:
    pid = header.producer_id
    first_seq = header.base_sequence
    if header.producer_epoch != entry.epoch:
        if first_seq != 0 and entry.epoch != NO_PRODUCER_EPOCH:
            raise ProducerStateError(
                ErrorCode.out_of_order_sequence_number,
                f"Invalid sequence number for new epoch of producer {pid}: {header.producer_epoch} "
                f"(request epoch), {first_seq} (seq. number), {entry.epoch} (current producer epoch)",
            )
        return
    if entry.epoch == NO_PRODUCER_EPOCH:
        return  # no epoch known (e.g. state rebuilt without it): any sequence is fine
    current = entry.last_seq  # NO_SEQUENCE when this epoch has no batches yet: only 0 is in sequence
    if not _in_sequence(current, first_seq):
        raise ProducerStateError(
            ErrorCode.out_of_order_sequence_number,
            f"Out of order sequence number for producer {pid}: {first_seq} (incoming seq. number), "
            f"{current} (current end sequence number)",
        )


def _apply(entry: ProducerEntry, header: BatchHeader, marker: EndTxnMarker | None) -> CompletedTxn | None:
    attributes = header.attributes
    if attributes & _ATTR_CONTROL:
        if marker is None:
            return None
        completed = None
        if entry.current_txn_first_offset is not None:
            completed = CompletedTxn(
                entry.producer_id, entry.current_txn_first_offset, header.base_offset, is_aborted=not marker.is_commit
            )
        entry._set_epoch(header.producer_epoch)
        entry.current_txn_first_offset = None
        entry.coordinator_epoch = marker.coordinator_epoch
        entry.last_timestamp = header.max_timestamp
        return completed
    if header.producer_epoch != entry.epoch:
        entry._set_epoch(header.producer_epoch)
    base_seq = header.base_sequence
    base_offset = header.base_offset
    delta = header.last_offset_delta
    timestamp = header.max_timestamp
    if base_seq != NO_SEQUENCE:
        entry.batches.append(
            BatchMetadata(base_seq, (base_seq + delta) % _SEQ_MOD, base_offset, base_offset + delta, timestamp)
        )
    entry.last_timestamp = timestamp
    if attributes & _ATTR_TRANSACTIONAL and entry.current_txn_first_offset is None:
        entry.current_txn_first_offset = base_offset
    return None


def decode_end_txn_markers(records: bytearray, batches: list[BatchHeader]) -> dict[int, EndTxnMarker] | None:
    """Decoded transaction markers of the control batches (by batch index); raises InvalidRecords."""
    markers: dict[int, EndTxnMarker] | None = None
    for i, b in enumerate(batches):
        if b.is_control and b.producer_id >= 0:
            marker = parse_end_txn_marker(bytes(records[b.position : b.position + b.size]))
            if marker is not None:
                if markers is None:
                    markers = {}
                markers[i] = marker
    return markers
