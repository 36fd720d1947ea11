"""One log segment: a ``.log`` file of record batches plus its offset and time indexes.

Batches are stored exactly as received (after offset assignment); the segment only ever
looks at 61-byte batch headers.  All I/O is positional (``os.pread``/``os.pwrite``) on a
descriptor held for the segment's lifetime, so readers never disturb the append position.
Not thread-safe by itself: :class:`~pykbroker.storage.log.Log` serialises access.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pykbroker.protocol.file_range import FileRange, SegmentFile
from pykbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    NO_TIMESTAMP,
    BatchHeader,
    InvalidRecords,
    Record,
    batch_crc,
    decode_records,
    iter_batches,
    parse_batch_header,
)
from pykbroker.storage.index import CorruptIndex, OffsetIndex, TimeIndex
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.txn_index import TransactionIndex

__all__ = [
    "INDEX_SUFFIX",
    "LOG_SUFFIX",
    "TIME_INDEX_SUFFIX",
    "TXN_INDEX_SUFFIX",
    "Segment",
    "SegmentRead",
    "SegmentSlice",
    "filename_prefix",
    "floor_index",
    "parse_base_offset",
]

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
MAX_RELATIVE_OFFSET = 2**31 - 1  # Kafka keeps relative offsets within a signed int
_SCAN_CHUNK = 16 * 1024
_HEADER_READ = 4 * 1024  # the first read looking for a fetch's first batch, when the data will not be read
# A fetch's range at least this long stays in the file (sent with sendfile); a shorter one is read
# into memory, where one pread costs less than the separate writes a file range needs.
FILE_RANGE_MIN_BYTES = 16 * 1024


def filename_prefix(offset: int) -> str:
    """Kafka's 20-digit zero-padded segment file name stem."""
    return f"{offset:020d}"


def parse_base_offset(name: str) -> int | None:
    """Base offset from a segment file name like ``00000000000000000042.log``."""
    stem = name.split(".", 1)[0]
    if len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


def floor_index(segments: list[Segment], offset: int) -> int:
    """Index of the segment containing ``offset`` (0 if it precedes all)."""
    return max(0, bisect.bisect_right([s.base_offset for s in segments], offset) - 1)


@dataclass(slots=True)
class SegmentRead:
    """Whole batches read from one segment."""

    records: bytes
    first_offset: int  # base offset of the first batch returned (requested offset when empty)
    next_offset: int  # offset after the last batch returned (requested offset when empty)
    first_batch_too_large: bool = False


@dataclass(slots=True)
class SegmentSlice:
    """Whole batches from one segment for a fetch: bytes, or a range of the file when long."""

    records: bytes | FileRange
    first_offset: int  # base offset of the first batch (requested offset when empty)
    next_offset: int  # offset after the last batch; may overshoot across a compaction gap (an upper bound)
    first_batch_too_large: bool = False


