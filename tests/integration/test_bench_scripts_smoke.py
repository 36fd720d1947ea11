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
               "--wait-idle", "0", "--warmup", "500")
    assert "| 100B acks=1 p=20 | pykbroker |" in out and "FAIL" not in out.split("CPU (broker")[0]


def test_bench_e2e_split_smoke() -> None:
    """--e2e-split: the e2e topic stamps LogAppendTime and every measured message is split at the append."""
    out = _run("bench.py", "--compare", "--brokers", "pykbroker", "--sizes", "100", "--acks", "1",
               "--count-small", "1000", "--e2e-seconds", "1", "--e2e-rate", "500", "--wait-idle", "0",
               "--e2e-split")
    notes = [line for line in out.splitlines() if "e2e: split over" in line]
    assert len(notes) == 1, out
    measured = int(notes[0].split("split over ")[1].split(" ")[0].replace(",", ""))
    assert measured >= 450, notes  # every measured message of the 1 s at 500 msg/s carried the split
    assert "send -> append p50" in notes[0] and "append -> poll p50" in notes[0]


def test_bench_kafka_command_contract(tmp_path: Path) -> None:
    """--brokers kafka-fsync --kafka-cmd: the script gets PORT and DATA_DIR, $CONTROLLER_PORT and the
    extra server properties (Kafka's flush-every-message counterpart of log.flush.on.ack).  Apache Kafka
    cannot be installed here, so the script stands in for one by running pykbroker on that port."""
    seen = tmp_path / "seen.txt"
    script = tmp_path / "fake-kafka.sh"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "port=$1" "dir=$2" "controller=$CONTROLLER_PORT" "$EXTRA_SERVER_PROPS" > {seen}\n'
        f'exec {sys.executable} -m pykbroker serve --override "listeners=PLAINTEXT://127.0.0.1:$1" '
        '--override "log.dirs=$2/logs"\n')
    script.chmod(0o755)
    out = _run("bench.py", "--compare", "--brokers", "kafka-fsync", "--kafka-cmd", str(script), "--sizes", "100",
               "--acks", "1", "--count-small", "2000", "--e2e-seconds", "0", "--wait-idle", "0")
    assert "| 100B acks=1 p=1 | kafka-fsync |" in out and "FAIL" not in out.split("CPU (broker")[0]
    lines = seen.read_text().splitlines()
    assert lines[0].startswith("port=") and int(lines[0][5:]) > 0
    assert lines[1].startswith("dir=") and lines[1].endswith("kafka-fsync-data")
    assert lines[2].startswith("controller=") and int(lines[2][11:]) > 0
    assert lines[3] == "log.flush.interval.messages=1"


def test_many_partitions_smoke(tmp_path: Path) -> None:
    """many_partitions.py against a running broker: create (every log online), produce, consume."""
    from tests.support.broker import BrokerProcess

    with BrokerProcess(tmp_path) as b:
        pid = str(b.proc.pid if b.proc else 0)
        out = _run("many_partitions.py", "create", "--bootstrap", b.bootstrap, "--topic", "mp", "--partitions", "30",
                   "--step", "20", "--timeout", "30")
        assert "mp: 30 partitions in " in out and "every log online after" in out
        out = _run("many_partitions.py", "produce", "--bootstrap", b.bootstrap, "--topic", "mp", "--partitions",
                   "30", "--count", "3000", "--size", "100")
        assert "produced 3000/3000 x 100 B" in out
        out = _run("many_partitions.py", "consume", "--bootstrap", b.bootstrap, "--topic", "mp", "--partitions",
                   "30", "--count", "3000", "--pid", pid, "--timeout", "30")
        assert "consumed 3000/3000 in " in out


