"""The cluster under test: an existing one (--bootstrap), or pykbroker started by the suite behind recording
proxies: one broker, or a ZooKeeper and N brokers (--pykbroker-cluster N)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compat import security, wire
from tests.support.broker import free_port  # one set of handed-out ports for both harnesses

if TYPE_CHECKING:
    from tests.support.zookeeper import ZooKeeperEnsemble

REPO = Path(__file__).resolve().parent.parent

# Kafka's single-broker settings (the ones any one-node Kafka needs, e.g. the apache/kafka image's
# defaults): internal topics with one replica, and no delay before the first rebalance.
SINGLE_NODE_OVERRIDES = {
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
}

# The listener other brokers use in a cluster the suite starts: it is not behind the proxy, so the
# proxy records only what clients send (replica fetches go straight from broker to broker).
REPLICATION_LISTENER = "REPLICATION"

# Added to the run's label when the broker refused the authorizer settings (security.authorizer_refused).
NO_AUTHORIZER = " [no ACLs: refused authorizer.class.name]"


def cluster_overrides(size: int) -> dict[str, str]:
    """What a Kafka cluster of ``size`` brokers has: Kafka's defaults for the internal topics (three
    replicas, two in sync for a transaction), capped by the number of brokers, and no delay before the
    first rebalance (as in SINGLE_NODE_OVERRIDES, so both runs wait alike)."""
    return {
        "offsets.topic.replication.factor": str(min(3, size)),
        "transaction.state.log.replication.factor": str(min(3, size)),
        "transaction.state.log.min.isr": str(min(2, size)),
        "group.initial.rebalance.delay.ms": "0",
    }


@dataclass
class ClusterInfo:
    bootstrap: str
    label: str
    api_versions: dict[int, tuple[int, int]]
    managed: bool
    record_files: list[str] = field(default_factory=list)
    brokers: int = 1
    # The secured (SASL_PLAINTEXT) listener's address, where the security scenarios connect; None: the
    # cluster has none, and those scenarios are "not possible on this cluster".
    sasl_bootstrap: str | None = None

    def to_json(self) -> str:
        return json.dumps({
            "bootstrap": self.bootstrap, "label": self.label, "managed": self.managed,
            "record_files": self.record_files, "brokers": self.brokers, "sasl_bootstrap": self.sasl_bootstrap,
            "api_versions": {str(k): list(v) for k, v in self.api_versions.items()},
        })

    @classmethod
    def from_json(cls, s: str) -> ClusterInfo:
        d = json.loads(s)
        return cls(d["bootstrap"], d["label"], {int(k): (v[0], v[1]) for k, v in d["api_versions"].items()},
                   d["managed"], list(d.get("record_files", [])), int(d.get("brokers", 1)), d.get("sasl_bootstrap"))


def recorded_requests(files: list[str]) -> list[dict[str, Any]]:
    """The distinct (client id, API key, version) the proxies recorded, in the order first seen."""
    seen: set[tuple[str, int, int]] = set()
    out = []
    for f in files:
        p = Path(f)
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            req = json.loads(line)
            key = (req["client_id"], req["api_key"], req["api_version"])
            if key not in seen:
                seen.add(key)
                out.append(req)
    return out


def wait_api_versions(bootstrap: str, proc: subprocess.Popen[bytes] | None, timeout: float,
                       log: Path | None = None) -> dict[int, tuple[int, int]]:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            text = log.read_text(errors="replace")[-4000:] if log else ""
            raise RuntimeError(f"process exited with {proc.returncode} before answering ApiVersions\n{text}")
        try:
            return wire.api_versions(bootstrap, timeout=2.0)
        except (OSError, ConnectionError, RuntimeError) as e:
            last = e
            time.sleep(0.1)
    raise TimeoutError(f"{bootstrap} did not answer ApiVersions within {timeout}s: {last}")


def wait_registered(bootstraps: dict[int, str], deadline: float) -> None:
    """Until every broker's Metadata (``bootstraps``: broker id -> its address) lists all the brokers and
    names one of them as the controller, or ``deadline`` (time.monotonic()) passes."""
    want = sorted(bootstraps)
    last: object = None
    for _ in range(10_000):
        try:
            views = [wire.cluster_brokers(b, timeout=5.0) for b in bootstraps.values()]
            last = views
            if all(ids == want and controller in want for ids, controller in views):
                return
        except (OSError, ConnectionError, RuntimeError) as e:
            last = e
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    raise TimeoutError(f"brokers {want} not all registered with a controller: last Metadata views {last}")


def pykbroker_version() -> str:
    try:
        out = subprocess.run([sys.executable, "-m", "pykbroker", "--version"], capture_output=True, text=True,
                             timeout=30, cwd=REPO).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    label = out or "pykbroker"
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=REPO)
        if sha.returncode == 0 and sha.stdout.strip():
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "pykbroker"],
                                   capture_output=True, text=True, timeout=10, cwd=REPO).stdout.strip()
            label += f" (git {sha.stdout.strip()}{'+dirty' if dirty else ''})"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return label


def cluster_label(version: str, size: int) -> str:
    """The results' name for a suite-started cluster, e.g. "pykbroker 0.1.0 (git abc1234), 3 brokers + ZooKeeper"."""
    return f"{version}, {size} broker{'s' if size != 1 else ''} + ZooKeeper"


