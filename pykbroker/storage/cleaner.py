"""Log compaction: keep the latest record per key in the inactive segments of compacted topics.

For a log with ``cleanup.policy`` containing ``compact`` the cleaner builds a map from key
to the offset of its latest record over every inactive segment (the active segment is
never touched, and records it supersedes stay until it rolls), then rewrites each inactive
segment keeping only those latest records, records without a key, and control batches.
Tombstones (a key with a null value) are kept until ``delete.retention.ms`` after their
timestamp.  Batches keep their base offset, last offset delta, producer fields and leader
epoch, so offsets never change and positions between kept records stay valid.

Crash safety: a cleaned segment is written to ``<base>.log.cleaned`` and fsynced, then
:meth:`Log.replace_segment` renames it over the original (one atomic rename).  A crash
before the rename leaves a stray ``.cleaned`` file that opening the log deletes; after it,
the new segment, whose indexes are rebuilt.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

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
from pykbroker.storage.segment import Segment

log = logging.getLogger("pykbroker.cleaner")

_HEADER = struct.Struct(">qiibIhiqqqhii")
_ATTR_COMPRESSION_MASK = 0x07
_CRC_OFFSET = 17


@dataclass
class CleanStats:
    segments_rewritten: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    records_removed: int = 0


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


def encode_subset_batch(h: BatchHeader, records: list[Record]) -> bytes:
    """A batch with ``h``'s header fields holding only ``records`` (uncompressed, offsets kept)."""
    base_ts = records[0].timestamp
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
    attributes = h.attributes & ~_ATTR_COMPRESSION_MASK
    _HEADER.pack_into(out, 0, h.base_offset, BATCH_HEADER_SIZE - LOG_OVERHEAD + len(body), h.partition_leader_epoch,
                      2, 0, attributes, h.last_offset_delta, base_ts, max(r.timestamp for r in records),
                      h.producer_id, h.producer_epoch, h.base_sequence, len(records))
    out += body
    struct.pack_into(">I", out, _CRC_OFFSET, batch_crc(out, 0, len(out)))
    return bytes(out)


def _batches(seg: Segment) -> list[tuple[BatchHeader, bytes]]:
    out = []
    for h in seg.scan(0):
        out.append((h, seg.read_batch(h)))
    return out


def clean_log(lg: Log, *, delete_retention_ms: int, now_ms: int | None = None) -> CleanStats:
    """Compact the inactive segments of one log (blocking: run it off the event loop)."""
    now = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    stats = CleanStats()
    segments = lg.inactive_segments()
    if not segments:
        return stats
    latest: dict[bytes, int] = {}
    decoded: dict[int, list[tuple[BatchHeader, bytes, list[Record] | None]]] = {}
    for seg in segments:
        items: list[tuple[BatchHeader, bytes, list[Record] | None]] = []
        for h, raw in _batches(seg):
            if h.is_control:
                items.append((h, raw, None))
                continue
            try:
                recs = decode_records(raw)
            except InvalidRecords:
                items.append((h, raw, None))
                continue
            for r in recs:
                if r.key is not None:
                    latest[r.key] = r.offset
            items.append((h, raw, recs))
        decoded[seg.base_offset] = items
    horizon = now - delete_retention_ms
    for seg in segments:
        out = bytearray()
        removed = 0
        for h, raw, rs in decoded[seg.base_offset]:
            if rs is None:
                out += raw
                continue
            keep = [r for r in rs if r.key is None or (
                latest.get(r.key) == r.offset and not (r.value is None and r.timestamp < horizon))]
            removed += len(rs) - len(keep)
            if len(keep) == len(rs):
                out += raw
            elif keep:
                out += encode_subset_batch(h, keep)
        if removed == 0:
            continue
        path = seg.log_path.with_name(seg.log_path.name + ".cleaned")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, out)
            os.fsync(fd)
        finally:
            os.close(fd)
        before = seg.size
        if lg.replace_segment(seg, path):
            stats.segments_rewritten += 1
            stats.bytes_before += before
            stats.bytes_after += len(out)
            stats.records_removed += removed
    return stats


class LogCleaner:
    """Cleans every compacted log whose inactive segments changed since its last clean."""

    def __init__(self, logs: Callable[[], dict[tuple[str, int], Log]],
                 delete_retention_ms: Callable[[str], int]) -> None:
        self.logs = logs
        self.delete_retention_ms = delete_retention_ms
        self._seen: dict[tuple[str, int], tuple[tuple[int, int], ...]] = {}
        self._passes = 0

    def run_once(self) -> CleanStats:
        total = CleanStats()
        self._passes += 1
        for tp, lg in list(self.logs().items()):
            if not lg.config.compact_enabled:
                continue
            try:
                shape = tuple((s.base_offset, s.size) for s in lg.inactive_segments())
            except Exception:
                continue
            # Re-clean when segments rolled, and now and then for tombstones coming of age.
            if self._seen.get(tp) == shape and self._passes % 20:
                continue
            try:
                st = clean_log(lg, delete_retention_ms=self.delete_retention_ms(tp[0]))
            except Exception:
                log.exception("cleaning %s-%d failed", *tp)
                continue
            self._seen[tp] = tuple((s.base_offset, s.size) for s in lg.inactive_segments())
            if st.segments_rewritten:
                log.info("cleaned %s-%d: %d segment(s) %d -> %d bytes, %d records removed", tp[0], tp[1],
                         st.segments_rewritten, st.bytes_before, st.bytes_after, st.records_removed)
                total.segments_rewritten += st.segments_rewritten
                total.bytes_before += st.bytes_before
                total.bytes_after += st.bytes_after
                total.records_removed += st.records_removed
        return total
