"""Replication rules without I/O: HW over the ISR, ISR expand/shrink, diverging epochs, follower truncation."""

from __future__ import annotations

from pathlib import Path

from kio.schema.errors import ErrorCode

from pykbroker.protocol.records import build_batch, validate_for_append
from pykbroker.replica.replica_manager import Partition
from pykbroker.replication.rules import (
    FollowerState,
    can_join_isr,
    diverging_epoch,
    follower_truncation_offset,
    leader_high_watermark,
    out_of_sync_replicas,
)
from pykbroker.storage.log import Log
from pykbroker.storage.log_config import LogConfig

T0 = 1_700_000_000_000


def _append(lg: Log, n: int = 1) -> None:
    buf = bytearray(build_batch([(b"k", b"v", [])] * n, timestamp_ms=T0))
    lg.append(buf, validate_for_append(buf, max_batch_bytes=10**7, now_ms=T0, timestamp_type=0))


def test_high_watermark_is_the_smallest_leo_over_the_isr() -> None:
    followers = {2: FollowerState(log_end_offset=7), 3: FollowerState(log_end_offset=4)}
    assert leader_high_watermark(10, [1, 2, 3], 1, followers) == 4
    assert leader_high_watermark(10, [1, 2], 1, followers) == 7
    assert leader_high_watermark(10, [1], 1, followers) == 10
    # An ISR member not heard from since we became leader holds the HW back.
    assert leader_high_watermark(10, [1, 4], 1, followers) == -1


def test_caught_up_time_follows_kafka() -> None:
    st = FollowerState()
    st.on_fetch(5, 0, leader_leo=10, now_ms=1000)  # behind, first fetch: not caught up
    assert st.last_caught_up_ms == 0 and st.log_end_offset == 5
    st.on_fetch(10, 0, leader_leo=12, now_ms=2000)  # reached the leader's LEO of the previous fetch
    assert st.last_caught_up_ms == 1000
    st.on_fetch(12, 0, leader_leo=12, now_ms=3000)  # at the leader's LEO
    assert st.last_caught_up_ms == 3000


def test_out_of_sync_and_join_rules() -> None:
    followers = {2: FollowerState(log_end_offset=9, last_caught_up_ms=1000),
                 3: FollowerState(log_end_offset=3, last_caught_up_ms=5000)}
    assert out_of_sync_replicas([1, 2, 3], 1, followers, now_ms=5500, lag_max_ms=1000) == [2]
    assert out_of_sync_replicas([1, 2, 3], 1, followers, now_ms=5500, lag_max_ms=10_000) == []
    assert out_of_sync_replicas([1, 4], 1, followers, now_ms=5500, lag_max_ms=10_000) == [4]  # never fetched
    assert can_join_isr(followers[2], high_watermark=9, leader_epoch_start=5)
    assert not can_join_isr(followers[3], high_watermark=9, leader_epoch_start=0)
    assert not can_join_isr(followers[2], high_watermark=5, leader_epoch_start=10)


def test_diverging_epoch_decision() -> None:
    assert diverging_epoch(-1, 10, None) is None  # a follower without epochs: nothing to check
    assert diverging_epoch(3, 10, (3, 12)) is None  # consistent
    assert diverging_epoch(3, 12, (3, 12)) is None
    assert diverging_epoch(3, 12, (3, 10)) == (3, 10)  # our epoch 3 ends before its fetch offset
    assert diverging_epoch(4, 12, (3, 10)) == (3, 10)  # it has an epoch we never had
    assert diverging_epoch(4, 12, None) == (-1, -1)  # unknown here


def test_follower_truncation_rule() -> None:
    # Same epoch on both sides: the smaller end offset.
    assert follower_truncation_offset((3, 10), (3, 12), log_end_offset=15, high_watermark=5) == 10
    assert follower_truncation_offset((3, 10), (3, 8), log_end_offset=15, high_watermark=5) == 8
    # We do not know the leader's epoch: its end offset.
    assert follower_truncation_offset((3, 10), None, log_end_offset=15, high_watermark=5) == 10
    # Our largest epoch below it ends earlier: our end for it (the next fetch refines).
    assert follower_truncation_offset((3, 10), (2, 7), log_end_offset=15, high_watermark=5) == 7
    # Unknown at the leader: our high watermark.
    assert follower_truncation_offset((-1, -1), None, log_end_offset=15, high_watermark=5) == 5
    # Never past our own end.
    assert follower_truncation_offset((3, 40), (3, 50), log_end_offset=15, high_watermark=5) == 15


