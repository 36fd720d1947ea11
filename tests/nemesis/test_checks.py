"""The campaign's transactional and share-group checks on made-up histories: a clean history passes, and each
anomaly, written into an otherwise clean history, is found under its own name."""

from __future__ import annotations

from tests.nemesis.checker import (
    ABORTED,
    COMMITTED,
    UNKNOWN,
    Anomalies,
    Record,
    Seen,
    Txn,
    check,
    check_transactions,
    share_deliveries,
)


def clean() -> tuple[list[Txn], dict[str, list[Seen]], list[Record]]:
    """Two key-value producers on partitions of their own (a on 0-1, b on 2-3) reading each other, and one aborted
    transaction; what a read_committed consumer saw after each commit, and the log."""
    a1 = Txn("a1", "a", COMMITTED, [(0, b"a1-0"), (1, b"a1-1")], [], commit_at=1.0, ended=1.1)
    b1 = Txn("b1", "b", COMMITTED, [(2, b"b1-2"), (3, b"b1-3")], [(0, 0, b"a1-0")], commit_at=2.0, ended=2.1)
    a2 = Txn("a2", "a", ABORTED, [(0, b"a2-0")], [(2, 0, b"b1-2")], ended=2.5)
    a3 = Txn("a3", "a", COMMITTED, [(0, b"a3-0"), (1, b"a3-1")], [(2, 0, b"b1-2"), (3, 0, b"b1-3")],
             commit_at=3.0, ended=3.1)
    b2 = Txn("b2", "b", UNKNOWN, [(2, b"b2-2")], [(0, 3, b"a3-0")], commit_at=4.0, ended=4.5)
    log = [(0, 0, b"a1-0"), (1, 0, b"a1-1"), (2, 0, b"b1-2"), (3, 0, b"b1-3"), (0, 3, b"a3-0"), (1, 2, b"a3-1")]
    seen = {"reader": [(1.2, 0, 0, b"a1-0"), (1.2, 1, 0, b"a1-1"), (2.2, 2, 0, b"b1-2"), (3.3, 0, 3, b"a3-0")]}
    return [a1, b1, a2, a3, b2], seen, log


def rpw(outcome2: str = ABORTED, offsets3: int = 5) -> tuple[list[Txn], list[bytes], list[Record]]:
    """Read-process-write: inputs i0..i4 processed by p1, then p2 (aborted: the inputs again), then p3."""
    p1 = Txn("p1", "w1", COMMITTED, [(0, b"i0|p1"), (0, b"i1|p1")], [(0, 0, b"i0"), (0, 1, b"i1")],
             commit_at=1.0, ended=1.1, offsets={0: 2})
    p2 = Txn("p2", "w1", outcome2, [(0, b"i2|p2")], [(0, 2, b"i2")], commit_at=None, ended=1.5, offsets={0: 3})
    p3 = Txn("p3", "w2", COMMITTED, [(0, b"i2|p3"), (0, b"i3|p3"), (0, b"i4|p3")],
             [(0, 2, b"i2"), (0, 3, b"i3"), (0, 4, b"i4")], commit_at=2.0, ended=2.1, offsets={0: offsets3})
    output = [(0, 0, b"i0|p1"), (0, 1, b"i1|p1"), (0, 5, b"i2|p3"), (0, 6, b"i3|p3"), (0, 7, b"i4|p3")]
    return [p1, p2, p3], [b"i%d" % i for i in range(5)], output


def counts(a: Anomalies) -> dict[str, int]:
    return dict(a.counts)


def test_a_clean_history_passes() -> None:
    txns, seen, log = clean()
    ptxns, inputs, output = rpw()
    assert counts(check_transactions(txns + ptxns, seen, {"kv": log, "out": output}, inputs, output)) == {}


def test_an_aborted_read_is_g1a() -> None:
    txns, seen, log = clean()
    seen["reader"].append((2.6, 0, 2, b"a2-0"))
    assert counts(check_transactions(txns, seen, {"kv": log}, [], [])) == {"G1a": 1}
    # In the committed log as well.
    assert counts(check_transactions(txns, {}, {"kv": [*log, (0, 2, b"a2-0")]}, [], [])) == {"G1a": 1}


def test_a_read_before_the_commit_was_asked_is_g1b() -> None:
    txns, seen, log = clean()
    seen["reader"].append((2.9, 1, 2, b"a3-1"))  # a3 asked to commit at 3.0
    assert counts(check_transactions(txns, seen, {"kv": log}, [], [])) == {"G1b": 1}


def test_a_write_cycle_is_g0() -> None:
    txns, seen, log = clean()
    # b1's record on partition 0 lands before a1's while a1's on 1 is before b1's there: a1 <ww b1 <ww a1.
    txns[1].writes.append((0, b"b1-0"))
    txns[1].writes.append((1, b"b1-1"))
    log = [(0, 0, b"b1-0"), (0, 1, b"a1-0"), (1, 0, b"a1-1"), (1, 1, b"b1-1"), *log[2:]]
    found = check_transactions(txns, seen, {"kv": log}, [], [])
    assert found.counts["G0"] == 1, found.as_dict()
    assert "G1c" in found.counts  # the write-read edges close larger cycles through the same transactions