class ProxiedBroker:
    """One pykbroker subprocess whose client listeners are advertised as the ports of its own recording
    proxies: PLAINTEXT, and the secured SASL_PLAINTEXT listener of the security scenarios
    (compat/security.py) behind a second proxy."""

    def __init__(self, workdir: Path, overrides: dict[str, str], trace_file: Path | None = None,
                 replication_port: int | None = None, authorizer: bool = True) -> None:
        self.workdir = workdir
        self.broker_port = free_port()
        self.proxy_port = free_port()
        self.sasl_port = free_port()
        self.sasl_proxy_port = free_port()
        sasl = security.SASL_LISTENER
        listeners = f"PLAINTEXT://127.0.0.1:{self.broker_port},{sasl}://127.0.0.1:{self.sasl_port}"
        advertised = f"PLAINTEXT://127.0.0.1:{self.proxy_port},{sasl}://127.0.0.1:{self.sasl_proxy_port}"
        extra: dict[str, str] = security.broker_overrides(authorizer)
        # As a Kafka broker with a client telemetry reporter (metric.reporters): the KIP-714 APIs are
        # advertised, so the telemetry scenarios can run.
        extra["pykbroker.client.telemetry.enable"] = "true"
        if replication_port is not None:
            repl = f"{REPLICATION_LISTENER}://127.0.0.1:{replication_port}"
            listeners, advertised = f"{listeners},{repl}", f"{advertised},{repl}"
            extra.update({"listener.security.protocol.map":
                          f"PLAINTEXT:PLAINTEXT,{sasl}:SASL_PLAINTEXT,{REPLICATION_LISTENER}:PLAINTEXT",
                          "inter.broker.listener.name": REPLICATION_LISTENER})
        self.overrides = {
            "listeners": listeners,
            "advertised.listeners": advertised,
            **extra,
            # Two log dirs, as a JBOD broker has: moving a replica between them (AlterReplicaLogDirs)
            # is then possible; with one, that scenario reports "not possible on this cluster".
            "log.dirs": f"{workdir / 'data'},{workdir / 'data2'}",
            **overrides,
        }
        self.record_file = workdir / "requests.jsonl"
        self.sasl_record_file = workdir / "requests-sasl.jsonl"
        self.trace_file = trace_file
        self.log_file = workdir / "broker.log"
        self.broker: subprocess.Popen[bytes] | None = None
        self.proxy: subprocess.Popen[bytes] | None = None
        self.sasl_proxy: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy_port}"

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_proxy_port}"

    @property
    def record_files(self) -> list[str]:
        return [str(self.record_file), str(self.sasl_record_file)]

    def launch(self) -> None:
        """Start the broker and its proxy without waiting (brokers of a cluster start side by side)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
        args = [sys.executable, "-m", "pykbroker", "serve"]
        for k, v in self.overrides.items():
            args += ["--override", f"{k}={v}"]
        with open(self.log_file, "ab") as logf:
            self.broker = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                           start_new_session=True)
        with open(self.workdir / "proxy.log", "ab") as logf:
            self.proxy = subprocess.Popen(
                [sys.executable, "-m", "compat.proxy", "--listen", self.bootstrap,
                 "--upstream", f"127.0.0.1:{self.broker_port}", "--record", str(self.record_file),
                 *(["--trace", str(self.trace_file)] if self.trace_file else [])],
                stdout=logf, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        with open(self.workdir / "proxy-sasl.log", "ab") as logf:
            trace = self.trace_file.with_name(f"{self.trace_file.stem}-sasl{self.trace_file.suffix}") \
                if self.trace_file else None
            self.sasl_proxy = subprocess.Popen(
                [sys.executable, "-m", "compat.proxy", "--listen", self.sasl_bootstrap,
                 "--upstream", f"127.0.0.1:{self.sasl_port}", "--record", str(self.sasl_record_file),
                 *(["--trace", str(trace)] if trace else [])],
                stdout=logf, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)

    def wait_serving(self, timeout: float) -> dict[int, tuple[int, int]]:
        """The broker's ApiVersions, directly and then through the proxy."""
        wait_api_versions(f"127.0.0.1:{self.broker_port}", self.broker, timeout, self.log_file)
        return wait_api_versions(self.bootstrap, self.proxy, 20.0, self.workdir / "proxy.log")

    def terminate(self) -> None:
        for p in (self.proxy, self.sasl_proxy, self.broker):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float) -> None:
        """Wait for both processes; SIGKILL what is still running after ``timeout``."""
        deadline = time.monotonic() + timeout
        for p in (self.proxy, self.sasl_proxy, self.broker):
            if p is None:
                continue
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

    def cleanup(self) -> None:
        for d in ("data", "data2"):
            shutil.rmtree(self.workdir / d, ignore_errors=True)


