"""Three short seeds of the fault campaign (the full one is ``python -m tests.nemesis.campaign --seeds 1-100``,
docs/reliability.md): a 3-broker ZooKeeper cluster, each node in a network namespace of its own, under an
idempotent producer and a consumer group of confluent-kafka and another pair of the Java client's (with its own
read-process-write), with read-process-write and key-value transactions and a share group beside them; random
kills, restarts, pauses of a broker or of ZooKeeper, controlled restarts, preferred elections, wall-clock steps,
a full disk and network partitions, then Jepsen's Kafka checks (with the transactional ones: G0, G1a, G1b, G1c,
torn transactions, exactly-once) over what the clients saw. Each seed's report and observations go to
build/artifacts/nemesis/seed-<seed>/."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nemesis.campaign import ARTIFACTS, run
from tests.nemesis.schedule import FAULTS, schedule
from tests.support.netns import unavailable
from tests.support.zookeeper import zookeeper_available

if not zookeeper_available():  # scripts/install.sh --test installs Debian's zookeeper package
    raise RuntimeError("ZooKeeper (Debian package zookeeper) is needed by tests/nemesis: run scripts/install.sh --test")
if unavailable() is not None:  # the partitions need network namespaces (CI runs as root)
    raise RuntimeError(f"tests/nemesis needs network namespaces: {unavailable()}")

pytestmark = [pytest.mark.timeout(600)]

# Seeds whose schedules together apply every kind of fault in 52 s.
SEEDS = (3514, 30, 1284)
DURATION = 52.0


def test_the_short_seeds_schedule_every_kind_of_fault() -> None:
    kinds = {f.kind for seed in SEEDS for f in schedule(seed, DURATION, [1, 2, 3])}
    assert kinds == set(FAULTS), set(FAULTS) - kinds


@pytest.mark.parametrize("seed", SEEDS)
def test_short_seed_has_no_anomalies(seed: int, tmp_path: Path) -> None:
    report = run(seed, DURATION, tmp_path, ARTIFACTS / f"seed-{seed}")
    assert [f["kind"] for f in report["faults"]] == [f.kind for f in schedule(seed, DURATION, [1, 2, 3])], \
        "every scheduled fault applied"
    assert report["acknowledged"] > 1000 and report["unreported"] == 0, report
    assert report["anomaly_total"] == 0, report["anomalies"]
    assert report["producer_error_count"] == 0, report["producer_errors"]
    # The Java client's producer and group: every send acknowledged, every record read back, clients closed.
    assert report["java_acknowledged"] > 1000 and report["java_unreported"] == 0, report
    assert report["java_producer_error_count"] == 0, report["java_producer_errors"]
    assert report["java_final_records"] == report["java_acknowledged"] == report["java_sent"], report
    assert len(report["java_consumed"]) == 2 and report["java_closed_cleanly"], report
    java_txns = report["java_transactions"].values()
    assert len(java_txns) == 2 and all(n["committed"] > 5 for n in java_txns), report["java_transactions"]
    assert report["java_output_records"] == report["java_acknowledged"], report
    # The transactional and share-group workloads did their part.
    assert report["input_acknowledged"] > 100, report
    # Each worker commits; a fifth of the transactions abort on purpose, so some abort (all four workers'
    # 50-odd transactions committing by chance: about 1 in 100,000 seeds; one worker's 12: 1 in 15).
    txns = report["transactions"].values()
    assert all(n["committed"] > 5 for n in txns) and sum(n["aborted"] for n in txns) > 0, report["transactions"]
    assert report["share_acknowledged"] > 100 and report["share_accepted"] > 0, report
