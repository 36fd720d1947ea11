"""Leader election follows Kafka's PartitionLeaderElectionAlgorithms and controller ISR rules."""

from __future__ import annotations

from pykbroker.controller.election import (
    NO_LEADER,
    LeaderAndIsr,
    controlled_shutdown_leader,
    elect_controlled_shutdown,
    elect_offline,
    elect_preferred,
    elect_reassignment,
    offline_leader,
    on_replicas_offline,
    preferred_leader,
    remove_from_isr,
)


def test_offline_election_takes_the_first_live_isr_replica_in_assignment_order() -> None:
    assert offline_leader([1, 2, 3], isr=[3, 2], online={2, 3}, unclean=False) == 2
    assert offline_leader([1, 2, 3], isr=[1], online={2, 3}, unclean=False) is None
    assert offline_leader([1, 2, 3], isr=[1], online={3, 2}, unclean=True) == 2
    assert offline_leader([1, 2, 3], isr=[1], online=set(), unclean=True) is None


def test_offline_election_isr_keeps_its_live_members_or_is_the_unclean_leader() -> None:
    assert elect_offline([1, 2, 3], [1, 2, 3], {2, 3}, False) == LeaderAndIsr(2, [2, 3])
    assert elect_offline([1, 2, 3], [1], {3}, True) == LeaderAndIsr(3, [3])
    assert elect_offline([1, 2, 3], [1], {3}, False) is None


def test_reassignment_election_uses_the_target_order() -> None:
    assert elect_reassignment([3, 2], [1, 2, 3], {1, 2, 3}) == LeaderAndIsr(3, [1, 2, 3])
    assert elect_reassignment([3, 2], [1, 2, 3], {1, 2}) == LeaderAndIsr(2, [1, 2, 3])
    assert elect_reassignment([3, 2], [1], {1, 2, 3}) is None


def test_preferred_election_only_picks_the_first_replica() -> None:
    assert preferred_leader([2, 1], [1, 2], {1, 2}) == 2
    assert preferred_leader([2, 1], [1], {1, 2}) is None  # not in ISR
    assert preferred_leader([2, 1], [1, 2], {1}) is None  # not live
    assert preferred_leader([], [1], {1}) is None
    assert elect_preferred([2, 1], [1, 2], {1, 2}) == LeaderAndIsr(2, [1, 2])


def test_controlled_shutdown_election_skips_brokers_shutting_down() -> None:
    assert controlled_shutdown_leader([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1}) == 2
    assert controlled_shutdown_leader([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1, 2}) == 3
    assert controlled_shutdown_leader([1, 2], [1], {1, 2}, {1}) is None
    assert elect_controlled_shutdown([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1, 3}) == LeaderAndIsr(2, [2])


def test_removing_from_isr_never_empties_it() -> None:
    assert remove_from_isr(1, [1, 2], {2}) == LeaderAndIsr(1, [1])
    assert remove_from_isr(1, [1, 2], {1}) == LeaderAndIsr(NO_LEADER, [2])
    assert remove_from_isr(1, [1], {1}) == LeaderAndIsr(NO_LEADER, [1])
    assert remove_from_isr(1, [2, 1, 3], {1, 2, 3}) == LeaderAndIsr(NO_LEADER, [1])  # the old leader stays
    assert remove_from_isr(NO_LEADER, [2, 3], {2, 3}) == LeaderAndIsr(NO_LEADER, [2])


def test_replicas_offline_elect_or_leave_the_partition_leaderless() -> None:
    # Leader died: a live ISR member takes over, dead replicas leave the ISR.
    assert on_replicas_offline([1, 2, 3], 1, [1, 2, 3], {2, 3}, False) == LeaderAndIsr(2, [2, 3])
    # A follower died: same leader, smaller ISR.
    assert on_replicas_offline([1, 2, 3], 1, [1, 2, 3], {1, 3}, False) == LeaderAndIsr(1, [1, 3])
    # Only dead ISR members: no leader, the last ISR member is kept (clean election impossible).
    assert on_replicas_offline([1, 2], 1, [1], {2}, False) == LeaderAndIsr(NO_LEADER, [1])
    assert on_replicas_offline([1, 2], 1, [1], {2}, True) == LeaderAndIsr(2, [2])
    # Nothing changes: None.
    assert on_replicas_offline([1, 2], 1, [1, 2], {1, 2}, False) is None
    assert on_replicas_offline([1, 2], NO_LEADER, [1], {2}, False) is None
    # The ISR member is back: it is elected.
    assert on_replicas_offline([1, 2], NO_LEADER, [1], {1, 2}, False) == LeaderAndIsr(1, [1])


def test_brokers_shutting_down_are_live_but_not_eligible() -> None:
    # Leader 1 is shutting down but alive: its partition is not offline.
    assert on_replicas_offline([1, 2], 1, [1, 2], {1, 2}, False, eligible={2}) is None
    # Leader 3 died; 1 is shutting down: 2 is elected and 1 leaves the new leader's ISR, as in Kafka.
    assert on_replicas_offline([3, 1, 2], 3, [3, 1, 2], {1, 2}, False, eligible={2}) == LeaderAndIsr(2, [2])
