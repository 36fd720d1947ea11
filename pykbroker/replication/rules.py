"""Sans-I/O replication rules shared by the leader and the follower (Kafka's semantics).

Plain functions over offsets and epochs, so each rule is unit-tested on its own:
the leader's high watermark and ISR decisions, the leader's diverging-epoch answer to a
follower fetch (KIP-320/KIP-595) and the follower's truncation point for such an answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one remote replica, learnt from its fetches."""

    log_end_offset: int = UNDEFINED_OFFSET  # unknown until its first fetch
    log_start_offset: int = UNDEFINED_OFFSET
    last_fetch_ms: int = 0
    last_fetch_leader_leo: int = UNDEFINED_OFFSET  # the leader's LEO when that fetch was served
    last_caught_up_ms: int = 0

    def on_fetch(self, fetch_offset: int, log_start_offset: int, leader_leo: int, now_ms: int) -> None:
        """Kafka's lastCaughtUpTime: caught up to the leader's LEO now, or to its LEO at the previous fetch."""
        if fetch_offset >= leader_leo:
            self.last_caught_up_ms = max(self.last_caught_up_ms, now_ms)
        elif self.last_fetch_leader_leo >= 0 and fetch_offset >= self.last_fetch_leader_leo:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.last_fetch_ms)
        self.log_end_offset = fetch_offset
        self.log_start_offset = log_start_offset
        self.last_fetch_ms = now_ms
        self.last_fetch_leader_leo = leader_leo


def leader_high_watermark(leader_leo: int, isr: Iterable[int], leader_id: int,
                          followers: Mapping[int, FollowerState]) -> int:
    """The smallest LEO over the ISR (an ISR member not heard from yet counts as unknown, -1)."""
    hw = leader_leo
    for rid in isr:
        if rid == leader_id:
            continue
        st = followers.get(rid)
        hw = min(hw, st.log_end_offset if st is not None else UNDEFINED_OFFSET)
    return hw


def can_join_isr(state: FollowerState, high_watermark: int, leader_epoch_start: int) -> bool:
    """A follower rejoins once it has everything up to the HW and the leader's current epoch start."""
    return state.log_end_offset >= high_watermark and state.log_end_offset >= leader_epoch_start


def out_of_sync_replicas(isr: Iterable[int], leader_id: int, followers: Mapping[int, FollowerState],
                         now_ms: int, lag_max_ms: int) -> list[int]:
    """ISR members that have not caught up with the leader for longer than replica.lag.time.max.ms."""
    out: list[int] = []
    for rid in isr:
        if rid == leader_id:
            continue
        st = followers.get(rid)
        if st is None or now_ms - st.last_caught_up_ms > lag_max_ms:
            out.append(rid)
    return out


def diverging_epoch(last_fetched_epoch: int, fetch_offset: int,
                    epoch_end: tuple[int, int] | None) -> tuple[int, int] | None:
    """The leader's check of a follower fetch: (epoch, end offset) to truncate by, or None if consistent.

    ``epoch_end`` is the leader's (largest epoch <= last_fetched_epoch, its end offset), None when
    unknown.  The fetch diverges when that epoch is older than the follower's or ends before
    the fetch offset.
    """
    if last_fetched_epoch < 0:
        return None
    if epoch_end is None:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    epoch, end = epoch_end
    if end < fetch_offset or epoch < last_fetched_epoch:
        return epoch, end
    return None


def follower_truncation_offset(diverging: tuple[int, int], local_end_for_epoch: tuple[int, int] | None,
                               log_end_offset: int, high_watermark: int) -> int:
    """Where a follower truncates after a diverging-epoch answer (Kafka's follower rule).

    Unknown at the leader: truncate to the follower's high watermark.  Otherwise to the
    smaller of the leader's end offset for that epoch and our own end offset for it; if we do
    not know the epoch either, to the leader's end offset.  Never past our log end.
    """
    epoch, end = diverging
    if epoch < 0 or end < 0:
        return min(high_watermark, log_end_offset)
    if local_end_for_epoch is None:
        return min(end, log_end_offset)
    local_epoch, local_end = local_end_for_epoch
    if local_epoch == epoch:
        return min(end, local_end, log_end_offset)
    return min(local_end, log_end_offset)