class Segment:
    """A ``.log`` file plus sparse ``.index``/``.timeindex`` for offsets >= ``base_offset``."""

    def __init__(self, dir: Path, base_offset: int, config: LogConfig, *, active: bool, now_ms: int) -> None:
        self.dir = dir
        self.base_offset = base_offset
        self.config = config
        self.log_path = dir / (filename_prefix(base_offset) + LOG_SUFFIX)
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        # Owns the descriptor: fetch responses' file ranges share it, and it closes when the last goes.
        self._file: SegmentFile | None = SegmentFile(self._fd, self.log_path.name)
        try:
            self.size = os.fstat(self._fd).st_size
            self._size_at_open = self.size  # before we preallocate anything
            self.offset_index = OffsetIndex(
                dir / (filename_prefix(base_offset) + INDEX_SUFFIX),
                base_offset,
                config.segment_index_bytes,
                writable=active,
            )
            self.time_index = TimeIndex(
                dir / (filename_prefix(base_offset) + TIME_INDEX_SUFFIX),
                base_offset,
                config.segment_index_bytes,
                writable=active,
            )
            self.txn_index = TransactionIndex(dir / (filename_prefix(base_offset) + TXN_INDEX_SUFFIX), base_offset)
        except BaseException:
            self._drop_file()
            raise
        self.active = active
        self.created_ms = now_ms
        self.roll_jitter_ms = random.randrange(config.segment_jitter_ms) if config.segment_jitter_ms > 0 else 0
        self.bytes_since_last_index_entry = 0
        # Largest timestamp in the segment and the base offset of the batch holding it.
        self.max_timestamp, self.offset_of_max_timestamp = self.time_index.last_entry()
        self._rolling_based_timestamp: int | None = None
        self._preallocated = False
        # The batch header the last fetch read started at, by fetch offset: a consumer with many
        # partitions asks again from the same offset for every partition its last response had no
        # room for, and this answers those without reading the file.  Batches never move in a
        # segment except by a cut (truncation, recovery), which forgets it.
        self._probe: tuple[int, BatchHeader] | None = None
        # The first batch of the last append through Log.append (segment position set), so that a consumer
        # at the tail, fetching from that batch's offset, finds it with no index search and no header read.
        self._tail: BatchHeader | None = None
        if active:
            self._maybe_preallocate()

    # -- naming / stats ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.log_path.name

    def __repr__(self) -> str:
        return f"Segment({self.log_path}, size={self.size})"

    @property
    def largest_timestamp(self) -> int:
        """Max record timestamp, or the file's mtime when no batch carries one (as Kafka)."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return int(os.stat(self.log_path).st_mtime * 1000)

    # -- lifecycle -------------------------------------------------------------------------------

    def _maybe_preallocate(self) -> None:
        if self.config.preallocate and self.size < self.config.segment_bytes:
            try:
                os.posix_fallocate(self._fd, 0, self.config.segment_bytes)
                self._preallocated = True
            except OSError:  # filesystem without fallocate support: just don't
                self._preallocated = False

    def make_active(self) -> None:
        """Prepare an existing segment to receive appends (indexes mapped and preallocated)."""
        self.offset_index.make_writable()
        self.time_index.make_writable()
        self.active = True
        self._maybe_preallocate()

    def on_become_inactive(self) -> None:
        """Seal the segment on roll: record its max timestamp and trim preallocated files."""
        if not self.active:
            return
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
        self.offset_index.trim()
        self.time_index.trim()
        if self._preallocated:
            os.ftruncate(self._fd, self.size)
            self._preallocated = False
        self.active = False

    def close(self) -> None:
        self.on_become_inactive()
        self.offset_index.close()
        self.time_index.close()
        self._drop_file()

    def _drop_file(self) -> None:
        """Let go of the descriptor: closed now, or once the last fetch response using it is sent."""
        self._file = None
        self._fd = -1

    def release(self) -> None:
        """Close every descriptor and mapping without writing anything (the log dir failed)."""
        self.offset_index.release()
        self.time_index.release()
        self._drop_file()
        self.active = False

    def delete(self) -> None:
        """Close and unlink all files (log first, so a crash leaves only orphan indexes)."""
        self._drop_file()
        with contextlib.suppress(FileNotFoundError):
            self.log_path.unlink()
        self.offset_index.delete()
        self.time_index.delete()
        self.txn_index.delete()
        self.active = False

    def dup_data_fd(self) -> int | None:
        """A duplicate descriptor of the .log file, for a data-only sync from another thread."""
        return os.dup(self._fd) if self._fd >= 0 else None

    def dup_fds(self) -> list[int]:
        """Duplicate descriptors of all files so another thread can fsync them lock-free."""
        fds = [os.dup(self._fd)] if self._fd >= 0 else []
        for index in (self.offset_index, self.time_index):
            fd = index.dup_fd()
            if fd is not None:
                fds.append(fd)
        fd = self.txn_index.dup_fd()
        if fd is not None:
            fds.append(fd)
        return fds

    # -- appends ---------------------------------------------------------------------------------

    def rolling_based_timestamp(self) -> int:
        """Max timestamp of the first batch (Kafka bases time rolling on it), -1 if none."""
        if self._rolling_based_timestamp is None:
            if self.size >= BATCH_HEADER_SIZE:
                try:
                    header = parse_batch_header(os.pread(self._fd, BATCH_HEADER_SIZE, 0), 0)
                    self._rolling_based_timestamp = header.max_timestamp
                except InvalidRecords:
                    self._rolling_based_timestamp = NO_TIMESTAMP
            else:
                return NO_TIMESTAMP
        return self._rolling_based_timestamp

    def should_roll(self, *, messages_size: int, max_timestamp: int, max_offset: int, now_ms: int) -> bool:
        """Kafka's LogSegment.shouldRoll: size, time, full index or relative-offset overflow."""
        if self.size == 0:
            return False
        first_ts = self.rolling_based_timestamp()
        waited = max_timestamp - first_ts if first_ts >= 0 else now_ms - self.created_ms
        return (
            self.size > self.config.segment_bytes - messages_size
            or waited > self.config.segment_ms - self.roll_jitter_ms
            or self.offset_index.is_full
            or self.time_index.is_full
            or not 0 <= max_offset - self.base_offset <= MAX_RELATIVE_OFFSET
        )

    def append(
        self,
        data: bytes | bytearray | memoryview,
        *,
        last_offset: int,
        max_timestamp: int,
        offset_of_max_timestamp: int,
        first_header: BatchHeader | None = None,
    ) -> None:
        """Write one append's batches at the end and maintain the sparse indexes.

        All or nothing: on an OSError (ENOSPC, EIO) the bytes already written are cut off
        again and :attr:`size` is unchanged, so nothing unacknowledged stays readable.
        ``first_header``: the header of ``data``'s first batch, as written, kept for tail fetches.
        """
        position = self.size
        with memoryview(data) as view:
            written = 0
            total = len(view)
            try:
                while written < total:
                    written += os.pwrite(self._fd, view[written:], position + written)
            except OSError:
                if written and not self._preallocated:
                    with contextlib.suppress(OSError):
                        os.ftruncate(self._fd, position)
                raise
        if position == 0:
            self._rolling_based_timestamp = max_timestamp
        self.size = position + total
        if first_header is not None:
            first_header.position = position
        self._tail = first_header
        self._track(position, total, last_offset, max_timestamp, offset_of_max_timestamp)

    def _track(
        self, position: int, size: int, last_offset: int, max_timestamp: int, offset_of_max_timestamp: int
    ) -> None:
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = offset_of_max_timestamp
        # Same rule as Kafka: an entry for this append's start once more than
        # index.interval.bytes were written since the last one (position 0 is implicit).
        # A full index (possible only when rebuilding with a smaller segment.index.bytes)
        # just stops gaining entries: they are hints.
        if (
            self.bytes_since_last_index_entry > self.config.index_interval_bytes
            and not self.offset_index.is_full
            and not self.time_index.is_full
        ):
            self.offset_index.append(last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += size

    # -- scanning --------------------------------------------------------------------------------

    def scan(self, start: int = 0, end: int | None = None, *, verify_crc: bool = False) -> Iterator[BatchHeader]:
        """Headers of the whole batches in [start, end), read in chunks.

        Stops silently at an incomplete batch and raises :class:`InvalidRecords` on a bad one.
        """
        limit = self.size if end is None else end
        pos = start
        buf = b""
        buf_start = start
        while limit - pos >= BATCH_HEADER_SIZE:
            rel = pos - buf_start
            if len(buf) - rel < BATCH_HEADER_SIZE:
                buf = os.pread(self._fd, max(_SCAN_CHUNK, BATCH_HEADER_SIZE), pos)
                buf_start, rel = pos, 0
                if len(buf) < BATCH_HEADER_SIZE:
                    return
            header = parse_batch_header(buf, rel)
            header.position = pos
            if pos + header.size > limit:
                return
            if verify_crc:
                if rel + header.size <= len(buf):
                    actual = batch_crc(buf, rel, header.size)
                else:
                    data = os.pread(self._fd, header.size, pos)
                    if len(data) < header.size:
                        return
                    actual = batch_crc(data, 0, header.size)
                if actual != header.crc:
                    raise InvalidRecords(2, f"{self.log_path}: corrupt batch at position {pos}")
            yield header
            pos += header.size

    def translate_offset(self, offset: int) -> BatchHeader | None:
        """Header of the first batch whose last offset >= ``offset`` (None: past the end)."""
        _, position = self.offset_index.lookup(offset)
        for header in self.scan(position):
            if header.last_offset >= offset:
                return header
        return None

    def read_next_offset(self) -> int:
        """Offset after the last batch, found by scanning from the last index entry."""
        return self.read_end()[0]

    def read_end(self) -> tuple[int, int]:
        """(next offset, end position of the last whole batch), scanning from the last index entry.

        An end position short of :attr:`size` means a torn or corrupt tail.
        """
        offset, position = self.offset_index.last_entry()
        next_offset = self.base_offset if position == 0 else offset + 1
        end = position
        try:
            for header in self.scan(position):
                next_offset = header.next_offset
                end = header.position + header.size
        except InvalidRecords:
            pass
        return next_offset, end

    def read_batch(self, header: BatchHeader) -> bytes:
        return os.pread(self._fd, header.size, header.position)

    # -- reads -----------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None, min_one_message: bool) -> SegmentRead | None:
        """Whole batches from the one containing ``offset``; None if it is past this segment."""
        header = self.translate_offset(offset)
        if header is None:
            return None
        if max_offset is not None and header.base_offset >= max_offset:
            return SegmentRead(b"", offset, offset)
        budget = max(max_bytes, header.size) if min_one_message else max_bytes
        if header.size > budget:
            return SegmentRead(b"", offset, offset, first_batch_too_large=True)
        data = os.pread(self._fd, min(budget, self.size - header.position), header.position)
        end = 0
        next_offset = header.base_offset
        for h in iter_batches(data):
            if max_offset is not None and h.base_offset >= max_offset:
                break
            end = h.position + h.size
            next_offset = h.next_offset
        records = data if end == len(data) else data[:end]
        return SegmentRead(records, header.base_offset, next_offset)

    def read_slice(self, offset: int, max_bytes: int, *, max_offset: int | None, min_one_message: bool,
                   end_offset: int) -> SegmentSlice | None:
        """What :meth:`read` returns, without reading a long range: it becomes a :class:`FileRange`.

        Only batch headers are read: the one holding ``offset``, and near the end of the range
        the ones that decide where the last whole batch ends (the offset index narrows both
        searches).  ``end_offset`` is where this segment's offsets end (the next segment's base,
        or the log end offset), so a high watermark past it needs no search.  None: ``offset``
        is past this segment.
        """
        walker = _HeaderWalker(self._fd, self.size)
        probe = self._probe
        tail = self._tail
        if probe is not None and probe[0] == offset:
            first = probe[1]
        elif tail is not None and tail.base_offset <= offset <= tail.base_offset + tail.last_offset_delta:
            first = tail  # a consumer at the tail: the batch just appended holds its offset
        else:
            _, position = self.offset_index.lookup(offset)
            if self.size - position > FILE_RANGE_MIN_BYTES:
                # The range will most likely stay in the file: read headers, not a chunk of data
                # (a consumer of 10,000 partitions would otherwise copy 160 MB per fetch for them).
                walker.next_read = _HEADER_READ
            found = walker.find(position, lambda h: h.last_offset >= offset)
            if found is None:
                return None
            first = found
            self._probe = (offset, first)
        if max_offset is not None and first.base_offset >= max_offset:
            return SegmentSlice(b"", offset, offset)
        budget = max(max_bytes, first.size) if min_one_message else max_bytes
        if first.size > budget:
            return SegmentSlice(b"", offset, offset, first_batch_too_large=True)
        start = first.position
        limit = min(start + budget, self.size)
        hw_inside = max_offset is not None and max_offset < end_offset
        if limit == self.size and not hw_inside:
            end, next_offset = limit, end_offset
        else:
            # Resume the walk at the last index entry below both limits (a batch boundary).
            resume = start
            if limit < self.size:
                resume = max(resume, self.offset_index.lookup_position(limit))
            if hw_inside:
                assert max_offset is not None
                resume = min(resume, max(start, self.offset_index.lookup(max_offset - 1)[1]))
            end, next_offset = walker.whole_batches_end(resume, limit, max_offset if hw_inside else None, end_offset)
        length = end - start
        if walker.holds(start, end):
            records: bytes | FileRange = walker.slice(start, end)
        elif length < FILE_RANGE_MIN_BYTES or self._file is None:
            records = os.pread(self._fd, length, start)
        else:
            records = FileRange(self._file, start, length)
        return SegmentSlice(records, first.base_offset, next_offset)

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record with timestamp >= target and offset >= start."""
        _, ts_offset = self.time_index.lookup(timestamp)
        _, position = self.offset_index.lookup(max(ts_offset, starting_offset))
        for header in self.scan(position):
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                for record in self._decode(header):
                    if record.timestamp >= timestamp and record.offset >= starting_offset:
                        return record.timestamp, record.offset
                # Undecodable batch or inconsistent header: answer at batch granularity.
                return header.max_timestamp, max(header.base_offset, starting_offset)
        return None

    def offset_of_max_timestamp_record(self) -> tuple[int, int] | None:
        """(max timestamp, offset of the first record carrying it) in this segment."""
        if self.max_timestamp < 0:
            return None
        header = self.translate_offset(self.offset_of_max_timestamp)
        if header is None:
            return None
        for record in self._decode(header):
            if record.timestamp == header.max_timestamp:
                return header.max_timestamp, record.offset
        return header.max_timestamp, header.base_offset

    def _decode(self, header: BatchHeader) -> list[Record]:
        try:
            return decode_records(self.read_batch(header))
        except InvalidRecords:
            return []

    # -- recovery / truncation -----------------------------------------------------------------

    def recover(self, *, verify_crc: bool = True) -> tuple[int, int]:
        """Rebuild both indexes from the log, truncating an invalid or torn tail.

        Returns (bytes truncated, next offset).  Batches must have monotonically increasing
        offsets within this segment's relative-offset range.
        """
        self._probe = None
        self._tail = None
        was_active = self.active
        if not was_active:
            self.offset_index.make_writable()
            self.time_index.make_writable()
        self.offset_index.reset()
        self.time_index.reset()
        self.max_timestamp, self.offset_of_max_timestamp = NO_TIMESTAMP, self.base_offset
        self.bytes_since_last_index_entry = 0
        self._rolling_based_timestamp = None
        file_size = os.fstat(self._fd).st_size
        if self._preallocated:
            # Our own preallocation is not data; earlier ones (a crash) are treated as torn.
            file_size = min(file_size, max(self._size_at_open, self.size))
        self.size = file_size
        valid_end = 0
        next_offset = self.base_offset
        try:
            for header in self.scan(0, file_size, verify_crc=verify_crc):
                if (
                    header.base_offset < next_offset
                    or header.last_offset_delta < 0
                    or header.last_offset - self.base_offset > MAX_RELATIVE_OFFSET
                ):
                    log.debug("%(log_path)s: out-of-order offsets at position %(position)d",
                              {"log_path": self.log_path, "position": header.position})
                    break
                self._track(header.position, header.size, header.last_offset, header.max_timestamp, header.base_offset)
                valid_end = header.position + header.size
                next_offset = header.next_offset
        except InvalidRecords as exc:
            log.debug("%(log_path)s: %(error)s", {"log_path": self.log_path, "error": exc})
        truncated = file_size - valid_end
        if truncated:
            self._cut(valid_end)
        self.size = valid_end
        self._preallocated = False
        if was_active:
            self._maybe_preallocate()
        else:
            if self.max_timestamp >= 0:
                self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True)
            self.offset_index.trim()
            self.time_index.trim()
        return truncated, next_offset

    def sanity_check(self, next_segment_offset: int | None) -> None:
        """Cheap consistency check of the indexes against the log; raises CorruptIndex."""
        if not self.offset_index.path.exists() or not self.time_index.path.exists():
            raise CorruptIndex(f"missing index for {self.log_path}")
        self.offset_index.sanity_check(self.size)
        self.time_index.sanity_check(next_segment_offset)

    def truncate_to(self, offset: int) -> int:
        """Drop the batch containing ``offset`` and everything after; returns bytes removed."""
        self.txn_index.truncate_to(offset)
        header = self.translate_offset(offset)
        if header is None:
            return 0
        removed = self.size - header.position
        self._cut(header.position)
        self.recover(verify_crc=False)
        return removed

    def _cut(self, position: int) -> None:
        """ftruncate, noted on the file so that fetch ranges it reaches are not sent."""
        self._probe = None
        self._tail = None
        if self._file is not None:
            self._file.truncated(position)
        os.ftruncate(self._fd, position)

    def fsync(self) -> None:
        os.fsync(self._fd)


class _HeaderWalker:
    """Batch headers of one segment, read through one chunk-sized buffer (a pread per chunk)."""

    __slots__ = ("_buf", "_buf_start", "_fd", "_size", "next_read")

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._size = size
        self._buf = b""
        self._buf_start = 0
        self.next_read = _SCAN_CHUNK  # bytes the next read takes (a scan's later reads take a whole chunk)

    def header_at(self, pos: int) -> BatchHeader | None:
        """The whole batch at ``pos``; None at the end of the data (or a torn tail)."""
        if self._size - pos < BATCH_HEADER_SIZE:
            return None
        rel = pos - self._buf_start
        if rel < 0 or len(self._buf) - rel < BATCH_HEADER_SIZE:
            self._buf = os.pread(self._fd, min(self.next_read, self._size - pos), pos)
            self.next_read = _SCAN_CHUNK
            self._buf_start, rel = pos, 0
            if len(self._buf) < BATCH_HEADER_SIZE:
                return None
        header = parse_batch_header(self._buf, rel)
        header.position = pos
        return None if pos + header.size > self._size else header

    def find(self, pos: int, stop: Callable[[BatchHeader], bool]) -> BatchHeader | None:
        """The first batch from ``pos`` on that ``stop`` accepts."""
        while True:
            header = self.header_at(pos)
            if header is None or stop(header):
                return header
            pos += header.size

    def whole_batches_end(self, pos: int, limit: int, max_offset: int | None, end_offset: int) -> tuple[int, int]:
        """(end position, next offset) of the whole batches from boundary ``pos`` that end by ``limit``
        and start below ``max_offset``; the next offset is the following batch's base, else ``end_offset``."""
        while True:
            header = self.header_at(pos)
            if header is None:
                return pos, end_offset
            if (max_offset is not None and header.base_offset >= max_offset) or pos + header.size > limit:
                return pos, header.base_offset
            pos += header.size

    def holds(self, start: int, end: int) -> bool:
        return self._buf_start <= start and end <= self._buf_start + len(self._buf)

    def slice(self, start: int, end: int) -> bytes:
        rel = start - self._buf_start
        buf = self._buf
        return buf if rel == 0 and end - start == len(buf) else buf[rel:rel + end - start]
