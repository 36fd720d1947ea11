"""One share-partition's delivery state (KIP-932), sans-I/O: which records of a topic partition a share
group has delivered, to whom, how often, and which are done.

Kafka's vocabulary: the share-partition start offset (SPSO) is the first record not yet finished; records
from there up to the end offset (SPEO, exclusive here: the next offset never acquired) are *in flight*,
each AVAILABLE, ACQUIRED (by one member, under a time lock), ACKNOWLEDGED or ARCHIVED.  Acquiring counts a
delivery; a record released, or whose lock expired, goes back to AVAILABLE unless it has been delivered
``delivery_count_limit`` times, in which case it is archived.  The SPSO moves past finished records.

The caller (the share fetch handler) reads batches from the log and hands their offset ranges here; this
class decides what is acquired and returns Kafka's acquired-records ranges.  Time comes in as ``now`` in
milliseconds so tests can drive a fake clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode


class RecordState(enum.IntEnum):
    # Kafka's RecordState ids, also the delivery_state persisted in __share_group_state.
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AckType(enum.IntEnum):
    """ShareFetch/ShareAcknowledge acknowledge types."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


class ArchiveReason(enum.Enum):
    """Why a record was archived: the dead-letter topic's ``pykbroker.dlq.reason`` header for the first two."""

    REJECTED = "rejected"
    DELIVERY_COUNT_EXCEEDED = "delivery-count-exceeded"
    GAP = "gap"  # no record at this offset (compacted away, or a control record): nothing to dead-letter


@dataclass(frozen=True)
class Archived:
    """A record archived by a transition that the dead-letter step may want to see."""

    offset: int
    delivery_count: int
    reason: ArchiveReason


@dataclass(frozen=True)
class LogBatch:
    """A batch the fetch read from the log: offsets [base, last]; not deliverable when it is a control batch
    or part of an aborted transaction (read_committed), which the share group archives without delivering."""

    base: int
    last: int
    deliverable: bool = True


@dataclass
class InFlight:
    state: RecordState
    delivery_count: int = 0
    member: str = ""
    deadline: int = 0  # ms; the acquisition lock's expiry while ACQUIRED


@dataclass(frozen=True)
class StateBatch:
    """A run of in-flight offsets with one state and delivery count (the persisted form)."""

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int


@dataclass
class ShareLimits:
    lock_duration_ms: int = 30000
    delivery_count_limit: int = 5
    max_record_locks: int = 2000


