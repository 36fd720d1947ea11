"""Run pykbroker as a subprocess on a free loopback port, so tests can SIGTERM or SIGKILL it."""

from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pykbroker.cli import healthcheck

_HANDED_OUT: set[int] = set()


def segment_sizes(partition_dir: Path) -> dict[int, int]:
    """Base offset -> size of each segment file, skipping files the broker deletes mid-scan.

    Retention and compaction delete segments while a test watches the directory, so a file
    listed by the glob may be gone by the time it is stat'ed.
    """
    sizes: dict[int, int] = {}
    for f in partition_dir.glob("*.log"):
        try:
            sizes[int(f.stem)] = f.stat().st_size
        except FileNotFoundError:
            continue
    return sizes


def _server_ports() -> range | None:
    """Where tests put the servers they start: below the kernel's ephemeral port range, so that no
    outgoing connection (the kernel picks its source port from that range) can take a chosen port before
    the server binds it; split between pytest-xdist workers, so that two workers never choose the same.
    None if the ephemeral range leaves no room below it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    start, end = 10000, ephemeral_low
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[:2] == "gw" and worker[2:].isdigit() else 0
    span = (end - start) // workers
    if span < 1000:
        return None
    return range(start + (index % workers) * span, start + (index % workers + 1) * span)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int = 1) -> int:
    """The first of ``n`` consecutive free loopback ports, none handed out before in this process."""
    ports = _server_ports()
    rng = random.Random()
    for _ in range(1000):
        if ports is not None:
            port = rng.randrange(ports.start, ports.stop - n)
        else:  # no room below the ephemeral range: the kernel's choice
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
        run = range(port, port + n)
        if any(p in _HANDED_OUT for p in run) or not all(_bindable(p) for p in run):
            continue
        _HANDED_OUT.update(run)
        return port
    raise RuntimeError(f"no {n} consecutive free loopback ports found in 1000 tries")


def free_port() -> int:
    """A free loopback port not handed out before in this process (see ``_server_ports``)."""
    return free_ports(1)


def free_port_pair() -> int:
    """A free loopback port whose successor is free too (``serve --processes`` gives process i port + i)."""
    return free_ports(2)


def tls_healthcheck(bootstrap: str, cafile: Path, timeout: float = 1.0) -> bool:
    """An ApiVersions v0 round trip over TLS (answered before any SASL login, as on SASL_PLAINTEXT)."""
    host, _, port = bootstrap.rpartition(":")
    ctx = ssl.create_default_context(cafile=str(cafile))
    request = struct.pack(">hhih", 18, 0, 1, len(b"ready")) + b"ready"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">i", len(request)) + request)
            head = b""
            for _ in range(16):
                if len(head) >= 10:
                    break
                chunk = s.recv(10 - len(head))
                if not chunk:
                    return False
                head += chunk
    except (OSError, ssl.SSLError):
        return False
    size, correlation_id, error_code = struct.unpack(">iih", head[:10])
    return size > 6 and correlation_id == 1 and error_code == 0


class BrokerProcess:
    """A broker subprocess with its own data directory and log file."""

    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None, port: int | None = None, *,
                 host: str = "127.0.0.1", launcher: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.host = host  # the address it listens on (and advertises): loopback, or its network namespace's
        # Prepended to the command line, e.g. ``ip netns exec <ns>`` (which execs: the pid stays the broker's).
        self.launcher = list(launcher or [])
        self.overrides = {
            "listeners": f"PLAINTEXT://{host}:{self.port}",
            "log.dirs": str(data_dir / "logs"),
            "group.initial.rebalance.delay.ms": "0",
            **(overrides or {}),
        }
        self.log_path = data_dir / "broker.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # More command-line arguments for `pykbroker serve` (e.g. ["--log-level", "DEBUG"]).
        self.extra_args: list[str] = []
        # More environment variables for the process.
        self.env: dict[str, str] = {}
        # How start() knows the broker serves (default: the health check, for a PLAINTEXT or SASL_PLAINTEXT
        # first listener; tls_healthcheck for a broker with TLS listeners only).
        self.ready: Callable[[], bool] = lambda: healthcheck(self.bootstrap, 1.0)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [*self.launcher, sys.executable, "-m", "pykbroker", "serve", *self.extra_args]
        for k, v in self.overrides.items():
            args += ["--override", f"{k}={v}"]
        logf = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}, **self.env}
        self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, env=env)
        logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            if self.ready():
                return self
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"broker did not become healthy in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: a graceful shutdown."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: no chance to flush or write the clean-shutdown marker."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
