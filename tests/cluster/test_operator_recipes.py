"""The operator's recipes, run as documented: docs/deploy.md's `pykbroker zookeeper` commands (one node,
a 3-node ensemble, a systemd unit) and the README's "A cluster" commands, each taken from the doc itself,
with a real consumer group on the cluster they build.  Only ports and directories are substituted (free
ports, a temp dir)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pykbroker.testing.cluster import four_letter_word
from tests.support.broker import BrokerProcess, _bindable, free_port
from tests.support.cluster import metadata, wait_for
from tests.support.zookeeper import zookeeper_available

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("replication")]

ROOT = Path(__file__).resolve().parents[2]
PYKBROKER = [sys.executable, "-m", "pykbroker"]


def _mode(address: str, port: int) -> str | None:
    m = re.search(r"^Mode: (\w+)", four_letter_word(port, timeout=2, address=address), re.M)
    return m.group(1) if m else None


class Processes:
    """Processes started in sessions of their own, killed with their children at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's pykbroker, whatever the cwd
        with open(log, "ab") as out:
            p = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                 env=env)
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in self.procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


@pytest.fixture
def procs() -> Iterator[Processes]:
    assert zookeeper_available(), "scripts/install.sh --test installs Debian's zookeeper and a JDK"
    p = Processes()
    try:
        yield p
    finally:
        p.stop()


