"""Real ZooKeeper servers (Debian's `zookeeper` package) for the cluster tests.

A standalone server or an ensemble of N servers on free loopback ports, each with its own
data directory under the test's temp dir, started as subprocesses so tests can stop, restart
or SIGKILL them. Every wait is bounded in time and in rounds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from pykbroker.testing.cluster import four_letter_word
from pykbroker.zookeeper_server import DEBIAN_JAR, ZooKeeperSettings, command, write_config
from tests.support.broker import free_port

JAVA = "/usr/bin/java"


def zookeeper_available() -> bool:
    return DEBIAN_JAR.exists() and Path(JAVA).exists()


def _free_port() -> int:
    return free_port()


def _ruok(port: int, timeout: float = 1.0, address: str = "127.0.0.1") -> bool:
    """Serving clients: `srvr` answers with the server's mode (ruok answers earlier)."""
    return "Mode:" in four_letter_word(port, "srvr", timeout, address=address)


class ZooKeeperServer:
    """One ZooKeeper server process (standalone, or one member of an ensemble)."""

    def __init__(self, base: Path, myid: int, client_port: int, peers: dict[int, tuple[int, int]] | None, *,
                 hosts: dict[int, str] | None = None, launcher: list[str] | None = None) -> None:
        self.dir = base / f"zk{myid}"
        self.myid = myid
        self.port = client_port
        self.peers = peers  # myid -> (quorum port, election port); None for standalone
        self.hosts = hosts or {}  # myid -> address (default loopback): each server's network namespace's
        self.host = self.hosts.get(myid, "127.0.0.1")
        # Prepended to the java command line, e.g. ``ip netns exec <ns>`` (which execs: the pid stays java's).
        self.launcher = list(launcher or [])
        self.proc: subprocess.Popen[bytes] | None = None

    def _settings(self) -> ZooKeeperSettings:
        servers = {sid: f"{self.hosts.get(sid, '127.0.0.1')}:{q}:{e}" for sid, (q, e) in (self.peers or {}).items()}
        return ZooKeeperSettings(self.dir, self.host, self.port, servers, self.myid if servers else None,
                                 tick_time_ms=500, max_session_timeout_ms=60000)

    def start(self) -> ZooKeeperServer:
        """The server as `pykbroker zookeeper init` and `start` run it (pykbroker/zookeeper_server.py), with a
        short tick and a small, quick-starting JVM."""
        write_config(self._settings())
        out = open(self.dir / "stdout.log", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [*self.launcher, *command(self.dir, 256, ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"))],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return self

    def wait_serving(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.1) + 1):
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"zookeeper {self.myid} exited with {self.proc.returncode}:\n{self.log()}")
            if _ruok(self.port, address=self.host):
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        raise TimeoutError(f"zookeeper {self.myid} not serving on {self.port} within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        parts = []
        for name in ("stdout.log", "zookeeper.log"):
            p = self.dir / name
            if p.exists():
                parts.append(p.read_text(errors="replace")[-4000:])
        return "\n".join(parts)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


class ZooKeeperEnsemble:
    """``size`` servers (1 = standalone). ``connect`` is the zookeeper.connect string."""

    def __init__(self, base: Path, size: int = 1, *, hosts: dict[int, str] | None = None,
                 launchers: dict[int, list[str]] | None = None) -> None:
        """``hosts`` and ``launchers``: per myid, the address and the command prefix (a network namespace's)."""
        ports = {i: _free_port() for i in range(1, size + 1)}
        peers = {i: (_free_port(), _free_port()) for i in range(1, size + 1)} if size > 1 else None
        self.servers = [ZooKeeperServer(base, i, ports[i], peers, hosts=hosts, launcher=(launchers or {}).get(i))
                        for i in range(1, size + 1)]

    @property
    def connect(self) -> str:
        return ",".join(f"{s.host}:{s.port}" for s in self.servers)

    def start(self, timeout: float = 45.0) -> ZooKeeperEnsemble:
        for s in self.servers:
            s.start()
        for s in self.servers:
            s.wait_serving(timeout)
        return self

    def restart(self, timeout: float = 45.0) -> None:
        self.stop()
        self.start(timeout)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def kill(self) -> None:
        for s in self.servers:
            s.kill()