def _partition(tmp_path: Path, isr: list[int]) -> Partition:
    lg = Log.open(tmp_path / "t-0", LogConfig(), recover=False)
    lg.become_leader(0)
    p = Partition("t", 0, lg, 1, 0, [1, 2, 3], list(isr), local_id=1)
    p.reset_followers(now_ms=1000)
    return p


def test_partition_hw_alone_follows_the_leo(tmp_path: Path) -> None:
    p = _partition(tmp_path, [1])
    _append(p.log, 3)
    assert p.maybe_advance_high_watermark() and p.high_watermark == 3
    assert not p.maybe_advance_high_watermark()


def test_partition_hw_waits_for_the_isr_and_never_goes_back(tmp_path: Path) -> None:
    p = _partition(tmp_path, [1, 2, 3])
    _append(p.log, 5)
    assert not p.maybe_advance_high_watermark() and p.high_watermark == 0
    p.update_follower_fetch(2, 5, 0, now_ms=2000)
    assert not p.maybe_advance_high_watermark()  # 3 has not fetched
    p.update_follower_fetch(3, 2, 0, now_ms=2000)
    assert p.maybe_advance_high_watermark() and p.high_watermark == 2
    p.update_follower_fetch(3, 1, 0, now_ms=2100)  # a truncated follower does not pull the HW back
    assert not p.maybe_advance_high_watermark() and p.high_watermark == 2
    assert p.is_leader


def test_partition_isr_expand_and_shrink(tmp_path: Path) -> None:
    p = _partition(tmp_path, [1, 2])
    _append(p.log, 4)
    p.update_follower_fetch(2, 4, 0, now_ms=1500)
    p.maybe_advance_high_watermark()
    assert p.high_watermark == 4
    assert p.maybe_expand_isr(3) is None  # 3 has not fetched
    assert p.maybe_expand_isr(2) is None  # already in
    p.update_follower_fetch(3, 2, 0, now_ms=1500)
    assert p.maybe_expand_isr(3) is None  # behind the HW
    p.update_follower_fetch(3, 4, 0, now_ms=1600)
    assert p.maybe_expand_isr(3) == [1, 2, 3]
    assert p.maybe_expand_isr(4) is None  # not a replica
    # 2 caught up at 1500; with a 1000 ms limit it is out at 2600 but not at 2400.
    assert p.maybe_shrink_isr(2400, 1000) is None
    assert p.maybe_shrink_isr(2600, 1000) == [1]
    # Once out, a follower's last known state does not bring it back: only its own fetch does.
    p.isr = [1]
    p.update_follower_fetch(3, 4, 0, now_ms=2700)
    assert p.maybe_expand_isr(3) == [1, 3]
    p.isr = [1, 3]
    p.update_follower_fetch(3, 4, 0, now_ms=2800)
    assert p.maybe_expand_isr(3) is None


def test_fast_fetch_encoder_writes_the_diverging_epoch_tag() -> None:
    """The leader's diverging_epoch (tagged field 0 of Fetch v12+ partitions) is on the wire, as kio writes it."""
    from pykbroker.protocol import codec
    from pykbroker.protocol.fast_codec import encode_fetch_response

    part = {"partition_index": 0, "error_code": ErrorCode.none, "high_watermark": 5, "last_stable_offset": 5,
            "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1, "records": b"",
            "diverging_epoch": {"epoch": 3, "end_offset": 42}}
    body = {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0,
            "responses": [{"topic": "t", "topic_id": None, "partitions": [part]}]}
    fast = encode_fetch_response(12, body)
    assert fast == codec.encode_response(1, 12, body)
    decoded = codec.decode_response(1, 12, fast, 0)
    div = decoded.responses[0].partitions[0].diverging_epoch
    assert (div.epoch, div.end_offset) == (3, 42)
    del part["diverging_epoch"]
    assert encode_fetch_response(12, body) == codec.encode_response(1, 12, body)
