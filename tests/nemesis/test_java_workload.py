"""The Java client's workload of the fault campaign against one broker, without faults: the program's real
output reaches the campaign's checks, a clean run passes them, and one acknowledged record taken out of the
topic read back is reported as a lost write, one committed derived record taken out of the output as a torn
transaction and a missing one (so the Java workload's checks cannot pass vacuously)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.nemesis.java_workload import JavaWorkload
from tests.support.broker import BrokerProcess
from tests.support.cluster import wait_for

pytestmark = [pytest.mark.timeout(300)]


def _both_outcomes(w: JavaWorkload) -> bool:
    """Each processor committed, and one of them aborted (a seeded fifth of the transactions)."""
    counts = w.seen.transaction_counts().values()
    return len(counts) == 2 and all(n["committed"] > 0 for n in counts) and any(n["aborted"] for n in counts)


def test_the_java_clients_observations_reach_the_checks(broker: BrokerProcess, tmp_path: Path) -> None:
    w = JavaWorkload(broker.bootstrap, f"t{uuid.uuid4().hex[:8]}", rate=50, max_seconds=240,
                     log=tmp_path / "java-client.log", replication=1)
    try:
        w.start()
        wait_for(lambda: (len(w.seen.acked) >= 200 and _both_outcomes(w)) or None, timeout=120, interval=0.2,
                 what="200 acknowledgements, and each processor's commits with an abort among them")
        unreported = w.stop_and_flush(60)
        wait_for(lambda: w.drained() or None, timeout=90, interval=0.2,
                 what="the Java group polling everything and its processors committing it")
    finally:
        w.stop()
    w.read_final()
    report = w.report()
    log = (tmp_path / "java-client.log").read_text(errors="replace")[-2000:]
    assert unreported == 0 and report["java_closed_cleanly"], (report, log)
    assert report["java_producer_error_count"] == 0 and report["java_sent"] == report["java_acknowledged"], report
    assert sorted(report["java_consumed"]) == ["java-reader-1", "java-reader-2"], report
    assert report["java_final_records"] == report["java_acknowledged"], report
    # Every member's history starts at an assignment and every acknowledged value is in the group's polls.
    assert all(seen[0] == "assigned" for seen in w.seen.polls.values() if seen), w.seen.polls
    txns = report["java_transactions"]
    assert sorted(txns) == ["java-processor-1", "java-processor-2"], report
    assert all(n["committed"] > 0 for n in txns.values()) and sum(n["aborted"] for n in txns.values()) > 0, report
    assert report["java_output_records"] == report["java_acknowledged"], report
    assert w.check().total == 0, w.check().as_dict()

    value, _ = next(iter(w.seen.acked.items()))
    without = [r for r in w.final if r[2] != value]
    assert len(without) == len(w.final) - 1
    found = w.seen.check(without)
    assert dict(found.counts) == {"lost-write": 1}, found.as_dict()
    torn = next(t for t in w.seen.txns if t.outcome == "committed" and len(t.writes) > 1)
    gone = torn.writes[0][1]
    output = [r for r in w.final_output if r[2] != gone]
    found = w.seen.check(w.final, w.output, output)
    assert dict(found.counts) == {"torn-transaction": 1, "eos-missing": 1}, found.as_dict()
