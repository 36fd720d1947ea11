"""Offset and time index files."""

from __future__ import annotations

import bisect
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykbroker.storage.index import IndexFullError, OffsetIndex, TimeIndex

BASE = 1000


def _offset_entries(draw_offsets: list[int], draw_gaps: list[int]) -> list[tuple[int, int]]:
    offsets = sorted(set(draw_offsets))
    pos = 0
    out = []
    for off, gap in zip(offsets, draw_gaps, strict=False):
        pos += gap
        out.append((BASE + off, pos))
    return out


@settings(max_examples=60, deadline=None)
@given(
    offsets=st.lists(st.integers(0, 10_000), max_size=60),
    gaps=st.lists(st.integers(1, 5000), min_size=60, max_size=60),
    targets=st.lists(st.integers(BASE - 5, BASE + 10_005), min_size=1, max_size=20),
)
def test_offset_index_lookup_matches_bisect(offsets: list[int], gaps: list[int], targets: list[int]) -> None:
    entries = _offset_entries(offsets, gaps)
    keys = [o for o, _ in entries]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.index"
        idx = OffsetIndex(path, BASE, 8 * 100, writable=True)
        for off, pos in entries:
            idx.append(off, pos)

        def expected(t: int) -> tuple[int, int]:
            i = bisect.bisect_right(keys, t) - 1
            return entries[i] if i >= 0 else (BASE, 0)

        for t in targets:
            assert idx.lookup(t) == expected(t)
        idx.trim()  # now read-only via pread
        assert path.stat().st_size == 8 * len(entries)
        for t in targets:
            assert idx.lookup(t) == expected(t)
        reopened = OffsetIndex(path, BASE, 8 * 100, writable=False)
        assert reopened.entries == len(entries)
        for t in targets:
            assert reopened.lookup(t) == expected(t)


@settings(max_examples=60, deadline=None)
@given(
    stamps=st.lists(st.integers(0, 10**12), max_size=50),
    targets=st.lists(st.integers(-5, 10**12 + 5), min_size=1, max_size=20),
)
def test_time_index_lookup_matches_bisect(stamps: list[int], targets: list[int]) -> None:
    ts = sorted(set(stamps))
    entries = [(t, BASE + i * 3) for i, t in enumerate(ts)]
    with tempfile.TemporaryDirectory() as tmp:
        idx = TimeIndex(Path(tmp) / "x.timeindex", BASE, 12 * 100, writable=True)
        for t, off in entries:
            idx.maybe_append(t, off)
            idx.maybe_append(t, off)  # not increasing: ignored
        assert idx.entries == len(entries)
        for target in targets:
            i = bisect.bisect_right(ts, target) - 1
            assert idx.lookup(target) == (entries[i] if i >= 0 else (-1, BASE))
        idx.trim()
        for target in targets:
            i = bisect.bisect_right(ts, target) - 1
            assert idx.lookup(target) == (entries[i] if i >= 0 else (-1, BASE))


def test_active_index_reaches_the_file_on_sync_and_trim(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    idx = OffsetIndex(path, 0, 8 * 10 + 5, writable=True)
    assert idx.max_entries == 10  # rounded down to whole entries
    for i in range(1, 4):
        idx.append(i * 10, i * 100)
    # A crash now: the file holds a valid prefix (here nothing), which recovery rebuilds.
    assert path.stat().st_size == 0
    assert OffsetIndex(path, 0, 80, writable=False).entries == 0
    fd = idx.dup_fd()  # what a log flush fsyncs: every entry written first
    assert fd is not None
    os.close(fd)
    again = OffsetIndex(path, 0, 80, writable=False)
    assert (again.entries, again.last_entry()) == (3, (30, 300))
    idx.truncate_to(20)  # a cut reaches the file at once: no stale entry survives it
    assert path.stat().st_size == 8
    idx.append(25, 250)
    idx.trim()
    assert path.stat().st_size == 16 and not idx.writable
    again = OffsetIndex(path, 0, 80, writable=True)
    assert again.entries == 2 and again.lookup(30) == (25, 250)
    again.append(40, 400)
    assert again.lookup(45) == (40, 400)
    again.close()
    assert OffsetIndex(path, 0, 80, writable=False).last_entry() == (40, 400)


def test_zero_padded_index_from_a_preallocating_version_loads(tmp_path: Path) -> None:
    path = tmp_path / "p.index"
    path.write_bytes(struct.pack(">II", 10, 100) + struct.pack(">II", 20, 200) + bytes(8 * 8))
    idx = OffsetIndex(path, 0, 80, writable=True)
    assert idx.entries == 2 and idx.last_entry() == (20, 200)
    idx.append(30, 300)
    idx.close()
    assert path.stat().st_size == 24  # the padding is cut when the entries are written


def test_offset_index_full_and_ordering(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "b.index", 0, 16, writable=True)
    idx.append(1, 10)
    with pytest.raises(ValueError):
        idx.append(1, 20)
    with pytest.raises(ValueError):
        idx.append(2, 0)
    idx.append(2, 20)
    assert idx.is_full
    with pytest.raises(IndexFullError):
        idx.append(3, 30)


def test_truncate_to(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "c.index", 100, 800, writable=True)
    tidx = TimeIndex(tmp_path / "c.timeindex", 100, 1200, writable=True)
    for i in range(1, 11):
        idx.append(100 + i * 10, i * 1000)
        tidx.maybe_append(5000 + i, 100 + i * 10)
    idx.truncate_to(155)
    tidx.truncate_to(155)
    assert idx.entries == 5 and idx.last_entry() == (150, 5000)
    assert tidx.entries == 5 and tidx.last_entry() == (5005, 150)
    idx.truncate_to(150)
    assert idx.last_entry() == (140, 4000)
    idx.truncate_to(0)
    tidx.truncate_to(100)
    assert idx.entries == 0 and tidx.entries == 0
    assert idx.lookup(10**9) == (100, 0)
    assert tidx.lookup(10**9) == (-1, 100)


def test_time_index_first_entry_may_be_zero(tmp_path: Path) -> None:
    path = tmp_path / "d.timeindex"
    tidx = TimeIndex(path, 0, 120, writable=True)
    tidx.maybe_append(0, 0)
    tidx.maybe_append(5, 3)
    tidx.sync_to_file()
    with path.open("ab") as f:
        f.write(bytes(12 * 8))  # zero padded, as a preallocating version left it
    reopened = TimeIndex(path, 0, 120, writable=False)
    assert reopened.entries == 2
    assert reopened.lookup(4) == (0, 0)
    assert reopened.lookup(5) == (5, 3)


def test_time_index_keeps_slot_for_roll_entry(tmp_path: Path) -> None:
    tidx = TimeIndex(tmp_path / "e.timeindex", 0, 36, writable=True)
    tidx.maybe_append(1, 0)
    tidx.maybe_append(2, 1)
    assert tidx.is_full
    tidx.maybe_append(3, 2, skip_full_check=True)
    assert tidx.entries == 3
