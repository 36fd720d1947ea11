"""The transaction coordinator's core, with no I/O: per-transactional-id metadata and its transitions.

Semantics follow Kafka's TransactionCoordinator / TransactionMetadata (transaction version 1):
InitProducerId, AddPartitionsToTxn (and AddOffsetsToTxn), EndTxn, timeouts and
transactional-id expiration, with Kafka's error codes.  Every state change is first written
through the injected ``writer`` (``__transaction_state`` partition, key, value-or-None), which
raises on failure; memory changes only after it returns, so it never runs ahead of the log.

Markers are not written here: EndTxn (or a timeout, or a fencing InitProducerId) returns a
:class:`MarkerJob`; the I/O edge writes the control batches and then calls
:meth:`TransactionStateMachine.complete` to record CompleteCommit/CompleteAbort.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.internal_topic import partition_for
from pykbroker.coordinator.transaction.log_serde import (
    TxnLogSerdeError,
    TxnLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from pykbroker.logsetup import fields

log = logging.getLogger("pykbroker.txn")

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767

TopicPartition = tuple[str, int]
Writer = Callable[[int, bytes, bytes | None], None]


class TxnState(IntEnum):
    """The on-disk status byte of TransactionLogValue."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def display(self) -> str:
        return _NAMES[self]


_NAMES = {
    TxnState.EMPTY: "Empty", TxnState.ONGOING: "Ongoing", TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort", TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort", TxnState.DEAD: "Dead",
    TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
STATE_BY_NAME = {v: k for k, v in _NAMES.items()}

# Kafka's TransactionState.validPreviousStates.
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.ONGOING: frozenset({TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT,
                                 TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}

COMPLETED = frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})
PREPARED = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})


def epoch_exhausted(epoch: int) -> bool:
    return epoch >= MAX_EPOCH - 1


class IllegalTransition(Exception):
    pass


@dataclass(slots=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition] = frozenset()
    start_ms: int = -1
    last_update_ms: int = -1
    last_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH

    def transition(self, state: TxnState, now: int, **changes: object) -> TransactionMetadata:
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalTransition(f"{self.transactional_id}: {self.state.display} -> {state.display}")
        return dataclasses.replace(self, state=state, last_update_ms=now, **changes)  # type: ignore[arg-type]

    def to_value(self) -> TxnLogValue:
        parts: dict[str, list[int]] = {}
        for t, p in self.partitions:
            parts.setdefault(t, []).append(p)
        return TxnLogValue(self.producer_id, self.producer_epoch, self.timeout_ms, int(self.state), parts,
                           self.last_update_ms, self.start_ms, previous_producer_id=self.last_producer_id)

    @classmethod
    def from_value(cls, txn_id: str, v: TxnLogValue) -> TransactionMetadata:
        return cls(txn_id, v.producer_id, v.producer_epoch, v.timeout_ms, TxnState(v.status),
                   frozenset((t, p) for t, ps in v.partitions.items() for p in ps), v.start_ms,
                   v.last_update_ms, last_producer_id=v.previous_producer_id)


