"""One partition's log: an ordered list of segments, the last of which takes appends.

Appends, reads and retention run on the event-loop thread at page-cache speed; only
:meth:`Log.flush` (fsync) is meant for a worker thread.  A per-log lock guards all
mutable state; ``flush`` holds it just long enough to snapshot which files to sync and
then fsyncs duplicated descriptors without it, so appends are never stalled by disk
latency.  Memory use is O(number of segments), independent of the number of batches.

Idempotent/transactional producers: the log owns a
:class:`~pykbroker.storage.producer_state.ProducerStateManager`, validates producer batches
against it before appending (batch headers only) and updates it afterwards.  Its state is
snapshotted to ``<offset>.snapshot`` files at segment roll and clean close; opening loads
the newest usable snapshot and replays batch headers from there
(:mod:`~pykbroker.storage.producer_snapshots`).  Aborted transactions are recorded in the
``.txnindex`` of the segment holding their abort marker.

Opening a directory (recovery) is :mod:`~pykbroker.storage.log_loader`; flushing and durable
offsets are :mod:`~pykbroker.storage.log_durability`; which old segments may go is
:mod:`~pykbroker.storage.log_retention`; the cleaner's output goes in place through
:mod:`~pykbroker.storage.segment_swap`.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pykbroker.protocol.records import (
    CORRUPT_MESSAGE,
    RECORD_LIST_TOO_LARGE,
    BatchHeader,
    InvalidRecords,
    assign_offsets,
    iter_batches,
    parse_batch_header,
)
from pykbroker.storage.errors import KafkaStorageError, OffsetOutOfRange, on_disk, out_of_descriptors
from pykbroker.storage.index import CorruptIndex
from pykbroker.storage.leader_epoch_cache import LeaderEpochCache
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_durability import LogDurability
from pykbroker.storage.log_flush import fsync_dir
from pykbroker.storage.log_loader import load_segments
from pykbroker.storage.log_results import AppendResult, ReadResult, SliceResult
from pykbroker.storage.log_retention import (
    LogStartOffsetIncrementReason,
    SegmentPredicate,
    below_log_start,
    deletable_segments,
    retention_size_breach,
    retention_time_breach,
)
from pykbroker.storage.producer_snapshots import (
    ProducerSnapshots,
    index_completed_txn,
    list_snapshots,
    replay_producer_state,
)
from pykbroker.storage.producer_state import (
    AppendOrigin,
    EndTxnMarker,
    ProducerStateError,
    ProducerStateManager,
    decode_end_txn_markers,
)
from pykbroker.storage.segment import (
    Segment,
    floor_index,
)
from pykbroker.storage.segment_swap import replace_with_cleaned, swap_in_merged

# The values and errors of the log's interface, importable from here.
__all__ = [
    "AppendOrigin",
    "AppendResult",
    "KafkaStorageError",
    "Log",
    "LogStartOffsetIncrementReason",
    "OffsetOutOfRange",
    "ProducerStateError",
    "ReadResult",
    "SliceResult",
    "out_of_descriptors",
]

log = logging.getLogger(__name__)

_ORIGINS = frozenset(("client", "coordinator", "replication"))


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Log(LogDurability):
    """Append-only, segmented log of one topic partition (Kafka's UnifiedLog/LocalLog)."""

    def __init__(
        self,
        dir: Path,
        config: LogConfig,
        segments: list[Segment],
        *,
        log_start_offset: int,
        log_end_offset: int,
        recovery_point: int,
        now_ms: Callable[[], int],
    ) -> None:
        self.dir = dir
        self.config = config
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.recovery_point = recovery_point
        self._durable_offset = recovery_point  # (see LogDurability)
        self._truncations = 0
        self._now_ms = now_ms
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()
        self._dir_dirty = False
        self._closed = False
        self.producer_state = ProducerStateManager()
        self.producer_state.map_end_offset = log_end_offset
        self._snapshots = ProducerSnapshots(dir, self._mark_dir_dirty)
        # Set once a disk operation failed or the log dir was declared offline; never cleared
        # (a restart brings the dir back).  ``on_storage_error(log, reason)`` tells the owner,
        # from whichever thread hit the error; it must not block.
        self.offline = False
        self.on_storage_error: Callable[[Log, str], None] | None = None
        # Start offset of each leader epoch (loaded by ``open``); the leader stamps
        # ``leader_epoch`` into every batch it appends unless the caller passes one.
        self.leader_epoch_cache = LeaderEpochCache(None)
        self.leader_epoch: int | None = None

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        dir: Path,
        config: LogConfig,
        *,
        recover: bool,
        now_ms: Callable[[], int] | None = None,
        log_start_offset: int | None = None,
        recovery_point: int | None = None,
    ) -> Log:
        """Load (and if ``recover``, repair) the log in ``dir``, creating it if needed.

        ``log_start_offset``/``recovery_point`` come from the log dir's checkpoint files.
        Without a recovery point, recovery re-validates every segment (Kafka's behaviour for
        a log missing from the recovery-point checkpoint).
        """
        clock = now_ms or _wall_clock_ms
        dir.mkdir(parents=True, exist_ok=True)
        segments, leo = load_segments(dir, config, recover=recover, clock=clock, log_start_offset=log_start_offset,
                                      recovery_point=recovery_point)
        lso = max(segments[0].base_offset, log_start_offset or 0)
        lso = min(lso, leo)
        self = cls(
            dir,
            config,
            segments,
            log_start_offset=lso,
            log_end_offset=leo,
            recovery_point=leo,
            now_ms=clock,
        )
        try:
            # Epochs past the log end (a torn tail) or before its start no longer apply.
            # Loading writes nothing (it must work on a full disk): the file catches up later.
            self.leader_epoch_cache = LeaderEpochCache.load(dir)
            self.leader_epoch_cache.truncate_from_end(leo, flush=False)
            self.leader_epoch_cache.truncate_from_start(lso, flush=False)
        except BaseException:
            for seg in segments:
                with contextlib.suppress(OSError):
                    seg.close()
            raise
        # Transaction indexes of recovered segments (and any torn one) are rebuilt by the
        # producer-state replay, which then has to start at or below the first of them.
        rebuild: set[int] = set()
        if recover:
            rebuild.update(s.base_offset for s in segments[floor_index(segments, recovery_point or 0) :])
        for seg in segments:
            try:
                seg.txn_index.sanity_check()
            except CorruptIndex as exc:
                log.warning("Rebuilding transaction index of %(segment)s: %(error)s",
                            {"segment": seg.log_path, "error": exc})
                rebuild.add(seg.base_offset)
        try:
            for seg in segments:
                if seg.base_offset in rebuild:
                    seg.txn_index.reset()
            self._snapshots.offsets = list_snapshots(dir)
            with self._lock:
                self._load_producer_state_locked(leo, limit=min(rebuild) if rebuild else None, rebuild=rebuild)
        except BaseException:
            for seg in segments:
                with contextlib.suppress(OSError):
                    seg.close()
            raise
        if rebuild:
            # Recovered data is now known good: make it durable before claiming it flushed.
            for seg in segments:
                if seg.base_offset in rebuild:
                    for fd in seg.dup_fds():
                        try:
                            os.fsync(fd)
                        finally:
                            os.close(fd)
            fsync_dir(dir)
        return self

    # -- properties ------------------------------------------------------------------------------

    @property
    def segments(self) -> list[Segment]:
        """Snapshot of the segments, oldest first."""
        with self._lock:
            return list(self._segments)

    @property
    def active_segment(self) -> Segment:
        return self._segments[-1]

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    def update_config(self, config: LogConfig) -> None:
        """Apply changed topic configs; segment/index sizes affect new segments only."""
        with self._lock:
            self.config = config
            self._segments[-1].config = config

    # -- append ----------------------------------------------------------------------------------

    @on_disk("appending to")
    def append(
        self,
        records: bytearray,
        batches: list[BatchHeader],
        *,
        log_append_time_ms: int | None = None,
        leader_epoch: int | None = None,
        origin: AppendOrigin = "client",
    ) -> AppendResult:
        """Assign offsets to validated batches and write them to the active segment.

        With ``message.timestamp.type=LogAppendTime`` the append time defaults to the
        clock.  ``leader_epoch`` (if given) is stamped as each batch's partition leader epoch.
        Page-cache write only; durability is :meth:`flush`'s job.

        Batches with a producer id are first checked against the producer state (``origin``
        says how strictly: see :mod:`~pykbroker.storage.producer_state`); a rejected batch
        raises :class:`ProducerStateError` and a retried ``client`` batch appends nothing and
        returns the original offsets with ``duplicate=True``.  Transaction markers are
        appended with ``origin="coordinator"``.
        """
        if not batches:
            raise ValueError("nothing to append")
        start = batches[0].position
        end = batches[-1].position + batches[-1].size
        size = end - start
        with self._lock:
            self._check_open()
            if size > self.config.segment_bytes:
                raise InvalidRecords(
                    RECORD_LIST_TOO_LARGE,
                    f"append of {size} bytes is larger than the segment size {self.config.segment_bytes}",
                )
            producer_state = self.producer_state
            idempotent = False
            for b in batches:
                if b.producer_id >= 0:
                    idempotent = True
                    break
            markers: dict[int, EndTxnMarker] | None = None
            if idempotent:
                if origin not in _ORIGINS:
                    raise ValueError(f"unknown append origin {origin!r}")
                markers = decode_end_txn_markers(records, batches)
                duplicate = producer_state.check_all(batches, origin, markers)
                if duplicate is not None:
                    return AppendResult(
                        first_offset=duplicate.first_offset,
                        last_offset=duplicate.last_offset,
                        log_append_time_ms=duplicate.timestamp if self.config.log_append_time else -1,
                        max_timestamp=duplicate.timestamp,
                        log_start_offset=self.log_start_offset,
                        duplicate=True,
                    )
            if log_append_time_ms is None and self.config.log_append_time:
                log_append_time_ms = self._now_ms()
            if leader_epoch is None:
                leader_epoch = self.leader_epoch
            first_offset = self.log_end_offset
            count = sum(b.last_offset_delta + 1 for b in batches)
            last_offset = first_offset + count - 1
            max_ts = max(b.max_timestamp for b in batches)
            if log_append_time_ms is not None:
                max_ts = log_append_time_ms
            segment = self._segments[-1]
            if segment.should_roll(
                messages_size=size, max_timestamp=max_ts, max_offset=last_offset, now_ms=self._now_ms()
            ):
                self._roll_locked()
                segment = self._segments[-1]
            next_offset = assign_offsets(
                records,
                batches,
                first_offset,
                log_append_time_ms=log_append_time_ms,
                partition_leader_epoch=leader_epoch,
            )
            # A new epoch's start is checkpointed before its data is written (as Kafka does).
            self._assign_epochs_locked(batches)
            offset_of_max = first_offset
            batch_max = -2
            for b in batches:
                if b.max_timestamp > batch_max:
                    batch_max = b.max_timestamp
                    offset_of_max = b.base_offset
            with memoryview(records) as view:
                segment.append(
                    view[start:end],
                    last_offset=next_offset - 1,
                    max_timestamp=max_ts,
                    offset_of_max_timestamp=offset_of_max,
                    first_header=parse_batch_header(records, start),  # as written: offsets assigned
                )
            self.log_end_offset = next_offset
            self._unflushed_messages += count
            if idempotent:
                for i, b in enumerate(batches):
                    if b.producer_id >= 0:
                        completed = producer_state.update(b, markers.get(i) if markers else None)
                        if completed is not None:
                            index_completed_txn(segment, producer_state, completed)
            producer_state.map_end_offset = next_offset
            return AppendResult(
                first_offset=first_offset,
                last_offset=next_offset - 1,
                log_append_time_ms=log_append_time_ms if log_append_time_ms is not None else -1,
                max_timestamp=max_ts,
                log_start_offset=self.log_start_offset,
            )

    @on_disk("appending to")
    def append_as_follower(self, records: bytes | bytearray | memoryview) -> AppendResult | None:
        """Append a leader's batches unchanged: its offsets, epochs and timestamps (replication).

        Every whole batch's CRC is checked; a partial batch at the end (a fetch response cut at
        its size limit) is dropped.  Batches wholly below the log end offset are skipped, so a
        repeated response is harmless.  Producer state, transaction markers and the
        aborted-transaction index are updated as the leader's append did; the leader epoch
        cache learns each new epoch from the batches.  Returns None when nothing was appended.
        """
        buf = bytes(records)
        headers = [h for h in iter_batches(buf, verify_crc=True)]
        with self._lock:
            self._check_open()
            leo = self.log_end_offset
            headers = [h for h in headers if h.last_offset >= leo]
            if not headers:
                return None
            if headers[0].base_offset < leo:
                raise InvalidRecords(CORRUPT_MESSAGE, f"batch at offset {headers[0].base_offset} overlaps the log "
                                     f"end offset {leo} of {self.dir.name}")
            prev = leo
            for h in headers:
                if h.base_offset < prev or h.last_offset < h.base_offset:
                    raise InvalidRecords(CORRUPT_MESSAGE, f"offsets of {self.dir.name} are not monotonic at "
                                         f"{h.base_offset}")
                if h.size > self.config.segment_bytes:
                    raise InvalidRecords(RECORD_LIST_TOO_LARGE, f"batch of {h.size} bytes is larger than the "
                                         f"segment size {self.config.segment_bytes}")
                prev = h.next_offset
            first = headers[0].base_offset
            # Chunks that fit one segment, each appended like the leader's append.
            chunk: list[BatchHeader] = []
            chunk_size = 0
            for h in headers:
                if chunk and chunk_size + h.size > self.config.segment_bytes:
                    self._append_follower_chunk_locked(buf, chunk)
                    chunk, chunk_size = [], 0
                chunk.append(h)
                chunk_size += h.size
            self._append_follower_chunk_locked(buf, chunk)
            last = headers[-1]
            return AppendResult(
                first_offset=first,
                last_offset=last.last_offset,
                log_append_time_ms=-1,
                max_timestamp=max(h.max_timestamp for h in headers),
                log_start_offset=self.log_start_offset,
            )

    def _append_follower_chunk_locked(self, buf: bytes, batches: list[BatchHeader]) -> None:
        start = batches[0].position
        end = batches[-1].position + batches[-1].size
        last = batches[-1]
        max_ts = -1
        offset_of_max = batches[0].base_offset
        for b in batches:
            if b.max_timestamp > max_ts:
                max_ts = b.max_timestamp
                offset_of_max = b.base_offset
        segment = self._segments[-1]
        if segment.should_roll(messages_size=end - start, max_timestamp=max_ts, max_offset=last.last_offset,
                               now_ms=self._now_ms()):
            self._roll_locked()
            segment = self._segments[-1]
        markers = decode_end_txn_markers(bytearray(buf), batches) if any(b.is_control for b in batches) else None
        self._assign_epochs_locked(batches)
        with memoryview(buf) as view:
            segment.append(view[start:end], last_offset=last.last_offset, max_timestamp=max_ts,
                           offset_of_max_timestamp=offset_of_max)
        self.log_end_offset = last.next_offset
        self._unflushed_messages += sum(b.last_offset_delta + 1 for b in batches)
        state = self.producer_state
        for i, b in enumerate(batches):
            if b.producer_id >= 0:
                completed = state.update(b, markers.get(i) if markers else None)
                if completed is not None:
                    index_completed_txn(segment, state, completed)
        state.map_end_offset = self.log_end_offset

    def _assign_epochs_locked(self, batches: list[BatchHeader]) -> None:
        """Record the start of every newer epoch the batches carry in the leader-epoch cache."""
        cache = self.leader_epoch_cache
        latest = cache.latest_epoch()
        for b in batches:
            epoch = b.partition_leader_epoch
            if epoch >= 0 and (latest is None or epoch > latest):
                cache.assign(epoch, b.base_offset)
                latest = epoch

    def become_leader(self, leader_epoch: int) -> None:
        """Stamp ``leader_epoch`` into appended batches from now on; it starts at the log end.

        The new entry is written at once when the disk allows; on a full disk it stays in
        memory (reads keep working; the next append cannot be written either) until
        :meth:`checkpoint_leader_epochs` or the next change writes it.
        """
        with self._lock:
            self._check_open()
            self.leader_epoch = leader_epoch
            if leader_epoch >= 0:
                try:
                    self.leader_epoch_cache.assign(leader_epoch, self.log_end_offset)
                except OSError as exc:
                    log.warning("Could not write the leader epoch checkpoint of %(log_dir)s yet: %(error)s",
                                {"log_dir": self.dir.name, "error": exc})

    @on_disk("writing the leader epoch checkpoint of")
    def checkpoint_leader_epochs(self) -> None:
        """Write the leader epoch cache if memory is ahead of its file."""
        with self._lock:
            if not self._closed and not self.offline:
                self.leader_epoch_cache.maybe_flush()

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int] | None:
        """(epoch, end offset) for OffsetForLeaderEpoch; None when the epoch is unknown."""
        with self._lock:
            epoch, offset = self.leader_epoch_cache.end_offset_for(leader_epoch, self.log_end_offset)
        return None if offset < 0 else (epoch, offset)

    # -- read ------------------------------------------------------------------------------------

    @on_disk("reading")
    def read(
        self, offset: int, max_bytes: int, *, max_offset: int | None = None, min_one_message: bool = True
    ) -> ReadResult:
        """Whole batches from the one containing ``offset`` (Kafka fetch semantics, KIP-74).

        At most ``max_bytes`` unless ``min_one_message`` lets the first batch exceed it;
        never a batch at/after ``max_offset`` (the high watermark); data comes from one
        segment per call.  Raises :class:`OffsetOutOfRange` outside [log start, LEO].
        """
        with self._lock:
            self._check_open()
            lso, leo = self.log_start_offset, self.log_end_offset
            if offset < lso or offset > leo:
                raise OffsetOutOfRange(f"offset {offset} is out of range for {self.dir.name}: [{lso}, {leo}]")
            empty = ReadResult(b"", offset, offset, lso, leo)
            if offset == leo or (max_offset is not None and offset >= max_offset):
                return empty
            i = max(0, bisect.bisect_right(self._bases, offset) - 1)
            for segment in self._segments[i:]:
                result = segment.read(offset, max(0, max_bytes), max_offset=max_offset, min_one_message=min_one_message)
                if result is not None:
                    return ReadResult(
                        result.records,
                        result.first_offset,
                        result.next_offset,
                        lso,
                        leo,
                        result.first_batch_too_large,
                    )
            return empty

    @on_disk("reading")
    def read_slice(
        self, offset: int, max_bytes: int, *, max_offset: int | None = None, min_one_message: bool = True
    ) -> SliceResult:
        """:meth:`read` for a fetch response: a long range stays in its segment file (a
        :class:`FileRange`, sent with sendfile), only batch headers are read.  ``next_offset`` may
        overshoot across a compaction gap: it bounds the aborted transactions to report, as in Kafka."""
        with self._lock:
            self._check_open()
            lso, leo = self.log_start_offset, self.log_end_offset
            if offset < lso or offset > leo:
                raise OffsetOutOfRange(f"offset {offset} is out of range for {self.dir.name}: [{lso}, {leo}]")
            if offset == leo or (max_offset is not None and offset >= max_offset):
                return SliceResult(b"", offset, offset)
            segments = self._segments
            i = max(0, bisect.bisect_right(self._bases, offset) - 1)
            for j in range(i, len(segments)):
                end_offset = segments[j + 1].base_offset if j + 1 < len(segments) else leo
                result = segments[j].read_slice(offset, max(0, max_bytes), max_offset=max_offset,
                                                min_one_message=min_one_message, end_offset=end_offset)
                if result is not None:
                    return SliceResult(result.records, result.first_offset, result.next_offset,
                                       result.first_batch_too_large)
            return SliceResult(b"", offset, offset)

    # -- timestamps --------------------------------------------------------------------------------

    @on_disk("searching")
    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= target, at or after the
        log start offset (ListOffsets by timestamp); None if every record is older."""
        with self._lock:
            self._check_open()
            segs = self._segments
            for i, segment in enumerate(segs):
                if i + 1 < len(segs) and segs[i + 1].base_offset <= self.log_start_offset:
                    continue  # wholly below the log start offset
                if segment.max_timestamp < timestamp_ms:
                    continue
                found = segment.find_offset_by_timestamp(timestamp_ms, self.log_start_offset)
                if found is not None:
                    ts, offset = found
                    return offset, ts
            return None

    @on_disk("searching")
    def max_timestamp_and_offset(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with the largest timestamp (ListOffsets -3)."""
        with self._lock:
            self._check_open()
            best: Segment | None = None
            for segment in self._segments:
                if segment.max_timestamp >= 0 and (best is None or segment.max_timestamp > best.max_timestamp):
                    best = segment
            if best is None:
                return None
            found = best.offset_of_max_timestamp_record()
            if found is None:
                return None
            ts, offset = found
            return offset, ts

    # -- producers and transactions --------------------------------------------------------------

    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest open transaction (the last stable offset cannot pass it)."""
        if not self.producer_state.has_ongoing_transactions:
            return None  # lock-free for the common case: every fetched partition asks this
        with self._lock:
            return self.producer_state.first_unstable_offset()

    @on_disk("reading the transaction index of")
    def collect_aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping [start, upper bound).

        For read_committed fetches (Kafka's collectAbortedTransactions): searches the
        transaction indexes from the segment holding ``start_offset`` until an entry's last
        stable offset shows no later marker can concern the range.
        """
        with self._lock:
            self._check_open()
            out: list[tuple[int, int]] = []
            if upper_bound_offset <= start_offset:
                return out
            i = max(0, bisect.bisect_right(self._bases, start_offset) - 1)
            for segment in self._segments[i:]:
                if segment.txn_index.entries == 0:
                    continue
                txns, complete = segment.txn_index.collect(start_offset, upper_bound_offset)
                out.extend((t.producer_id, t.first_offset) for t in txns)
                if complete:
                    break
            return out

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for ``expiration_ms`` (producer.id.expiration.ms); returns how many."""
        with self._lock:
            if self._closed:
                return 0
            expired = self.producer_state.remove_expired(now_ms, expiration_ms)
            if expired:
                log.debug("Expired %(expired)d producer id(s) of %(log_dir)s",
                          {"expired": len(expired), "log_dir": self.dir.name})
            return len(expired)

    def _mark_dir_dirty(self) -> None:
        self._dir_dirty = True

    def _take_snapshot_locked(self, *, sync: bool, strict: bool = False) -> None:
        """Write the producer state as ``<LEO>.snapshot`` (see :meth:`ProducerSnapshots.write`)."""
        offset = self.log_end_offset
        state = self.producer_state
        state.map_end_offset = offset
        if self._snapshots.write(state, offset, sync=sync, strict=strict):
            self._prune_snapshots_locked()

    def _prune_snapshots_locked(self) -> None:
        recovery_base = self._segments[floor_index(self._segments, self.recovery_point)].base_offset
        self._snapshots.prune(recovery_base=recovery_base, log_start_offset=self.log_start_offset)

    def _load_producer_state_locked(
        self, end: int, *, limit: int | None = None, rebuild: set[int] | None = None, sync: bool = True
    ) -> int:
        """Producer state as of ``end``: the newest readable snapshot at or below ``end`` (and
        ``limit``) plus a replay of batch headers, adding aborted transactions to the indexes of
        segments in ``rebuild``.  Newer snapshots are deleted.  Returns the batches replayed."""
        max_offset = end if limit is None else min(end, limit)
        newest = self._snapshots.load_newest(max_offset)
        if newest is None:
            state = ProducerStateManager()
            start = self.log_start_offset
        else:
            state, offset = newest
            start = max(offset, self.log_start_offset)
        state.map_end_offset = start
        replayed = replay_producer_state(self._segments, state, start, end, rebuild or set())
        state.map_end_offset = end
        self.producer_state = state
        if replayed:
            log.debug("Loaded producer state of %(log_dir)s: replayed %(replayed)d batch(es) from %(start)d",
                      {"log_dir": self.dir.name, "replayed": replayed, "start": start})
            self._take_snapshot_locked(sync=sync)
        return replayed

    # -- roll / flush ------------------------------------------------------------------------------

    @on_disk("rolling")
    def roll(self) -> None:
        """Start a new active segment at the log end offset (no-op if the active one is empty)."""
        with self._lock:
            self._check_open()
            self._roll_locked()

    def _roll_locked(self) -> None:
        active = self._segments[-1]
        if active.size == 0 and active.base_offset == self.log_end_offset:
            return
        # The new segment first: if the disk refuses it, the active segment is untouched.
        segment = Segment(self.dir, self.log_end_offset, self.config, active=True, now_ms=self._now_ms())
        try:
            if active.size == 0:
                # Empty segment at a stale base offset (after truncation): replace it.
                self._segments.pop()
                self._bases.pop()
                active.delete()
            else:
                active.on_become_inactive()
        except BaseException:
            segment.release()
            raise
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._dir_dirty = True
        log.debug("Rolled new log segment %(segment)s at offset %(base_offset)d",
                  {"segment": segment.name, "base_offset": segment.base_offset})
        # Producer state as of the new segment's base: recovery replays from here at most.
        self._take_snapshot_locked(sync=False, strict=True)

    # -- deletion of old data ------------------------------------------------------------------------

    @on_disk("deleting records of")
    def delete_records_before(self, offset: int, *, reason: LogStartOffsetIncrementReason,
                              high_watermark: int | None = None) -> int:
        """Advance the log start offset to ``offset`` (a DeleteRecords request, or a follower following its
        leader's log start); drop whole segments below it."""
        with self._lock:
            self._check_open()
            limit = self.log_end_offset if high_watermark is None else min(high_watermark, self.log_end_offset)
            if offset < 0 or offset > limit:
                raise OffsetOutOfRange(f"cannot delete records before {offset}: the limit is {limit}")
            if offset > self.log_start_offset:
                self.log_start_offset = offset
                log.info("Incremented log start offset of %(log_dir)s to %(offset)d (%(reason)s)",
                         {"log_dir": self.dir.name, "offset": offset, "reason": reason.value})
                self.leader_epoch_cache.truncate_from_start(offset)
                self._delete_segments_locked(self._deletable(below_log_start(self.log_start_offset)),
                                             "log start offset breach")
            return self.log_start_offset

    @on_disk("applying retention to")
    def apply_retention(self, now_ms: int, *, high_watermark: int | None = None) -> list[str]:
        """Kafka's deleteOldSegments: time, size and log-start-offset based segment deletion
        (:mod:`~pykbroker.storage.log_retention`).

        Only whole segments below the high watermark (default: LEO) are deleted; if every
        segment expired the log rolls first so the (now empty) new segment remains.
        """
        with self._lock:
            self._check_open()
            hw = self.log_end_offset if high_watermark is None else high_watermark
            deleted: list[str] = []
            config = self.config
            if config.delete_enabled:
                if config.retention_ms >= 0:
                    deleted += self._delete_segments_locked(
                        self._deletable(retention_time_breach(now_ms, config.retention_ms), hw),
                        f"retention time {config.retention_ms}ms breach",
                    )
                if config.retention_bytes >= 0:
                    oversize = retention_size_breach(self._segments, config.retention_bytes)
                    if oversize is not None:
                        deleted += self._delete_segments_locked(
                            self._deletable(oversize, hw), f"retention size {config.retention_bytes} breach"
                        )
            deleted += self._delete_segments_locked(
                self._deletable(below_log_start(self.log_start_offset), hw), "log start offset breach"
            )
            return deleted

    def _deletable(self, predicate: SegmentPredicate, high_watermark: int | None = None) -> list[Segment]:
        hw = self.log_end_offset if high_watermark is None else high_watermark
        return deletable_segments(self._segments, self.log_end_offset, hw, predicate)

    def _delete_segments_locked(self, deletable: list[Segment], reason: str) -> list[str]:
        if not deletable:
            return []
        if len(deletable) == len(self._segments):
            self._roll_locked()
        names: list[str] = []
        for seg in deletable:
            log.info(
                "Deleting segment %(segment)s of %(log_dir)s (base offset %(base_offset)d, size %(size)d) due to "
                "%(reason)s",
                {"segment": seg.name, "log_dir": self.dir.name, "base_offset": seg.base_offset, "size": seg.size,
                 "reason": reason},
            )
            self._segments.remove(seg)
            seg.delete()
            names.append(seg.name)
        self._bases = [s.base_offset for s in self._segments]
        if self._segments[0].base_offset > self.log_start_offset:
            self.log_start_offset = self._segments[0].base_offset
            log.info("Incremented log start offset of %(log_dir)s to %(log_start_offset)d (%(reason)s: %(cause)s)",
                     {"log_dir": self.dir.name, "log_start_offset": self.log_start_offset,
                      "reason": LogStartOffsetIncrementReason.SEGMENT_DELETION.value, "cause": reason})
        self.leader_epoch_cache.truncate_from_start(self.log_start_offset)
        self._dir_dirty = True
        self._prune_snapshots_locked()
        return names

    @on_disk("truncating")
    def truncate_to(self, offset: int) -> None:
        """Remove everything at and after ``offset`` (follower truncation)."""
        with self._lock:
            self._check_open()
            if offset < 0:
                raise ValueError(f"cannot truncate to negative offset {offset}")
            if offset >= self.log_end_offset:
                # No data to cut, but an epoch this replica started at its log end as leader and
                # never wrote must go: left in place, the follower would keep sending it as its
                # last fetched epoch and the leader would answer the same divergence forever.
                self.leader_epoch_cache.truncate_from_end(offset)
                return
            log.info("Truncating %(log_dir)s to offset %(offset)d (LEO was %(log_end_offset)d)",
                     {"log_dir": self.dir.name, "offset": offset, "log_end_offset": self.log_end_offset})
            if offset < self._segments[0].base_offset:
                self.truncate_fully_and_start_at(offset)
                return
            while len(self._segments) > 1 and self._segments[-1].base_offset > offset:
                self._segments.pop().delete()
            self._bases = [s.base_offset for s in self._segments]
            active = self._segments[-1]
            active.truncate_to(offset)
            active.make_active()
            self.log_end_offset = offset
            self.log_start_offset = min(self.log_start_offset, offset)
            self.recovery_point = min(self.recovery_point, offset)
            self._durable_offset = min(self._durable_offset, offset)
            self._truncations += 1
            self.leader_epoch_cache.truncate_from_end(offset)
            self._unflushed_messages = 0
            self._dir_dirty = True
            # Producer state as of ``offset``: newest snapshot at or below it plus a replay.
            self._load_producer_state_locked(offset, sync=False)

    @on_disk("truncating")
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete all data and restart the log at ``offset``."""
        with self._lock:
            self._check_open()
            for seg in self._segments:
                seg.delete()
            segment = Segment(self.dir, offset, self.config, active=True, now_ms=self._now_ms())
            self._segments = [segment]
            self._bases = [offset]
            self.log_start_offset = offset
            self.log_end_offset = offset
            self.recovery_point = offset
            self._durable_offset = offset
            self._truncations += 1
            self._unflushed_messages = 0
            self._dir_dirty = True
            for snapshot_offset in list(self._snapshots.offsets):
                self._snapshots.delete(snapshot_offset)
            self.producer_state.truncate_and_reset(offset)
            self.leader_epoch_cache.clear()

    # -- log cleaner hooks (pykbroker/storage/cleaner.py) ------------------------------

    def inactive_segments(self) -> list[Segment]:
        """Every segment but the active one (a snapshot; the cleaner works on these)."""
        with self._lock:
            return list(self._segments[:-1])

    @on_disk("replacing a segment of")
    def replace_segment(self, old: Segment, cleaned: Path) -> bool:
        """Swap a cleaned copy of an inactive segment in, atomically (one rename of the .log file).

        ``cleaned`` holds a subset of ``old``'s batches with their original offsets.  A crash
        before the rename leaves a stray ``.cleaned`` file (deleted on open) and the old segment;
        after it, the new data with indexes rebuilt on open.  An empty result that is not the
        first segment is deleted instead.  Returns False if ``old`` is no longer an inactive segment.
        """
        with self._lock:
            if self._closed or old not in self._segments[:-1]:
                cleaned.unlink(missing_ok=True)
                return False
            i = self._segments.index(old)
            if cleaned.stat().st_size == 0 and i > 0:
                old.delete()
                cleaned.unlink(missing_ok=True)
                del self._segments[i]
                self._bases = [s.base_offset for s in self._segments]
                fsync_dir(self.dir)
                return True
            new = replace_with_cleaned(self.dir, old, cleaned, self.config, self._now_ms())
            self._segments[i] = new
            return True


    def last_data_offsets(self) -> dict[int, int]:
        """Producer id -> last offset of its last data batch (the cleaner keeps those batches)."""
        with self._lock:
            return {pid: e.batches[-1].last_offset for pid, e in self.producer_state.producers.items() if e.batches}

    @on_disk("replacing segments of")
    def replace_segments(self, olds: list[Segment], cleaned: Path, txn_index: bytes = b"") -> bool:
        """Swap one cleaned file in for several adjacent inactive segments (Kafka's .swap protocol).

        ``cleaned`` (fsynced by the caller) holds the surviving batches of ``olds`` with their
        offsets; ``txn_index`` the raw transaction-index entries for the merged segment.  It goes
        in through ``.swap`` files (:mod:`~pykbroker.storage.segment_swap`).  Returns False if
        ``olds`` are no longer adjacent inactive segments of this log.
        """
        with self._lock:
            inactive = self._segments[:-1]
            if self._closed or not olds or any(s not in inactive for s in olds):
                cleaned.unlink(missing_ok=True)
                return False
            i = self._segments.index(olds[0])
            if self._segments[i:i + len(olds)] != olds:
                cleaned.unlink(missing_ok=True)
                return False
            if len(olds) == 1:
                return self.replace_segment(olds[0], cleaned)
            new = swap_in_merged(self.dir, olds, cleaned, txn_index, self.config, self._now_ms())
            self._segments[i:i + len(olds)] = [new]
            self._bases = [s.base_offset for s in self._segments]
            return True


    # -- moving to another log dir (AlterReplicaLogDirs; see LogManager.complete_move) -------------

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold off every other operation on this log, flushes included, for the final step of a move."""
        with self._flush_lock, self._lock:
            self._check_open()
            yield

    def active_indexes(self) -> dict[str, int]:
        """The active segment's index files (they change in place through their mapping) and their used bytes."""
        with self._lock:
            seg = self._segments[-1]
            return {seg.offset_index.path.name: seg.offset_index.size_bytes,
                    seg.time_index.path.name: seg.time_index.size_bytes}

    def snapshot_for_move(self) -> None:
        """Write the producer state at the log end (caller holds :meth:`exclusive`): no replay after the move."""
        self._take_snapshot_locked(sync=True)

    def superseded(self) -> None:
        """Its files were moved to another log dir (caller holds :meth:`exclusive`): close without writing.

        Whoever still holds this object gets 'closed' (and a flush is a no-op: the moved copy is durable).
        """
        self.recovery_point = self.log_end_offset
        self._durable_offset = self.log_end_offset
        self._unflushed_messages = 0
        self._closed = True
        for seg in self._segments:
            seg.release()

    # -- shutdown ----------------------------------------------------------------------------------

    def close(self, *, snapshot: bool = True) -> None:
        """Seal the active segment's indexes and close every file (no fsync of the data; see flush).

        Writes (and syncs) a producer-state snapshot at the log end offset first, so a clean
        reopen needs no replay.
        """
        with self._flush_lock, self._lock:
            if self._closed:
                return
            if snapshot:
                self._take_snapshot_locked(sync=True)
            self._closed = True
            for seg in self._segments:
                seg.close()

    def delete(self) -> None:
        """Close and remove the whole partition directory."""
        self.close(snapshot=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- disk failure ------------------------------------------------------------------------------

    def storage_failure(self, exc: BaseException, what: str) -> KafkaStorageError:
        """Record a failed disk operation: the log goes offline and the owner hears of it.

        Returns the error for the caller to raise.  Thread-safe and lock-free: it runs on
        whichever thread hit the error, possibly holding this log's lock.
        """
        if out_of_descriptors(exc):
            log.error("%(what)s %(log_dir)s failed: %(error)s (raise the broker's open-file limit, ulimit -n)",
                      {"what": what, "log_dir": self.dir, "error": exc})
            return KafkaStorageError(f"storage error while {what} {self.dir.name}: {exc}")
        first = not self.offline
        self.offline = True
        if first:
            log.error("I/O error while %(what)s %(log_dir)s: %(error)s",
                      {"what": what, "log_dir": self.dir, "error": exc})
        hook = self.on_storage_error
        if hook is not None:
            hook(self, f"{what} {self.dir.name} failed: {exc}")
        return KafkaStorageError(f"storage error while {what} {self.dir.name}: {exc}")

    def release(self) -> None:
        """Close every file without writing anything more (its log dir failed); stays offline.

        Unlike :meth:`close` no snapshot is written and no index is trimmed: the disk is
        not to be trusted, and the next start recovers this log from its last checkpoint.
        """
        self.offline = True
        with self._lock:
            self._closed = True
            for seg in self._segments:  # idempotent, so also after a close that failed halfway
                seg.release()

    def _check_open(self) -> None:
        if self.offline:
            raise KafkaStorageError(f"the log dir of {self.dir.name} is offline")
        if self._closed:
            raise RuntimeError(f"log {self.dir} is closed")

    def __repr__(self) -> str:
        return (
            f"Log({self.dir}, start={self.log_start_offset}, end={self.log_end_offset}, segments={len(self._segments)})"
        )
