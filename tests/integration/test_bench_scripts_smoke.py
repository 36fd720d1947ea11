"""Smoke runs of the cluster benchmark scripts (bench/cluster_bench.py, bench/replication_bench.py,
bench/multiprocess_bench.py) at tiny sizes, so that they keep working as the broker changes. Nothing here
is about speed: a run must finish, exit 0 and print its tables (replication_bench and multiprocess_bench
exit 1 on a delivery error, a lost or duplicated record).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.zookeeper import zookeeper_available

if not zookeeper_available():  # scripts/install.sh --test installs Debian's zookeeper package
    raise RuntimeError("ZooKeeper (Debian package zookeeper) is needed by this test: run scripts/install.sh --test")

pytestmark = [pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_replication_bench_smoke() -> None:
    out = _run("replication_bench.py", "--only", "throughput,e2e,failover", "--sizes", "100", "--acks", "all",
               "--count-small", "2000", "--e2e-seconds", "0.5", "--e2e-rate", "500", "--failover-signals", "term",
               "--repeat", "1", "--failover-rate", "100")
    assert "| 100 B | 3 | all |" in out
    assert "| SIGTERM | 1 |" in out
    assert "### End-to-end at 500 msg/s" in out


def test_cluster_bench_smoke() -> None:
    out = _run("cluster_bench.py", "--only", "metadata", "--partitions", "20", "--metadata-rounds", "3")
    assert "| create 20 partitions (RF 1, 1 topics of 20) s |" in out
    assert "| Metadata v12 one topic (20 partitions) p99 ms |" in out


def test_bench_smoke() -> None:
    out = _run("bench.py", "--compare", "--brokers", "pykbroker", "--sizes", "100", "--acks", "1",
               "--partitions", "20", "--count-small", "2000", "--e2e-seconds", "0.5", "--e2e-rate", "500",
               "--wait-idle", "0")
    assert "| 100B acks=1 p=20 | pykbroker |" in out and "FAIL" not in out.split("CPU (broker")[0]


def test_fanout_bench_smoke() -> None:
    out = _run("fanout_bench.py", "--groups", "2", "--consumers", "2", "--idle-producers", "10",
               "--active-producers", "3", "--rate", "300", "--seconds", "1", "--drain", "2")
    assert "| idle producer connections up | 10 |" in out
    assert "| received per group, min of 2 (of " in out


def test_multiprocess_bench_smoke() -> None:
    out = _run("multiprocess_bench.py", "--processes", "1,2", "--sizes", "100", "--count", "3000", "--partitions", "4",
               "--clients", "1")
    assert "| 1 | 100 B | 4 | " in out and "| 2 | 100 B | 2/2 | " in out, out
    assert "FAILURES" not in out