def _init(dir_: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PYKBROKER, "zookeeper", "init", "--dir", str(dir_), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def _doc_section(doc: str, heading: str) -> str:
    text = (ROOT / doc).read_text()
    section = text[text.index(heading):]
    level = heading.split(" ")[0]
    rest = section[len(heading):]
    stops = [i for i in (rest.find(f"\n{level} "), rest.find("\n" + level[:-1] + " ")) if i >= 0]
    return section[:len(heading) + min(stops)] if stops else section


def _sh_blocks(section: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def _command(line: str, subs: dict[str, str]) -> list[str]:
    """One documented ``pykbroker ...`` command line as argv: comment and redirection dropped, the
    documented directories and ports replaced by the test's."""
    line = line.split("  #")[0].split(" > ")[0].strip()
    for old, new in subs.items():
        line = line.replace(old, new)
    argv = shlex.split(line)
    assert argv[0] == "pykbroker", line
    return [*PYKBROKER, *argv[1:]]


ZK_DOCS = ("docs/deploy.md", "### ZooKeeper without containers")


def test_zookeeper_one_node_as_documented(tmp_path: Path, procs: Processes) -> None:
    """docs/deploy.md's one-node commands (init, start, the srvr check) and its systemd unit."""
    section = _doc_section(*ZK_DOCS)
    blocks = _sh_blocks(section)
    one_node, systemd = blocks[0], blocks[-1]
    port = free_port()
    subs = {"/srv/zookeeper": str(tmp_path / "zk"), "2181": str(port)}
    lines = [x for x in one_node.splitlines() if x.startswith("pykbroker zookeeper")]
    assert [x.split()[2] for x in lines] == ["init", "start"], one_node
    done = subprocess.run(_command(lines[0], subs), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"127.0.0.1:{port}" in done.stdout
    cfg = (tmp_path / "zk" / "zoo.cfg").read_text()
    assert "clientPortAddress=127.0.0.1" in cfg and f"dataDir={tmp_path / 'zk' / 'data'}" in cfg
    procs.start(_command(lines[1], subs), ROOT, tmp_path / "zk.out")
    assert "echo srvr | nc 127.0.0.1 2181" in one_node and '"Mode: standalone"' in one_node
    wait_for(lambda: _mode("127.0.0.1", port) == "standalone", timeout=60, what="ZooKeeper serving")
    # Only on the address it was given: another loopback address of this host finds nothing there.
    assert four_letter_word(port, timeout=2, address="127.0.0.2") == ""
    unit_line = next(x for x in systemd.splitlines() if x.startswith("pykbroker zookeeper systemd-unit"))
    unit = subprocess.run(_command(unit_line, subs), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert unit.returncode == 0 and "ExecStart=" in unit.stdout and "QuorumPeerMain" in unit.stdout
    assert "User=zookeeper" in unit.stdout and str(tmp_path / "zk" / "zoo.cfg") in unit.stdout
    # A mistake is said at once, with exit status 2.
    bad = _init(tmp_path / "zk2", "--servers", "127.0.0.1:1:2,127.0.0.1:3:4", "--myid", "1")
    assert bad.returncode == 2 and "odd number" in bad.stderr


def test_zookeeper_three_node_ensemble_as_documented(tmp_path: Path, procs: Processes) -> None:
    """docs/deploy.md's ensemble: its init line with the one-host test bed's --servers and client ports."""
    section = _doc_section(*ZK_DOCS)
    init = next(b for b in _sh_blocks(section) if "--servers" in b)
    init_line = " ".join(x.rstrip("\\").strip() for x in init.splitlines() if x.strip())
    m = re.search(r"`--servers (\S+)` with client ports (\d+), (\d+)\s+and (\d+)", section)
    assert m, "the test bed's --servers and client ports"
    doc_servers, doc_clients = m.group(1), [m.group(2), m.group(3), m.group(4)]
    servers = doc_servers
    for old in sorted(set(re.findall(r":(\d+)", doc_servers)), key=len, reverse=True):
        servers = servers.replace(f":{old}", f":{free_port()}")
    doc_init_servers = re.search(r"--servers (\S+)", init_line)
    assert doc_init_servers
    clients = [free_port() for _ in range(3)]
    for i, port in enumerate(clients, start=1):
        argv = _command(init_line, {doc_init_servers.group(1): servers, "/srv/zookeeper": str(tmp_path / f"zk{i}"),
                                    "10.0.0.11": "127.0.0.1", doc_clients[0]: str(port), "--myid 1": f"--myid {i}"})
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / f"zk{i}" / "data" / "myid").read_text().strip() == str(i)
        procs.start([*PYKBROKER, "zookeeper", "start", "--dir", str(tmp_path / f"zk{i}")], ROOT,
                    tmp_path / f"zk{i}.out")
    modes = wait_for(lambda: (m := sorted(str(_mode("127.0.0.1", p)) for p in clients)) == ["follower", "follower",
                                                                                              "leader"] and m,
                     timeout=90, what="a leader and two followers")
    assert modes == ["follower", "follower", "leader"]


def _readme_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    section = section[:section.index("\n## ", 1) if "\n## " in section[1:] else len(section)]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    assert m, f"no sh block under {heading}"
    return m.group(1)


def _free_prefix() -> int:
    """A port prefix P with P1, P2 and P3 free (the recipe's 920$id becomes P$id)."""
    for _ in range(200):
        prefix = free_port() // 10
        if all(_bindable(prefix * 10 + i) for i in (1, 2, 3)):
            return prefix
    raise AssertionError("no three free ports of one prefix")


def test_readme_cluster_recipe_builds_a_cluster_groups_can_use(tmp_path: Path, procs: Processes) -> None:
    script = _readme_block("### A cluster\n")
    zk_port, prefix = free_port(), _free_prefix()
    assert "920$id" in script and "2181" in script and ".venv/bin/pykbroker" in script
    script = (script.replace("2181", str(zk_port)).replace("920$id", f"{prefix}$id")
              .replace(".venv/bin/pykbroker", " ".join(PYKBROKER))
              .replace("config/server.properties", str(ROOT / "config" / "server.properties")))
    procs.start(["bash", "-c", script + "wait\n"], tmp_path, tmp_path / "recipe.out")
    bootstrap = ",".join(f"127.0.0.1:{prefix}{i}" for i in (1, 2, 3))

    def three_brokers() -> bool:
        try:
            return len(metadata(f"127.0.0.1:{prefix}1").brokers) == 3
        except OSError:
            return False

    wait_for(three_brokers, timeout=90, what="three brokers registered")
    topic = f"recipe-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(30):
        p.produce(topic, f"m{i}".encode())
    assert p.flush(30) == 0
    group = f"recipe-{uuid.uuid4().hex[:6]}"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    try:
        c.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < 30 and time.monotonic() < deadline:  # bounded in time; each poll at most 1 s
            m = c.poll(1.0)
            if m is not None and m.error() is None:
                got.append(m.value() or b"")
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(30)), "the group joined and read everything"
        c.commit(asynchronous=False)
    finally:
        c.close()
    logs = "".join((tmp_path / f"broker-{i}.out").read_text(errors="replace") for i in (1, 2, 3))
    assert "can never write" not in logs

    # The trap the recipe avoids, said at start: a broker of this ZooKeeper (another chroot) whose
    # __consumer_offsets would have one replica under min.insync.replicas=2.
    trap = BrokerProcess(tmp_path / "trap", {"broker.id": "7", "zookeeper.connect": f"127.0.0.1:{zk_port}/trap",
                                             "offsets.topic.replication.factor": "1", "min.insync.replicas": "2"})
    trap.start(60)
    try:
        line = next((x for x in trap.log().splitlines() if "__consumer_offsets" in x and "can never write" in x), "")
        assert "WARN" in line and "replication factor 1 but min.insync.replicas 2" in line, trap.log()[-3000:]
        assert "offsets.topic.replication.factor" in line
    finally:
        trap.stop()
