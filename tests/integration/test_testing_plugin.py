"""pykbroker's pytest plugin as its users meet it: a project's own test files run by pytest in a subprocess
(pytester), with the plugin switched on as docs/testing.md says. Each run gets a TMPDIR of its own, which must
be empty afterwards (every broker's temporary directory removed), and no broker process may outlive it."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import psutil
import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 240.0


@pytest.fixture
def run(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[pytest.Pytester, Path]:
    """pytester with this checkout's pykbroker importable and a fresh TMPDIR for the brokers' directories."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("PYKBROKER_PLUGIN_RECORD", str(tmp_path / "record.json"))
    # Only the plugins named with -p: the switch and the fixtures as a user without pykbroker's entry point
    # (installed or not) enables them, and no start-up time for this machine's other pytest plugins.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return pytester, tmpdir


def _left_behind(record: dict[str, list[int]], tmpdir: Path) -> list[str]:
    """What a run left: its temporary directories, and any process still running one of its brokers."""
    left = [str(p) for p in tmpdir.iterdir()]
    for pid in record.get("pids", []):
        if psutil.pid_exists(int(pid)) and psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE:
            left.append(f"process {pid}")
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(str(tmpdir) in part for part in (proc.info["cmdline"] or [])):
            left.append(f"process {proc.info['pid']}: {' '.join(proc.info['cmdline'])[:200]}")
    return left


USER_TESTS = '''
import asyncio
import json
import socket
import os
import time

import pytest

from pykbroker.testing import Broker, WireError
from pykbroker.testing.wire import metadata

made = {}


def record(**values):
    path = os.environ["PYKBROKER_PLUGIN_RECORD"]
    data = json.load(open(path)) if os.path.exists(path) else {"pids": []}
    data["pids"] += values.pop("pids", [])
    data.update(values)
    json.dump(data, open(path, "w"))


def partitions(bootstrap, topic):
    shown = metadata(bootstrap, [topic]).topics[0]
    return None if int(shown.error_code) else len(shown.partitions)


def test_session_broker(pykbroker_broker, pykbroker_bootstrap_servers, pykbroker_confluent_producer):
    assert pykbroker_bootstrap_servers == pykbroker_broker.bootstrap_servers
    assert pykbroker_bootstrap_servers.startswith("127.0.0.1:")
    record(pids=[pykbroker_broker.pid], log=str(pykbroker_broker.log_path))
    # pykbroker_overrides (conftest.py) reached the broker: an auto-created topic has its num.partitions
    pykbroker_confluent_producer.produce("auto-created", b"x")
    assert pykbroker_confluent_producer.flush(30) == 0
    assert partitions(pykbroker_bootstrap_servers, "auto-created") == 2


@pytest.mark.pykbroker_topic(partitions=3)
def test_marked_topic(pykbroker_topic, pykbroker_bootstrap_servers):
    made["marked"] = pykbroker_topic
    assert "test_marked_topic" in pykbroker_topic
    assert partitions(pykbroker_bootstrap_servers, pykbroker_topic) == 3


def test_topic_is_deleted_after_its_test(pykbroker_topic, pykbroker_bootstrap_servers):
    assert pykbroker_topic != made["marked"]
    assert partitions(pykbroker_bootstrap_servers, pykbroker_topic) == 1
    assert partitions(pykbroker_bootstrap_servers, made["marked"]) is None


def test_topic_factory(pykbroker_topic_factory, pykbroker_bootstrap_servers):
    compacted = pykbroker_topic_factory(partitions=2, config={"cleanup.policy": "compact"})
    named = pykbroker_topic_factory(name="orders-v1")
    assert partitions(pykbroker_bootstrap_servers, compacted) == 2
    assert partitions(pykbroker_bootstrap_servers, named) == 1
    with pytest.raises(WireError, match="INVALID_CONFIG"):
        pykbroker_topic_factory(config={"cleanup.policy": "sometimes"})


def test_confluent_clients(pykbroker_topic, pykbroker_confluent_producer, pykbroker_confluent_consumer,
                           pykbroker_confluent_admin):
    for i in range(3):
        pykbroker_confluent_producer.produce(pykbroker_topic, f"v{i}".encode())
    assert pykbroker_confluent_producer.flush(30) == 0
    pykbroker_confluent_consumer.subscribe([pykbroker_topic])
    got, deadline = [], time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        msg = pykbroker_confluent_consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    assert got == [b"v0", b"v1", b"v2"]
    assert pykbroker_topic in pykbroker_confluent_admin.list_topics(timeout=10).topics


def test_kafka_python_clients(pykbroker_topic, pykbroker_kafka_python_producer, pykbroker_kafka_python_consumer,
                              pykbroker_kafka_python_admin):
    pykbroker_kafka_python_producer.send(pykbroker_topic, b"kp").get(timeout=30)
    pykbroker_kafka_python_consumer.subscribe([pykbroker_topic])
    got, deadline = [], time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        for records in pykbroker_kafka_python_consumer.poll(timeout_ms=500).values():
            got += [r.value for r in records]
    assert got == [b"kp"]
    assert pykbroker_topic in pykbroker_kafka_python_admin.list_topics()


def test_aiokafka_clients(pykbroker_topic, pykbroker_aiokafka):
    async def main():
        async with pykbroker_aiokafka.producer() as producer:
            await producer.send_and_wait(pykbroker_topic, b"aio")
        async with pykbroker_aiokafka.consumer(pykbroker_topic) as consumer:
            return (await asyncio.wait_for(consumer.getone(), 30)).value
    assert asyncio.run(main()) == b"aio"


def test_async_broker():
    async def main():
        async with Broker({"num.partitions": 4}) as broker:
            record(pids=[broker.pid], async_dir=str(broker.base_dir))
            assert broker.running()
            name = broker.create_topic(partitions=2)
            assert partitions(broker.bootstrap_servers, name) == 2
        return broker
    broker = asyncio.run(main())
    assert not broker.running() and broker.returncode == 0
    assert not os.path.exists(json.load(open(os.environ["PYKBROKER_PLUGIN_RECORD"]))["async_dir"])
'''


