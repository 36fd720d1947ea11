"""Log compaction, following Kafka's LogCleaner.

Which logs: every log with ``cleanup.policy`` containing ``compact``.  A log's *cleanable
range* ends at its first uncleanable offset: the active segment, the segment holding the
first unstable offset (an open transaction), and the first dirty segment younger than
``min.compaction.lag.ms`` (by its largest timestamp) bound it.  The part after the last
clean point (the *dirty* part) over the whole gives the cleanable ratio; a pass cleans the
logs whose ratio exceeds ``min.cleanable.dirty.ratio`` (or whose oldest dirty batch is
older than ``max.compaction.lag.ms``), filthiest first.

How: a map from key to its latest offset is built over the dirty part (aborted transactional
batches and control batches excluded), then every segment of the cleanable range is
rewritten, adjacent segments grouped so the result stays under ``segment.bytes`` (Kafka's
groupSegmentsBySize).  A record survives when no later record of its key is in the map.
Tombstones and transaction markers follow Kafka's v2 *delete horizon* (KIP-534): the first
clean that keeps one stamps its batch with ``delete horizon = now + delete.retention.ms``
(attribute bit 0x40, horizon in the base timestamp); a later clean after the horizon drops
it.  Batches of aborted transactions are dropped; an abort/commit marker is dropped once no
batch of its transaction is left (and its horizon passed).  The last data batch of every
producer still in the producer state is kept, empty if need be, so idempotent
deduplication survives compaction.  Keyless records are kept (Kafka rejects them on produce
to compacted topics; we never drop data that was accepted).  Offsets never change.

Crash safety: a rewritten segment goes to ``<base>.log.cleaned`` (fsynced); a single segment
is renamed over the original (:meth:`Log.replace_segment`), several merged ones go through
``<base>.log.swap`` (:meth:`Log.replace_segments`), which opening the log completes.  A
stray ``.cleaned`` file is deleted on open.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pykbroker.protocol.records import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    InvalidRecords,
    Record,
    batch_crc,
    decode_records,
)
from pykbroker.storage.log import Log
from pykbroker.storage.log_flush import write_synced
from pykbroker.storage.segment import Segment

log = logging.getLogger("pykbroker.cleaner")

_HEADER = struct.Struct(">qiibIhiqqqhii")
_ATTR_COMPRESSION_MASK = 0x07
_CRC_OFFSET = 17


_ATTR_DELETE_HORIZON = 0x40
LONG_MAX = 2**63 - 1
_MAX_RELATIVE_OFFSET = 2**31 - 1


@dataclass
class CleanStats:
    segments_rewritten: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    records_removed: int = 0
    segments_merged: int = 0
    # Where the next clean's dirty part starts (Kafka's cleaner checkpoint).
    end_offset: int = 0
    # The earliest delete horizon still pending in the cleaned range (None: none).
    next_horizon: int | None = None


@dataclass
class CleanerConfig:
    """A topic's compaction settings (Kafka's topic configs of the same names)."""

    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    min_cleanable_ratio: float = 0.5

    @classmethod
    def from_topic_config(cls, cfg: Mapping[str, Any]) -> CleanerConfig:
        return cls(int(cfg.get("delete.retention.ms", 86_400_000)), int(cfg.get("min.compaction.lag.ms", 0)),
                   int(cfg.get("max.compaction.lag.ms", LONG_MAX)), float(cfg.get("min.cleanable.dirty.ratio", 0.5)))


@dataclass
class LogToClean:
    """Kafka's LogToClean: the cleanable range of a log and how dirty it is."""

    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    dirty_bytes: int
    need_compaction_now: bool = False
    segments: list[Segment] = field(default_factory=list)

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def _varint(out: bytearray, value: int) -> None:
    v = (value << 1) ^ (value >> 63)
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _vbytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _varint(out, -1)
    else:
        _varint(out, len(data))
        out += data


