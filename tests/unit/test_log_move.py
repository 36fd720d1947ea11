"""Moving a partition's log between log dirs (AlterReplicaLogDirs), and the states a crash can leave."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from pykbroker.protocol.records import build_batch, validate_for_append
from pykbroker.storage.log import Log, LogStartOffsetIncrementReason
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import FUTURE_DIR_SUFFIX, MOVED_MARKER_FILE, LogManager

T0 = 1_700_000_000_000
CFG = LogConfig(segment_bytes=2000)

DELETE_RECORDS = LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION


def append(lg: Log, i: int) -> None:
    buf = bytearray(build_batch([(b"k%d" % i, b"v%06d" % i + b"." * 100, [])], timestamp_ms=T0))
    lg.append(buf, validate_for_append(buf, max_batch_bytes=10**6, now_ms=T0, timestamp_type=0))


def values(lg: Log) -> list[bytes]:
    out = []
    offset = lg.log_start_offset
    for _ in range(10_000):
        if offset >= lg.log_end_offset:
            break
        r = lg.read(offset, 1 << 20)
        data = r.records
        pos = 0
        while pos < len(data):
            size = int.from_bytes(data[pos + 8:pos + 12], "big")
            batch = data[pos:pos + 12 + size]
            found = re.search(rb"v\d{6}\.", batch)
            assert found is not None
            out.append(found.group()[:7])
            pos += 12 + size
        offset = r.next_offset
    return out


def manager(tmp_path: Path) -> tuple[LogManager, Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    mgr = LogManager([a, b], CFG, now_ms=lambda: T0)
    mgr.startup()
    mgr.startup_complete()
    return mgr, a, b


def test_move_copies_in_rounds_then_swaps(tmp_path: Path) -> None:
    mgr, a, b = manager(tmp_path)
    lg = mgr.get_or_create_log("t", 0, CFG)
    src_dir = lg.dir.parent
    target = b if src_dir == a else a
    lg.become_leader(0)
    for i in range(60):
        append(lg, i)
    mv = mgr.start_move("t", 0, target)
    assert mv.future_dir.name.startswith("t-0.") and mv.future_dir.name.endswith(FUTURE_DIR_SUFFIX)
    assert mv.copy_round(volatile=lg.active_indexes()) > 0
    by_dir = mgr.replicas_by_dir()
    (future,) = by_dir[target]
    assert future.is_future and future.tp == ("t", 0) and future.log_end_offset <= lg.log_end_offset
    for i in range(60, 90):  # appends, a roll, and retention meanwhile
        append(lg, i)
    lg.delete_records_before(20, reason=DELETE_RECORDS)
    lg.apply_retention(T0)
    assert mv.copy_round(volatile=lg.active_indexes()) > 0
    assert mv.copy_round(volatile=lg.active_indexes()) == 0
    new = mgr.complete_move(mv, CFG)
    mgr.delete_retired()
    assert new.dir == target / "t-0" and mgr.get_log("t", 0) is new and mgr.log_dir_of("t", 0) == target
    assert not (src_dir / "t-0").exists() and not list(src_dir.glob("t-0*"))
    assert not (new.dir / MOVED_MARKER_FILE).exists()
    assert lg.closed and new.log_start_offset == 20 and new.log_end_offset == 90
    assert values(new) == [b"v%06d" % i for i in range(20, 90)]
    assert [(e.epoch, e.start_offset) for e in new.leader_epoch_cache.entries()] == [(0, 20)]
    append(new, 90)
    assert new.leader_epoch == 0 and new.end_offset_for_epoch(0) == (0, 91)
    lg.flush()  # the retired object: a no-op, not an error
    mgr.shutdown()
    again = LogManager([a, b], CFG, now_ms=lambda: T0)
    again.startup()
    try:
        lg2 = again.get_log("t", 0)
        assert lg2 is not None and lg2.dir == target / "t-0"
        assert values(lg2) == [b"v%06d" % i for i in range(20, 91)]
    finally:
        again.shutdown()


def test_abandoned_move_leaves_no_future_dir(tmp_path: Path) -> None:
    mgr, a, b = manager(tmp_path)
    lg = mgr.get_or_create_log("t", 0, CFG)
    for i in range(10):
        append(lg, i)
    target = b if lg.dir.parent == a else a
    mv = mgr.start_move("t", 0, target)
    mv.copy_round()
    mgr.abandon_move(mv)
    assert list(target.iterdir()) == [] and mgr.replicas_by_dir().get(target, []) == []
    assert values(lg) == [b"v%06d" % i for i in range(10)]
    mgr.shutdown()


def _crashed_copy(mgr: LogManager, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A partition with data in dir a or b, and the broker 'killed' (no clean shutdown)."""
    lg = mgr.get_or_create_log("t", 0, CFG)
    for i in range(40):
        append(lg, i)
    lg.flush()
    src = lg.dir
    target_dir = tmp_path / ("b" if src.parent.name == "a" else "a")
    snapshot = tmp_path / "snapshot"
    shutil.copytree(tmp_path, snapshot, ignore=shutil.ignore_patterns("snapshot"))  # kill -9 here
    mgr.shutdown()
    shutil.rmtree(tmp_path / "a")
    shutil.rmtree(tmp_path / "b")
    shutil.copytree(snapshot / "a", tmp_path / "a")
    shutil.copytree(snapshot / "b", tmp_path / "b")
    return src, target_dir, snapshot


