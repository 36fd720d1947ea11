"""The fault schedule (tests/nemesis/schedule.py): the seed alone decides it, one fault at a time, every
kind reachable, targets that exist."""

from __future__ import annotations

from itertools import pairwise

from tests.nemesis.schedule import FAULTS, PARTITION_FAULTS, schedule

BROKERS = [1, 2, 3]


def test_the_same_seed_gives_the_same_schedule_and_others_differ() -> None:
    assert schedule(7, 180, BROKERS) == schedule(7, 180, BROKERS)
    assert len({tuple(schedule(seed, 180, BROKERS)) for seed in range(1, 21)}) == 20


def test_one_fault_at_a_time_and_the_last_seconds_quiet() -> None:
    for seed in range(1, 201):
        faults = schedule(seed, 120, BROKERS)
        assert faults and faults[0].at == 5.0
        for f, nxt in pairwise(faults):
            assert nxt.at >= f.at + f.hold + 6.0 - 0.02, (seed, f, nxt)
        assert faults[-1].at < 110.0


def test_targets_and_holds() -> None:
    for seed in range(1, 201):
        for f in schedule(seed, 120, BROKERS):
            assert f.kind in FAULTS
            if f.kind in ("pause_zookeeper", "preferred_election"):
                assert f.target == 0
            else:
                assert f.target in BROKERS
            assert 1.0 <= f.hold <= 8.0
            if f.kind == "pause_zookeeper":
                assert f.hold <= 4.0


def test_every_kind_is_scheduled_partitions_included() -> None:
    seen = {f.kind for seed in range(1, 51) for f in schedule(seed, 180, BROKERS)}
    assert seen == set(FAULTS)
    assert set(PARTITION_FAULTS) <= set(FAULTS)
    targets = {(f.kind, f.target) for seed in range(1, 101) for f in schedule(seed, 180, BROKERS)
               if f.kind in PARTITION_FAULTS}
    assert targets == {(k, b) for k in PARTITION_FAULTS for b in BROKERS}
