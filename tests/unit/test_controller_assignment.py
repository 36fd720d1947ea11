"""Replica assignment follows Kafka's AdminUtils.assignReplicasToBrokers."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pykbroker.controller.assignment import (
    AssignmentError,
    InvalidPartitions,
    InvalidReplicationFactor,
    assign_new_partitions,
    assign_replicas,
    rack_alternated,
)


def test_rack_unaware_matches_kafkas_documented_layout() -> None:
    # Kafka's javadoc example: 5 brokers, 10 partitions, 3 replicas, start index 0.
    got = assign_replicas({b: None for b in range(5)}, 10, 3, fixed_start_index=0)
    assert got == {
        0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
        5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2],
    }


def test_rack_unaware_uses_broker_ids_sorted() -> None:
    got = assign_replicas({30: None, 10: None, 20: None}, 3, 2, fixed_start_index=0)
    assert got == {0: [10, 20], 1: [20, 30], 2: [30, 10]}


def test_random_start_is_reproducible_with_a_seeded_rng_and_balanced() -> None:
    brokers = {b: None for b in range(1, 7)}
    a = assign_replicas(brokers, 60, 3, rng=random.Random(7))
    b = assign_replicas(brokers, 60, 3, rng=random.Random(7))
    assert a == b
    leaders = Counter(r[0] for r in a.values())
    assert set(leaders.values()) == {10}
    replicas = Counter(x for r in a.values() for x in r)
    assert set(replicas.values()) == {30}
    assert all(len(set(r)) == 3 for r in a.values())


def test_rack_alternated_list_matches_kafkas_example() -> None:
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert rack_alternated(racks) == [0, 3, 1, 5, 4, 2]
    assert rack_alternated({0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b", 6: "c", 7: "c", 8: "c"}) == \
        [0, 3, 6, 1, 4, 7, 2, 5, 8]


def test_rack_aware_matches_kafkas_documented_layout() -> None:
    racks: dict[int, str | None] = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    got = assign_replicas(racks, 7, 3, fixed_start_index=0)
    assert {p: got[p] for p in range(6)} == {
        0: [0, 3, 1], 1: [3, 1, 5], 2: [1, 5, 4], 3: [5, 4, 2], 4: [4, 2, 0], 5: [2, 0, 3]}
    assert got[6] == [0, 4, 2]  # the second round shifts the followers


def test_rack_aware_spreads_every_partition_over_all_racks() -> None:
    racks: dict[int, str | None] = {b: f"r{b % 3}" for b in range(9)}
    got = assign_replicas(racks, 90, 3, rng=random.Random(3))
    for replicas in got.values():
        assert len({racks[b] for b in replicas}) == 3
        assert len(set(replicas)) == 3
    assert set(Counter(r[0] for r in got.values()).values()) == {10}
    # More replicas than racks: every rack holds at least one, no broker twice.
    got = assign_replicas({b: f"r{b % 2}" for b in range(6)}, 12, 3, fixed_start_index=1)
    for replicas in got.values():
        assert len({b % 2 for b in replicas}) == 2 and len(set(replicas)) == 3


def test_errors_carry_kafkas_messages_and_codes() -> None:
    with pytest.raises(InvalidReplicationFactor, match=r"^Replication factor: 3 larger than available brokers: 2\.$") \
            as e:
        assign_replicas({1: None, 2: None}, 1, 3)
    assert e.value.error_code == 38
    with pytest.raises(InvalidReplicationFactor, match="must be larger than 0"):
        assign_replicas({1: None}, 1, 0)
    with pytest.raises(InvalidPartitions, match="Number of partitions must be larger than 0.") as p:
        assign_replicas({1: None}, 0, 1)
    assert p.value.error_code == 37
    with pytest.raises(AssignmentError, match="Not all brokers have rack information for replica rack aware"):
        assign_replicas({1: "a", 2: None}, 1, 1)


def test_start_partition_id_continues_the_numbering() -> None:
    got = assign_replicas({b: None for b in range(3)}, 2, 2, fixed_start_index=0, start_partition_id=3)
    assert got == {3: [0, 2], 4: [1, 0]}


def test_new_partitions_keep_the_replication_factor_and_continue_the_layout() -> None:
    brokers: dict[int, str | None] = {1: None, 2: None, 3: None}
    existing = assign_replicas(brokers, 3, 2, fixed_start_index=1)
    added = assign_new_partitions(brokers, existing, 6)
    assert sorted(added) == [3, 4, 5]
    assert all(len(r) == 2 and len(set(r)) == 2 for r in added.values())
    assert [added[p][0] for p in (3, 4, 5)] == [2, 3, 1]  # round-robin goes on from partition 0's leader
    with pytest.raises(InvalidPartitions):
        assign_new_partitions(brokers, existing, 3)
