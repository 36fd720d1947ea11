"""Sparse on-disk offset and time indexes for one log segment (Kafka's file formats).

``.index``     8-byte entries: relative offset u32, file position u32 (big-endian).
``.timeindex`` 12-byte entries: timestamp i64, relative offset u32 (big-endian).

The active segment's indexes live in memory (``segment.index.bytes`` bounds them), so
appends are buffer writes and lookups an O(log n) binary search without syscalls; the
entries reach the file when the log is flushed and when the segment is rolled or closed.
Inactive indexes are read with ``os.pread`` and hold no file descriptor between lookups,
so the number of open files is one per partition (its active ``.log``), not three.

Entries are only ever hints: losing trailing entries just means a longer forward scan,
which is why a crash-torn index can always be repaired by dropping or rebuilding it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path

__all__ = ["CorruptIndex", "IndexFullError", "OffsetIndex", "TimeIndex"]

log = logging.getLogger("pykbroker.storage.index")

_MAX_RELATIVE = 0xFFFFFFFF
_DISK_FULL = frozenset((errno.ENOSPC, errno.EDQUOT))


class CorruptIndex(Exception):
    """The index failed its sanity check and must be rebuilt from the log."""


class IndexFullError(Exception):
    """Appending would exceed the preallocated index size (the segment should have rolled)."""


class _IndexFile:
    """Shared machinery: fixed-size entries, an in-memory buffer when writable, pread when not."""

    entry_size: int = 0
    _struct: struct.Struct

    def __init__(self, path: Path, base_offset: int, max_index_size: int, *, writable: bool) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_index_size = max(self.entry_size, max_index_size - max_index_size % self.entry_size)
        # The active segment's entries (None when not writable); the file holds the first
        # ``_synced`` of them and is ``_file_size`` bytes long (longer after a truncation or
        # when it was preallocated by an older version).
        self._buf: bytearray | None = None
        self._synced = 0
        self._file_size = 0
        try:
            length = os.stat(path).st_size
        except FileNotFoundError:
            length = -1
        self._entries = self._count_valid_entries(length) if length > 0 else 0
        if writable:
            self.make_writable(exists=length >= 0)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def max_entries(self) -> int:
        return self.max_index_size // self.entry_size

    @property
    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    @property
    def size_bytes(self) -> int:
        """Bytes of real entries."""
        return self._entries * self.entry_size

    @property
    def writable(self) -> bool:
        return self._buf is not None

    def make_writable(self, *, exists: bool | None = None) -> None:
        """Load the entries into memory for appends (the active segment).

        The active index is a buffer, written to its file when the log is flushed and when
        the segment is rolled or closed: it costs no file descriptor (a thousand partitions
        would otherwise hold two thousand, or four thousand with mmap's own duplicates), and
        an entry not yet written is rebuilt from the log by recovery after a crash, like
        every index entry past the recovery point.
        """
        if self._buf is not None:
            return
        size = self.size_bytes
        if size == 0 and not (self.path.exists() if exists is None else exists):
            # A new segment: an empty file, as Kafka's layout has one beside every .log.
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644))
            self._buf, self._synced, self._file_size = bytearray(), 0, 0
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            data = os.pread(fd, size, 0) if size else b""
            self._file_size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if len(data) != size:
            raise CorruptIndex(f"{self.path}: short read of {len(data)} of {size} bytes")
        self._buf = bytearray(data)
        self._synced = self._entries

    def _write_pending(self, fd: int) -> None:
        """Write the entries not yet in the file and cut anything stale after them.

        A full disk is not an error here: the file keeps a valid prefix of the entries (only
        hints: a lookup past them scans forward in the log) and the rest stays buffered for
        the next flush, so a full disk costs index entries, never the log's data or service.
        """
        assert self._buf is not None
        if self._synced < self._entries:
            start = self._synced * self.entry_size
            written = 0
            with memoryview(self._buf) as view:
                pending = view[start : self.size_bytes]
                try:
                    while written < len(pending):
                        written += os.pwrite(fd, pending[written:], start + written)
                except OSError as e:
                    if e.errno not in _DISK_FULL:
                        raise
                    whole = (start + written) // self.entry_size
                    self._file_size = max(self._file_size, start + written)
                    if (start + written) % self.entry_size:
                        os.ftruncate(fd, whole * self.entry_size)  # no partial entry
                        self._file_size = whole * self.entry_size
                    self._synced = whole
                    log.warning("%(path)s: disk full, %(entries)d index entries not written yet",
                                {"path": self.path, "entries": self._entries - whole})
                    return
            self._synced = self._entries
            self._file_size = max(self._file_size, self.size_bytes)
        if self._file_size > self.size_bytes:
            os.ftruncate(fd, self.size_bytes)
            self._file_size = self.size_bytes

    def sync_to_file(self) -> None:
        """Write buffered entries to the file (no fsync)."""
        if self._buf is None or (self._synced == self._entries and self._file_size == self.size_bytes):
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            self._write_pending(fd)
        finally:
            os.close(fd)

    def release(self) -> None:
        """Drop the buffer without touching the file (its log dir failed)."""
        self._buf = None

    def trim(self) -> None:
        """Write the entries, cut the file to them and drop the buffer (segment became inactive)."""
        if self._buf is not None:
            self.sync_to_file()
            self._buf = None
        elif self.path.exists() and self.path.stat().st_size != self.size_bytes:
            os.truncate(self.path, self.size_bytes)

    def close(self) -> None:
        self.trim()

    def delete(self) -> None:
        """Drop the buffer and remove the file (segment deleted)."""
        self._buf = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def dup_fd(self) -> int | None:
        """A descriptor of the file, with every entry written, for fsync from another thread
        (caller closes it)."""
        if self._buf is not None:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                self._write_pending(fd)
            except BaseException:
                os.close(fd)
                raise
            return fd
        try:
            return os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self._truncate_entries(0)

    def rename(self, path: Path) -> None:
        os.replace(self.path, path)
        self.path = path

    # -- entry access --------------------------------------------------------------------------

    def _raw_entry(self, i: int, fd: int | None = None) -> tuple[int, int]:
        if self._buf is not None and fd is None:
            a, b = self._struct.unpack_from(self._buf, i * self.entry_size)
            return int(a), int(b)
        assert fd is not None
        data = os.pread(fd, self.entry_size, i * self.entry_size)
        if len(data) != self.entry_size:
            raise CorruptIndex(f"{self.path}: short read of entry {i}")
        a, b = self._struct.unpack(data)
        return int(a), int(b)

    def _with_reader(self, fn: Callable[[Callable[[int], tuple[int, int]]], int]) -> int:
        """Run ``fn(read_entry)`` against the buffer or a short-lived read-only descriptor."""
        if self._buf is not None:
            return fn(self._raw_entry)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return -1
        try:
            return fn(lambda i: self._raw_entry(i, fd))
        finally:
            os.close(fd)

    def _write_entry(self, i: int, a: int, b: int) -> None:
        if i >= self.max_entries:
            raise IndexFullError(f"{self.path} is full ({self.max_entries} entries)")
        buf = self._buf
        assert buf is not None, "index is not writable"
        if i * self.entry_size == len(buf):
            buf += self._struct.pack(a, b)
        else:
            self._struct.pack_into(buf, i * self.entry_size, a, b)
            self._synced = min(self._synced, i)

    def _truncate_entries(self, n: int) -> None:
        if n >= self._entries:
            return
        if self._buf is not None:
            del self._buf[n * self.entry_size :]
            self._synced = min(self._synced, n)
            if self._file_size > n * self.entry_size:
                # Stale entries past the cut must not outlive it on disk (truncations are rare).
                os.truncate(self.path, n * self.entry_size)
                self._file_size = n * self.entry_size
        elif self.path.exists():
            os.truncate(self.path, n * self.entry_size)
        self._entries = n

    def _count_valid_entries(self, length: int) -> int:
        """Number of real entries in a possibly preallocated (zero-padded) file.

        Valid entries form a prefix and all-zero slots a suffix, so this is a binary search.
        """
        n = length // self.entry_size

        def search(read: Callable[[int], tuple[int, int]]) -> int:
            lo, hi = self._first_candidate(read, n), n
            while lo < hi:
                mid = (lo + hi) // 2
                if read(mid) == (0, 0):
                    hi = mid
                else:
                    lo = mid + 1
            return lo

        fd = os.open(self.path, os.O_RDONLY)
        try:
            return search(lambda i: self._raw_entry(i, fd))
        finally:
            os.close(fd)

    def _first_candidate(self, read: Callable[[int], tuple[int, int]], n: int) -> int:
        return 0

    def _bisect_last_le(self, key_of: Callable[[tuple[int, int]], int], target: int) -> int:
        """Index of the last entry whose key <= target, or -1."""

        def search(read: Callable[[int], tuple[int, int]]) -> int:
            lo, hi = 0, self._entries
            while lo < hi:
                mid = (lo + hi) // 2
                if key_of(read(mid)) <= target:
                    lo = mid + 1
                else:
                    hi = mid
            return lo - 1

        if self._entries == 0:
            return -1
        return self._with_reader(search)

    def _entry(self, i: int) -> tuple[int, int]:
        holder: list[tuple[int, int]] = []

        def get(read: Callable[[int], tuple[int, int]]) -> int:
            holder.append(read(i))
            return 0

        if self._with_reader(get) < 0:
            raise CorruptIndex(f"{self.path} is missing")
        return holder[0]


class OffsetIndex(_IndexFile):
    """Maps offsets to file positions (sparse, one entry per ``index.interval.bytes``)."""

    entry_size = 8
    _struct = struct.Struct(">II")

    def __init__(self, path: Path, base_offset: int, max_index_size: int, *, writable: bool) -> None:
        super().__init__(path, base_offset, max_index_size, writable=writable)
        self._last_offset = self._read_last_offset()

    def _read_last_offset(self) -> int:
        if self._entries == 0:
            return self.base_offset
        return self.base_offset + self._entry(self._entries - 1)[0]

    @property
    def last_offset(self) -> int:
        """Offset of the last entry (the base offset when empty)."""
        return self._last_offset

    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, (base_offset, 0) when empty."""
        if self._entries == 0:
            return self.base_offset, 0
        rel, pos = self._entry(self._entries - 1)
        return self.base_offset + rel, pos

    def append(self, offset: int, position: int) -> None:
        """Add an entry; offsets and positions must be strictly increasing."""
        rel = offset - self.base_offset
        if not 0 <= rel <= _MAX_RELATIVE:
            raise ValueError(f"offset {offset} is out of range for index base {self.base_offset}")
        if position <= 0:
            raise ValueError("position 0 is implicit and never indexed")
        if self._entries and offset <= self._last_offset:
            raise ValueError(f"index offsets must increase: {offset} after {self._last_offset}")
        self._write_entry(self._entries, rel, position)
        self._entries += 1
        self._last_offset = offset

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry with offset <= target, else (base_offset, 0)."""
        rel_target = target_offset - self.base_offset
        if rel_target < 0 or self._entries == 0:
            return self.base_offset, 0
        i = self._bisect_last_le(lambda e: e[0], min(rel_target, _MAX_RELATIVE))
        if i < 0:
            return self.base_offset, 0
        rel, pos = self._entry(i)
        return self.base_offset + rel, pos

    def lookup_position(self, position: int) -> int:
        """Position of the last entry at or below ``position`` (0 when none): a batch boundary from which
        a fetch walks to the last whole batch that fits its byte limit."""
        if self._entries == 0:
            return 0
        i = self._bisect_last_le(lambda e: e[1], position)
        return self._entry(i)[1] if i >= 0 else 0

    def truncate_to(self, offset: int) -> None:
        """Remove entries with offset >= ``offset``."""
        i = self._bisect_last_le(lambda e: e[0], offset - self.base_offset - 1) if offset > self.base_offset else -1
        self._truncate_entries(i + 1)
        self._last_offset = self._read_last_offset()

    def sanity_check(self, log_size: int) -> None:
        """Kafka-style cheap check of the last entry; raises :class:`CorruptIndex`."""
        if self.path.exists() and self._buf is None and self.path.stat().st_size % self.entry_size:
            raise CorruptIndex(f"{self.path} has a partial entry")
        if self._entries:
            _, pos = self.last_entry()
            if pos >= log_size:
                raise CorruptIndex(f"{self.path}: last entry position {pos} >= log size {log_size}")

    def reset(self) -> None:
        super().reset()
        self._last_offset = self.base_offset


class TimeIndex(_IndexFile):
    """Maps timestamps to offsets; timestamps strictly increase across entries."""

    entry_size = 12
    _struct = struct.Struct(">qI")

    def __init__(self, path: Path, base_offset: int, max_index_size: int, *, writable: bool) -> None:
        super().__init__(path, base_offset, max_index_size, writable=writable)
        self._last = self._read_last()

    def _first_candidate(self, read: Callable[[int], tuple[int, int]], n: int) -> int:
        # Entry 0 may legitimately be (timestamp 0, relative offset 0); later entries must
        # have larger timestamps, so only they can be told apart from zero padding.
        if n == 0:
            return 0
        if read(0) == (0, 0):
            return 0 if n == 1 or read(1) == (0, 0) else 1
        return 1

    def _read_last(self) -> tuple[int, int]:
        if self._entries == 0:
            return -1, self.base_offset
        ts, rel = self._entry(self._entries - 1)
        return ts, self.base_offset + rel

    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, (-1, base_offset) when empty."""
        return self._last

    @property
    def is_full(self) -> bool:
        # Keep one slot free for the final entry written when the segment is rolled.
        return self._entries >= self.max_entries - 1

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> None:
        """Append if ``timestamp`` is larger than the last entry's (as Kafka's TimeIndex)."""
        if timestamp <= self._last[0]:
            return
        rel = offset - self.base_offset
        if not 0 <= rel <= _MAX_RELATIVE:
            raise ValueError(f"offset {offset} is out of range for index base {self.base_offset}")
        if offset < self._last[1]:
            raise ValueError(f"time index offsets must not decrease: {offset} after {self._last[1]}")
        if not skip_full_check and self.is_full:
            raise IndexFullError(f"{self.path} is full")
        self._write_entry(self._entries, timestamp, rel)
        self._entries += 1
        self._last = (timestamp, offset)

    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the last entry with timestamp <= target, else (-1, base_offset)."""
        i = self._bisect_last_le(lambda e: e[0], target_timestamp)
        if i < 0:
            return -1, self.base_offset
        ts, rel = self._entry(i)
        return ts, self.base_offset + rel

    def truncate_to(self, offset: int) -> None:
        """Remove entries with offset >= ``offset``."""
        i = self._bisect_last_le(lambda e: e[1], offset - self.base_offset - 1) if offset > self.base_offset else -1
        self._truncate_entries(i + 1)
        self._last = self._read_last()

    def sanity_check(self, next_segment_offset: int | None) -> None:
        if self.path.exists() and self._buf is None and self.path.stat().st_size % self.entry_size:
            raise CorruptIndex(f"{self.path} has a partial entry")
        if self._entries:
            _, off = self._last
            if next_segment_offset is not None and off >= next_segment_offset:
                raise CorruptIndex(f"{self.path}: last entry offset {off} is beyond the segment")

    def reset(self) -> None:
        super().reset()
        self._last = (-1, self.base_offset)
