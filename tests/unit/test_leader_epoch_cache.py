"""The leader epoch cache (Kafka's LeaderEpochFileCache) and its hookup in Log."""

from __future__ import annotations

from pathlib import Path

import pytest

from pykbroker.protocol.records import build_batch, validate_for_append
from pykbroker.storage.leader_epoch_cache import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    EpochEntry,
    LeaderEpochCache,
    parse_checkpoint,
)
from pykbroker.storage.log import Log, LogStartOffsetIncrementReason
from pykbroker.storage.log_config import LogConfig

T0 = 1_700_000_000_000

DELETE_RECORDS = LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION


def entries(cache: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in cache.entries()]


def test_assign_keeps_epochs_and_offsets_monotonic(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path / LEADER_EPOCH_CHECKPOINT_FILE)
    assert cache.latest_epoch() is None
    assert cache.assign(0, 0)
    assert not cache.assign(0, 5)  # same epoch, later offset: nothing new
    assert cache.assign(2, 10)
    assert cache.assign(3, 10)  # a newer epoch at the same offset replaces the one with no data
    assert entries(cache) == [(0, 0), (3, 10)]
    assert cache.assign(3, 8)  # the same epoch earlier: its start moves back
    assert entries(cache) == [(0, 0), (3, 8)]
    assert cache.assign(1, 4)  # an older epoch: newer entries that conflict are dropped
    assert entries(cache) == [(0, 0), (1, 4)]
    with pytest.raises(ValueError):
        cache.assign(-1, 0)
    assert cache.latest_epoch() == 1


def test_end_offset_for() -> None:
    cache = LeaderEpochCache(None, [EpochEntry(1, 0), EpochEntry(3, 10), EpochEntry(6, 25)])
    leo = 40
    assert cache.end_offset_for(-1, leo) == (-1, -1)  # undefined epoch
    assert cache.end_offset_for(6, leo) == (6, 40)  # the latest ends at the log end
    assert cache.end_offset_for(3, leo) == (3, 25)  # ends where the next starts
    assert cache.end_offset_for(1, leo) == (1, 10)
    assert cache.end_offset_for(4, leo) == (3, 25)  # unknown epoch between: the floor epoch, next start
    assert cache.end_offset_for(2, leo) == (1, 10)
    assert cache.end_offset_for(0, leo) == (0, 0)  # below every epoch: the first start, requested epoch
    assert cache.end_offset_for(7, leo) == (-1, -1)  # newer than any known
    assert LeaderEpochCache(None).end_offset_for(0, leo) == (-1, -1)
    assert cache.epoch_for_offset(9) == 1 and cache.epoch_for_offset(10) == 3 and cache.epoch_for_offset(99) == 6


def test_truncation_from_end_and_start(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path / LEADER_EPOCH_CHECKPOINT_FILE,
                             [EpochEntry(1, 0), EpochEntry(3, 10), EpochEntry(6, 25)])
    cache.truncate_from_end(30)  # nothing starts at or after 30
    assert entries(cache) == [(1, 0), (3, 10), (6, 25)]
    cache.truncate_from_end(25)
    assert entries(cache) == [(1, 0), (3, 10)]
    cache.truncate_from_start(12)  # the epoch containing the new log start now starts there
    assert entries(cache) == [(3, 12)]
    cache.truncate_from_start(5)
    assert entries(cache) == [(3, 12)]
    cache.clear()
    assert entries(cache) == []
    assert parse_checkpoint(cache.path.read_text()) == []  # type: ignore[union-attr]


def test_checkpoint_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    cache = LeaderEpochCache(path)
    cache.assign(0, 0)
    cache.assign(4, 17)
    assert path.read_text() == "0\n2\n0 0\n4 17\n"  # Kafka's format: version, count, 'epoch offset'
    assert not list(tmp_path.glob("*.tmp"))
    assert entries(LeaderEpochCache.load(tmp_path)) == [(0, 0), (4, 17)]
    assert entries(LeaderEpochCache.load(tmp_path / "missing")) == []
    for bad in ("1\n0\n", "0\n2\n0 0\n", "0\n2\n3 5\n2 9\n", "0\n1\nx y\n"):
        path.write_text(bad)
        with pytest.raises(ValueError):
            parse_checkpoint(bad)
        assert entries(LeaderEpochCache.load(tmp_path)) == []  # dropped with a warning, refilled later


def append(lg: Log, n: int = 1, leader_epoch: int | None = None) -> None:
    buf = bytearray(build_batch([(b"k", b"v" * 30, [])] * n, timestamp_ms=T0))
    lg.append(buf, validate_for_append(buf, max_batch_bytes=10**6, now_ms=T0, timestamp_type=0),
              leader_epoch=leader_epoch)


def test_log_stamps_epochs_and_keeps_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    cfg = LogConfig(segment_bytes=600)
    lg = Log.open(path, cfg, recover=False, now_ms=lambda: T0)
    lg.become_leader(0)
    append(lg, 3)
    lg.become_leader(2)  # a new leader epoch starts at the log end
    append(lg, 2)
    append(lg, 1, leader_epoch=5)  # an explicit epoch (e.g. a coordinator's) wins
    assert entries(lg.leader_epoch_cache) == [(0, 0), (2, 3), (5, 5)]
    data = lg.read(0, 1 << 20).records
    epochs = []
    pos = 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 8:pos + 12], "big")
        epochs.append(int.from_bytes(data[pos + 12:pos + 16], "big", signed=True))
        pos += 12 + size
    assert epochs == [0, 2, 5]  # partitionLeaderEpoch of each stored batch
    assert lg.end_offset_for_epoch(0) == (0, 3)
    assert lg.end_offset_for_epoch(5) == (5, 6)
    assert lg.end_offset_for_epoch(-1) is None
    lg.truncate_to(5)  # a batch boundary, as follower truncation is
    assert entries(lg.leader_epoch_cache) == [(0, 0), (2, 3)]
    lg.delete_records_before(2, reason=DELETE_RECORDS)
    assert entries(lg.leader_epoch_cache) == [(0, 2), (2, 3)]
    lg.close()
    again = Log.open(path, cfg, recover=False, now_ms=lambda: T0)
    try:
        assert entries(again.leader_epoch_cache) == [(0, 2), (2, 3)]
        assert again.end_offset_for_epoch(2) == (2, 5)
    finally:
        again.close()


def test_loading_writes_nothing_and_the_checkpoint_catches_up(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    cfg = LogConfig()
    lg = Log.open(path, cfg, recover=False, now_ms=lambda: T0)
    lg.become_leader(0)
    append(lg, 2)
    lg.close()
    stale = "0\n2\n0 0\n3 7\n"  # an epoch past the log end, as a torn tail leaves it
    (path / LEADER_EPOCH_CHECKPOINT_FILE).write_text(stale)
    again = Log.open(path, cfg, recover=True, now_ms=lambda: T0)
    try:
        assert entries(again.leader_epoch_cache) == [(0, 0)]
        assert (path / LEADER_EPOCH_CHECKPOINT_FILE).read_text() == stale  # a full disk must not stop loading
        assert again.leader_epoch_cache.dirty
        again.checkpoint_leader_epochs()
        assert (path / LEADER_EPOCH_CHECKPOINT_FILE).read_text() == "0\n1\n0 0\n"
        assert not again.leader_epoch_cache.dirty
    finally:
        again.close()