def test_many_partitions_compare_smoke() -> None:
    """many_partitions.py compare starts its own broker and reports every step of every size."""
    out = _run("many_partitions.py", "compare", "--brokers", "pykbroker", "--partitions", "12", "--step", "5",
               "--sizes", "100,1024", "--count", "600", "--rounds", "2", "--timeout", "30")
    for size in ("100 B", "1024 B"):
        assert f"| pykbroker | {size} | create 12 partitions | answered " in out
        for step in ("produce 1", "produce 2", "consume 1", "consume 2"):
            row = next(line for line in out.splitlines() if line.startswith(f"| pykbroker | {size} | {step} |"))
            assert "only" not in row and " msg/s |" in row
            assert float(row.rsplit("|", 2)[1]) > 0  # the broker's CPU per million messages was measured


def test_bench_kafka_without_a_command_is_reported_not_run() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench.py"), "--compare", "--brokers", "kafka",
                           "--kafka-cmd", "", "--sizes", "100", "--acks", "1", "--count-small", "100",
                           "--e2e-seconds", "0", "--wait-idle", "0"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 1  # a broker that could not run is a failed phase
    assert "no Apache Kafka to start: pass --kafka-cmd" in proc.stdout


def test_bench_default_kafka_is_apache_kafka_from_maven_central() -> None:
    """Without --kafka-cmd, --brokers kafka starts bench/kafka_node.py: Apache Kafka 4.x in KRaft mode from the
    jars compat/kafka/pom.xml pins (resolved with Maven here if the compatibility suite has not yet)."""
    from compat.realkafka import release, resolve

    rel = release("4")
    resolve(rel)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    env["KAFKA_HEAP_OPTS"] = "-Xmx512m -Xms512m"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench.py"), "--compare", "--brokers", "kafka",
                           "--sizes", "100", "--acks", "all", "--count-small", "2000", "--e2e-seconds", "0",
                           "--wait-idle", "0"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| 100B acks=all p=1 | kafka |" in proc.stdout


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


def test_commit_bench_smoke() -> None:
    out = _run("commit_bench.py", "--brokers", "pykbroker,pykbroker-fsync", "--groups", "3", "--seconds", "1")
    lines = [line for line in out.splitlines() if line.startswith("| pykbroker")]
    assert [line.split("|")[1].strip() for line in lines] == ["pykbroker", "pykbroker-fsync"], out
    for line in lines:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells[1] == "3" and float(cells[2].replace(",", "")) > 0, out  # groups, commits/s


def test_connection_bench_smoke() -> None:
    out = _run("connection_bench.py", "--brokers", "pykbroker", "--seconds", "0.5")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| pykbroker")]
    assert [r[1].strip() for r in rows] == ["connect + ApiVersions + close", "ApiVersions round trip"], out
    for r in rows:
        assert float(r[2].replace(",", "")) > 0 and r[5].strip() not in ("", "-"), out  # ops/s, broker CPU


def test_ack_cpu_smoke() -> None:
    out = _run("ack_cpu.py", "--rounds", "1", "--rate", "100", "--seconds", "0.5")
    rows = [line for line in out.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 1, out
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]  # round, binary, Produce/s, Fetch/s, CPU %, µs
    assert float(cells[2]) > 0 and float(cells[3]) > 0 and float(cells[5]) > 0, out
    assert "| median µs per request |" in out


def test_ack_cpu_loop_profile_smoke() -> None:
    out = _run("ack_cpu.py", "--rounds", "1", "--rate", "100", "--seconds", "0.5", "--loop-profile")
    assert "loop thread CPU" in out and "callback _NativeSyncs._collect" in out, out


def test_instructions_bench_rounds_do_real_work() -> None:
    """bench/instructions.py's measured rounds (run here without valgrind): every produce appended to every
    partition and every fetch carried records, so the count is of the real paths, not of error answers."""
    out = _run("instructions.py", "--inner", "--rounds", "4", "--partitions", "3")
    assert "high watermarks [270, 270, 270]" in out, out  # (50 warm-up + 4) produces of 5 records
    per_round = int(out.rsplit("fetch response bytes per round ", 1)[1].split()[0])
    assert per_round > 3 * 5 * 100, out