class ManagedPykbroker:
    """One pykbroker on a private port, advertised as the recording proxy's port."""

    def __init__(self, workdir: Path | None = None, overrides: dict[str, str] | None = None,
                 trace_file: Path | None = None) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="compat-pykbroker-"))
        self._settings = ({**SINGLE_NODE_OVERRIDES, **(overrides or {})}, trace_file)
        self.node = ProxiedBroker(self.workdir, *self._settings)
        self.overrides = self.node.overrides
        self.record_file = self.node.record_file
        self.log_file = self.node.log_file
        self.authorizer = True

    @property
    def bootstrap(self) -> str:
        return self.node.bootstrap

    @property
    def log_files(self) -> list[Path]:
        return [self.log_file]

    def start(self, timeout: float = 60.0) -> ClusterInfo:
        self.node.launch()
        try:
            versions = self.node.wait_serving(timeout)
        except RuntimeError:
            self.stop()
            if not self.authorizer or not security.authorizer_refused(self.log_file.read_text(errors="replace")):
                raise
            # A build without ACLs: the same broker without the authorizer settings (see authorizer_refused).
            self.authorizer = False
            self.node = ProxiedBroker(self.workdir, *self._settings, authorizer=False)
            self.overrides = self.node.overrides
            return self.start(timeout)
        except BaseException:
            self.stop()
            raise
        info = ClusterInfo(self.bootstrap, pykbroker_version() + ("" if self.authorizer else NO_AUTHORIZER),
                           versions, managed=True,
                           record_files=self.node.record_files, sasl_bootstrap=self.node.sasl_bootstrap)
        try:
            security.create_scram_users(info.sasl_bootstrap or "")
        except BaseException:
            self.stop()
            raise
        return info

    def stop(self) -> None:
        self.node.terminate()
        self.node.wait_stopped(20.0)

    def cleanup(self) -> None:
        self.node.cleanup()


