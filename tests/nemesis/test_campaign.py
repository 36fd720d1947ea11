"""Three short seeds of the fault campaign (the full one is ``python -m tests.nemesis.campaign --seeds 1-100``,
docs/reliability.md): a 3-broker ZooKeeper cluster under an idempotent producer and a consumer group, with
read-process-write and key-value transactions and a share group beside them, random kills, restarts, pauses
of a broker or of ZooKeeper, controlled restarts and preferred elections, then Jepsen's Kafka checks (with the
transactional ones: G0, G1a, G1b, G1c, torn transactions, exactly-once) over what the clients saw. Each
seed's report and observations go to build/artifacts/nemesis/seed-<seed>/."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nemesis.campaign import ARTIFACTS, run
from tests.support.zookeeper import zookeeper_available

if not zookeeper_available():  # scripts/install.sh --test installs Debian's zookeeper package
    raise RuntimeError("ZooKeeper (Debian package zookeeper) is needed by tests/nemesis: run scripts/install.sh --test")

pytestmark = [pytest.mark.timeout(600)]


# Seeds whose schedules together apply every kind of fault in 45 s.
@pytest.mark.parametrize("seed", [1, 2, 9])
def test_short_seed_has_no_anomalies(seed: int, tmp_path: Path) -> None:
    report = run(seed, 45.0, tmp_path, ARTIFACTS / f"seed-{seed}")
    assert report["faults"], "the schedule applied no fault"
    assert report["acknowledged"] > 1000 and report["unreported"] == 0, report
    assert report["anomaly_total"] == 0, report["anomalies"]
    assert report["producer_error_count"] == 0, report["producer_errors"]
    # The transactional and share-group workloads did their part.
    assert report["input_acknowledged"] > 100, report
    assert all(n["committed"] > 5 and n["aborted"] > 0 for n in report["transactions"].values()), report["transactions"]
    assert report["share_acknowledged"] > 100 and report["share_accepted"] > 0, report
