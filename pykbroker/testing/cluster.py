"""Three pykbrokers and a ZooKeeper for an application's tests of what only a cluster shows: replication,
leader changes, a broker going away. ZooKeeper is Debian's package, run as ``pykbroker zookeeper`` runs it;
the brokers are :class:`~pykbroker.testing.broker.Broker` subprocesses. Everything lives in one temporary
directory, removed on exit."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from collections.abc import Mapping
from pathlib import Path

from pykbroker.testing import wire
from pykbroker.testing.broker import Broker, BrokerStartError, _setting, _tail, free_port, python_env
from pykbroker.testing.lifecycle import StartStop

# A broker that goes away is noticed within seconds rather than Kafka's 18 s.
CLUSTER_DEFAULTS: dict[str, str] = {
    "zookeeper.session.timeout.ms": "6000",
}
# A small JVM that starts quickly: ZooKeeper here serves a handful of brokers for the length of a test run.
_ZK_JVM_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
_ZK_HEAP_MB = 256


_running: weakref.WeakSet[Cluster] = weakref.WeakSet()


class ZooKeeperUnavailable(RuntimeError):
    """ZooKeeper (Debian's ``zookeeper`` package and a Java runtime) is not installed on this machine."""


def four_letter_word(port: int, word: str = "srvr", timeout: float = 1.0, address: str = "127.0.0.1") -> str:
    """ZooKeeper's answer to a four-letter word (``srvr``: "Mode: ..." once it serves); empty if none."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(word.encode())
            data = b""
            for _ in range(64):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.decode(errors="replace")
    except OSError:
        return ""


class ZooKeeper:
    """A standalone ZooKeeper on a free loopback port, set up by ``pykbroker zookeeper init`` and run by
    ``pykbroker zookeeper start`` (which runs Debian's server in the foreground)."""

    def __init__(self, directory: Path, stop_timeout: float = 10.0) -> None:
        self.dir = directory
        self.port = 0
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.dir / "zookeeper.out"

    def start(self, timeout: float = 60.0) -> ZooKeeper:
        deadline = time.monotonic() + timeout
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        cli = [sys.executable, "-m", "pykbroker", "zookeeper"]
        init = subprocess.run([*cli, "init", "--dir", str(self.dir), "--client-port", str(self.port)],
                              capture_output=True, text=True, timeout=timeout, env=python_env())
        if init.returncode != 0:
            raise RuntimeError(f"pykbroker zookeeper init failed: {init.stderr.strip() or init.stdout.strip()}")
        env = {**python_env(), "JAVA_TOOL_OPTIONS": _ZK_JVM_OPTIONS}
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen([*cli, "start", "--dir", str(self.dir), "--heap-mb", str(_ZK_HEAP_MB)],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        for _ in range(100_000):
            code = self.proc.poll()
            if code == 2 and "pykbroker zookeeper:" in _tail(self.log_path, 5):
                # `pykbroker zookeeper start` found no java or no ZooKeeper jars, and says which
                raise ZooKeeperUnavailable(_tail(self.log_path, 5).strip())
            if code is not None:
                raise RuntimeError(f"ZooKeeper exited with status {code}; its log is {self.log_path}, ending:\n"
                                   f"{_tail(self.log_path)}")
            if "Mode:" in four_letter_word(self.port):
                return self
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"ZooKeeper did not serve on {self.connect} within {timeout:g} s; its log is "
                           f"{self.log_path}, ending:\n{_tail(self.log_path)}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class Cluster(StartStop):
    """``size`` brokers (ids 1..size) sharing one ZooKeeper, as a context manager (``with`` or ``async with``).

    ``overrides`` apply to every broker, on top of the test defaults of :class:`Broker` and
    :data:`CLUSTER_DEFAULTS`. Topics made by :meth:`create_topic` are replicated on up to three brokers."""

    def __init__(self, size: int = 3, overrides: Mapping[str, object] | None = None, *,
                 start_timeout: float = 90.0, stop_timeout: float = 15.0) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one broker")
        self.size = size
        self.overrides = {k: _setting(v) for k, v in {**CLUSTER_DEFAULTS, **(overrides or {})}.items()}
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.base_dir: Path | None = None
        self.zookeeper: ZooKeeper | None = None
        self.brokers: list[Broker] = []

    @property
    def bootstrap_servers(self) -> str:
        if not self.brokers:
            raise RuntimeError("the cluster is not started")
        return ",".join(b.bootstrap_servers for b in self.brokers)

    def broker(self, broker_id: int) -> Broker:
        """The broker with id ``broker_id`` (1..size)."""
        return self.brokers[broker_id - 1]

    def start(self) -> Cluster:
        """ZooKeeper, then all brokers at once; returns when every broker serves and all are registered."""
        deadline = time.monotonic() + self.start_timeout
        self.base_dir = Path(tempfile.mkdtemp(prefix="pykbroker-cluster-"))
        _running.add(self)
        try:
            self.zookeeper = ZooKeeper(self.base_dir / "zookeeper", self.stop_timeout).start(self.start_timeout)
            self.brokers = [
                Broker({**self.overrides, "broker.id": i, "zookeeper.connect": self.zookeeper.connect},
                       data_dir=self.base_dir / f"broker{i}", log_path=self.base_dir / f"broker{i}.log",
                       start_timeout=self.start_timeout, stop_timeout=self.stop_timeout)
                for i in range(1, self.size + 1)]
            for b in self.brokers:
                b.launch()
            for b in self.brokers:
                b.wait_ready(deadline)
            self._wait_registered(deadline)
        except BrokerStartError as e:
            self._stop_processes()
            self._remove(keep_logs=True)
            _running.discard(self)
            raise BrokerStartError(f"a broker of the cluster did not start (logs kept in {self.base_dir}): {e}",
                                   e.log_path) from None
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_registered(self, deadline: float) -> None:
        ids = list(range(1, self.size + 1))
        last = "no answer yet"
        for _ in range(100_000):
            try:
                md = wire.metadata(self.brokers[0].bootstrap_servers, [], timeout=5.0)
                shown = sorted(b.node_id for b in md.brokers)
                if shown == ids and md.controller_id in ids:
                    return
                last = f"brokers {shown}, controller {md.controller_id}"
            except (OSError, ConnectionError) as e:
                last = str(e)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        raise BrokerStartError(f"brokers {ids} not all registered with a controller within "
                               f"{self.start_timeout:g} s (last: {last})", self.brokers[0].log_path or Path())

    def _stop_processes(self) -> None:
        for b in self.brokers:  # all at once: each then shuts down while the others do
            b.request_stop()
        for b in self.brokers:
            b.stop()
        if self.zookeeper is not None:
            self.zookeeper.stop()

    def _remove(self, keep_logs: bool) -> None:
        if self.base_dir is None:
            return
        if not keep_logs:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None
            return
        for child in self.base_dir.iterdir():
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)

    def stop(self) -> None:
        """Stop the brokers (SIGTERM, then SIGKILL after ``stop_timeout``) and ZooKeeper; remove the directory."""
        self._stop_processes()
        self._remove(keep_logs=False)
        _running.discard(self)

    def create_topic(self, name: str | None = None, partitions: int = 1, config: Mapping[str, object] | None = None,
                     *, replication_factor: int | None = None, timeout: float = 30.0) -> str:
        """Create a topic (replicated on ``min(3, size)`` brokers unless told) and wait until every broker
        shows a leader for each partition; its name."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        rf = replication_factor if replication_factor is not None else min(3, self.size)
        wire.create_topic(self.bootstrap_servers, name, partitions, rf,
                          {k: _setting(v) for k, v in (config or {}).items()}, timeout)
        return name

    def delete_topic(self, name: str, timeout: float = 30.0) -> None:
        wire.delete_topic(self.bootstrap_servers, name, timeout)

def _stop_all() -> None:
    """At interpreter exit, stop the clusters a test left running."""
    for cluster in list(_running):
        cluster.stop()


atexit.register(_stop_all)
