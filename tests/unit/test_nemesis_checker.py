"""The fault campaign's checks on made-up histories: each anomaly is found, and a clean history has none."""

from __future__ import annotations

from itertools import pairwise

from tests.nemesis.checker import ASSIGNED, check
from tests.nemesis.schedule import FAULTS, schedule


def _final(n: int, partition: int = 0) -> list[tuple[int, int, bytes]]:
    return [(partition, i, b"v%d" % i) for i in range(n)]


def test_a_clean_history_has_no_anomalies() -> None:
    final = _final(5)
    acked = {b"v%d" % i: (0, i) for i in range(5)}
    polls = {"a": [ASSIGNED, *final[:3]], "b": [ASSIGNED, *final[3:]]}
    commits = {"a": [ASSIGNED, (0, 3)], "b": [ASSIGNED, (0, 5)]}
    assert check(acked, polls, commits, final).total == 0  # type: ignore[arg-type]


def test_each_anomaly_is_found() -> None:
    final = [(0, 0, b"v0"), (0, 1, b"v1"), (0, 2, b"v2"), (0, 3, b"v1"), (0, 4, b"v4")]
    acked = {b"v0": (0, 0), b"v1": (0, 1), b"v2": (0, 9), b"lost": (0, 7)}
    polls = {"a": [ASSIGNED, (0, 0, b"v0"), (0, 2, b"v2"), (0, 1, b"v1"), (0, 4, b"other")]}
    commits = {"a": [(0, 3), ASSIGNED, (0, 2)]}
    counts = check(acked, polls, commits, final).counts  # type: ignore[arg-type]
    assert counts["lost-write"] == 1  # b"lost" acknowledged, never read
    assert counts["duplicate"] == 1  # v1 at offsets 1 and 3
    assert counts["inconsistent-offset"] == 2  # v2 acknowledged at 9; "other" polled where v4 is
    assert counts["poll-skip"] == 2  # 0 -> 2 skips 1; 1 -> 4 skips 2 and 3
    assert counts["nonmonotonic-poll"] == 1  # 2 then 1
    assert counts["commit-backwards"] == 1  # 3 then 2, a rebalance between does not excuse it


def test_a_rebalance_lets_a_consumer_go_back() -> None:
    final = _final(4)
    polls = {"a": [ASSIGNED, *final[:3], ASSIGNED, *final[1:]]}
    assert check({}, polls, {}, final).total == 0  # type: ignore[arg-type]


def test_gaps_without_records_are_not_skips() -> None:
    final = [(0, 0, b"a"), (0, 5, b"b")]  # offsets 1-4: control batches or compacted away
    assert check({}, {"a": [ASSIGNED, *final]}, {}, final).total == 0  # type: ignore[arg-type]


def test_schedule_is_a_function_of_the_seed() -> None:
    one, again, other = schedule(7, 180, [1, 2, 3]), schedule(7, 180, [1, 2, 3]), schedule(8, 180, [1, 2, 3])
    assert one == again and one != other
    assert one and all(f.kind in FAULTS and 5 <= f.at < 170 for f in one)
    assert all(b.at >= a.at + a.hold + 6 for a, b in pairwise(one))