def encode_subset_batch(h: BatchHeader, records: list[Record], delete_horizon: int | None = None) -> bytes:
    """A batch with ``h``'s header fields holding only ``records`` (uncompressed, offsets kept).

    With ``delete_horizon`` (or when ``h`` already has one) the batch carries Kafka's delete
    horizon flag and the horizon as its base timestamp; record timestamps stay exact (their
    deltas are taken from it).  ``records`` may be empty (a producer's retained last batch).
    """
    attributes = h.attributes & ~_ATTR_COMPRESSION_MASK
    if delete_horizon is not None:
        attributes |= _ATTR_DELETE_HORIZON
        base_ts = delete_horizon
    elif h.attributes & _ATTR_DELETE_HORIZON:
        base_ts = h.base_timestamp
    else:
        base_ts = records[0].timestamp if records else h.base_timestamp
    max_ts = max((r.timestamp for r in records), default=h.max_timestamp)
    body = bytearray()
    rec = bytearray()
    for r in records:
        rec.clear()
        rec.append(0)
        _varint(rec, r.timestamp - base_ts)
        _varint(rec, r.offset - h.base_offset)
        _vbytes(rec, r.key)
        _vbytes(rec, r.value)
        _varint(rec, len(r.headers))
        for hk, hv in r.headers:
            _vbytes(rec, hk.encode())
            _vbytes(rec, hv)
        _varint(body, len(rec))
        body += rec
    out = bytearray(BATCH_HEADER_SIZE)
    _HEADER.pack_into(out, 0, h.base_offset, BATCH_HEADER_SIZE - LOG_OVERHEAD + len(body), h.partition_leader_epoch,
                      2, 0, attributes, h.last_offset_delta, base_ts, max_ts,
                      h.producer_id, h.producer_epoch, h.base_sequence, len(records))
    out += body
    struct.pack_into(">I", out, _CRC_OFFSET, batch_crc(out, 0, len(out)))
    return bytes(out)


def _control_type(records: list[Record] | None) -> int | None:
    if not records or records[0].key is None or len(records[0].key) < 4:
        return None
    return int(struct.unpack_from(">h", records[0].key, 2)[0])


def _segment_base_for(segments: list[Segment], offset: int) -> int:
    base = segments[0].base_offset if segments else offset
    for seg in segments:
        if seg.base_offset <= offset:
            base = seg.base_offset
    return base


def _first_batch_timestamp(seg: Segment) -> int | None:
    for h in seg.scan(0):
        return h.max_timestamp if h.base_timestamp < 0 or h.attributes & _ATTR_DELETE_HORIZON else h.base_timestamp
    return None


def cleanable_range(lg: Log, first_dirty: int, cfg: CleanerConfig, now: int) -> LogToClean:
    """Kafka's LogCleanerManager.cleanableOffsets and the dirty/clean byte counts."""
    inactive = lg.inactive_segments()
    active_base = lg.active_segment.base_offset
    start = lg.log_start_offset
    if first_dirty < start or first_dirty > active_base:
        first_dirty = start  # checkpoint out of range: everything is dirty
    limit = active_base
    unstable = lg.first_unstable_offset()
    if unstable is not None:
        limit = min(limit, _segment_base_for([*inactive, lg.active_segment], unstable))
    dirty_segments = [s for s in inactive if _seg_end(s, inactive, active_base) > first_dirty]
    if cfg.min_compaction_lag_ms > 0:
        for seg in dirty_segments:
            if seg.size > 0 and seg.largest_timestamp > now - cfg.min_compaction_lag_ms:
                limit = min(limit, seg.base_offset)
                break
    clean_bytes = sum(s.size for s in inactive if _seg_end(s, inactive, active_base) <= first_dirty)
    dirty = [s for s in dirty_segments if s.base_offset < limit]
    need_now = False
    if cfg.max_compaction_lag_ms < LONG_MAX and dirty:
        ts = _first_batch_timestamp(dirty[0])
        need_now = ts is not None and ts >= 0 and now - ts > cfg.max_compaction_lag_ms
    return LogToClean(first_dirty, max(limit, first_dirty), clean_bytes, sum(s.size for s in dirty), need_now,
                      [s for s in inactive if s.base_offset < limit])


def _seg_end(seg: Segment, segments: list[Segment], active_base: int) -> int:
    i = segments.index(seg)
    return segments[i + 1].base_offset if i + 1 < len(segments) else active_base


def group_segments_by_size(segments: list[Segment], max_size: int, end_offset: int) -> list[list[Segment]]:
    """Kafka's groupSegmentsBySize: adjacent segments whose total size fits in one segment."""
    groups: list[list[Segment]] = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        size = segments[i].size
        i += 1
        while i < len(segments) and size + segments[i].size <= max_size:
            nxt_end = segments[i + 1].base_offset if i + 1 < len(segments) else end_offset
            if nxt_end - 1 - group[0].base_offset > _MAX_RELATIVE_OFFSET:
                break
            group.append(segments[i])
            size += segments[i].size
            i += 1
        groups.append(group)
    return groups


@dataclass
class _Item:
    header: BatchHeader
    raw: bytes
    records: list[Record] | None
    aborted: bool = False
    marker_discardable: bool = False