def test_crash_before_the_commit_keeps_the_original(tmp_path: Path) -> None:
    mgr, _, _ = manager(tmp_path)
    src, target_dir, _ = _crashed_copy(mgr, tmp_path)
    # A half-copied future log, even one already marked, is not the log yet.
    future = target_dir / f"t-0.{'0' * 32}{FUTURE_DIR_SUFFIX}"
    future.mkdir()
    first = sorted(src.glob("*.log"))[0]
    (future / first.name).write_bytes(first.read_bytes()[:100])
    (future / MOVED_MARKER_FILE).touch()
    again = LogManager([tmp_path / "a", tmp_path / "b"], CFG, now_ms=lambda: T0)
    again.startup()
    try:
        assert not future.exists()
        lg = again.get_log("t", 0)
        assert lg is not None and lg.dir == src
        assert values(lg) == [b"v%06d" % i for i in range(40)]
    finally:
        again.shutdown()


def test_crash_after_the_commit_keeps_the_moved_copy(tmp_path: Path) -> None:
    mgr, _, _ = manager(tmp_path)
    src, target_dir, _ = _crashed_copy(mgr, tmp_path)
    # Renamed into place with its marker, the original not yet retired: the moved copy wins.
    moved = target_dir / "t-0"
    shutil.copytree(src, moved)
    (moved / MOVED_MARKER_FILE).touch()
    with open(sorted(src.glob("*.log"))[-1], "ab") as f:
        f.write(b"\0" * 10)  # what differs must not matter: the original is deleted unread
    again = LogManager([tmp_path / "a", tmp_path / "b"], CFG, now_ms=lambda: T0)
    again.startup()
    try:
        lg = again.get_log("t", 0)
        assert lg is not None and lg.dir == moved
        assert not src.exists() and not (moved / MOVED_MARKER_FILE).exists()
        assert not [p for p in src.parent.iterdir() if p.name.startswith("t-0")]
        assert values(lg) == [b"v%06d" % i for i in range(40)]
    finally:
        again.shutdown()


def test_copy_round_follows_replaced_and_deleted_files(tmp_path: Path) -> None:
    mgr, a, b = manager(tmp_path)
    lg = mgr.get_or_create_log("t", 0, CFG)
    for i in range(50):
        append(lg, i)
    target = b if lg.dir.parent == a else a
    mv = mgr.start_move("t", 0, target)
    mv.copy_round(volatile=lg.active_indexes())
    # A file replaced whole (as the cleaner's swap does) and one deleted (retention).
    extra = lg.dir / "extra.bin"
    extra.write_bytes(b"1" * 50)
    mv.copy_round()
    tmp = lg.dir / "extra.tmp"
    tmp.write_bytes(b"2" * 20)
    os.replace(tmp, extra)
    mv.copy_round()
    assert (mv.future_dir / "extra.bin").read_bytes() == b"2" * 20
    extra.unlink()
    mv.copy_round()
    assert not (mv.future_dir / "extra.bin").exists()
    mgr.abandon_move(mv)
    mgr.shutdown()


def test_a_round_stops_at_its_budget_and_the_next_goes_on(tmp_path: Path) -> None:
    mgr, a, b = manager(tmp_path)
    big = LogConfig(segment_bytes=1 << 20)
    lg = mgr.get_or_create_log("t", 0, big)
    for i in range(2000):
        append(lg, i)
    size = lg.size_bytes
    target = b if lg.dir.parent == a else a
    mv = mgr.start_move("t", 0, target)
    rounds = []
    for _ in range(100):
        n = mv.copy_round(volatile=lg.active_indexes(), budget=1 << 16)
        rounds.append(n)
        if n == 0:
            break
    assert len(rounds) > 3 and max(rounds) <= 1 << 16  # bounded per round, even within one file
    assert mv.copied_bytes() == size
    new = mgr.complete_move(mv, big)
    assert values(new) == [b"v%06d" % i for i in range(2000)]
    mgr.shutdown()


def test_a_file_deleted_between_listing_and_copy_is_skipped(tmp_path: Path) -> None:
    """An older producer snapshot is deleted at a roll while a round runs: the round goes on (seen under CI load)."""
    mgr, a, b = manager(tmp_path)
    lg = mgr.get_or_create_log("t", 0, CFG)
    for i in range(50):
        append(lg, i)
    target = b if lg.dir.parent == a else a
    mv = mgr.start_move("t", 0, target)
    doomed = lg.dir / "00000000000000000007.snapshot"
    doomed.write_bytes(b"s" * 40)
    real_copy = mv._copy

    def copy_after_delete(src: Path, dst: Path, start: int, end: int, *, sync: bool) -> int:
        if src == doomed:
            doomed.unlink()  # what a roll does between the round's listing and its copy
        return real_copy(src, dst, start, end, sync=sync)

    mv._copy = copy_after_delete  # type: ignore[method-assign]
    assert mv.copy_round(volatile=lg.active_indexes()) > 0
    assert not (mv.future_dir / doomed.name).exists()
    new = mgr.complete_move(mv, CFG)
    assert values(new) == [b"v%06d" % i for i in range(50)]
    mgr.shutdown()
