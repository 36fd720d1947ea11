"""``pykbroker serve --processes 2`` with a real ZooKeeper: two brokers under one parent process.

Both children register, a topic spread over both is produced and consumed by confluent-kafka with
every record once, SIGTERM to the parent ends both children cleanly, a SIGKILL'd child is restarted
and the cluster carries on, and a SIGKILL'd parent leaves no children behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import free_port_pair
from tests.support.cluster import CLUSTER_DEFAULTS, metadata, wait_for
from tests.support.zookeeper import ZooKeeperEnsemble

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("multiprocess")]



def _alive(pid: int) -> bool:
    """Running and not a zombie waiting for its reaper."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2:][:1] != b"Z"


def _children(pid: int) -> dict[int, int]:
    """broker id -> pid of the running children of ``pid`` (from their --override broker.id=)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if int(stat[stat.rfind(b")") + 2:].split()[1]) != pid or not _alive(int(name)):
            continue
        ids = [a for a in args if a.startswith(b"broker.id=")]
        if ids:
            out[int(ids[-1].split(b"=")[1])] = int(name)
    return out


class Supervised:
    """The parent process of `pykbroker serve --processes N`, its log and its brokers' bootstrap."""

    def __init__(self, base: Path, zk: ZooKeeperEnsemble, processes: int = 2, **overrides: str) -> None:
        self.port = free_port_pair()
        self.processes = processes
        self.log_path = base / "supervisor.log"
        settings = {**CLUSTER_DEFAULTS, "zookeeper.connect": f"{zk.connect}/{uuid.uuid4().hex[:8]}",
                    "broker.id": "1", "listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
                    "log.dirs": str(base / "data"), "default.replication.factor": "2",
                    "offsets.topic.replication.factor": "2", **overrides}
        self.args = [sys.executable, "-m", "pykbroker", "serve", "--processes", str(processes)]
        for k, v in settings.items():
            self.args += ["--override", f"{k}={v}"]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + i}" for i in range(self.processes))

    def start(self) -> Supervised:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(self.args, stdout=logf, stderr=subprocess.STDOUT, env=env)
        self.wait_brokers(list(range(1, self.processes + 1)))
        return self

    def wait_brokers(self, ids: list[int], timeout: float = 60.0) -> None:
        def registered() -> bool:
            assert self.proc is not None and self.proc.poll() is None, f"parent exited:\n{self.log()}"
            try:
                md = metadata(f"127.0.0.1:{self.port}", [])
            except (OSError, ConnectionError):
                return False
            return sorted(b.node_id for b in md.brokers) == ids and md.controller_id in ids
        wait_for(registered, timeout=timeout, what=f"brokers {ids} registered")

    def children(self) -> dict[int, int]:
        assert self.proc is not None
        return _children(self.proc.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:]

    def close(self) -> None:
        if self.proc is None:
            return
        pids = list(self.children().values())
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    ensemble = ZooKeeperEnsemble(tmp_path_factory.mktemp("zk"))
    try:
        yield ensemble.start()
    finally:
        ensemble.kill()


@pytest.fixture
def supervised(tmp_path: Path, zk: ZooKeeperEnsemble) -> Iterator[Supervised]:
    s = Supervised(tmp_path, zk)
    try:
        yield s.start()
    finally:
        s.close()


def _topic(bootstrap: str, partitions: int = 4, rf: int = 2) -> str:
    name = f"mp-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, rf)], operation_timeout=30).values():
        f.result(30)
    return name


