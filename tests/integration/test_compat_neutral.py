"""The compat suite against a broker that advertises ConsumerGroupHeartbeat with KIP-848 switched off.

Kafka 3.8 does that by default (and answers UNSUPPORTED_VERSION); pykbroker does the same with
``group.coordinator.rebalance.protocols=classic``.  The suite must say "not supported by the broker"
at once, from the members' own errors, instead of waiting 45 s per client and failing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(420)
def test_consumer_protocol_disabled_is_reported_as_not_supported_by_the_broker(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "compat",
         "-k", "rebalance_consumer_protocol", "--clients", "confluent-kafka,java",
         "--pykbroker-override", "group.coordinator.rebalance.protocols=classic",
         "--results", str(results)],
        cwd=REPO, capture_output=True, text=True, timeout=400)  # the first run may fetch the Java client
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(results.read_text())
    got = {r["client"]: r for r in doc["results"]}
    assert set(got) == {"confluent-kafka", "java"}
    for client, r in got.items():
        assert (r["outcome"], r.get("by")) == ("not_supported", "broker"), (client, r)
        assert "answered UNSUPPORTED_VERSION" in r["detail"], (client, r["detail"])
        # The member's own error ends the wait; the scenario's join timeout is 45 s.
        assert r["duration"] < 20, (client, r["duration"])