def test_a_write_read_cycle_is_g1c() -> None:
    txns, seen, log = clean()
    txns[0].reads.append((2, 0, b"b1-2"))  # a1 read b1's record and b1 read a1's: a1 <wr b1 <wr a1
    assert counts(check_transactions(txns, seen, {"kv": log}, [], [])) == {"G1c": 1}


def test_a_cycle_of_write_write_and_write_read_edges_is_g1c() -> None:
    txns, seen, log = clean()
    # b1 also wrote partition 0 after a3 (a3 <ww b1) while b1 read a1 and a3 read b1 (b1 <wr a3): a cycle.
    txns[1].writes.append((0, b"b1-0"))
    log.append((0, 4, b"b1-0"))
    assert counts(check_transactions(txns, seen, {"kv": log}, [], [])) == {"G1c": 1}


def test_a_committed_transaction_partly_in_the_log_is_torn() -> None:
    txns, seen, log = clean()
    log.remove((1, 2, b"a3-1"))
    assert counts(check_transactions(txns, seen, {"kv": log}, [], [])) == {"torn-transaction": 1}


def test_an_unknown_outcome_may_be_all_or_nothing_but_not_part() -> None:
    txns, seen, log = clean()
    txns[4].writes.append((3, b"b2-3"))
    assert counts(check_transactions(txns, seen, {"kv": [*log, (2, 1, b"b2-2"), (3, 1, b"b2-3")]}, [], [])) == {}
    assert counts(check_transactions(txns, seen, {"kv": [*log, (2, 1, b"b2-2")]}, [], [])) == {"torn-transaction": 1}


def test_a_committed_transaction_missing_from_the_log_is_lost() -> None:
    txns, seen, log = clean()
    log = [r for r in log if not r[2].startswith(b"a3")]
    seen["reader"].pop()
    txns[4].reads.clear()
    assert counts(check_transactions(txns, seen, {"kv": log}, [], [])) == {"lost-transaction": 1}


def test_group_offsets_committed_lower_move_backwards() -> None:
    ptxns, inputs, output = rpw(offsets3=1)
    assert counts(check_transactions(ptxns, {}, {"out": output}, inputs, output)) == {"txn-offset-backwards": 1}


def test_an_input_processed_twice_into_the_committed_output_is_a_duplicate() -> None:
    ptxns, inputs, output = rpw(outcome2=COMMITTED)  # p2 committed, and p3 processed i2 again
    output.insert(2, (0, 2, b"i2|p2"))
    found = counts(check_transactions(ptxns, {}, {"out": output}, inputs, output))
    assert found == {"eos-duplicate": 1}


def test_an_input_without_derived_record_is_missing() -> None:
    ptxns, inputs, output = rpw()
    inputs.append(b"i5")
    assert counts(check_transactions(ptxns, {}, {"out": output}, inputs, output)) == {"eos-missing": 1}


def test_an_output_record_of_no_transaction_is_foreign() -> None:
    ptxns, inputs, output = rpw()
    output.append((0, 8, b"stray"))
    assert counts(check_transactions(ptxns, {}, {"out": output}, inputs, output)) == {"eos-foreign": 1}


def share_history() -> tuple[dict[bytes, tuple[int, int]], list[tuple[float, str, int, int]],
                             list[tuple[float, str, int, int]]]:
    """Three records; the second delivered twice because its first acceptance was not confirmed."""
    acked = {b"v0": (0, 0), b"v1": (0, 1), b"v2": (1, 0)}
    delivered = [(1.0, "c1", 0, 0), (1.0, "c1", 0, 1), (1.1, "c2", 1, 0), (3.0, "c2", 0, 1)]
    accepted = [(1.2, "c1", 0, 0), (1.3, "c2", 1, 0), (3.1, "c2", 0, 1)]
    return acked, delivered, accepted


def test_share_clean_history_passes() -> None:
    out = Anomalies()
    share_deliveries(out, *share_history())
    assert counts(out) == {}


def test_share_record_never_delivered() -> None:
    acked, delivered, accepted = share_history()
    acked[b"v3"] = (1, 1)
    out = Anomalies()
    share_deliveries(out, acked, delivered, accepted)
    assert counts(out) == {"share-undelivered": 1}


def test_share_record_delivered_and_accepted_again_after_a_confirmed_acceptance() -> None:
    acked, delivered, accepted = share_history()
    delivered.append((4.0, "c1", 0, 0))
    out = Anomalies()
    share_deliveries(out, acked, delivered, accepted)
    assert counts(out) == {"share-redelivered": 1}
    accepted.append((4.1, "c1", 0, 0))
    out = Anomalies()
    share_deliveries(out, acked, delivered, accepted)
    assert counts(out) == {"share-redelivered": 1, "share-accepted-twice": 1}