def _leaders(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    def led() -> dict[int, int] | None:
        try:
            md = metadata(bootstrap, [topic])
        except (OSError, ConnectionError):
            return None
        view = {p.partition_index: p.leader_id for t in md.topics for p in t.partitions}
        return view if len(view) == partitions and all(v >= 0 for v in view.values()) else None
    return wait_for(led, timeout=30, what=f"leaders of {topic}")


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": 60000})
    errors: list[str] = []
    for i, v in enumerate(values):
        producer.produce(topic, v, key=str(i).encode(),
                         on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
        producer.poll(0)
    assert producer.flush(60) == 0, "every record delivered within 60 s"
    assert not errors, errors[:3]


def _consume(bootstrap: str, topic: str, expected: int, timeout: float = 60.0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        for _ in range(int(timeout / 0.5) + 1):
            if len(got) >= expected or time.monotonic() > deadline:
                break
            for msg in consumer.consume(500, 0.5):
                assert msg.error() is None, msg.error()
                got.append(msg.value())
        # Anything beyond the expected count (a duplicate) would show up within a short extra poll.
        got.extend(m.value() for m in consumer.consume(500, 1.0) if m.error() is None)
    finally:
        consumer.close()
    return got


def test_two_processes_form_a_cluster_that_serves_clients(supervised: Supervised) -> None:
    md = metadata(f"127.0.0.1:{supervised.port}", [])
    assert sorted((b.node_id, b.port) for b in md.brokers) == [(1, supervised.port), (2, supervised.port + 1)]
    assert {b.rack for b in md.brokers} == {socket.gethostname()}, "broker.rack defaults to the host name"
    assert sorted(supervised.children()) == [1, 2]
    topic = _topic(supervised.bootstrap)
    assert set(_leaders(supervised.bootstrap, topic, 4).values()) == {1, 2}, "partitions led by both processes"
    values = [f"r{i}".encode() for i in range(500)]
    _produce(f"127.0.0.1:{supervised.port}", topic, values)
    got = _consume(f"127.0.0.1:{supervised.port + 1}", topic, len(values))
    assert sorted(got) == sorted(values), "every record once"
    data = Path(supervised.log_path).parent / "data"
    assert sorted(p.name for p in data.iterdir()) == ["broker-1", "broker-2"]


def test_sigterm_to_the_parent_stops_both_children_cleanly(supervised: Supervised) -> None:
    pids = supervised.children()
    assert sorted(pids) == [1, 2]
    assert supervised.proc is not None
    supervised.proc.send_signal(signal.SIGTERM)
    assert supervised.proc.wait(90) == 0, supervised.log()
    assert not any(_alive(pid) for pid in pids.values())
    log = supervised.log()
    for broker_id, pid in pids.items():
        assert f"broker {broker_id} (pid {pid}) stopped: exit status 0" in log
    assert log.count("shutdown complete") == 2
    for broker_id in pids:  # each child's lines say which broker wrote them
        assert f"pykbroker.broker: received SIGTERM, shutting down broker={broker_id}\n" in log


def test_a_killed_child_is_restarted_and_the_cluster_carries_on(supervised: Supervised) -> None:
    topic = _topic(supervised.bootstrap)
    _leaders(supervised.bootstrap, topic, 4)
    first = [f"a{i}".encode() for i in range(200)]
    _produce(supervised.bootstrap, topic, first)
    before = supervised.children()
    os.kill(before[2], signal.SIGKILL)
    restarted = wait_for(lambda: (c := supervised.children()).get(2) not in (None, before[2]) and c,
                         timeout=30, what="broker 2 restarted under a new pid")
    assert restarted[1] == before[1], "the other child was left alone"
    assert f"broker 2 (pid {before[2]}) died (killed by SIGKILL); restart 1 in 1.0 s" in supervised.log()
    supervised.wait_brokers([1, 2])
    second = [f"b{i}".encode() for i in range(200)]
    _produce(supervised.bootstrap, topic, second)
    got = _consume(supervised.bootstrap, topic, len(first) + len(second))
    assert sorted(got) == sorted(first + second), "every record once, before and after the kill"


def test_replication_between_processes_stays_on_loopback(tmp_path: Path, zk: ZooKeeperEnsemble) -> None:
    """Brokers advertise a recording proxy's port (as a published or NAT'd address would be); clients go
    through it, but a follower fetches from its sibling on the loopback listener, never through it."""
    repo = Path(__file__).resolve().parents[2]
    proxy_port = free_port_pair()
    s = Supervised(tmp_path, zk, **{"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port}"})
    records = [tmp_path / f"proxy{i}.jsonl" for i in range(2)]
    proxies = [subprocess.Popen([sys.executable, "-m", "compat.proxy", "--listen", f"127.0.0.1:{proxy_port + i}",
                                 "--upstream", f"127.0.0.1:{s.port + i}", "--record", str(records[i])], cwd=repo)
               for i in range(2)]
    try:
        s.start()
        bootstrap = f"127.0.0.1:{proxy_port},127.0.0.1:{proxy_port + 1}"
        topic = _topic(bootstrap)
        assert set(_leaders(bootstrap, topic, 4).values()) == {1, 2}
        values = [f"v{i}".encode() for i in range(300)]
        _produce(bootstrap, topic, values)  # acks=all: each follower has fetched every record
        assert sorted(_consume(bootstrap, topic, len(values))) == sorted(values)
        seen = [json.loads(line) for r in records if r.exists() for line in r.read_text().splitlines()]
        clients = {d["client_id"] for d in seen}
        assert any(c.startswith("rdkafka") for c in clients), f"clients went through the proxies: {clients}"
        assert not any(c.startswith("broker-") for c in clients), f"inter-broker traffic took the proxy: {clients}"
    finally:
        s.close()
        for p in proxies:
            p.terminate()
            p.wait(10)


def test_sigkill_of_the_parent_leaves_no_children(supervised: Supervised) -> None:
    pids = list(supervised.children().values())
    assert len(pids) == 2
    assert supervised.proc is not None
    supervised.proc.kill()
    supervised.proc.wait(10)
    wait_for(lambda: not any(_alive(pid) for pid in pids), timeout=90, what="the children to end")
    log = supervised.log()
    assert log.count("received SIGTERM, shutting down") == 2, "each child got SIGTERM (PR_SET_PDEATHSIG)"