def _read_items(segments: list[Segment], aborted: list[tuple[int, int]]) -> dict[int, list[_Item]]:
    """Decode every batch, marking aborted transactional batches and discardable markers (in offset order)."""
    pending = sorted(aborted, key=lambda a: a[1])  # (producer id, first offset)
    nxt = 0
    ongoing_aborted: dict[int, bool] = {}  # producer id -> saw a batch of the aborted txn in this pass
    ongoing_committed: set[int] = set()
    out: dict[int, list[_Item]] = {}

    def consume_up_to(offset: int) -> None:
        nonlocal nxt
        while nxt < len(pending) and pending[nxt][1] <= offset:
            ongoing_aborted.setdefault(pending[nxt][0], False)
            nxt += 1

    for seg in segments:
        items: list[_Item] = []
        for h in seg.scan(0):
            raw = seg.read_batch(h)
            try:
                recs: list[Record] | None = decode_records(raw)
            except InvalidRecords:
                recs = None
            item = _Item(h, raw, recs)
            consume_up_to(h.last_offset)
            if h.is_control:
                ctype = _control_type(recs)
                if ctype == 0:  # ABORT: keep the marker while batches of the txn were still seen
                    seen = ongoing_aborted.pop(h.producer_id, None)
                    item.marker_discardable = not seen
                elif ctype == 1:  # COMMIT
                    item.marker_discardable = h.producer_id not in ongoing_committed
                    ongoing_committed.discard(h.producer_id)
            elif h.is_transactional:
                if h.producer_id in ongoing_aborted:
                    ongoing_aborted[h.producer_id] = True
                    item.aborted = True
                else:
                    ongoing_committed.add(h.producer_id)
            items.append(item)
        out[seg.base_offset] = items
    return out


def clean_log(lg: Log, *, delete_retention_ms: int, now_ms: int | None = None, first_dirty: int | None = None,
              config: CleanerConfig | None = None) -> CleanStats:
    """Compact the cleanable range of one log (blocking: run it off the event loop)."""
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    cfg = config or CleanerConfig(delete_retention_ms=delete_retention_ms, min_cleanable_ratio=0.0)
    cfg.delete_retention_ms = delete_retention_ms
    ltc = cleanable_range(lg, lg.log_start_offset if first_dirty is None else first_dirty, cfg, now)
    stats = CleanStats(end_offset=ltc.first_dirty)
    segments = ltc.segments
    if not segments:
        return stats
    limit = ltc.first_uncleanable
    items = _read_items(segments, lg.collect_aborted_transactions(segments[0].base_offset, limit))
    # The offset map: key -> latest offset in the dirty part.
    latest: dict[bytes, int] = {}
    for seg in segments:
        for it in items[seg.base_offset]:
            if it.records is None or it.header.is_control or it.aborted:
                continue
            for r in it.records:
                if r.key is not None and r.offset >= ltc.first_dirty:
                    latest[r.key] = r.offset
    last_batches = set(lg.last_data_offsets().items())
    new_horizon = now + cfg.delete_retention_ms
    next_horizon: list[int] = []
    for group in group_segments_by_size(segments, lg.config.segment_bytes, limit):
        out = bytearray()
        removed = 0
        changed = len(group) > 1
        for seg in group:
            for it in items[seg.base_offset]:
                h, rs = it.header, it.records
                horizon = h.base_timestamp if h.attributes & _ATTR_DELETE_HORIZON else None
                if rs is None:
                    out += it.raw
                    continue
                retain_empty = h.producer_id >= 0 and (h.producer_id, h.last_offset) in last_batches
                if h.is_control:
                    if it.marker_discardable and horizon is not None and now >= horizon:
                        removed += len(rs)
                        changed = True
                        continue
                    if it.marker_discardable and horizon is None:
                        out += encode_subset_batch(h, rs, new_horizon)
                        next_horizon.append(new_horizon)
                        changed = True
                        continue
                    if horizon is not None:
                        next_horizon.append(horizon)
                    out += it.raw
                    continue
                if it.aborted:
                    keep: list[Record] = []
                else:
                    keep = [r for r in rs if r.key is None or (
                        r.offset >= latest.get(r.key, -1)
                        and (r.value is not None or horizon is None or now < horizon))]
                removed += len(rs) - len(keep)
                tombstones = any(r.value is None and r.key is not None for r in keep)
                if not keep and not retain_empty:
                    changed = True
                    continue
                if tombstones and horizon is None:
                    out += encode_subset_batch(h, keep, new_horizon)
                    next_horizon.append(new_horizon)
                    changed = True
                    continue
                if tombstones and horizon is not None:
                    next_horizon.append(horizon)
                if len(keep) == len(rs):
                    out += it.raw
                else:
                    out += encode_subset_batch(h, keep)
                    changed = True
        if not changed:
            continue
        first = group[0]
        path = first.log_path.with_name(first.log_path.name + ".cleaned")
        write_synced(path, out)
        before = sum(s.size for s in group)
        txn = b"".join(s.txn_index.path.read_bytes() for s in group if s.txn_index.path.exists()) \
            if len(group) > 1 else b""
        if lg.replace_segments(group, path, txn):
            stats.segments_rewritten += len(group)
            stats.segments_merged += len(group) - 1
            stats.bytes_before += before
            stats.bytes_after += len(out)
            stats.records_removed += removed
    stats.end_offset = limit
    stats.next_horizon = min(next_horizon) if next_horizon else None
    return stats


