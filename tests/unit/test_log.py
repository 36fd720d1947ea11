"""Partition log: rolling, reads, timestamps, retention, truncation, flushing and recovery."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pykbroker.protocol.records import (
    RECORD_LIST_TOO_LARGE,
    InvalidRecords,
    build_batch,
    decode_records,
    iter_batches,
    validate_for_append,
)
from pykbroker.storage.log import AppendResult, Log, OffsetOutOfRange
from pykbroker.storage.log_config import LogConfig

T0 = 1_700_000_000_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def append(lg: Log, n: int = 1, ts: int = T0, value: bytes = b"x" * 40, **kw: object) -> AppendResult:
    buf = bytearray(build_batch([(b"k", value, [])] * n, timestamp_ms=ts))
    hs = validate_for_append(buf, max_batch_bytes=10**7, now_ms=ts, timestamp_type=0)
    return lg.append(buf, hs, **kw)  # type: ignore[arg-type]


def offsets_in(data: bytes) -> list[int]:
    return [
        r.offset
        for h in iter_batches(data, verify_crc=True)
        for r in decode_records(data[h.position : h.position + h.size])
    ]


def read_all(lg: Log) -> list[int]:
    out: list[int] = []
    off = lg.log_start_offset
    while off < lg.log_end_offset:
        r = lg.read(off, 10_000)
        if not r.records:
            break
        out += [o for o in offsets_in(r.records) if o >= off]
        off = r.next_offset
    return out


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def opened() -> Iterator[list[Log]]:
    logs: list[Log] = []
    yield logs
    for lg in logs:
        lg.close()


def open_log(path: Path, config: LogConfig, clock: Clock, opened: list[Log], **kw: object) -> Log:
    lg = Log.open(path, config, recover=kw.pop("recover", False), now_ms=clock, **kw)  # type: ignore[arg-type]
    opened.append(lg)
    return lg


# --- appends and rolling ---------------------------------------------------------------------------


def test_append_assigns_offsets(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(), clock, opened)
    r1 = append(lg, 3)
    r2 = append(lg, 2, ts=T0 + 5)
    assert (r1.first_offset, r1.last_offset, r1.log_append_time_ms, r1.log_start_offset) == (0, 2, -1, 0)
    assert (r2.first_offset, r2.last_offset, r2.max_timestamp) == (3, 4, T0 + 5)
    assert lg.log_end_offset == 5
    assert (tmp_path / "t-0" / "00000000000000000000.log").exists()
    assert read_all(lg) == list(range(5))


def test_roll_by_size(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=1000), clock, opened)
    for _ in range(30):
        append(lg, 2)
    segs = lg.segments
    assert len(segs) > 3
    assert all(s.size <= 1000 for s in segs)
    assert [s.name for s in segs][1] == f"{segs[1].base_offset:020d}.log"
    assert read_all(lg) == list(range(60))
    with pytest.raises(InvalidRecords) as info:
        append(lg, 1, value=b"y" * 2000)
    assert info.value.error_code == RECORD_LIST_TOO_LARGE


def test_roll_by_time_uses_record_timestamps(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_ms=1000), clock, opened)
    append(lg, ts=T0)
    append(lg, ts=T0 + 1000)
    assert len(lg.segments) == 1
    append(lg, ts=T0 + 1001)
    assert [s.base_offset for s in lg.segments] == [0, 2]


def test_roll_by_time_without_timestamps_uses_clock(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_ms=1000), clock, opened)
    append(lg, ts=-1)
    clock.now += 1001
    append(lg, ts=-1)
    assert [s.base_offset for s in lg.segments] == [0, 1]


def test_roll_by_index_full(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_index_bytes=8 * 3, index_interval_bytes=0), clock, opened)
    for i in range(10):
        append(lg, ts=T0 + i)
    segs = lg.segments
    assert len(segs) >= 3
    assert all(s.offset_index.entries <= 3 for s in segs)
    assert read_all(lg) == list(range(10))


def test_explicit_roll_and_empty_roll_noop(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(), clock, opened)
    lg.roll()
    assert len(lg.segments) == 1
    append(lg, 2)
    lg.roll()
    lg.roll()
    assert [s.base_offset for s in lg.segments] == [0, 2]
    # The sealed segment's index files are trimmed to their real size.
    seg0 = lg.segments[0]
    assert seg0.offset_index.path.stat().st_size == 8 * seg0.offset_index.entries


def test_log_append_time(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(message_timestamp_type="LogAppendTime"), clock, opened)
    clock.now = T0 + 777
    r = append(lg, 3, ts=T0)
    assert r.log_append_time_ms == T0 + 777 and r.max_timestamp == T0 + 777
    data = lg.read(0, 10_000).records
    (h,) = list(iter_batches(data, verify_crc=True))
    assert h.timestamp_type == 1 and h.max_timestamp == T0 + 777
    assert [x.timestamp for x in decode_records(data)] == [T0 + 777] * 3
    assert lg.offset_for_timestamp(T0 + 1) == (0, T0 + 777)


# --- reads -------------------------------------------------------------------------------------------


def test_read_semantics(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=600), clock, opened)
    for i in range(20):
        append(lg, 3, ts=T0 + i)
    batch_size = lg.segments[0].scan().__next__().size
    # Mid-batch positions get the whole batch.
    r = lg.read(4, batch_size)
    assert (r.first_offset, r.next_offset) == (3, 6)
    # max_bytes limits to whole batches; at least one with min_one_message.
    r = lg.read(0, 2 * batch_size + 10)
    assert len(r.records) == 2 * batch_size and r.next_offset == 6
    r = lg.read(0, 1)
    assert len(r.records) == batch_size
    r = lg.read(0, 1, min_one_message=False)
    assert r.records == b"" and r.first_batch_too_large
    # Reads never span segments but continue across them.
    seg1 = lg.segments[1].base_offset
    r = lg.read(0, 10**6)
    assert r.next_offset == seg1
    r = lg.read(seg1, 10**6)
    assert r.first_offset == seg1
    # High watermark bound.
    r = lg.read(0, 10**6, max_offset=6)
    assert r.next_offset == 6
    assert lg.read(6, 10**6, max_offset=6).records == b""
    assert lg.read(8, 10**6, max_offset=6).records == b""
    # End and out of range.
    end = lg.read(lg.log_end_offset, 100)
    assert end.records == b"" and end.first_offset == lg.log_end_offset == 60
    with pytest.raises(OffsetOutOfRange):
        lg.read(61, 100)
    with pytest.raises(OffsetOutOfRange):
        lg.read(-1, 100)
    assert read_all(lg) == list(range(60))


# --- timestamps ----------------------------------------------------------------------------------------


def test_offset_for_timestamp(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=500, index_interval_bytes=0), clock, opened)
    assert lg.offset_for_timestamp(T0) is None
    assert lg.max_timestamp_and_offset() is None
    for i in range(20):
        buf = bytearray(
            build_batch(
                [(b"k", b"v", [])] * 3,
                timestamp_ms=T0,
                timestamps=[T0 + 100 * i, T0 + 100 * i + 50, T0 + 100 * i + 10],
            )
        )
        lg.append(buf, validate_for_append(buf, max_batch_bytes=10**6, now_ms=T0, timestamp_type=0))
    assert len(lg.segments) > 2
    assert lg.offset_for_timestamp(0) == (0, T0)
    assert lg.offset_for_timestamp(T0 + 1) == (1, T0 + 50)
    assert lg.offset_for_timestamp(T0 + 1020) == (31, T0 + 1050)  # record-exact inside the batch
    assert lg.offset_for_timestamp(T0 + 1051) == (33, T0 + 1100)
    assert lg.offset_for_timestamp(T0 + 1950) == (58, T0 + 1950)
    assert lg.offset_for_timestamp(T0 + 1951) is None
    assert lg.max_timestamp_and_offset() == (58, T0 + 1950)
    lg.delete_records_before(31)
    assert lg.offset_for_timestamp(0) == (31, T0 + 1050)


# --- retention and deletion --------------------------------------------------------------------------------


def test_retention_by_time(tmp_path: Path, clock: Clock, opened: list[Log], caplog: pytest.LogCaptureFixture) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=500, retention_ms=1000), clock, opened)
    for i in range(12):
        append(lg, 2, ts=T0 + 100 * i)
    segs = lg.segments
    assert len(segs) >= 3
    caplog.set_level(logging.INFO, logger="pykbroker.storage.log")
    # now - largest_timestamp > retention for the first segment only.
    now = segs[0].max_timestamp + 1001
    deleted = lg.apply_retention(now)
    assert deleted == [segs[0].name]
    assert lg.log_start_offset == segs[1].base_offset
    assert not segs[0].log_path.exists()
    assert sum("retention time" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(OffsetOutOfRange):
        lg.read(0, 100)
    # Everything expired: the log rolls, keeps an empty active segment at the LEO.
    deleted = lg.apply_retention(T0 + 10**9)
    assert len(deleted) == len(segs) - 1
    assert [s.base_offset for s in lg.segments] == [24]
    assert lg.log_start_offset == lg.log_end_offset == 24
    assert lg.read(24, 100).records == b""
    append(lg)
    assert read_all(lg) == [24]


def test_retention_respects_high_watermark_and_policy(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    cfg = LogConfig(segment_bytes=500, retention_ms=0, cleanup_policy="compact")
    lg = open_log(tmp_path / "t-0", cfg, clock, opened)
    for _ in range(12):
        append(lg, 2)
    assert lg.apply_retention(T0 + 10**9) == []
    lg.update_config(LogConfig(segment_bytes=500, retention_ms=0, cleanup_policy="compact,delete"))
    hw = lg.segments[2].base_offset
    deleted = lg.apply_retention(T0 + 10**9, high_watermark=hw)
    assert len(deleted) == 2 and lg.log_start_offset == hw


def test_retention_by_size(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=500, retention_bytes=1200, retention_ms=-1), clock, opened)
    for _ in range(20):
        append(lg, 2)
    before = lg.size_bytes
    deleted = lg.apply_retention(T0)
    assert deleted
    assert lg.size_bytes <= before
    # Deleted just enough whole segments: dropping one more would go under the limit.
    assert lg.size_bytes - lg.segments[0].size < 1200 <= lg.size_bytes
    assert read_all(lg) == list(range(lg.log_start_offset, 40))


def test_delete_records_before(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=500), clock, opened)
    for _ in range(12):
        append(lg, 2)
    seg2 = lg.segments[2].base_offset
    assert lg.delete_records_before(seg2 + 1) == seg2 + 1
    assert lg.segments[0].base_offset == seg2
    r = lg.read(seg2 + 1, 100)  # mid-batch read at the log start offset
    assert r.first_offset == seg2
    with pytest.raises(OffsetOutOfRange):
        lg.read(seg2, 100)
    assert lg.delete_records_before(3) == seg2 + 1  # never moves backwards
    with pytest.raises(OffsetOutOfRange):
        lg.delete_records_before(25)
    with pytest.raises(OffsetOutOfRange):
        lg.delete_records_before(20, high_watermark=10)
    assert lg.delete_records_before(24) == 24
    assert lg.read(24, 100).records == b""


def test_truncate_to(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=500), clock, opened)
    for i in range(12):
        append(lg, 2, ts=T0 + i)
    lg.truncate_to(9)  # inside the batch [8, 9]: the whole batch goes (Kafka sets LEO to the target)
    assert lg.log_end_offset == 9
    assert read_all(lg) == list(range(8))
    assert all(s.base_offset <= 9 for s in lg.segments)
    r = append(lg, 1, ts=T0 + 50)
    assert r.first_offset == 9
    assert lg.max_timestamp_and_offset() == (9, T0 + 50)
    lg.truncate_to(0)
    assert lg.log_end_offset == 0 and read_all(lg) == []
    assert append(lg).first_offset == 0


def test_delete(tmp_path: Path, clock: Clock) -> None:
    lg = Log.open(tmp_path / "t-0", LogConfig(), recover=False, now_ms=clock)
    append(lg)
    lg.delete()
    assert not (tmp_path / "t-0").exists()


# --- flushing ------------------------------------------------------------------------------------------------


def test_needs_flush_and_recovery_point(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(flush_messages=5, flush_ms=1000), clock, opened)
    assert lg.recovery_point == 0 and not lg.needs_flush(clock.now)
    append(lg, 3)
    assert not lg.needs_flush(clock.now)
    assert lg.needs_flush(clock.now + 1000)
    append(lg, 2)
    assert lg.needs_flush(clock.now)
    lg.flush()
    assert lg.recovery_point == 5 and not lg.needs_flush(clock.now + 10**6)
    append(lg)
    lg.roll()
    assert lg.needs_flush(clock.now)  # a rolled segment is not yet durable (Kafka flushes on roll)


def test_flush_from_another_thread_while_appending(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=4000), clock, opened)
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                lg.flush()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=flusher)
    t.start()
    try:
        for _ in range(300):
            append(lg, 2)
    finally:
        stop.set()
        t.join(timeout=10)
    assert not errors and not t.is_alive()
    lg.flush()
    assert lg.recovery_point == lg.log_end_offset == 600
    assert read_all(lg) == list(range(600))


# --- recovery -----------------------------------------------------------------------------------------------------


def _populate(path: Path, clock: Clock, config: LogConfig, n: int = 20) -> tuple[list[int], list[int]]:
    """Write n 2-record batches, close uncleanly-ish (files left as a crash would), return sizes."""
    lg = Log.open(path, config, recover=False, now_ms=clock)
    for i in range(n):
        append(lg, 2, ts=T0 + i)
    sizes = [s.size for s in lg.segments]
    bases = [s.base_offset for s in lg.segments]
    lg.close()
    return bases, sizes


def test_recovery_truncates_torn_tail(
    tmp_path: Path, clock: Clock, opened: list[Log], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = LogConfig(segment_bytes=800, index_interval_bytes=0)
    path = tmp_path / "t-0"
    bases, sizes = _populate(path, clock, cfg)
    last = path / f"{bases[-1]:020d}.log"
    batch = os.path.getsize(last) // ((40 - bases[-1]) // 2)
    # Cut the last batch in half (torn write).
    os.truncate(last, sizes[-1] - batch // 2)
    caplog.set_level(logging.WARNING, logger="pykbroker.storage.log")
    lg = open_log(path, cfg, clock, opened, recover=True)
    assert lg.log_end_offset == 38
    assert read_all(lg) == list(range(38))
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"truncated {sizes[-1] - batch // 2 - (sizes[-1] - batch)} bytes" in m for m in msgs)
    assert append(lg).first_offset == 38
    assert read_all(lg) == list(range(39))


def test_recovery_of_garbage_appended(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    cfg = LogConfig(segment_bytes=800)
    path = tmp_path / "t-0"
    bases, _ = _populate(path, clock, cfg)
    last = path / f"{bases[-1]:020d}.log"
    with open(last, "ab") as f:
        f.write(b"\0" * 4096)  # the classic "file grew but blocks were never written"
    lg = open_log(path, cfg, clock, opened, recover=True)
    assert lg.log_end_offset == 40
    assert os.path.getsize(last) == lg.segments[-1].size


def test_recovery_of_corrupted_middle_batch_drops_later_segments(
    tmp_path: Path, clock: Clock, opened: list[Log]
) -> None:
    cfg = LogConfig(segment_bytes=800)
    path = tmp_path / "t-0"
    bases, _ = _populate(path, clock, cfg)
    assert len(bases) >= 3
    victim = path / f"{bases[1]:020d}.log"
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF  # flip a byte inside the last batch of the second segment
    victim.write_bytes(bytes(data))
    lg = open_log(path, cfg, clock, opened, recover=True, recovery_point=bases[1])
    # A prefix survives: everything before the corrupt batch.
    assert read_all(lg) == list(range(lg.log_end_offset))
    assert lg.log_end_offset == bases[2] - 2
    assert [s.base_offset for s in lg.segments] == bases[:2]
    assert not (path / f"{bases[2]:020d}.log").exists()
    assert lg.recovery_point == lg.log_end_offset


def test_recovery_point_limits_scan(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    cfg = LogConfig(segment_bytes=800)
    path = tmp_path / "t-0"
    bases, _ = _populate(path, clock, cfg)
    victim = path / f"{bases[0]:020d}.log"
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF
    victim.write_bytes(bytes(data))
    # The first segment is below the recovery point: it is trusted, not rescanned.
    lg = open_log(path, cfg, clock, opened, recover=True, recovery_point=bases[-1])
    assert lg.log_end_offset == 40


def test_torn_and_missing_index(
    tmp_path: Path, clock: Clock, opened: list[Log], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = LogConfig(segment_bytes=800, index_interval_bytes=0)
    path = tmp_path / "t-0"
    bases, _ = _populate(path, clock, cfg)
    first_index = path / f"{bases[0]:020d}.index"
    entries = first_index.stat().st_size // 8
    # Torn write: partial entry with garbage pointing past the end of the log.
    with open(first_index, "ab") as f:
        f.write(b"\xff\xff\xff\x7f\xff\xff")
    (path / f"{bases[1]:020d}.index").unlink()
    (path / f"{bases[1]:020d}.timeindex").unlink()
    active_index = path / f"{bases[-1]:020d}.index"
    active_index.write_bytes(os.urandom(37))
    (path / "00000000000000000000.log.deleted").write_bytes(b"x")
    (path / "00000000000000000007.index.swap").write_bytes(b"x")
    (path / "00000000000009999999.index").write_bytes(b"x")  # orphan
    caplog.set_level(logging.WARNING, logger="pykbroker.storage.log")
    lg = open_log(path, cfg, clock, opened, recover=True, recovery_point=bases[-1])
    assert any("Rebuilding index" in r.getMessage() for r in caplog.records)
    assert lg.segments[0].offset_index.entries == entries
    assert lg.segments[1].offset_index.entries > 0
    assert not (path / "00000000000000000000.log.deleted").exists()
    assert not (path / "00000000000000000007.index.swap").exists()
    assert not (path / "00000000000009999999.index").exists()
    assert lg.log_end_offset == 40
    for off in range(40):
        assert lg.read(off, 1).first_offset in (off, off - 1)
    assert lg.offset_for_timestamp(T0 + 7) == (14, T0 + 7)


def test_clean_reopen_keeps_everything(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    cfg = LogConfig(segment_bytes=800, index_interval_bytes=100)
    path = tmp_path / "t-0"
    _populate(path, clock, cfg)
    lg = open_log(path, cfg, clock, opened, recover=False, log_start_offset=3)
    assert lg.log_end_offset == 40 and lg.log_start_offset == 3
    assert lg.recovery_point == 40
    assert lg.max_timestamp_and_offset() == (38, T0 + 19)
    assert lg.active_segment.offset_index.writable
    append(lg, ts=T0 + 20)
    assert read_all(lg) == list(range(3, 41))


def test_preallocate(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    cfg = LogConfig(segment_bytes=4096, preallocate=True)
    path = tmp_path / "t-0"
    lg = Log.open(path, cfg, recover=False, now_ms=clock)
    for _ in range(5):
        append(lg)
    seg = lg.active_segment
    assert os.path.getsize(seg.log_path) in (4096, seg.size)
    lg.close()
    assert os.path.getsize(seg.log_path) == seg.size
    lg = open_log(path, cfg, clock, opened, recover=True)
    assert lg.log_end_offset == 5


def test_clean_open_with_torn_tail_never_appends_after_garbage(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    cfg = LogConfig(segment_bytes=800)
    path = tmp_path / "t-0"
    bases, _ = _populate(path, clock, cfg)
    with open(path / f"{bases[-1]:020d}.log", "ab") as f:
        f.write(b"\x01" * 30)
    lg = open_log(path, cfg, clock, opened, recover=False)
    assert lg.log_end_offset == 40
    assert append(lg).first_offset == 40
    assert read_all(lg) == list(range(41))


@pytest.mark.parametrize("seed", range(6))
def test_crash_at_random_point_recovers_a_prefix(tmp_path: Path, clock: Clock, opened: list[Log], seed: int) -> None:
    import random
    import shutil

    rng = random.Random(seed)
    cfg = LogConfig(segment_bytes=900, index_interval_bytes=rng.choice([0, 100, 4096]))
    base = tmp_path / "orig" / "t-0"
    bases, _ = _populate(base, clock, cfg, n=25)
    for trial in range(4):
        path = tmp_path / f"c{trial}" / "t-0"
        shutil.copytree(base, path)
        victim = path / f"{rng.choice(bases[-2:]):020d}.log"
        size = os.path.getsize(victim)
        cut = rng.randrange(size + 1)
        if rng.random() < 0.5:
            os.truncate(victim, cut)
        else:
            with open(victim, "r+b") as f:
                f.seek(cut)
                f.write(os.urandom(rng.randrange(1, 64)))
        index = victim.with_suffix(".index")
        if index.exists() and rng.random() < 0.5:
            os.truncate(index, rng.randrange(index.stat().st_size + 1))
        lg = open_log(path, cfg, clock, opened, recover=True, recovery_point=bases[-2])
        got = read_all(lg)
        assert got == list(range(len(got))) and lg.log_end_offset == len(got)
        assert append(lg).first_offset == len(got)
        assert read_all(lg) == list(range(len(got) + 1))
