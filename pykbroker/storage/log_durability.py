"""How a log's appends become durable: flush.messages/flush.ms and the full flush (every file and the
directory, which moves the recovery point), the data sync an acknowledgement under log.flush.on.ack waits for
(:meth:`LogDurability.flush_to`, shared between waiters), and that same sync handed to a syncer outside Python
(:mod:`~pykbroker.storage.log_flush`).

:class:`LogDurability` is the part of :class:`~pykbroker.storage.log.Log` that does this; the state it reads
and moves (offsets, segments, the lock) is the log's own, set up by the log.
"""

from __future__ import annotations

import abc
import bisect
import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from pykbroker.storage.errors import KafkaStorageError, on_disk
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_flush import DataFlush, fsync_dir, sync_data_flush
from pykbroker.storage.producer_snapshots import ProducerSnapshots
from pykbroker.storage.segment import Segment


class LogDurability(abc.ABC):
    """Flushing and durable offsets of one log (a part of :class:`~pykbroker.storage.log.Log`)."""

    dir: Path
    config: LogConfig
    offline: bool
    recovery_point: int
    log_end_offset: int
    _segments: list[Segment]
    _bases: list[int]
    _lock: threading.RLock
    _flush_lock: threading.Lock
    # Offsets below this are on disk (fdatasync'd) though maybe not yet indexed durably: what an
    # acknowledgement under log.flush.on.ack needs. The recovery point, below which recovery
    # skips a segment altogether, only moves with a full flush.
    _durable_offset: int
    _truncations: int  # bumped by every truncation: a data sync begun before one covers nothing after
    _unflushed_messages: int
    _last_flush_ms: int
    _dir_dirty: bool
    _closed: bool
    _snapshots: ProducerSnapshots
    _now_ms: Callable[[], int]

    @property
    def closed(self) -> bool:
        return self._closed

    @abc.abstractmethod
    def storage_failure(self, exc: BaseException, what: str) -> KafkaStorageError:
        """Record a failed disk operation (the log goes offline); the error to raise."""

    def needs_flush(self, now_ms: int) -> bool:
        """Whether flush.messages / flush.ms say so, or rolled segments are not yet durable."""
        with self._lock:
            if self._closed or self.offline:
                return False
            if self.recovery_point < self._segments[-1].base_offset:
                return True
            if self._unflushed_messages == 0:
                return False
            return (
                self._unflushed_messages >= self.config.flush_messages
                or now_ms - self._last_flush_ms >= self.config.flush_ms
            )

    @on_disk("flushing")
    def flush(self) -> None:
        """fsync everything appended so far and advance the recovery point. Thread-safe."""
        with self._flush_lock:
            with self._lock:
                if self.offline:
                    raise KafkaStorageError(f"the log dir of {self.dir.name} is offline")
                if self._closed:
                    return
                target = self.log_end_offset
                flushed_messages = self._unflushed_messages
                dir_dirty = self._dir_dirty
                self._dir_dirty = False
                i = max(0, bisect.bisect_right(self._bases, self.recovery_point) - 1)
                fds: list[int] = []
                for segment in self._segments[i:]:
                    fds.extend(segment.dup_fds())
                for path in self._snapshots.unsynced:
                    with contextlib.suppress(FileNotFoundError):
                        fds.append(os.open(path, os.O_RDONLY))
                self._snapshots.unsynced.clear()
            try:
                for fd in fds:
                    os.fsync(fd)
                if dir_dirty:
                    fsync_dir(self.dir)
            finally:
                for fd in fds:
                    os.close(fd)
            with self._lock:
                self.recovery_point = max(self.recovery_point, min(target, self.log_end_offset))
                self._durable_offset = max(self._durable_offset, self.recovery_point)
                self._unflushed_messages = max(0, self._unflushed_messages - flushed_messages)
                self._last_flush_ms = self._now_ms()

    def flush_to(self, offset: int) -> None:
        """Make the data below ``offset`` durable, sharing syncs between waiters (group commit).

        Producers that appended while another flush was running wait for it to end; if that
        flush already covered their data they return without a sync of their own.  Only the
        segment data is synced (one fdatasync, plus the directory after a roll): the indexes
        follow with the next full flush, and recovery rebuilds them past the recovery point, so
        an acknowledgement does not wait for three more syncs (under CPU contention each one
        can take tens of milliseconds, which queued acknowledgements for seconds).
        """
        if self._durable_offset >= offset:
            return
        with self._flush_lock:  # wait out a flush in progress
            pass
        if self._durable_offset >= offset:
            return
        self._flush_data()

    @on_disk("flushing")
    def _flush_data(self) -> None:
        """The data sync of :meth:`begin_data_flush` run here, in the calling thread."""
        with self._flush_lock:
            flush = self.begin_data_flush(self.log_end_offset)
            if flush is None:
                return
            try:
                error = sync_data_flush(flush)
            except BaseException:  # not an OSError (those are reported): the directory stays to be synced
                if flush.dir_dirty:
                    with self._lock:
                        self._dir_dirty = True
                raise
            self.end_data_flush(flush, error)

    # -- the same data sync, split for a syncer outside Python (replica/group_commit.py) -----------------

    @on_disk("flushing")
    def begin_data_flush(self, offset: int) -> DataFlush | None:
        """What :meth:`flush_to` would sync, as duplicated descriptors the caller hands to a syncer that
        fdatasyncs (the directory: fsyncs) and closes them, then reports to :meth:`end_data_flush`.
        None when the data below ``offset`` is already durable or the log is closed.  Runs on the event
        loop: only the descriptors are duplicated here, nothing waits for the disk."""
        with self._lock:
            if self.offline:
                raise KafkaStorageError(f"the log dir of {self.dir.name} is offline")
            if self._closed or self._durable_offset >= offset:
                return None
            target = self.log_end_offset
            i = max(0, bisect.bisect_right(self._bases, self._durable_offset) - 1)
            fds: list[int] = []
            dir_fd = -1
            try:
                for segment in self._segments[i:]:
                    fd = segment.dup_data_fd()
                    if fd is not None:
                        fds.append(fd)
                if self._dir_dirty:
                    dir_fd = os.open(self.dir, os.O_RDONLY)
            except BaseException:
                for fd in fds:
                    os.close(fd)
                raise
            dir_dirty = self._dir_dirty
            self._dir_dirty = False
            return DataFlush(target, tuple(fds), dir_fd, dir_dirty, self._truncations)

    def abandon_data_flush(self, flush: DataFlush) -> None:
        """``flush`` will not be synced after all: close its descriptors; the directory stays to be synced."""
        for fd in (*flush.fds, flush.dir_fd):
            if fd >= 0:
                os.close(fd)
        if flush.dir_dirty:
            with self._lock:
                self._dir_dirty = True

    def end_data_flush(self, flush: DataFlush, error: int) -> None:
        """The syncer's report for ``flush``: advance the durable offset, or (``error``: an errno) take
        the log dir offline and raise KafkaStorageError, as a failed :meth:`flush_to` does."""
        if error:
            with self._lock:
                if flush.dir_dirty:
                    self._dir_dirty = True
            exc = OSError(error, os.strerror(error))
            if self._closed and not self.offline:
                raise RuntimeError(f"log {self.dir} is closed") from exc
            raise self.storage_failure(exc, "flushing") from exc
        with self._lock:
            if flush.truncations == self._truncations:  # else the bytes it synced may be gone
                self._durable_offset = max(self._durable_offset, min(flush.target, self.log_end_offset))
