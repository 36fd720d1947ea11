"""A real pykbroker for an application's tests: ``pykbroker serve`` as a subprocess on a free loopback port with
a temporary data directory, ready once it answers ApiVersions, stopped and removed on exit.

It runs the broker as a separate process (the same Python, the same pykbroker), so nothing of the broker's
internals is imported here and a test can never share state with the broker it talks to."""

from __future__ import annotations

import atexit
import os
import random
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

import pykbroker
from pykbroker.testing import wire
from pykbroker.testing.lifecycle import StartStop

# Settings that make a broker fit for tests, each overridable: the first consumer of a group joins at once
# rather than after Kafka's 3 s wait for more members, and the internal topics that the broker creates at start
# have one partition rather than 50 each (a broker starts and stops in half the time).
TEST_DEFAULTS: dict[str, str] = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
}
LOG_TAIL_LINES = 40
_BIND_ATTEMPTS = 5  # another process may take the chosen port before the broker binds it

_running: weakref.WeakSet[Broker] = weakref.WeakSet()


class BrokerStartError(RuntimeError):
    """The broker exited or did not answer in time; the message holds the end of its log."""

    def __init__(self, message: str, log_path: Path) -> None:
        self.log_path = log_path
        super().__init__(message)


def _setting(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _server_ports() -> range:
    """Where to look for a free port: below the kernel's ephemeral range, whose ports outgoing connections
    take as their source ports (so no client connection can take the chosen port before the broker binds it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10000, low) if low - 10000 >= 1000 else range(0)


def free_port() -> int:
    """A loopback port nothing listens on now (the broker retries with another if it is taken meanwhile)."""
    ports = _server_ports()
    for _ in range(200):
        if ports:
            port = random.randrange(ports.start, ports.stop)
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return int(s.getsockname()[1])
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port found in 200 tries")


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"(log unreadable: {e})"
    return "\n".join(text.splitlines()[-lines:])


def python_env() -> dict[str, str]:
    """The environment for a broker subprocess: this process's, without the ``PYKBROKER_*`` settings (the
    broker's settings are the ones given here), with this pykbroker first on the path so that the
    subprocess runs the same code as the one imported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    root = str(Path(pykbroker.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


class Broker(StartStop):
    """One pykbroker with embedded metadata, as a context manager (``with``) or an async one (``async with``).

    ``overrides`` are broker settings (``server.properties`` keys) on top of :data:`TEST_DEFAULTS`;
    ``listeners`` and ``log.dirs`` are chosen here. The data directory is temporary unless ``data_dir`` is
    given; the broker's log goes to ``log_path`` (default: inside the temporary directory, kept if the start
    fails so that the error can name it)."""

    def __init__(self, overrides: Mapping[str, object] | None = None, *, data_dir: str | Path | None = None,
                 log_path: str | Path | None = None, start_timeout: float = 30.0, stop_timeout: float = 10.0,
                 log_level: str = "INFO", port: int | None = None) -> None:
        self.overrides = {k: _setting(v) for k, v in {**TEST_DEFAULTS, **(overrides or {})}.items()}
        for reserved in ("listeners",):
            if reserved in (overrides or {}) and port is None:
                raise ValueError(f"{reserved} is chosen by the harness: pass port= for a fixed port")
        self._given_dir = Path(data_dir) if data_dir is not None else None
        self._given_log = Path(log_path) if log_path is not None else None
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.log_level = log_level
        self._fixed_port = port
        self.port = 0
        self.base_dir: Path | None = None  # the temporary directory this harness made, removed on stop
        self.data_dir: Path | None = None
        self.log_path: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self._stop_requested = False

    # --- addresses ---------------------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:PORT``, the ``bootstrap.servers`` of a client."""
        if not self.port:
            raise RuntimeError("the broker is not started")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # --- start -------------------------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The command line of the broker (``python -m pykbroker serve --override ...``)."""
        assert self.data_dir is not None
        settings = {"listeners": f"PLAINTEXT://127.0.0.1:{self.port}", "log.dirs": str(self.data_dir),
                    **{k: v for k, v in self.overrides.items() if k != "listeners"}}
        args = [sys.executable, "-m", "pykbroker", "serve", "--log-level", self.log_level]
        for k, v in settings.items():
            args += ["--override", f"{k}={v}"]
        return args

    def launch(self) -> None:
        """Start the process without waiting for it to serve (:meth:`wait_ready` waits)."""
        if self.running():
            raise RuntimeError("the broker is already running")
        if self.base_dir is None and (self._given_dir is None or self._given_log is None):
            self.base_dir = Path(tempfile.mkdtemp(prefix="pykbroker-"))
        base = self.base_dir or Path(tempfile.gettempdir())
        self.data_dir = self._given_dir or base / "data"
        self.log_path = self._given_log or base / "broker.log"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.port = self._fixed_port or free_port()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=python_env())
        self.returncode = None
        self._stop_requested = False
        _running.add(self)

    def _port_taken(self, log_start: int) -> bool:
        assert self.log_path is not None
        try:
            with open(self.log_path, "rb") as f:
                f.seek(log_start)
                text = f.read().decode(errors="replace")
        except OSError:
            return False
        return "Address already in use" in text or "address already in use" in text

    def ready(self) -> bool:
        """Serving: it answers ApiVersions (a broker opens its listeners last, once its metadata and internal
        topics are loaded). A raw request, so that a test process that only hands the address to its own
        clients never loads the codec."""
        return wire.api_versions_ok(self.bootstrap_servers)

    def wait_ready(self, deadline: float) -> None:
        """Until the broker serves, bounded by ``deadline`` (``time.monotonic()``); raises BrokerStartError."""
        assert self.proc is not None and self.log_path is not None
        for _ in range(100_000):
            code = self.proc.poll()
            if code is not None:
                self.returncode = code
                raise self._start_error(f"pykbroker exited with status {code} before it served")
            if self.ready():
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        self._terminate()
        raise self._start_error(f"pykbroker did not answer on {self.bootstrap_servers} within "
                                f"{self.start_timeout:g} s")

    def _start_error(self, what: str) -> BrokerStartError:
        assert self.log_path is not None
        self._remove_data(keep_log=True)
        return BrokerStartError(f"{what}; its log is {self.log_path}, ending:\n{_tail(self.log_path)}",
                                self.log_path)

    def start(self) -> Broker:
        """Start and wait until it serves (within ``start_timeout``); on failure nothing is left running."""
        deadline = time.monotonic() + self.start_timeout
        for attempt in range(_BIND_ATTEMPTS):
            log_start = self.log_path.stat().st_size if self.log_path and self.log_path.exists() else 0
            self.launch()
            try:
                self.wait_ready(deadline)
                return self
            except BrokerStartError:
                retry = (self._fixed_port is None and attempt + 1 < _BIND_ATTEMPTS and self.proc is not None
                         and self.proc.poll() is not None and self._port_taken(log_start))
                if not retry:
                    raise
        raise AssertionError("unreachable")

    # --- stop --------------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """SIGTERM, once: the broker shuts down gracefully (a second SIGTERM would end it at once)."""
        if self.proc is not None and self.proc.poll() is None and not self._stop_requested:
            self._stop_requested = True
            self.proc.send_signal(signal.SIGTERM)

    def _terminate(self) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL if it has not exited within ``stop_timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.request_stop()
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.returncode = self.proc.returncode
        _running.discard(self)

    def kill(self) -> None:
        """SIGKILL: the broker gets no chance to shut down cleanly (the data directory stays until stop)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
            self.returncode = self.proc.returncode

    def _remove_data(self, keep_log: bool) -> None:
        self._terminate()
        if self.base_dir is None:
            return
        if not keep_log or self._given_log is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None
            return
        for child in self.base_dir.iterdir():  # keep only the log, which the start error names
            if child != self.log_path:
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)

    def stop(self) -> int | None:
        """Stop the broker and remove its temporary directory; its exit status (None if never started)."""
        self._remove_data(keep_log=False)
        return self.returncode

    # --- topics ------------------------------------------------------------------------------------------

    def create_topic(self, name: str | None = None, partitions: int = 1, config: Mapping[str, object] | None = None,
                     *, replication_factor: int = -1, timeout: float = 30.0) -> str:
        """Create a topic (a unique name if none given) and wait until it has leaders; its name."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        wire.create_topic(self.bootstrap_servers, name, partitions, replication_factor,
                          {k: _setting(v) for k, v in (config or {}).items()}, timeout)
        return name

    def delete_topic(self, name: str, timeout: float = 30.0) -> None:
        wire.delete_topic(self.bootstrap_servers, name, timeout)

    def log(self) -> str:
        """The broker's log so far."""
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def __repr__(self) -> str:
        state = "running" if self.running() else "stopped"
        return f"<pykbroker.testing.Broker {self.bootstrap_servers if self.port else '-'} {state}>"


def _stop_all() -> None:
    """At interpreter exit, stop the brokers a test left running (no orphan keeps its port)."""
    for broker in list(_running):
        broker.stop()


atexit.register(_stop_all)
