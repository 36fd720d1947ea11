"""A single log segment: appends, sparse indexes, lookups and recovery."""

from __future__ import annotations

import os
from pathlib import Path

from pykbroker.protocol.records import assign_offsets, build_batch, iter_batches, validate_for_append
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.segment import Segment, filename_prefix, parse_base_offset

T0 = 1_700_000_000_000


def _append(seg: Segment, offset: int, n: int, ts: int, value: bytes = b"v" * 50) -> int:
    buf = bytearray(build_batch([(b"k", value, [])] * n, timestamp_ms=ts))
    hs = validate_for_append(buf, max_batch_bytes=10**7, now_ms=ts, timestamp_type=0)
    nxt = assign_offsets(buf, hs, offset)
    seg.append(buf, last_offset=nxt - 1, max_timestamp=hs[0].max_timestamp, offset_of_max_timestamp=offset)
    return nxt


def test_names() -> None:
    assert filename_prefix(42) == "00000000000000000042"
    assert parse_base_offset("00000000000000000042.timeindex") == 42
    assert parse_base_offset("foo.log") is None


def test_append_index_and_translate(tmp_path: Path) -> None:
    cfg = LogConfig(index_interval_bytes=200)
    seg = Segment(tmp_path, 100, cfg, active=True, now_ms=T0)
    off = 100
    for i in range(40):
        off = _append(seg, off, 2, T0 + i)
    assert seg.size == os.path.getsize(seg.log_path)
    assert 0 < seg.offset_index.entries < 40
    assert seg.max_timestamp == T0 + 39
    for target in range(100, off):
        h = seg.translate_offset(target)
        assert h is not None and h.base_offset <= target <= h.last_offset
    assert seg.translate_offset(off) is None
    assert seg.read_next_offset() == off
    # Entries point at batch starts.
    for i in range(seg.offset_index.entries):
        rel, pos = seg.offset_index._entry(i)
        h = next(seg.scan(pos))
        assert h.last_offset == 100 + rel
    seg.close()
    assert seg.offset_index.path.stat().st_size == 8 * seg.offset_index.entries


def test_read_and_timestamp_lookup(tmp_path: Path) -> None:
    seg = Segment(tmp_path, 0, LogConfig(index_interval_bytes=0), active=True, now_ms=T0)
    off = 0
    for i in range(10):
        off = _append(seg, off, 3, T0 + 10 * i)
    r = seg.read(4, 10_000, max_offset=None, min_one_message=True)
    assert r is not None and r.first_offset == 3 and r.next_offset == 30
    r = seg.read(4, 10_000, max_offset=9, min_one_message=True)
    assert r is not None and (r.first_offset, r.next_offset) == (3, 9)
    assert [h.base_offset for h in iter_batches(r.records, verify_crc=True)] == [3, 6]
    assert seg.find_offset_by_timestamp(T0 + 15, 0) == (T0 + 20, 6)
    assert seg.find_offset_by_timestamp(T0 + 20, 0) == (T0 + 20, 6)
    assert seg.find_offset_by_timestamp(T0 + 20, 7) == (T0 + 20, 7)
    assert seg.find_offset_by_timestamp(T0 + 91, 0) is None
    assert seg.offset_of_max_timestamp_record() == (T0 + 90, 27)


def test_should_roll(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=1000, segment_ms=100)
    seg = Segment(tmp_path, 0, cfg, active=True, now_ms=T0)
    assert not seg.should_roll(messages_size=5000, max_timestamp=T0, max_offset=0, now_ms=T0)  # empty
    _append(seg, 0, 1, T0)
    assert not seg.should_roll(messages_size=100, max_timestamp=T0 + 100, max_offset=1, now_ms=T0)
    assert seg.should_roll(messages_size=100, max_timestamp=T0 + 101, max_offset=1, now_ms=T0)
    assert seg.should_roll(messages_size=1000, max_timestamp=T0, max_offset=1, now_ms=T0)
    assert seg.should_roll(messages_size=1, max_timestamp=T0, max_offset=2**31, now_ms=T0)


def test_recover_truncates_garbage_and_rebuilds(tmp_path: Path) -> None:
    cfg = LogConfig(index_interval_bytes=0)
    seg = Segment(tmp_path, 0, cfg, active=True, now_ms=T0)
    off = 0
    for i in range(5):
        off = _append(seg, off, 2, T0 + i)
    good_size = seg.size
    entries = seg.offset_index.entries
    seg.close()
    with open(seg.log_path, "ab") as f:
        f.write(b"\x00" * 7 + os.urandom(100))
    seg = Segment(tmp_path, 0, cfg, active=True, now_ms=T0)
    truncated, nxt = seg.recover()
    assert truncated == 107 and nxt == off
    assert seg.size == good_size == os.path.getsize(seg.log_path)
    assert seg.offset_index.entries == entries
    assert seg.max_timestamp == T0 + 4
    seg.close()