class LogCleaner:
    """Cleans the compacted logs that need it, filthiest first (Kafka's grabFilthiestCompactedLog)."""

    def __init__(self, logs: Callable[[], dict[tuple[str, int], Log]],
                 delete_retention_ms: Callable[[str], int],
                 topic_config: Callable[[str], Mapping[str, Any]] | None = None,
                 clock: Callable[[], int] | None = None) -> None:
        self.logs = logs
        self.delete_retention_ms = delete_retention_ms
        self.topic_config = topic_config
        self.clock = clock or (lambda: time.time_ns() // 1_000_000)
        # In memory, as Kafka's cleaner-offset-checkpoint: after a restart every log is dirty again.
        self.checkpoints: dict[tuple[str, int], int] = {}
        self.horizons: dict[tuple[str, int], int] = {}

    def _config(self, topic: str) -> CleanerConfig:
        if self.topic_config is not None:
            cfg = CleanerConfig.from_topic_config(self.topic_config(topic))
        else:
            cfg = CleanerConfig()
        cfg.delete_retention_ms = self.delete_retention_ms(topic)
        return cfg

    def candidates(self, now: int) -> list[tuple[tuple[str, int], Log, CleanerConfig, LogToClean]]:
        """Logs to clean now, filthiest first."""
        out = []
        for tp, lg in list(self.logs().items()):
            if not lg.config.compact_enabled:
                continue
            try:
                cfg = self._config(tp[0])
                ltc = cleanable_range(lg, self.checkpoints.get(tp, lg.log_start_offset), cfg, now)
            except Exception:
                continue
            horizon = self.horizons.get(tp)
            due = horizon is not None and now >= horizon
            if (ltc.dirty_bytes > 0 and (ltc.need_compaction_now or ltc.cleanable_ratio > cfg.min_cleanable_ratio)) \
                    or due:
                out.append((tp, lg, cfg, ltc))
        out.sort(key=lambda x: x[3].cleanable_ratio, reverse=True)
        return out

    def run_once(self) -> CleanStats:
        total = CleanStats()
        now = self.clock()
        for tp, lg, cfg, ltc in self.candidates(now):
            try:
                st = clean_log(lg, delete_retention_ms=cfg.delete_retention_ms, now_ms=now,
                               first_dirty=ltc.first_dirty, config=cfg)
            except OSError as exc:  # a disk failure takes the log dir offline (KIP-112)
                if not lg.closed:
                    lg.storage_failure(exc, "cleaning")
                continue
            except Exception:
                log.exception("cleaning %(topic)s-%(partition)d failed", {"topic": tp[0], "partition": tp[1]})
                continue
            self.checkpoints[tp] = st.end_offset
            if st.next_horizon is None:
                self.horizons.pop(tp, None)
            else:
                self.horizons[tp] = st.next_horizon
            if st.segments_rewritten:
                log.info("cleaned %(topic)s-%(partition)d (dirty ratio %(cleanable_ratio).2f): "
                         "%(segments_rewritten)d segment(s) %(bytes_before)d -> %(bytes_after)d bytes, "
                         "%(records_removed)d records removed, %(segments_merged)d merged",
                         {"topic": tp[0], "partition": tp[1], "cleanable_ratio": ltc.cleanable_ratio,
                          "segments_rewritten": st.segments_rewritten, "bytes_before": st.bytes_before,
                          "bytes_after": st.bytes_after, "records_removed": st.records_removed,
                          "segments_merged": st.segments_merged})
                total.segments_rewritten += st.segments_rewritten
                total.bytes_before += st.bytes_before
                total.bytes_after += st.bytes_after
                total.records_removed += st.records_removed
                total.segments_merged += st.segments_merged
        return total
