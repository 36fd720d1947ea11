"""Producer state kept across restarts: a log's ``<offset>.snapshot`` files and the replay after them.

A snapshot is written at each segment roll and clean close; opening (or truncating) a log
loads the newest readable one at or below the wanted offset and replays batch headers from
there, recording aborted transactions in the ``.txnindex`` of segments being rebuilt.  The
caller (:class:`~pykbroker.storage.log.Log`) holds the log's lock around every call.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from pykbroker.protocol.records import BatchHeader, InvalidRecords
from pykbroker.storage.log_flush import fsync_dir
from pykbroker.storage.producer_state import (
    CompletedTxn,
    EndTxnMarker,
    ProducerStateManager,
    parse_end_txn_marker,
)
from pykbroker.storage.segment import Segment, filename_prefix, floor_index, parse_base_offset
from pykbroker.storage.txn_index import AbortedTxn

__all__ = [
    "SNAPSHOTS_TO_KEEP",
    "SNAPSHOT_SUFFIX",
    "ProducerSnapshots",
    "index_completed_txn",
    "list_snapshots",
    "replay_producer_state",
]

log = logging.getLogger("pykbroker.storage.log")  # the partition log's lines, wherever its code lives

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOTS_TO_KEEP = 3  # newest producer snapshots kept (plus the one recovery would start from)


class ProducerSnapshots:
    """The producer snapshot files of one log directory, and which of them are not yet fsynced.

    ``on_dir_change`` is called whenever a file is added without a directory sync or removed: the
    log's next flush then syncs the directory.
    """

    def __init__(self, dir: Path, on_dir_change: Callable[[], None]) -> None:
        self.dir = dir
        self.offsets: list[int] = []  # offsets of the <offset>.snapshot files, ascending
        self.unsynced: set[Path] = set()
        self._on_dir_change = on_dir_change

    def path(self, offset: int) -> Path:
        return self.dir / (filename_prefix(offset) + SNAPSHOT_SUFFIX)

    def write(self, state: ProducerStateManager, offset: int, *, sync: bool, strict: bool) -> bool:
        """Write ``state`` as ``<offset>.snapshot`` (atomically); whether it was written.

        A failure is only logged (a missing snapshot costs a longer replay), unless ``strict``:
        at a roll it is a disk failure like any other and the OSError propagates."""
        path = self.path(offset)
        tmp = path.with_name(path.name + ".tmp")
        try:
            data = state.snapshot()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                with memoryview(data) as view:
                    written = 0
                    while written < len(view):
                        written += os.write(fd, view[written:])
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            if sync:
                fsync_dir(self.dir)
                self.unsynced.discard(path)
            else:
                self.unsynced.add(path)
                self._on_dir_change()
        except OSError as exc:
            log.warning("Could not write producer snapshot %(path)s: %(error)s", {"path": path, "error": exc})
            with contextlib.suppress(OSError):
                tmp.unlink()
            if strict:
                raise
            return False
        if offset not in self.offsets:
            bisect.insort(self.offsets, offset)
        return True

    def delete(self, offset: int) -> None:
        path = self.path(offset)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self.unsynced.discard(path)
        with contextlib.suppress(ValueError):
            self.offsets.remove(offset)
        self._on_dir_change()

    def prune(self, *, recovery_base: int, log_start_offset: int) -> None:
        """Keep the newest few snapshots and the one recovery would start from (at or below
        ``recovery_base``); drop those below the log start offset (but never the newest)."""
        snapshots = self.offsets
        if len(snapshots) <= 1:
            return
        keep = set(snapshots[-SNAPSHOTS_TO_KEEP:])
        i = bisect.bisect_right(snapshots, recovery_base)
        if i:
            keep.add(snapshots[i - 1])
        newest = snapshots[-1]
        for offset in list(snapshots):
            if offset == newest or (offset in keep and offset >= log_start_offset):
                continue
            self.delete(offset)

    def load_newest(self, max_offset: int) -> tuple[ProducerStateManager, int] | None:
        """The newest readable snapshot at or below ``max_offset`` and its offset; newer and
        unreadable snapshots are deleted on the way."""
        for offset in [o for o in self.offsets if o > max_offset]:
            self.delete(offset)
        while self.offsets:
            offset = self.offsets[-1]
            path = self.path(offset)
            try:
                state = ProducerStateManager.from_snapshot(path.read_bytes())
            except (OSError, ValueError) as exc:
                log.warning("Deleting unreadable producer snapshot %(path)s: %(error)s", {"path": path, "error": exc})
                self.delete(offset)
                continue
            return state, offset
        return None


def replay_producer_state(
    segments: list[Segment], state: ProducerStateManager, start: int, end: int, rebuild: set[int]
) -> int:
    """Apply the producer batches in [start, end) to ``state``, indexing aborted transactions in
    the segments whose base offset is in ``rebuild``; returns the batches replayed."""
    replayed = 0
    if start >= end:
        return replayed
    for segment in segments[floor_index(segments, start) :]:
        if segment.base_offset >= end:
            break
        _, position = segment.offset_index.lookup(start)
        try:
            for header in segment.scan(position):
                if header.base_offset >= end:
                    break
                if header.last_offset < start or header.producer_id < 0:
                    continue
                marker = _read_marker(segment, header) if header.is_control else None
                completed = state.update(header, marker)
                replayed += 1
                if completed is not None and segment.base_offset in rebuild:
                    index_completed_txn(segment, state, completed)
        except InvalidRecords as exc:
            log.warning("Producer state replay stopped in %(segment)s: %(error)s",
                        {"segment": segment.log_path, "error": exc})
    return replayed


def index_completed_txn(segment: Segment, state: ProducerStateManager, completed: CompletedTxn) -> None:
    """Record an aborted transaction in the index of the segment holding its marker."""
    if completed.is_aborted:
        segment.txn_index.append(
            AbortedTxn(
                completed.producer_id,
                completed.first_offset,
                completed.last_offset,
                state.last_stable_offset(completed),
            )
        )


def list_snapshots(dir: Path) -> list[int]:
    out: list[int] = []
    for entry in os.scandir(dir):
        if entry.name.endswith(SNAPSHOT_SUFFIX) and entry.is_file():
            offset = parse_base_offset(entry.name)
            if offset is not None:
                out.append(offset)
    return sorted(out)


def _read_marker(segment: Segment, header: BatchHeader) -> EndTxnMarker | None:
    try:
        return parse_end_txn_marker(segment.read_batch(header))
    except InvalidRecords as exc:
        log.warning("Ignoring unreadable control batch at offset %(base_offset)d of %(segment)s: %(error)s",
                    {"base_offset": header.base_offset, "segment": segment.name, "error": exc})
        return None
