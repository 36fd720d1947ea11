"""A segment's ``.txnindex``: the aborted transactions whose abort marker lies in the segment.

Kafka's TransactionIndex format: 34-byte big-endian entries of
``version int16 (0), producer id int64, first offset int64, last offset int64,
last stable offset int64`` in marker order.  ``last offset`` is the marker's offset and
``last stable offset`` the LSO just after the marker was written, which lets a
read_committed lookup stop early.  Aborted transactions are rare, so the file is created
lazily on the first entry and holds no descriptor between operations.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from pykbroker.storage.index import CorruptIndex

__all__ = ["ENTRY_SIZE", "AbortedTxn", "TransactionIndex"]

_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size  # 34
_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        try:
            self._size = path.stat().st_size
        except FileNotFoundError:
            self._size = 0
        self._last_offset: int | None = None  # of the last entry, read lazily
        self._dirty = False

    @property
    def entries(self) -> int:
        return self._size // ENTRY_SIZE

    def append(self, txn: AbortedTxn) -> None:
        """Add an entry; last offsets must increase (markers are appended in offset order)."""
        if self._size:
            if self._last_offset is None:
                entries = self.all()
                self._last_offset = entries[-1].last_offset if entries else None
            if self._last_offset is not None and txn.last_offset <= self._last_offset:
                raise ValueError(
                    f"{self.path}: aborted transaction {txn} does not come after last offset {self._last_offset}"
                )
        data = _ENTRY.pack(_VERSION, txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, self._size)
        finally:
            os.close(fd)
        self._size += ENTRY_SIZE
        self._last_offset = txn.last_offset
        self._dirty = True

    def all(self) -> list[AbortedTxn]:
        """Every whole entry, in file order (a torn trailing entry is ignored)."""
        if self._size == 0:
            return []
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return []
        try:
            data = os.pread(fd, self._size, 0)
        finally:
            os.close(fd)
        out: list[AbortedTxn] = []
        for pos in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
            version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
            if version != _VERSION:
                raise CorruptIndex(f"{self.path}: unexpected entry version {version} at position {pos}")
            out.append(AbortedTxn(pid, first, last, lso))
        return out

    def collect(self, fetch_offset: int, upper_bound_offset: int) -> tuple[list[AbortedTxn], bool]:
        """Aborted transactions overlapping [fetch_offset, upper_bound_offset), and whether the
        search is complete (an entry's LSO reached the upper bound, so later segments cannot add any)."""
        out: list[AbortedTxn] = []
        for txn in self.all():
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                out.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return out, True
        return out, False

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose marker is at or after ``offset``."""
        if self._size == 0:
            return
        keep = 0
        for txn in self.all():
            if txn.last_offset >= offset:
                break
            keep += 1
        if keep * ENTRY_SIZE != self._size:
            self._truncate(keep * ENTRY_SIZE)

    def reset(self) -> None:
        """Remove every entry (before a rebuild from the log)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._size = 0
        self._last_offset = None
        self._dirty = False

    def delete(self) -> None:
        self.reset()

    def sanity_check(self) -> None:
        """Raise CorruptIndex for a torn file or a bad entry."""
        if self._size % ENTRY_SIZE:
            raise CorruptIndex(f"{self.path}: size {self._size} is not a multiple of {ENTRY_SIZE}")
        last = -1
        for txn in self.all():
            if txn.last_offset <= last or txn.last_offset < self.base_offset:
                raise CorruptIndex(f"{self.path}: entry {txn} is out of order")
            last = txn.last_offset

    def dup_fd(self) -> int | None:
        """A descriptor to fsync if entries were written since the last call, else None."""
        if not self._dirty:
            return None
        self._dirty = False
        try:
            return os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None

    def _truncate(self, size: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.truncate(self.path, size)
        self._size = size
        self._last_offset = None
        self._dirty = True
