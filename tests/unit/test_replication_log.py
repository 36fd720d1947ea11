"""Follower appends keep the leader's bytes, offsets, epochs and producer state; the HW checkpoint file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from pykbroker.protocol.records import InvalidRecords, build_batch, iter_batches, validate_for_append
from pykbroker.replica.replica_manager import ReplicaManager
from pykbroker.replication.fetcher import FetchSettings, ReplicaFetcherManager
from pykbroker.storage.log import Log
from pykbroker.storage.log_config import LogConfig
from pykbroker.storage.log_manager import (
    REPLICATION_OFFSET_CHECKPOINT_FILE,
    LogManager,
    read_offset_checkpoint,
)
from pykbroker.storage.producer_state import end_txn_marker_record

T0 = 1_700_000_000_000


def _append(lg: Log, n: int = 1, *, origin: str = "client", **kw: object) -> None:
    buf = bytearray(build_batch([(b"k", b"v" * 20, [])] * n, timestamp_ms=T0, **kw))  # type: ignore[arg-type]
    lg.append(buf, validate_for_append(buf, max_batch_bytes=10**7, now_ms=T0, timestamp_type=0),
              origin=origin)  # type: ignore[arg-type]


def _all_bytes(lg: Log) -> bytes:
    out = b""
    off = lg.log_start_offset
    for _ in range(1000):
        if off >= lg.log_end_offset:
            break
        r = lg.read(off, 1 << 20)
        out += r.records
        off = r.next_offset
    return out


def _leader_log(path: Path) -> Log:
    """Epoch 0: plain batches; epoch 3: an idempotent producer, an aborted and an open transaction."""
    lg = Log.open(path, LogConfig(segment_bytes=400), recover=False)
    lg.become_leader(0)
    _append(lg, 3)
    _append(lg, 2)
    lg.become_leader(3)
    _append(lg, 2, producer_id=7, producer_epoch=0, base_sequence=0)
    _append(lg, 1, producer_id=8, producer_epoch=0, base_sequence=0, is_transactional=True)
    marker = bytearray(build_batch([end_txn_marker_record(False, 0)], timestamp_ms=T0, producer_id=8,
                                   producer_epoch=0, is_transactional=True, is_control=True))
    lg.append(marker, validate_for_append(marker, max_batch_bytes=10**7, now_ms=T0, timestamp_type=0,
                                          from_client=False),
              origin="coordinator")
    for i in range(6):
        _append(lg, 2, producer_id=7, producer_epoch=0, base_sequence=2 + 2 * i)
    _append(lg, 1, producer_id=9, producer_epoch=0, base_sequence=0, is_transactional=True)  # stays open
    return lg


def test_append_as_follower_keeps_the_leaders_log(tmp_path: Path) -> None:
    leader = _leader_log(tmp_path / "leader" / "t-0")
    data = _all_bytes(leader)
    follower = Log.open(tmp_path / "follower" / "t-0", LogConfig(segment_bytes=400), recover=False)
    result = follower.append_as_follower(data)
    assert result is not None and result.first_offset == 0 and result.last_offset == leader.log_end_offset - 1
    assert follower.log_end_offset == leader.log_end_offset
    assert _all_bytes(follower) == data  # offsets, epochs, timestamps, CRCs: byte for byte
    assert len(follower.segments) > 1  # rolled like any append
    assert follower.leader_epoch_cache.entries() == leader.leader_epoch_cache.entries()
    assert [(e.epoch, e.start_offset) for e in follower.leader_epoch_cache.entries()] == [(0, 0), (3, 5)]
    for pid in (7, 8, 9):
        assert follower.producer_state.producers[pid].last_seq == leader.producer_state.producers[pid].last_seq
    assert follower.first_unstable_offset() == leader.first_unstable_offset() is not None
    end = leader.log_end_offset
    assert follower.collect_aborted_transactions(0, end) == leader.collect_aborted_transactions(0, end) == [(8, 7)]
    # Reopened, the follower's log recovers to the same state.
    follower.close()
    again = Log.open(tmp_path / "follower" / "t-0", LogConfig(segment_bytes=400), recover=True)
    assert _all_bytes(again) == data
    assert again.producer_state.producers[7].last_seq == leader.producer_state.producers[7].last_seq
    again.close()
    leader.close()


def test_append_as_follower_edges(tmp_path: Path) -> None:
    leader = _leader_log(tmp_path / "leader" / "t-0")
    data = _all_bytes(leader)
    sizes = [h.size for h in iter_batches(data)]
    follower = Log.open(tmp_path / "follower" / "t-0", LogConfig(), recover=False)
    # A response cut inside its second batch appends the first only.
    assert follower.append_as_follower(data[: sizes[0] + 10]) is not None
    assert follower.log_end_offset == 3
    # A repeated response appends nothing; the rest follows on.
    assert follower.append_as_follower(data[: sizes[0]]) is None
    follower.append_as_follower(data[sizes[0]:])
    assert _all_bytes(follower) == data
    assert follower.append_as_follower(b"") is None
    # A corrupt batch is refused whole.
    other = Log.open(tmp_path / "other" / "t-0", LogConfig(), recover=False)
    bad = bytearray(data[: sizes[0]])
    bad[-1] ^= 0xFF
    with pytest.raises(InvalidRecords):
        other.append_as_follower(bytes(bad))
    assert other.log_end_offset == 0
    # Batches that do not start at our end offset but overlap it are refused.
    other.append_as_follower(data[: sizes[0]])  # offsets 0..2
    shifted = bytearray(build_batch([(b"k", b"v", [])] * 3, timestamp_ms=T0, base_offset=1))
    with pytest.raises(InvalidRecords):
        other.append_as_follower(bytes(shifted))
    for lg in (leader, follower, other):
        lg.close()


def test_high_watermark_checkpoint_file(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    lm = LogManager(dirs, LogConfig())
    lm.startup()
    lm.startup_complete()
    rm = ReplicaManager(2, lm)
    rm.set_cluster(lambda _b: None, _never_writes)
    for i in range(2):
        p = rm.make_follower("t", i, LogConfig(), leader_id=1, leader_epoch=0, replicas=[1, 2], isr=[1, 2])
        assert p is not None
        _append(p.log, 5)
        p.high_watermark = 3 + i
    assert lm.checkpoint_high_watermarks()
    files = {d: read_offset_checkpoint(d / REPLICATION_OFFSET_CHECKPOINT_FILE) for d in dirs}
    assert sorted(files[dirs[0]].items()) + sorted(files[dirs[1]].items()) in (
        [(("t", 0), 3), (("t", 1), 4)], [(("t", 1), 4), (("t", 0), 3)])
    text = (lm.log_dir_of("t", 0) / REPLICATION_OFFSET_CHECKPOINT_FILE).read_text()  # type: ignore[operator]
    assert text == "0\n1\nt 0 3\n"  # Kafka's format: version, count, "topic partition offset"
    lm.shutdown()
    # After a restart the partitions start from the checkpointed HW, capped at the LEO.
    lm2 = LogManager(dirs, LogConfig())
    lm2.startup()
    lm2.startup_complete()
    rm2 = ReplicaManager(2, lm2)
    p0 = rm2.make_follower("t", 0, LogConfig(), leader_id=1, leader_epoch=0, replicas=[1, 2], isr=[1, 2])
    assert p0 is not None and p0.high_watermark == 3
    lm2.get_log("t", 1).truncate_to(2)  # type: ignore[union-attr]
    p1 = rm2.make_leader("t", 1, LogConfig(), leader_epoch=1, replicas=[1, 2], isr=[2, 1])
    assert p1 is not None and p1.high_watermark == 2  # leader too; never past its LEO
    lm2.shutdown()


async def _never_writes(topic: str, index: int, epoch: int, isr: list[int], version: int) -> int:
    raise AssertionError("no ISR change expected")


def test_truncating_at_the_log_end_drops_an_epoch_never_written(tmp_path: Path) -> None:
    """A leader that wrote nothing in its epoch and then follows a newer leader must forget that epoch.

    Otherwise it keeps sending it as its last fetched epoch, the leader (which never saw it) keeps
    answering the same diverging epoch, and the follower never fetches again (seen after a preferred
    leader election moved leadership back to a restarted broker).
    """
    lg = Log.open(tmp_path / "t-0", LogConfig(), recover=False)
    lg.become_leader(1)
    _append(lg, 3)
    lg.become_leader(2)  # leader again at offset 3, but nothing written in epoch 2
    assert lg.leader_epoch_cache.latest_epoch() == 2
    lg.truncate_to(3)  # the diverging answer (epoch 1 ends at 3): no data to cut
    assert lg.log_end_offset == 3
    assert lg.leader_epoch_cache.latest_epoch() == 1
    lg.truncate_to(5)  # beyond the end: nothing at all changes
    assert lg.log_end_offset == 3 and lg.leader_epoch_cache.latest_epoch() == 1
    lg.close()


def test_out_of_range_handling_leaves_a_partition_that_became_leader_meanwhile(tmp_path: Path) -> None:
    """The follower asks the leader for its log's range (ListOffsets) when its fetch offset is out of range. If
    this broker becomes the partition's leader while that answer is awaited, the answer is about a log that is no
    longer ours to follow: truncating to it would drop what this broker appended as leader since."""
    lm = LogManager([tmp_path], LogConfig())
    lm.startup()
    lm.startup_complete()
    rm = ReplicaManager(2, lm)
    rm.set_cluster(lambda _b: None, _never_writes)
    p = rm.make_follower("t", 0, LogConfig(), leader_id=1, leader_epoch=0, replicas=[1, 2], isr=[1, 2])
    assert p is not None
    _append(p.log, 5)
    fetcher = ReplicaFetcherManager(rm, FetchSettings(broker_id=2))
    fetcher.add(p)
    state = fetcher._states[p.tp]

    class LeaderAnswering:
        """The old leader's ListOffsets answer (its log end: 2), arriving after this broker took over."""

        async def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
            fetcher.remove(p.tp)  # the controller made this broker the leader meanwhile
            _append(p.log, 3)  # and a producer appended to it
            part = SimpleNamespace(error_code=0, partition_index=0, offset=2)
            return SimpleNamespace(topics=[SimpleNamespace(partitions=[part])])

    anyio.run(fetcher._handle_out_of_range, LeaderAnswering(), state)
    assert p.log.log_end_offset == 8
    lm.shutdown()