def test_fixtures_in_a_users_tests(run: tuple[pytest.Pytester, Path], tmp_path: Path) -> None:
    pytester, tmpdir = run
    pytester.makeconftest('''
        import pytest

        @pytest.fixture(scope="session")
        def pykbroker_overrides():
            return {"num.partitions": 2}
    ''')
    pytester.makepyfile(test_app=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "pykbroker.testing.pytest_plugin", "-p", "no:cacheprovider",
                                           timeout=RUN_TIMEOUT)
    result.assert_outcomes(passed=8)
    record = json.loads((tmp_path / "record.json").read_text())
    assert _left_behind(record, tmpdir) == []
    # the session broker's log stays in pytest's temporary directory, for a look after a failure
    log = Path(record["log"])
    assert log.is_file() and "started" in log.read_text() and "shutting down" in log.read_text()


def test_cluster_fixture(run: tuple[pytest.Pytester, Path], tmp_path: Path) -> None:
    pytester, tmpdir = run
    pytester.makeconftest('''
        import json, os

        CLUSTERS = []

        def pytest_sessionfinish():  # after the session's fixtures are torn down
            path = os.environ["PYKBROKER_PLUGIN_RECORD"]
            record = json.load(open(path))
            record["exits"] = [b.returncode for c in CLUSTERS for b in c.brokers]
            json.dump(record, open(path, "w"))
    ''')
    pytester.makepyfile(test_cluster='''
        import json, os, time

        import conftest
        from pykbroker.testing.wire import metadata

        def test_three_brokers(pykbroker_cluster):
            c = pykbroker_cluster
            conftest.CLUSTERS.append(c)
            json.dump({"pids": [b.pid for b in c.brokers] + [c.zookeeper.proc.pid], "dir": str(c.base_dir)},
                      open(os.environ["PYKBROKER_PLUGIN_RECORD"], "w"))
            assert len(c.bootstrap_servers.split(",")) == 3
            topic = c.create_topic(partitions=2)
            md = metadata(c.broker(2).bootstrap_servers, [topic])
            assert sorted(b.node_id for b in md.brokers) == [1, 2, 3]
            assert [sorted(p.replica_nodes) for p in md.topics[0].partitions] == [[1, 2, 3], [1, 2, 3]]
            from confluent_kafka import Producer
            producer = Producer({"bootstrap.servers": c.bootstrap_servers, "acks": "all"})
            producer.produce(topic, b"replicated")
            assert producer.flush(30) == 0
            c.delete_topic(topic)
    ''')
    # the command-line switch (what the installed entry point adds)
    result = pytester.runpytest_subprocess("-p", "pykbroker.testing.pytest_entry", "--pykbroker",
                                           "-p", "no:cacheprovider", timeout=RUN_TIMEOUT)
    result.assert_outcomes(passed=1)
    record = json.loads((tmp_path / "record.json").read_text())
    assert _left_behind(record, tmpdir) == []
    assert record["exits"] == [0, 0, 0]  # each broker shut down cleanly on one SIGTERM


