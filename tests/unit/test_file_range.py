"""Fetch reads as file ranges (zero-copy fetch): the same batches as Log.read, and ranges that stay
valid, or report themselves stale, when the segment is deleted, replaced or truncated meanwhile."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from pykbroker.protocol.file_range import FileRange, SegmentFile, StaleRange
from pykbroker.protocol.records import build_batch, iter_batches, validate_for_append
from pykbroker.storage.log import Log, LogStartOffsetIncrementReason
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.segment import FILE_RANGE_MIN_BYTES

T0 = 1_700_000_000_000

DELETE_RECORDS = LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION


def _append(lg: Log, n: int, value_size: int, rng: random.Random) -> None:
    buf = bytearray(build_batch([(b"k", rng.randbytes(value_size), [])] * n, timestamp_ms=T0))
    hs = validate_for_append(buf, max_batch_bytes=10**8, now_ms=T0, timestamp_type=0)
    lg.append(buf, hs)  # type: ignore[arg-type]


def _bytes(records: bytes | FileRange) -> bytes:
    return records.read() if isinstance(records, FileRange) else records


@pytest.fixture
def logs() -> Iterator[list[Log]]:
    opened: list[Log] = []
    yield opened
    for lg in opened:
        if not lg.closed:
            lg.close()


def _open(path: Path, config: LogConfig, logs: list[Log]) -> Log:
    lg = Log.open(path, config, recover=False, now_ms=lambda: T0)
    logs.append(lg)
    return lg


def _fill(lg: Log, rng: random.Random, batches: int) -> None:
    for _ in range(batches):
        # Mostly small batches, some larger than a scan chunk and than FILE_RANGE_MIN_BYTES.
        size = rng.choice([30, 200, 1000, 5000, 30_000, 90_000])
        _append(lg, rng.randint(1, 4), size, rng)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_read_slice_returns_what_read_returns(tmp_path: Path, logs: list[Log], seed: int) -> None:
    rng = random.Random(seed)
    lg = _open(tmp_path / "t-0", LogConfig(segment_bytes=2_000_000, index_interval_bytes=4096), logs)
    _fill(lg, rng, 120)
    assert len(lg.segments) > 1
    leo = lg.log_end_offset
    ranges = 0
    for _ in range(400):
        offset = rng.randrange(0, leo + 1)
        max_bytes = rng.choice([0, 100, 4000, 20_000, 70_000, 300_000, 1_048_576, 3_000_000])
        max_offset = rng.choice([None, leo, rng.randrange(offset, leo + 1)])
        min_one = rng.random() < 0.7
        want = lg.read(offset, max_bytes, max_offset=max_offset, min_one_message=min_one)
        got = lg.read_slice(offset, max_bytes, max_offset=max_offset, min_one_message=min_one)
        data = _bytes(got.records)
        assert data == want.records, (offset, max_bytes, max_offset, min_one)
        assert len(got.records) == len(want.records)
        assert got.first_batch_too_large == want.first_batch_too_large
        if want.records:
            assert got.first_offset == want.first_offset
            assert got.next_offset >= want.next_offset
            # The bound is tight: nothing between it and what was returned.
            assert got.next_offset <= max(lg.log_end_offset, want.next_offset)
            assert [h.size for h in iter_batches(data)] and sum(h.size for h in iter_batches(data)) == len(data)
        if isinstance(got.records, FileRange):
            ranges += 1
            assert got.records.length >= FILE_RANGE_MIN_BYTES
    assert ranges > 20  # the long reads did become file ranges


def _long_range(lg: Log) -> FileRange:
    got = lg.read_slice(0, 10_000_000)
    assert isinstance(got.records, FileRange), got
    return got.records


def test_range_survives_retention_deleting_its_segment(tmp_path: Path, logs: list[Log]) -> None:
    rng = random.Random(7)
    lg = _open(tmp_path / "t-0", LogConfig(segment_bytes=300_000), logs)
    for _ in range(12):
        _append(lg, 2, 60_000, rng)
    rng_range = _long_range(lg)
    expected = lg.read(0, 10_000_000).records
    first = lg.segments[0]
    lg.delete_records_before(lg.segments[1].base_offset, reason=DELETE_RECORDS)
    assert first not in lg.segments and not first.log_path.exists()
    assert rng_range.read() == expected  # the unlinked inode is still readable through the range


def test_range_survives_the_cleaner_replacing_its_segment(tmp_path: Path, logs: list[Log]) -> None:
    rng = random.Random(8)
    lg = _open(tmp_path / "t-0", LogConfig(segment_bytes=300_000), logs)
    for _ in range(12):
        _append(lg, 2, 60_000, rng)
    rng_range = _long_range(lg)
    expected = lg.read(0, 10_000_000).records
    old = lg.segments[0]
    cleaned = tmp_path / "cleaned"
    first_batch = next(iter_batches(expected))
    cleaned.write_bytes(expected[: first_batch.size])  # a compacted copy: fewer bytes under the same name
    assert lg.replace_segment(old, cleaned)
    assert lg.segments[0].size == first_batch.size
    assert rng_range.read() == expected


def test_truncation_into_a_range_makes_it_stale(tmp_path: Path, logs: list[Log]) -> None:
    rng = random.Random(9)
    lg = _open(tmp_path / "t-0", LogConfig(), logs)
    for _ in range(6):
        _append(lg, 1, 40_000, rng)
    whole = _long_range(lg)
    head = lg.read_slice(0, 90_000, min_one_message=True).records  # the first two batches
    assert isinstance(head, FileRange)
    lg.truncate_to(3)
    with pytest.raises(StaleRange):
        whole.read()
    assert head.read()  # the cut was past this range: still good
    _append(lg, 3, 40_000, rng)  # same length again, different bytes: still refused
    with pytest.raises(StaleRange):
        whole.check()


def test_descriptor_closes_with_the_last_holder(tmp_path: Path, logs: list[Log]) -> None:
    rng = random.Random(10)
    lg = _open(tmp_path / "t-0", LogConfig(), logs)
    for _ in range(3):
        _append(lg, 1, 40_000, rng)
    held = _long_range(lg)
    fd = held.file.fd
    lg.close()
    os.fstat(fd)  # still open: a response holds it
    del held
    with pytest.raises(OSError):
        os.fstat(fd)


def test_short_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    path.write_bytes(b"x" * 100)
    f = SegmentFile(os.open(path, os.O_RDONLY), path.name)
    r = FileRange(f, 50, 80)
    with pytest.raises(StaleRange):
        r.read()
    assert FileRange(f, 10, 20).read() == b"x" * 20
    assert len(r) == 80 and r


def test_repeated_read_at_one_offset_reads_no_header_again(tmp_path: Path, logs: list[Log],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer with many partitions asks again from the same offset for each partition its last
    response had no room for: the batch header found last time answers without a read."""
    lg = _open(tmp_path / "t-0", LogConfig(), logs)
    rng = random.Random(11)
    for _ in range(20):
        _append(lg, 1, 1000, rng)
    first = lg.read_slice(5, 500, min_one_message=False)  # no room for the batch at 5
    assert first.records == b""
    reads: list[int] = []
    real = os.pread

    def counting(fd: int, n: int, pos: int) -> bytes:
        reads.append(n)
        return real(fd, n, pos)

    monkeypatch.setattr(os, "pread", counting)
    again = lg.read_slice(5, 500, min_one_message=False)
    assert again.records == b"" and reads == []
    whole = lg.read_slice(5, 1 << 20, min_one_message=False)
    assert _bytes(whole.records) == _bytes(lg.read_slice(5, 1 << 20, min_one_message=True).records)
    assert whole.first_offset == 5 and whole.next_offset == 20


def test_truncation_forgets_the_remembered_header(tmp_path: Path, logs: list[Log]) -> None:
    """After a follower's truncation new batches take the old positions: a read at a remembered
    offset must find the new batch, not the header remembered from before."""
    lg = _open(tmp_path / "t-0", LogConfig(), logs)
    rng = random.Random(12)
    for _ in range(6):
        _append(lg, 1, 300, rng)
    before = _bytes(lg.read_slice(5, 1 << 20).records)  # remembers the header of the batch at 5
    lg.truncate_to(4)
    _append(lg, 3, 700, rng)  # one batch of three records at offset 4, over where 4 and 5 were
    after = lg.read_slice(5, 1 << 20)
    data = _bytes(after.records)
    assert data != before
    assert [(h.base_offset, h.last_offset) for h in iter_batches(data)] == [(4, 6)]
    assert after.next_offset == 7