class ManagedPykbrokerCluster:
    """A standalone ZooKeeper and ``size`` pykbroker brokers (ids 1..size) coordinated through it.

    Each broker has two listeners: PLAINTEXT for clients, advertised as the port of the broker's own
    recording proxy (so every client connection, to any broker, is recorded), and REPLICATION, the
    inter-broker listener, reached directly. Clients get ONE broker's address as the bootstrap, as a
    user gives ``--bootstrap``, and find the others through Metadata.
    """

    def __init__(self, size: int = 3, workdir: Path | None = None, overrides: dict[str, str] | None = None,
                 trace_file: Path | None = None) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one broker, not {size}")
        self.size = size
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="compat-pykbroker-cluster-"))
        self.overrides = overrides or {}
        self.trace_file = trace_file
        self.zookeeper: ZooKeeperEnsemble | None = None
        self.nodes: dict[int, ProxiedBroker] = {}
        self.authorizer = True

    @property
    def bootstrap(self) -> str:
        return self.nodes[1].bootstrap

    @property
    def log_files(self) -> list[Path]:
        return [n.log_file for n in self.nodes.values()]

    def _trace(self, broker_id: int) -> Path | None:
        t = self.trace_file
        return t.with_name(f"{t.stem}-broker{broker_id}{t.suffix}") if t else None

    def start(self, timeout: float = 120.0) -> ClusterInfo:
        # Imported here: the ZooKeeper runner lives with the project's own cluster tests, and only this
        # mode needs it (the rest of compat runs against any cluster without the project's tests).
        from tests.support.zookeeper import ZooKeeperEnsemble, zookeeper_available

        if not zookeeper_available():
            raise RuntimeError("--pykbroker-cluster needs ZooKeeper (Debian package zookeeper): "
                               "run scripts/install.sh --test")
        zk = self.zookeeper = ZooKeeperEnsemble(self.workdir / "zookeeper", 1)
        try:
            zk.start()
            deadline = time.monotonic() + timeout
            try:
                versions = self._launch(zk.connect, deadline)
            except RuntimeError:
                if not any(security.authorizer_refused(n.log_file.read_text(errors="replace"))
                           for n in self.nodes.values() if n.log_file.exists()):
                    raise
                for node in self.nodes.values():  # a build without ACLs (see security.authorizer_refused)
                    node.terminate()
                    node.wait_stopped(30.0)
                self.authorizer = False
                versions = self._launch(zk.connect, deadline)
            wait_registered({i: n.bootstrap for i, n in self.nodes.items()}, deadline)
            security.create_scram_users(self.nodes[1].sasl_bootstrap)
        except BaseException:
            self.stop()
            raise
        label = cluster_label(pykbroker_version(), self.size) + ("" if self.authorizer else NO_AUTHORIZER)
        return ClusterInfo(self.bootstrap, label, versions[1], managed=True,
                           record_files=[f for n in self.nodes.values() for f in n.record_files], brokers=self.size,
                           sasl_bootstrap=self.nodes[1].sasl_bootstrap)

    def _launch(self, zookeeper_connect: str, deadline: float) -> dict[int, dict[int, tuple[int, int]]]:
        self.nodes = self.make_nodes(zookeeper_connect)
        for node in self.nodes.values():
            node.launch()
        return {i: n.wait_serving(max(1.0, deadline - time.monotonic())) for i, n in self.nodes.items()}

    def make_nodes(self, zookeeper_connect: str) -> dict[int, ProxiedBroker]:
        """The brokers' processes-to-be: ids 1..size, the same ZooKeeper and cluster settings."""
        base = {"zookeeper.connect": zookeeper_connect, **cluster_overrides(self.size), **self.overrides}
        return {i: ProxiedBroker(self.workdir / f"broker{i}", {"broker.id": str(i), **base}, self._trace(i),
                                 replication_port=free_port(), authorizer=self.authorizer)
                for i in range(1, self.size + 1)}

    def stop(self) -> None:
        for node in self.nodes.values():
            node.terminate()
        for node in self.nodes.values():
            node.wait_stopped(30.0)
        if self.zookeeper is not None:
            self.zookeeper.kill()

    def cleanup(self) -> None:
        for node in self.nodes.values():
            node.cleanup()
        shutil.rmtree(self.workdir / "zookeeper", ignore_errors=True)


def external(bootstrap: str, label: str | None, sasl_bootstrap: str | None = None) -> ClusterInfo:
    """An existing cluster; ``sasl_bootstrap`` is its SASL_PLAINTEXT listener set up as compat/README.md
    describes (the SCRAM users are created here, as admin, like for the suite's own brokers)."""
    versions = wait_api_versions(bootstrap, None, 30.0)
    if sasl_bootstrap:
        security.create_scram_users(sasl_bootstrap)
    return ClusterInfo(bootstrap, label or f"external cluster at {bootstrap}", versions, managed=False,
                       sasl_bootstrap=sasl_bootstrap)
