"""Partition log: rolling, reads, timestamps, retention, truncation, flushing and recovery."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.protocol.records import (
    RECORD_LIST_TOO_LARGE,
    InvalidRecords,
    build_batch,
    decode_records,
    iter_batches,
    validate_for_append,
)
from pykbroker.storage.log import AppendResult, Log, LogStartOffsetIncrementReason, OffsetOutOfRange
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import LogManager
from pykbroker.storage.producer_snapshots import SNAPSHOTS_TO_KEEP
from pykbroker.storage.producer_state import ProducerStateError, end_txn_marker_record

T0 = 1_700_000_000_000

DELETE_RECORDS = LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION


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
    lg.delete_records_before(31, reason=DELETE_RECORDS)
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
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("Deleting segment") and "retention time" in m for m in messages) == 1
    # The log start offset moved for retention, and its line says so (not DeleteRecords).
    assert [m for m in messages if m.startswith("Incremented log start offset")] == [
        f"Incremented log start offset of t-0 to {segs[1].base_offset} (segment deletion: retention time 1000ms "
        "breach)"]
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
    assert lg.delete_records_before(seg2 + 1, reason=DELETE_RECORDS) == seg2 + 1
    assert lg.segments[0].base_offset == seg2
    r = lg.read(seg2 + 1, 100)  # mid-batch read at the log start offset
    assert r.first_offset == seg2
    with pytest.raises(OffsetOutOfRange):
        lg.read(seg2, 100)
    assert lg.delete_records_before(3, reason=DELETE_RECORDS) == seg2 + 1  # never moves backwards
    with pytest.raises(OffsetOutOfRange):
        lg.delete_records_before(25, reason=DELETE_RECORDS)
    with pytest.raises(OffsetOutOfRange):
        lg.delete_records_before(20, reason=DELETE_RECORDS, high_watermark=10)
    assert lg.delete_records_before(24, reason=DELETE_RECORDS) == 24
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


# --- idempotent producers and transactions -------------------------------------------------------------------------


def produce(
    lg: Log, pid: int, seq: int, n: int = 1, *, epoch: int = 0, txn: bool = False, ts: int = T0
) -> AppendResult:
    buf = bytearray(
        build_batch(
            [(b"k", b"v" * 40, [])] * n,
            timestamp_ms=ts,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            is_transactional=txn,
        )
    )
    hs = validate_for_append(buf, max_batch_bytes=10**7, now_ms=ts, timestamp_type=0)
    return lg.append(buf, hs)


def end_txn(lg: Log, pid: int, commit: bool, *, epoch: int = 0, coordinator_epoch: int = 0) -> AppendResult:
    key, value, headers = end_txn_marker_record(commit, coordinator_epoch)
    buf = bytearray(
        build_batch(
            [(key, value, headers)],
            timestamp_ms=T0,
            producer_id=pid,
            producer_epoch=epoch,
            is_control=True,
            is_transactional=True,
        )
    )
    hs = validate_for_append(buf, max_batch_bytes=10**7, now_ms=T0, timestamp_type=0, from_client=False)
    return lg.append(buf, hs, origin="coordinator")


def snapshot_offsets(path: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in path.glob("*.snapshot"))


def crash_copy(lg: Log, target: Path) -> Path:
    """The partition dir as a kill -9 would leave it: files copied while the log is open."""
    shutil.copytree(lg.dir, target)
    return target


def test_duplicate_append_returns_original_offsets(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(), clock, opened)
    first = produce(lg, 7, seq=0, n=3)
    assert (first.first_offset, first.last_offset, first.duplicate) == (0, 2, False)
    append(lg)  # a non-idempotent batch in between
    assert produce(lg, 7, seq=3, n=2).first_offset == 4
    size, leo = lg.size_bytes, lg.log_end_offset
    retry = produce(lg, 7, seq=0, n=3)
    assert (retry.first_offset, retry.last_offset, retry.duplicate) == (0, 2, True)
    assert retry.log_append_time_ms == -1
    assert (lg.size_bytes, lg.log_end_offset) == (size, leo)
    assert produce(lg, 7, seq=3, n=2).duplicate
    assert read_all(lg) == list(range(6))


def test_producer_state_errors_append_nothing(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(), clock, opened)
    produce(lg, 7, seq=0, epoch=2)
    with pytest.raises(ProducerStateError) as info:
        produce(lg, 7, seq=5, epoch=2)
    assert info.value.error_code == ErrorCode.out_of_order_sequence_number
    with pytest.raises(ProducerStateError) as info:
        produce(lg, 7, seq=1, epoch=1)
    assert info.value.error_code == ErrorCode.invalid_producer_epoch
    with pytest.raises(ProducerStateError) as info:
        end_txn(lg, 7, commit=True, epoch=1)
    assert info.value.error_code == ErrorCode.invalid_producer_epoch
    assert lg.log_end_offset == 1
    assert produce(lg, 7, seq=1, epoch=2).first_offset == 1


def test_first_unstable_offset_moves_with_markers(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(), clock, opened)
    append(lg)
    assert lg.first_unstable_offset() is None
    produce(lg, 1, seq=0, txn=True)  # 1
    produce(lg, 2, seq=0, txn=True)  # 2
    produce(lg, 1, seq=1, txn=True)  # 3
    assert lg.first_unstable_offset() == 1
    assert end_txn(lg, 1, commit=True).first_offset == 4
    assert lg.first_unstable_offset() == 2
    assert end_txn(lg, 2, commit=True).first_offset == 5
    assert lg.first_unstable_offset() is None
    assert lg.collect_aborted_transactions(0, lg.log_end_offset) == []
    assert not list((tmp_path / "t-0").glob("*.txnindex"))


def test_aborted_transactions_across_segments(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    path = tmp_path / "t-0"
    lg = open_log(path, LogConfig(segment_bytes=600), clock, opened)
    seqs: dict[int, int] = {}

    def write(pid: int, n: int = 1, txn: bool = True) -> int:
        r = produce(lg, pid, seq=seqs.get(pid, 0), n=n, txn=txn)
        seqs[pid] = seqs.get(pid, 0) + n
        return r.first_offset

    p1_first = write(1)
    for _ in range(8):
        write(9, txn=False)  # rolls a segment or two
    write(1)
    p3_first = write(3)
    p1_marker = end_txn(lg, 1, commit=False).first_offset
    for _ in range(8):
        write(9, txn=False)
    end_txn(lg, 3, commit=True)
    p4_first = write(4, n=2)
    for _ in range(8):
        write(9, txn=False)
    p4_marker = end_txn(lg, 4, commit=False).first_offset
    assert len(lg.segments) >= 4
    leo = lg.log_end_offset

    # Each entry sits in the txn index of the segment holding its abort marker.
    marker_segments = {
        s.base_offset for s in lg.segments for t in s.txn_index.all() if t.last_offset in (p1_marker, p4_marker)
    }
    assert len(marker_segments) == 2
    assert lg.segments[0].txn_index.entries == 0
    (p1_entry,) = next(s for s in lg.segments if s.txn_index.entries and s.base_offset <= p1_marker).txn_index.all()
    assert p1_entry.last_stable_offset == p3_first  # producer 3's open transaction pinned the LSO

    assert lg.collect_aborted_transactions(0, leo) == [(1, p1_first), (4, p4_first)]
    assert lg.collect_aborted_transactions(p1_marker + 1, leo) == [(4, p4_first)]
    assert lg.collect_aborted_transactions(p1_first, p1_first + 1) == [(1, p1_first)]
    assert lg.collect_aborted_transactions(p1_marker + 1, p4_first) == []
    assert lg.collect_aborted_transactions(p4_marker, leo) == [(4, p4_first)]
    assert lg.collect_aborted_transactions(p4_marker + 1, leo) == []

    # Clean reopen keeps the indexes; recovery rebuilds a lost one.
    lg.close()
    lg = open_log(path, LogConfig(segment_bytes=600), clock, opened)
    assert lg.collect_aborted_transactions(0, leo) == [(1, p1_first), (4, p4_first)]
    lg.close()
    for f in path.glob("*.txnindex"):
        f.unlink()
    lg = open_log(path, LogConfig(segment_bytes=600), clock, opened, recover=True)
    assert lg.collect_aborted_transactions(0, leo) == [(1, p1_first), (4, p4_first)]
    assert lg.first_unstable_offset() is None


def test_dedup_survives_crash(
    tmp_path: Path, clock: Clock, opened: list[Log], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = LogConfig(segment_bytes=700)
    lg = open_log(tmp_path / "t-0", cfg, clock, opened)
    results = []
    seq = 0
    while len(lg.segments) < 3:
        results.append(produce(lg, 42, seq=seq, n=2))
        seq += 2
    lg.flush()  # the recovery point reaches the active segment, whose base has a snapshot
    recovery_point = lg.recovery_point
    active_base = lg.active_segment.base_offset
    assert active_base in snapshot_offsets(lg.dir)
    for _ in range(2):
        results.append(produce(lg, 42, seq=seq, n=2))
        seq += 2
    produce(lg, 43, seq=0, txn=True)
    aborted_first = produce(lg, 44, seq=0, txn=True).first_offset
    end_txn(lg, 44, commit=False)
    leo = lg.log_end_offset

    copy = crash_copy(lg, tmp_path / "crashed-0")
    caplog.set_level(logging.DEBUG, logger="pykbroker.storage.log")  # the replay summary is a DEBUG line
    lg2 = open_log(copy, cfg, clock, opened, recover=True, recovery_point=recovery_point)
    assert lg2.log_end_offset == leo
    # replay started at the snapshot (the batch that rolled + 5 more), not at the log start
    assert any(f"replayed 6 batch(es) from {active_base}" in r.getMessage() for r in caplog.records)
    for r, retry_seq in zip(results[-5:], range(seq - 10, seq, 2), strict=True):
        again = produce(lg2, 42, seq=retry_seq, n=2)
        assert again.duplicate
        assert (again.first_offset, again.last_offset) == (r.first_offset, r.last_offset)
    assert lg2.log_end_offset == leo
    assert lg2.first_unstable_offset() == leo - 3  # producer 43's transaction is still open
    assert lg2.collect_aborted_transactions(0, leo) == [(44, aborted_first)]
    with pytest.raises(ProducerStateError):
        produce(lg2, 42, seq=seq + 1, n=2)
    assert produce(lg2, 42, seq=seq, n=2).first_offset == leo

    # A crash with no snapshot at all: replay from the log start gives the same answer.
    for f in copy.glob("*.snapshot"):
        f.unlink()
    copy2 = crash_copy(lg2, tmp_path / "crashed2-0")
    lg3 = open_log(copy2, cfg, clock, opened, recover=True)
    assert produce(lg3, 42, seq=seq, n=2).duplicate
    assert not produce(lg3, 42, seq=seq + 2, n=2).duplicate


def test_clean_reopen_uses_snapshot(
    tmp_path: Path, clock: Clock, opened: list[Log], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "t-0"
    lg = open_log(path, LogConfig(), clock, opened)
    for i in range(4):
        produce(lg, 5, seq=i)
    produce(lg, 6, seq=0, txn=True)
    state = lg.producer_state.snapshot()
    lg.close()
    assert snapshot_offsets(path) == [5]
    caplog.set_level(logging.INFO, logger="pykbroker.storage.log")
    lg = open_log(path, LogConfig(), clock, opened)
    assert not any("replayed" in r.getMessage() for r in caplog.records)
    assert lg.producer_state.snapshot() == state
    assert produce(lg, 5, seq=3).duplicate
    assert lg.first_unstable_offset() == 4


def test_truncate_to_reloads_producer_state(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=600), clock, opened)
    offsets = [produce(lg, 1, seq=i).first_offset for i in range(10)]
    produce(lg, 2, seq=0, txn=True)
    end_txn(lg, 2, commit=False)
    assert len(lg.segments) >= 2
    assert lg.collect_aborted_transactions(0, lg.log_end_offset) == [(2, 10)]
    lg.truncate_to(offsets[7])
    assert all(o <= offsets[7] for o in snapshot_offsets(lg.dir))
    assert lg.collect_aborted_transactions(0, lg.log_end_offset + 5) == []
    assert lg.first_unstable_offset() is None
    # batch 7 is gone, so it is the next in sequence, not a duplicate
    r = produce(lg, 1, seq=7)
    assert (r.first_offset, r.duplicate) == (offsets[7], False)
    assert produce(lg, 1, seq=6).duplicate
    lg.truncate_to(2)
    assert produce(lg, 1, seq=1).duplicate
    assert produce(lg, 1, seq=2).first_offset == 2
    lg.truncate_fully_and_start_at(100)
    assert snapshot_offsets(lg.dir) == [] and len(lg.producer_state) == 0
    assert produce(lg, 1, seq=50).first_offset == 100  # unknown producer again


def test_snapshot_retention(tmp_path: Path, clock: Clock, opened: list[Log]) -> None:
    lg = open_log(tmp_path / "t-0", LogConfig(segment_bytes=400), clock, opened)
    for i in range(60):
        produce(lg, 1, seq=i)
        if i % 10 == 0:
            lg.flush()
    assert len(lg.segments) > 8
    snaps = snapshot_offsets(lg.dir)
    assert 2 <= len(snaps) <= SNAPSHOTS_TO_KEEP + 1
    assert snaps[-1] == lg.active_segment.base_offset
    lg.flush()
    lg.delete_records_before(lg.log_end_offset, reason=DELETE_RECORDS)
    assert len(lg.segments) == 1
    assert snapshot_offsets(lg.dir) == [snaps[-1]]  # below the log start offset, but the newest is kept
    assert produce(lg, 1, seq=59).duplicate  # the state itself is not tied to the log start offset


def test_expire_producers(tmp_path: Path, clock: Clock) -> None:
    mgr = LogManager([tmp_path], LogConfig(), now_ms=clock)
    mgr.startup()
    lg = mgr.get_or_create_log("t", 0, LogConfig())
    produce(lg, 1, seq=0, ts=T0)
    produce(lg, 2, seq=0, ts=T0 + 5_000)
    produce(lg, 3, seq=0, ts=T0, txn=True)
    assert mgr.expire_producers(T0 + 1_000, 1_000) == 1
    assert lg.remove_expired_producers(T0 + 6_000, 1_000) == 1
    assert set(lg.producer_state.producers) == {3}
    assert not produce(lg, 1, seq=17).duplicate  # forgotten: any sequence is accepted
    mgr.shutdown()


def test_flush_to_skips_an_fsync_already_covered(tmp_path: Path) -> None:
    import itertools
    from unittest import mock

    from pykbroker.protocol.records import build_batch, validate_for_append
    from pykbroker.storage.log import Log
    from pykbroker.storage.log_config import LogConfig

    lg = Log.open(tmp_path / "t-0", LogConfig(), recover=False)
    counter = itertools.count()
    for _ in range(3):
        raw = bytearray(build_batch([(None, b"v", [])], timestamp_ms=1))
        lg.append(raw, validate_for_append(raw, max_batch_bytes=1 << 20, now_ms=1, timestamp_type=0))
    with mock.patch("os.fdatasync", side_effect=lambda fd: next(counter)), \
            mock.patch("os.fsync", side_effect=lambda fd: next(counter)):
        lg.flush_to(3)
        first = next(counter)
        assert first == 1  # the .log file alone: no index syncs
        lg.flush_to(2)  # covered by the flush above: no sync
        assert next(counter) == first + 1
    # The acknowledged data is synced; the recovery point (which spares a segment recovery after a
    # crash) waits for the next full flush, which also syncs the indexes.
    assert lg.recovery_point == 0
    lg.flush()
    assert lg.recovery_point == 3
    lg.close()


def test_a_tail_fetch_reads_only_the_batch_just_appended(
        tmp_path: Path, clock: Clock, opened: list[Log], monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer at the tail fetches from the offset of the batch just appended: the segment knows its
    header, so the read is one pread of its bytes (no index search, no header read); a truncation forgets it."""
    import pykbroker.storage.segment as segment_mod
    lg = open_log(tmp_path / "t-0", LogConfig(), clock, opened)
    preads: list[tuple[int, int]] = []
    real = os.pread

    def counting(fd: int, n: int, pos: int) -> bytes:
        preads.append((n, pos))
        return real(fd, n, pos)

    monkeypatch.setattr(segment_mod.os, "pread", counting)
    value = b"v" * 2000
    for i in range(20):  # 10 KB batches: past the size where a read starts with headers only
        append(lg, 5, ts=T0 + i, value=value)
        offset = lg.log_end_offset - 5
        preads.clear()
        r = lg.read_slice(offset, 1 << 20)
        assert isinstance(r.records, bytes) and offsets_in(r.records) == list(range(offset, offset + 5))
        assert r.next_offset == lg.log_end_offset
        assert len(preads) == 1  # the batch itself
        middle = lg.read_slice(offset + 2, 1 << 20)  # inside that batch: the same batch
        assert middle.records == r.records
    lg.truncate_to(50)
    append(lg, 1, ts=T0 + 99, value=b"after")
    r = lg.read_slice(50, 1 << 20)
    assert offsets_in(r.records) == [50]
    assert [rec.value for rec in decode_records(r.records)] == [b"after"]
    assert offsets_in(lg.read(40, 1 << 20).records) == list(range(40, 51))