@dataclass(frozen=True, slots=True)
class MarkerJob:
    """Commit or abort markers to write into every partition of one transaction."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: frozenset[TopicPartition]


@dataclass(slots=True)
class InitResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    job: MarkerJob | None = None  # an ongoing transaction being aborted to fence its producer


@dataclass
class TxnConfig:
    num_partitions: int = 50
    max_timeout_ms: int = 900_000
    id_expiration_ms: int = 604_800_000


@dataclass(slots=True)
class _Partition:
    loading: bool
    coordinator_epoch: int
    txn_ids: set[str] = field(default_factory=set)


class TransactionStateMachine:
    def __init__(self, config: TxnConfig, writer: Writer, clock: Callable[[], int],
                 allocate_producer_id: Callable[[], int]) -> None:
        self.config = config
        self.writer = writer
        self.clock = clock
        self.allocate_producer_id = allocate_producer_id
        self.txns: dict[str, TransactionMetadata] = {}
        self.partitions: dict[int, _Partition] = {}

    # --- ownership of __transaction_state partitions ----------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.config.num_partitions)

    def begin_loading(self, partition: int, coordinator_epoch: int) -> None:
        self.unload(partition)
        self.partitions[partition] = _Partition(True, coordinator_epoch)

    def load(self, partition: int, records: Iterable[tuple[bytes | None, bytes | None]]) -> int:
        """Replay one partition's ``(key, value)`` records in log order; returns how many ids it holds."""
        state: dict[str, TransactionMetadata | None] = {}
        for key, value in records:
            if key is None:
                continue
            try:
                txn_id = decode_key(key)
                state[txn_id] = None if value is None else TransactionMetadata.from_value(txn_id, decode_value(value))
            except (TxnLogSerdeError, UnicodeDecodeError, ValueError) as e:
                log.warning("skipping an undecodable __transaction_state record",
                            extra=fields(partition=partition, reason=str(e)))
        part = self.partitions.get(partition)
        if part is None:
            return 0
        for txn_id, md in state.items():
            if md is None or md.state == TxnState.DEAD:
                continue
            if md.state == TxnState.PREPARE_EPOCH_FENCE:  # never written by us; treat as ongoing
                md.state = TxnState.ONGOING
            self.txns[txn_id] = md
            part.txn_ids.add(txn_id)
        return len(part.txn_ids)

    def finish_loading(self, partition: int) -> list[MarkerJob]:
        """Mark the partition active; returns the marker jobs of prepared transactions to finish."""
        part = self.partitions.get(partition)
        if part is None:
            return []
        part.loading = False
        return [self._job(self.txns[t]) for t in sorted(part.txn_ids) if self.txns[t].state in PREPARED]

    def unload(self, partition: int) -> None:
        part = self.partitions.pop(partition, None)
        if part is not None:
            for t in part.txn_ids:
                self.txns.pop(t, None)

    def coordinator_error(self, transactional_id: str) -> ErrorCode | None:
        part = self.partitions.get(self.partition_for(transactional_id))
        if part is None:
            return ErrorCode.not_coordinator
        if part.loading:
            return ErrorCode.coordinator_load_in_progress
        return None

    def coordinator_epoch(self, transactional_id: str) -> int:
        part = self.partitions.get(self.partition_for(transactional_id))
        return part.coordinator_epoch if part is not None else -1

    # --- writing ------------------------------------------------------------------------------

    def _store(self, md: TransactionMetadata) -> None:
        """Persist then apply a new version of a transaction's metadata."""
        p = self.partition_for(md.transactional_id)
        self.writer(p, encode_key(md.transactional_id), encode_value(md.to_value()))
        self.txns[md.transactional_id] = md
        part = self.partitions.get(p)
        if part is not None:
            part.txn_ids.add(md.transactional_id)

    def _job(self, md: TransactionMetadata) -> MarkerJob:
        return MarkerJob(md.transactional_id, md.producer_id, md.producer_epoch,
                         md.state == TxnState.PREPARE_COMMIT, self.coordinator_epoch(md.transactional_id),
                         md.partitions)

    # --- InitProducerId ------------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str | None, timeout_ms: int,
                         expected_producer_id: int = NO_PRODUCER_ID,
                         expected_epoch: int = NO_PRODUCER_EPOCH) -> InitResult:
        if transactional_id is None:
            # Idempotent producer: always a fresh producer id (Kafka ignores the expected one).
            return InitResult(ErrorCode.none, self.allocate_producer_id(), 0)
        if transactional_id == "":
            return InitResult(ErrorCode.invalid_request)
        if not 0 < timeout_ms <= self.config.max_timeout_ms:
            return InitResult(ErrorCode.invalid_transaction_timeout)
        err = self.coordinator_error(transactional_id)
        if err is not None:
            return InitResult(err)
        now = self.clock()
        md = self.txns.get(transactional_id)
        if md is None:
            md = TransactionMetadata(transactional_id, self.allocate_producer_id(), NO_PRODUCER_EPOCH, timeout_ms,
                                     TxnState.EMPTY, last_update_ms=now)
        if expected_producer_id != NO_PRODUCER_ID and not (
                md.producer_epoch == NO_PRODUCER_EPOCH or expected_producer_id == md.producer_id
                or (expected_producer_id == md.last_producer_id and epoch_exhausted(expected_epoch))):
            return InitResult(ErrorCode.producer_fenced)
        if md.state in PREPARED or md.state in (TxnState.PREPARE_EPOCH_FENCE, TxnState.DEAD):
            return InitResult(ErrorCode.concurrent_transactions)
        if md.state == TxnState.ONGOING:
            # Fence the current producer: bump the epoch and abort its transaction with it.  The
            # new producer retries (CONCURRENT_TRANSACTIONS) until the abort completes.
            fenced_epoch = md.producer_epoch if epoch_exhausted(md.producer_epoch) else md.producer_epoch + 1
            new = md.transition(TxnState.PREPARE_EPOCH_FENCE, now).transition(
                TxnState.PREPARE_ABORT, now, producer_epoch=fenced_epoch, last_producer_epoch=NO_PRODUCER_EPOCH)
            self._store(new)
            log.info("fencing a producer: aborting its transaction", extra=fields(
                transactional_id=transactional_id, producer_id=md.producer_id, producer_epoch=md.producer_epoch))
            return InitResult(ErrorCode.concurrent_transactions, job=self._job(new))
        # Empty, CompleteCommit, CompleteAbort.
        pid, last_pid = md.producer_id, md.last_producer_id
        if epoch_exhausted(md.producer_epoch):
            last_pid, pid = md.producer_id, self.allocate_producer_id()
            epoch, last_epoch = 0, NO_PRODUCER_EPOCH
        elif expected_producer_id == NO_PRODUCER_ID:
            epoch, last_epoch = md.producer_epoch + 1, NO_PRODUCER_EPOCH
        elif md.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == md.producer_epoch:
            epoch, last_epoch = md.producer_epoch + 1, md.producer_epoch
        elif expected_epoch == md.last_producer_epoch:
            epoch, last_epoch = md.producer_epoch, md.last_producer_epoch  # a retry of the last bump
        else:
            return InitResult(ErrorCode.producer_fenced)
        new = md.transition(TxnState.EMPTY, now, producer_id=pid, producer_epoch=max(epoch, 0), timeout_ms=timeout_ms,
                            partitions=frozenset(), start_ms=-1, last_producer_id=last_pid,
                            last_producer_epoch=last_epoch)
        self._store(new)
        return InitResult(ErrorCode.none, new.producer_id, new.producer_epoch)

    # --- AddPartitionsToTxn / AddOffsetsToTxn ------------------------------------------------------

    def _check_producer(self, transactional_id: str, producer_id: int, epoch: int
                        ) -> tuple[ErrorCode, TransactionMetadata | None]:
        if not transactional_id:
            return ErrorCode.invalid_request, None
        err = self.coordinator_error(transactional_id)
        if err is not None:
            return err, None
        md = self.txns.get(transactional_id)
        if md is None or md.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping, None
        if md.producer_epoch != epoch:
            return ErrorCode.producer_fenced, None
        return ErrorCode.none, md

    def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                       partitions: Iterable[TopicPartition]) -> ErrorCode:
        err, md = self._check_producer(transactional_id, producer_id, epoch)
        if md is None:
            return err
        wanted = frozenset(partitions)
        if md.state in PREPARED or md.state == TxnState.PREPARE_EPOCH_FENCE:
            return ErrorCode.concurrent_transactions
        if md.state == TxnState.DEAD:
            return ErrorCode.invalid_producer_id_mapping
        if md.state == TxnState.ONGOING and wanted <= md.partitions:
            return ErrorCode.none
        now = self.clock()
        start = md.start_ms if md.state == TxnState.ONGOING else now
        self._store(md.transition(TxnState.ONGOING, now, partitions=md.partitions | wanted, start_ms=start))
        return ErrorCode.none

    def verify_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                          partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """KIP-890 part 1: is each partition already in the producer's transaction?  Changes nothing.

        As Kafka's coordinator answers AddPartitionsToTxn with ``verify_only``: an unknown id, another
        producer, a fenced epoch or a transaction being completed fail every partition; otherwise a
        partition not in the transaction gets TRANSACTION_ABORTABLE (the caller translates it for
        versions that do not know that code).  The pending state is not checked: a marker that lands
        between verification and append is caught by the partition's producer state.
        """
        parts = list(partitions)
        if not transactional_id:
            return dict.fromkeys(parts, ErrorCode.invalid_request)
        err, md = self._check_producer(transactional_id, producer_id, epoch)
        if md is not None and md.state in PREPARED:
            err, md = ErrorCode.concurrent_transactions, None
        if md is None:
            return dict.fromkeys(parts, err)
        return {tp: ErrorCode.none if tp in md.partitions else ErrorCode.transaction_abortable for tp in parts}

    # --- EndTxn --------------------------------------------------------------------------------

    def end_txn(self, transactional_id: str, producer_id: int, epoch: int, commit: bool
                ) -> tuple[ErrorCode, MarkerJob | None]:
        err, md = self._check_producer(transactional_id, producer_id, epoch)
        if md is None:
            return err, None
        s = md.state
        if s == TxnState.ONGOING:
            new = md.transition(TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT, self.clock())
            self._store(new)
            return ErrorCode.none, self._job(new)
        if s == TxnState.COMPLETE_COMMIT:
            return (ErrorCode.none if commit else ErrorCode.invalid_txn_state), None
        if s == TxnState.COMPLETE_ABORT:
            return (ErrorCode.none if not commit else ErrorCode.invalid_txn_state), None
        if s == TxnState.PREPARE_COMMIT:
            return (ErrorCode.concurrent_transactions if commit else ErrorCode.invalid_txn_state), None
        if s == TxnState.PREPARE_ABORT:
            return (ErrorCode.concurrent_transactions if not commit else ErrorCode.invalid_txn_state), None
        return ErrorCode.invalid_txn_state, None

    def complete(self, job: MarkerJob) -> bool:
        """Record that every marker of ``job`` is written: PrepareX -> CompleteX.  False if stale."""
        md = self.txns.get(job.transactional_id)
        if md is None or md.producer_id != job.producer_id or md.producer_epoch != job.producer_epoch:
            return False
        target = TxnState.PREPARE_COMMIT if job.commit else TxnState.PREPARE_ABORT
        if md.state != target or self.coordinator_error(job.transactional_id) is not None:
            return False
        done = TxnState.COMPLETE_COMMIT if job.commit else TxnState.COMPLETE_ABORT
        self._store(md.transition(done, self.clock(), partitions=frozenset()))
        return True

    def is_pending(self, job: MarkerJob) -> bool:
        """Whether ``job`` is still the one its transaction waits for. A job taken earlier (the retry loop's
        list, a load) whose transaction completed since must write nothing: the producer's next transaction
        has the same producer id and epoch, so its markers would end that transaction instead (a commit marker
        would commit records the producer never committed)."""
        md = self.txns.get(job.transactional_id)
        return md is not None and md.state in PREPARED and self._job(md) == job

    def prepared_jobs(self) -> list[MarkerJob]:
        """Marker jobs of every prepared transaction in an active partition (for retries)."""
        return [self._job(md) for t, md in self.txns.items()
                if md.state in PREPARED and self.coordinator_error(t) is None]

    # --- timeouts and expiration ------------------------------------------------------------------

    def abort_timed_out(self) -> list[MarkerJob]:
        """Kafka's abortTimedOutTransactions: fence the producer's epoch and abort."""
        now = self.clock()
        jobs: list[MarkerJob] = []
        for t, md in list(self.txns.items()):
            if md.state != TxnState.ONGOING or self.coordinator_error(t) is not None:
                continue
            if md.start_ms + md.timeout_ms > now:
                continue
            fenced_epoch = md.producer_epoch if epoch_exhausted(md.producer_epoch) else md.producer_epoch + 1
            new = md.transition(TxnState.PREPARE_EPOCH_FENCE, now).transition(
                TxnState.PREPARE_ABORT, now, producer_epoch=fenced_epoch, last_producer_epoch=NO_PRODUCER_EPOCH)
            try:
                self._store(new)
            except Exception:
                log.exception("failed to abort timed-out transaction %(transactional_id)s", {"transactional_id": t})
                continue
            log.info("aborting a transaction that timed out",
                     extra=fields(transactional_id=t, producer_id=md.producer_id, timeout_ms=md.timeout_ms))
            jobs.append(self._job(new))
        return jobs

    def expire_transactional_ids(self) -> list[str]:
        """Tombstone ids idle for transactional.id.expiration.ms with no transaction in flight."""
        now = self.clock()
        expired: list[str] = []
        for t, md in list(self.txns.items()):
            if md.state not in COMPLETED or self.coordinator_error(t) is not None:
                continue
            if md.last_update_ms + self.config.id_expiration_ms > now:
                continue
            p = self.partition_for(t)
            try:
                self.writer(p, encode_key(t), None)
            except Exception:
                log.exception("failed to expire transactional id %(transactional_id)s", {"transactional_id": t})
                continue
            del self.txns[t]
            part = self.partitions.get(p)
            if part is not None:
                part.txn_ids.discard(t)
            expired.append(t)
        return expired

    # --- operator views -------------------------------------------------------------------------

    def describe(self, transactional_id: str) -> tuple[ErrorCode, TransactionMetadata | None]:
        err = self.coordinator_error(transactional_id)
        if err is not None:
            return err, None
        md = self.txns.get(transactional_id)
        if md is None:
            return ErrorCode.transactional_id_not_found, None
        return ErrorCode.none, md

    def list(self, states: set[TxnState] | None, producer_ids: set[int] | None,
             min_duration_ms: int = -1) -> list[TransactionMetadata]:
        now = self.clock()
        out = []
        for t, md in sorted(self.txns.items()):
            if self.coordinator_error(t) is not None:
                continue
            if states and md.state not in states:
                continue
            if producer_ids and md.producer_id not in producer_ids:
                continue
            if min_duration_ms >= 0 and (md.start_ms < 0 or now - md.start_ms < min_duration_ms):
                continue
            out.append(md)
        return out

    def loading(self) -> bool:
        return any(p.loading for p in self.partitions.values())