def test_a_broker_that_cannot_start_says_why_and_a_missing_library_skips(run: tuple[pytest.Pytester, Path]) -> None:
    pytester, tmpdir = run
    pytester.makeini("[pytest]\npykbroker = true\n")  # the ini switch
    pytester.makeconftest('''
        import sys

        import pytest

        sys.modules["aiokafka"] = None  # as where aiokafka is not installed

        @pytest.fixture(scope="session")
        def pykbroker_overrides():
            return {"num.partitions": 0}
    ''')
    pytester.makepyfile(test_app="""
        def test_without_aiokafka(pykbroker_aiokafka):
            pass

        def test_uses_the_broker(pykbroker_topic):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "pykbroker.testing.pytest_entry", "-p", "no:cacheprovider", "-rs",
                                           timeout=RUN_TIMEOUT)
    result.assert_outcomes(skipped=1, errors=1)
    # the skip comes before the broker starts: the test that cannot run does not wait for one
    result.stdout.fnmatch_lines(["*the fixture pykbroker_aiokafka needs aiokafka (pip install aiokafka)*"])
    result.stdout.fnmatch_lines(["*BrokerStartError: pykbroker exited with status 2 before it served; its log is "
                                 "*broker.log, ending:*", "*invalid configuration*num.partitions*"])
    log = next(line for line in result.outlines if "its log is" in line).split("its log is ")[1].split(",")[0]
    assert "num.partitions" in Path(log).read_text()
    assert _left_behind({}, tmpdir) == []


def test_off_unless_switched_on(run: tuple[pytest.Pytester, Path]) -> None:
    pytester, tmpdir = run
    pytester.makepyfile(test_app="def test_uses_it(pykbroker_broker):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "pykbroker.testing.pytest_entry", "-p", "no:cacheprovider",
                                           timeout=RUN_TIMEOUT)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'pykbroker_broker' not found*"])
    assert _left_behind({}, tmpdir) == []


def test_broker_starts_again_elsewhere_when_its_port_was_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The port chosen is free when chosen; if another process binds it before the broker does, the broker
    exits on the bind and the harness starts it again on another port."""
    from pykbroker.testing import broker as harness

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([int(taken.getsockname()[1]), harness.free_port()])
    monkeypatch.setattr(harness, "free_port", lambda: next(ports))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    try:
        broker = harness.Broker()
        with broker:
            assert broker.port != taken.getsockname()[1]
            assert "Address already in use" in broker.log()
            pid, base = broker.pid, broker.base_dir
            assert base is not None and broker.running()
            broker.kill()  # what an application sees when its broker vanishes
            assert not broker.running() and broker.returncode == -9
        assert base is not None and not base.exists() and pid is not None and not psutil.pid_exists(pid)
    finally:
        taken.close()