@dataclass
class SharePartition:
    """The delivery state of one (group, topic, partition)."""

    start_offset: int
    limits: ShareLimits = field(default_factory=ShareLimits)
    # Offset -> state for start_offset <= offset < end_offset; finished records below the SPSO are dropped.
    records: dict[int, InFlight] = field(default_factory=dict)
    end_offset: int = -1
    # Bumped on every change a persisted snapshot must capture (acquisitions only change delivery counts,
    # which Kafka also persists lazily: with the next acknowledgement).
    state_epoch: int = 0

    def __post_init__(self) -> None:
        if self.end_offset < self.start_offset:
            self.end_offset = self.start_offset

    # --- restore and inspect -----------------------------------------------------------------------------

    @classmethod
    def restore(cls, start_offset: int, batches: Iterable[StateBatch], limits: ShareLimits) -> SharePartition:
        """From a persisted snapshot: ACQUIRED was persisted as AVAILABLE, with its delivery count."""
        sp = cls(start_offset, limits)
        for b in batches:
            for off in range(max(b.first_offset, start_offset), b.last_offset + 1):
                state = RecordState.AVAILABLE if b.state == RecordState.ACQUIRED else b.state
                sp.records[off] = InFlight(state, b.delivery_count)
                sp.end_offset = max(sp.end_offset, off + 1)
        sp._advance_start()
        return sp

    def state_batches(self) -> list[StateBatch]:
        """The in-flight records as runs for persistence (ACQUIRED written as AVAILABLE: a lock does not
        survive the broker)."""
        out: list[StateBatch] = []
        first = last = -2
        state, count = RecordState.AVAILABLE, 0
        for off in sorted(self.records):
            r = self.records[off]
            s = RecordState.AVAILABLE if r.state == RecordState.ACQUIRED else r.state
            if off == last + 1 and s == state and r.delivery_count == count:
                last = off
                continue
            if last >= 0:
                out.append(StateBatch(first, last, state, count))
            first = last = off
            state, count = s, r.delivery_count
        if last >= 0:
            out.append(StateBatch(first, last, state, count))
        return out

    def fetch_offset(self) -> int:
        """Where the log should be read from: the first AVAILABLE in-flight record, else the end offset."""
        available = [off for off, r in self.records.items() if r.state == RecordState.AVAILABLE]
        return min(available) if available else self.end_offset

    def has_available(self) -> bool:
        return any(r.state == RecordState.AVAILABLE for r in self.records.values())

    def acquired_by(self, member: str) -> list[int]:
        return sorted(o for o, r in self.records.items() if r.state == RecordState.ACQUIRED and r.member == member)

    def next_deadline(self) -> int | None:
        deadlines = [r.deadline for r in self.records.values() if r.state == RecordState.ACQUIRED]
        return min(deadlines) if deadlines else None

    # --- transitions -------------------------------------------------------------------------------------

    def move_start(self, offset: int) -> None:
        """The log's start offset passed the SPSO (retention, DeleteRecords) or an admin reset: forget below."""
        if offset <= self.start_offset:
            return
        for off in [o for o in self.records if o < offset]:
            del self.records[off]
        self.start_offset = offset
        self.end_offset = max(self.end_offset, offset)
        self.state_epoch += 1

    def acquire(self, member: str, batches: Iterable[LogBatch], max_records: int, now: int
                ) -> tuple[list[tuple[int, int, int]], list[Archived]]:
        """Acquire up to ``max_records`` deliverable records of ``batches`` for ``member``.

        Returns Kafka's acquired-records ranges (first offset, last offset, delivery count) and the records
        archived on the way (non-deliverable offsets beyond the end offset, as GAP).
        """
        acquired: list[int] = []
        archived: list[Archived] = []
        lock_until = now + self.limits.lock_duration_ms
        limit_offset = self.start_offset + self.limits.max_record_locks
        for b in batches:
            if len(acquired) >= max_records:
                break
            for off in range(max(b.base, self.start_offset), b.last + 1):
                if len(acquired) >= max_records:
                    break
                if off >= self.end_offset:
                    if off >= limit_offset:
                        break
                    # Records are acquired in log order: fill any hole (offsets the log no longer has).
                    for hole in range(self.end_offset, off):
                        self.records[hole] = InFlight(RecordState.ARCHIVED)
                        archived.append(Archived(hole, 0, ArchiveReason.GAP))
                    self.end_offset = off + 1
                    if not b.deliverable:
                        self.records[off] = InFlight(RecordState.ARCHIVED)
                        archived.append(Archived(off, 0, ArchiveReason.GAP))
                        continue
                    self.records[off] = InFlight(RecordState.ACQUIRED, 1, member, lock_until)
                    acquired.append(off)
                    continue
                r = self.records.get(off)
                if r is None or r.state != RecordState.AVAILABLE:
                    continue
                if not b.deliverable:
                    r.state = RecordState.ARCHIVED
                    archived.append(Archived(off, r.delivery_count, ArchiveReason.GAP))
                    continue
                r.state, r.member, r.deadline = RecordState.ACQUIRED, member, lock_until
                r.delivery_count += 1
                acquired.append(off)
        if archived:
            self.state_epoch += 1
            self._advance_start()
        return self._ranges(acquired), archived

    def _ranges(self, offsets: list[int]) -> list[tuple[int, int, int]]:
        out: list[tuple[int, int, int]] = []
        for off in offsets:
            count = self.records[off].delivery_count
            if out and out[-1][1] == off - 1 and out[-1][2] == count:
                out[-1] = (out[-1][0], off, count)
            else:
                out.append((off, off, count))
        return out

    def acknowledge(self, member: str, first: int, last: int, types: list[int], now: int
                    ) -> tuple[ErrorCode, list[Archived]]:
        """Apply one acknowledgement batch: one type for the whole range, or one per offset.

        All or nothing, as Kafka: INVALID_RECORD_STATE if any offset is not ACQUIRED by ``member``,
        INVALID_REQUEST for a malformed batch.
        """
        if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
            return ErrorCode.invalid_request, []
        try:
            kinds = [AckType(t) for t in types]
        except ValueError:
            return ErrorCode.invalid_request, []
        if last >= self.end_offset:
            return ErrorCode.invalid_record_state, []
        # Offsets below the start offset are finished: only a GAP may name them. The loops below then stay
        # within the in-flight window, however wide a range the request claims.
        lo = max(first, self.start_offset)
        if first < lo and any(k != AckType.GAP for k in kinds[:lo - first]):
            return ErrorCode.invalid_record_state, []
        for off in range(lo, last + 1):
            kind = kinds[0] if len(kinds) == 1 else kinds[off - first]
            r = self.records.get(off)
            if r is None or r.state != RecordState.ACQUIRED or r.member != member:
                return ErrorCode.invalid_record_state, []
        archived: list[Archived] = []
        for off in range(lo, last + 1):
            kind = kinds[0] if len(kinds) == 1 else kinds[off - first]
            rec = self.records.get(off)
            if rec is None:
                continue
            if kind == AckType.ACCEPT:
                rec.state = RecordState.ACKNOWLEDGED
            elif kind == AckType.RENEW:
                rec.deadline = now + self.limits.lock_duration_ms
                continue
            elif kind == AckType.RELEASE:
                a = self._release(off, rec)
                if a is not None:
                    archived.append(a)
            elif kind == AckType.REJECT:
                rec.state = RecordState.ARCHIVED
                archived.append(Archived(off, rec.delivery_count, ArchiveReason.REJECTED))
            else:  # GAP: no record there
                rec.state = RecordState.ARCHIVED
            rec.member, rec.deadline = "", 0
        self.state_epoch += 1
        self._advance_start()
        return ErrorCode.none, archived

    def _release(self, off: int, rec: InFlight) -> Archived | None:
        rec.member, rec.deadline = "", 0
        if rec.delivery_count >= self.limits.delivery_count_limit:
            rec.state = RecordState.ARCHIVED
            return Archived(off, rec.delivery_count, ArchiveReason.DELIVERY_COUNT_EXCEEDED)
        rec.state = RecordState.AVAILABLE
        return None

    def expire_locks(self, now: int) -> tuple[bool, list[Archived]]:
        """Release records whose acquisition lock expired; (anything changed, records archived)."""
        changed = False
        archived: list[Archived] = []
        for off in sorted(self.records):
            r = self.records[off]
            if r.state == RecordState.ACQUIRED and r.deadline <= now:
                changed = True
                a = self._release(off, r)
                if a is not None:
                    archived.append(a)
        if changed:
            self.state_epoch += 1
            self._advance_start()
        return changed, archived

    def release_member(self, member: str) -> list[Archived]:
        """A member left or was fenced: its acquired records are released (KIP-932)."""
        archived: list[Archived] = []
        changed = False
        for off in self.acquired_by(member):
            changed = True
            a = self._release(off, self.records[off])
            if a is not None:
                archived.append(a)
        if changed:
            self.state_epoch += 1
            self._advance_start()
        return archived

    def _advance_start(self) -> None:
        off = self.start_offset
        while off < self.end_offset:
            r = self.records.get(off)
            if r is not None and r.state not in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED):
                break
            self.records.pop(off, None)
            off += 1
        self.start_offset = off

    def iter_in_flight(self) -> Iterator[tuple[int, InFlight]]:
        for off in sorted(self.records):
            yield off, self.records[off]