def test_a_client_call_that_does_not_return_in_time_is_abandoned() -> None:
    import threading

    import pytest

    from tests.nemesis.transactional import Abandoned, bounded

    release = threading.Event()

    def hangs() -> None:
        release.wait(10)

    with pytest.raises(Abandoned):
        bounded(hangs, 0.2)
    release.set()

    def fails() -> None:
        raise ValueError("from the call")

    with pytest.raises(ValueError, match="from the call"):
        bounded(fails, 5)
    bounded(lambda: None, 5)


def test_an_acknowledgement_without_an_offset_is_checked_by_partition() -> None:
    """librdkafka acknowledges the batches before an acknowledged one implicitly, with no offset (None)."""
    final: list[Record] = [(4, 0, b"a"), (4, 1, b"b"), (2, 0, b"c")]
    fine = check({b"a": (4, 0), b"b": (4, None), b"c": (2, -1)}, {}, {}, final)
    assert fine.total == 0, fine.as_dict()
    wrong = check({b"b": (3, None)}, {}, {}, final)
    assert dict(wrong.counts) == {"inconsistent-offset": 1}, wrong.as_dict()
    lost = check({b"d": (4, None)}, {}, {}, final)
    assert dict(lost.counts) == {"lost-write": 1}, lost.as_dict()


def java_lines() -> list[str]:
    """What tests/nemesis/java/NemesisClient.java prints for four records: sent, acknowledged, polled by one member
    after its assignment and committed."""
    import json

    events: list[dict[str, object]] = [{"e": "assigned", "c": "java-reader-1", "partitions": [0, 1]}]
    for n, (p, o) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        v = f"t-java-{n:08d}"
        events += [{"e": "send", "v": v}, {"e": "ack", "v": v, "p": p, "o": o}]
    for n, (p, o) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        events.append({"e": "poll", "c": "java-reader-1", "p": p, "o": o, "v": f"t-java-{n:08d}"})
    events += [{"e": "commit", "c": "java-reader-1", "p": p, "o": 2} for p in (0, 1)]
    events += [{"e": "producer-closed", "sent": 4, "unreported": 0}, {"e": "closed"}]
    return [json.dumps(e) for e in events]


def java_final() -> list[Record]:
    return [(0, 0, b"t-java-00000000"), (1, 0, b"t-java-00000001"), (0, 1, b"t-java-00000002"),
            (1, 1, b"t-java-00000003")]


def java_check(lines: list[str], final: list[Record]) -> dict[str, int]:
    """The Java client's observations through the campaign's checks, named as the campaign reports them."""
    from tests.nemesis.java_workload import Observations

    seen = Observations()
    for line in lines:
        seen.add(line + "\n")
    out = Anomalies()
    out.merge(seen.check(final), prefix="java-")
    return counts(out)


def test_the_java_clients_clean_history_passes() -> None:
    from tests.nemesis.java_workload import Observations

    seen = Observations()
    for line in ["SLF4J: not an event", *java_lines()]:
        seen.add(line + "\n")
    assert len(seen.acked) == 4 and seen.consumed() == 4 and seen.unreported == 0 and seen.closed
    assert seen.polls["java-reader-1"][0] == "assigned" and seen.noise == ["SLF4J: not an event"]
    assert java_check(java_lines(), java_final()) == {}


def test_an_acknowledged_java_record_missing_from_the_log_is_a_lost_write() -> None:
    final = java_final()
    del final[2]  # acknowledged at 0:1, not in the topic read back whole
    lines = [x for x in java_lines() if '"t-java-00000002"' not in x or '"ack"' in x]  # nor polled
    assert java_check(lines, final) == {"java-lost-write": 1}


def test_java_polls_and_commits_out_of_order_are_found() -> None:
    lines = java_lines()
    polls = [i for i, x in enumerate(lines) if '"poll"' in x]
    lines[polls[0]], lines[polls[2]] = lines[polls[2]], lines[polls[0]]  # 0:1 polled before 0:0
    commit = '{"e": "commit", "c": "java-reader-1", "p": 0, "o": 1}'  # after 0:2 was committed
    assert java_check([*lines, commit], java_final()) == {"java-nonmonotonic-poll": 1, "java-commit-backwards": 1}
    # A rebalance between them allows a member to poll again from the committed offset.
    rebalanced = [*java_lines(), '{"e": "revoked", "c": "java-reader-1", "partitions": [0, 1]}',
                  '{"e": "poll", "c": "java-reader-1", "p": 0, "o": 1, "v": "t-java-00000002"}']
    assert java_check(rebalanced, java_final()) == {}
    skipped = [x for x in java_lines() if not ('"poll"' in x and '"t-java-00000002"' in x)]
    extra = '{"e": "poll", "c": "java-reader-1", "p": 0, "o": 2, "v": "t-java-00000004"}'
    assert java_check([*skipped, extra], [*java_final(), (0, 2, b"t-java-00000004")]) == {"java-poll-skip": 1}
