"""Per-partition leader epoch cache (Kafka's LeaderEpochFileCache).

For each leader epoch the log records the offset of its first batch.  That is what
OffsetForLeaderEpoch answers (the end offset of an epoch is the start offset of the
next higher one, or the log end offset for the latest), what consumers use to detect
log truncation after a leader change (KIP-320), and what followers will truncate by
when replication lands.

Persisted beside the segments as ``leader-epoch-checkpoint`` in Kafka's text format
(version line ``0``, count line, then ``epoch start_offset`` lines), always replaced
atomically (temp file, fsync, rename, fsync of the dir).  The file is rewritten only
when an entry changes, which happens on a new leader epoch, truncation, or a moved log
start offset; never per append.  Changes made while loading a log (dropping entries past a
torn tail) and a new epoch's entry that could not be written (a full disk: reads must keep
working) stay ``dirty`` in memory until the next write, :meth:`maybe_flush`, which the log
manager's checkpoint calls.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LEADER_EPOCH_CHECKPOINT_FILE",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEntry",
    "LeaderEpochCache",
]

log = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
_VERSION = 0


@dataclass(frozen=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """Epoch -> start offset, ascending in both; thread-safe (the log lock is not always held)."""

    def __init__(self, path: Path | None, entries: list[EpochEntry] | None = None) -> None:
        self.path = path  # None: memory only (tests)
        self._entries: list[EpochEntry] = list(entries or [])
        self._lock = threading.Lock()
        self.dirty = False  # changed in memory, not yet in the file

    # -- persistence -----------------------------------------------------------------------------

    @classmethod
    def load(cls, dir: Path) -> LeaderEpochCache:
        """Read ``dir``'s checkpoint; a missing file is an empty cache.

        A malformed file is logged and dropped: the cache then refills from new leader
        epochs, which is what Kafka does for a log that predates the cache.
        """
        path = dir / LEADER_EPOCH_CHECKPOINT_FILE
        try:
            text = path.read_text(encoding="ascii")
        except FileNotFoundError:
            return cls(path)
        try:
            entries = parse_checkpoint(text)
        except ValueError as exc:
            log.warning("Ignoring malformed leader epoch checkpoint %(path)s: %(error)s", {"path": path, "error": exc})
            entries = []
        return cls(path, entries)

    def _write_locked(self, flush: bool = True) -> None:
        if not flush:
            self.dirty = True
            return
        self.dirty = False
        if self.path is None:
            return
        lines = [str(_VERSION), str(len(self._entries))]
        lines += [f"{e.epoch} {e.start_offset}" for e in self._entries]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="ascii") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def flush(self) -> None:
        """Write the file (raises OSError; the cache then stays dirty)."""
        with self._lock:
            try:
                self._write_locked()
            except OSError:
                self.dirty = True
                raise

    def maybe_flush(self) -> None:
        """Write the file if memory is ahead of it."""
        if self.dirty:
            self.flush()

    # -- queries ---------------------------------------------------------------------------------

    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._entries)

    def latest_epoch(self) -> int | None:
        with self._lock:
            return self._entries[-1].epoch if self._entries else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch whose range contains ``offset`` (None before the first entry)."""
        with self._lock:
            found = None
            for e in self._entries:
                if e.start_offset > offset:
                    break
                found = e.epoch
            return found

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for ``requested_epoch``, as Kafka's endOffsetFor answers.

        The latest epoch ends at the log end offset; an older one at the start of the
        next higher epoch, reported with the largest known epoch not above the request.
        A request below every known epoch gets the first entry's start offset with the
        requested epoch; an undefined or too-new epoch gets (-1, -1).
        """
        with self._lock:
            if requested_epoch == UNDEFINED_EPOCH or not self._entries:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if self._entries[-1].epoch == requested_epoch:
                return requested_epoch, log_end_offset
            floor: EpochEntry | None = None
            higher: EpochEntry | None = None
            for e in self._entries:
                if e.epoch <= requested_epoch:
                    floor = e
                else:
                    higher = e
                    break
            if higher is None:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if floor is None:
                return requested_epoch, higher.start_offset
            return floor.epoch, higher.start_offset

    # -- updates ---------------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int, *, flush: bool = True) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True if the cache changed.

        Entries that would no longer be monotonic (an epoch at or above ``epoch``, or a
        start offset at or above ``start_offset``) are dropped first, as in Kafka.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid epoch entry ({epoch}, {start_offset})")
        with self._lock:
            if self._entries:
                last = self._entries[-1]
                if last.epoch == epoch and start_offset >= last.start_offset:
                    return False
            self._entries = [e for e in self._entries if e.epoch < epoch and e.start_offset < start_offset]
            self._entries.append(EpochEntry(epoch, start_offset))
            try:
                self._write_locked(flush)
            except OSError:
                self.dirty = True
                raise
            return True

    def truncate_from_end(self, end_offset: int, *, flush: bool = True) -> None:
        """Forget epochs starting at or after ``end_offset`` (the log was truncated there)."""
        with self._lock:
            if end_offset < 0 or not self._entries or self._entries[-1].start_offset < end_offset:
                return
            self._entries = [e for e in self._entries if e.start_offset < end_offset]
            self._write_locked(flush)

    def truncate_from_start(self, start_offset: int, *, flush: bool = True) -> None:
        """The log now starts at ``start_offset``: the epoch containing it starts there."""
        with self._lock:
            removed = [e for e in self._entries if e.start_offset <= start_offset]
            if not removed:
                return
            last = removed[-1]
            if len(removed) == 1 and last.start_offset == start_offset:
                return
            kept = [e for e in self._entries if e.start_offset > start_offset]
            self._entries = [EpochEntry(last.epoch, start_offset), *kept]
            self._write_locked(flush)

    def clear(self) -> None:
        with self._lock:
            if not self._entries:
                return
            self._entries = []
            self._write_locked()


def parse_checkpoint(text: str) -> list[EpochEntry]:
    """Kafka's checkpoint text -> entries; raises ValueError when malformed or not monotonic."""
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != str(_VERSION):
        raise ValueError("unsupported header")
    count = int(lines[1])
    if count < 0 or len(lines) - 2 < count:
        raise ValueError(f"expected {count} entries, found {len(lines) - 2}")
    entries: list[EpochEntry] = []
    for line in lines[2 : 2 + count]:
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"malformed line {line!r}")
        e = EpochEntry(int(parts[0]), int(parts[1]))
        if e.epoch < 0 or e.start_offset < 0:
            raise ValueError(f"negative entry {line!r}")
        if entries and (e.epoch <= entries[-1].epoch or e.start_offset < entries[-1].start_offset):
            raise ValueError(f"entry {line!r} is not monotonic")
        entries.append(e)
    return entries
