"""What a person sees on the console: a short first start, errors once with their cause,
health checks that say why, and scripts/run.sh taking its data directory from the real setting."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pykbroker.cli import healthcheck
from pykbroker.storage.log_manager import CLEAN_SHUTDOWN_FILE
from tests.support.broker import free_port

ROOT = Path(__file__).resolve().parents[2]
# A first start and a clean shutdown at INFO, one line per event: the file descriptor limit, the
# logs loaded, the two internal topics created, "started", their two loads, SIGTERM received, the
# logs closed and "shutdown complete" make ten (it was 110 lines, 100 of them per partition).
FIRST_START_MAX_LINES = 10


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    env.update(extra)
    return env


def _serve(*overrides: str, **env: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "pykbroker", "serve"]
    for o in overrides:
        args += ["--override", o]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=_env(**env), cwd=ROOT)


def _wait_healthy(proc: subprocess.Popen[bytes], bootstrap: str, out: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{out.read_text(errors='replace')}"
        if healthcheck(bootstrap, 1.0):
            return
        time.sleep(0.05)
    raise AssertionError(f"not healthy within {timeout} s:\n{out.read_text(errors='replace')}")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise


def test_unimplemented_setting_fails_at_start_with_the_message_once(tmp_path: Path) -> None:
    r = _serve(f"log.dirs={tmp_path}", "ssl.keymanager.algorithm=SunX509")
    assert r.returncode == 2
    lines = (r.stdout + r.stderr).splitlines()
    message = ("unknown configuration 'ssl.keymanager.algorithm': a Kafka setting pykbroker does not implement "
               "(from --override ssl.keymanager.algorithm=...) (of the ssl.* keys only those listed in "
               "docs/security.md are implemented; see README 'Settings not implemented')")
    assert len(lines) == 1, lines
    assert lines[0].endswith("ERROR   pykbroker: invalid configuration: " + message)
    assert list(tmp_path.iterdir()) == []  # refused before touching the data directory


def test_config_error_from_the_environment_is_printed_once(tmp_path: Path) -> None:
    r = _serve(f"log.dirs={tmp_path}", PYKBROKER_LISTENERS="PLAINTEXT://127.0.0.1:9093,PLAINTEXT://127.0.0.1:9094")
    assert r.returncode == 2
    out = r.stdout + r.stderr
    assert out.count("configuration 'listeners' names a listener more than once") == 1
    assert len(out.splitlines()) == 1


def test_port_in_use_is_one_line_with_the_address(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = _serve(f"log.dirs={tmp_path}", f"listeners=PLAINTEXT://127.0.0.1:{port}")
    assert r.returncode == 1
    out = r.stdout + r.stderr
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert len(errors) == 1, out
    assert f"cannot start: [Errno 98] listener PLAINTEXT://127.0.0.1:{port}: Address already in use" in errors[0]
    # nothing was served, so the logs were closed cleanly: the next start will not recover them
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).is_file()


def test_first_start_and_shutdown_are_a_few_lines(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "console.txt"
    with out.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pykbroker", "serve", "--override", f"log.dirs={tmp_path / 'data'}",
             "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}"],
            stdout=f, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT)
    try:
        _wait_healthy(proc, f"127.0.0.1:{port}", out, 30)
        hc = subprocess.run([sys.executable, "-m", "pykbroker", "healthcheck", "--bootstrap", f"127.0.0.1:{port}"],
                            capture_output=True, text=True, timeout=30, env=_env())
        assert (hc.returncode, hc.stdout) == (0, "healthy\n")
        deadline = time.monotonic() + 10  # the coordinators load their partitions just after "started"
        while out.read_text().count("__transaction_state partition(s)") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        rc = _stop(proc)
    lines = out.read_text().splitlines()
    assert rc == 0
    assert "Traceback" not in out.read_text()
    assert len(lines) <= FIRST_START_MAX_LINES, "\n".join(lines)
    assert all(" INFO " in line for line in lines), "\n".join(lines)
    assert sum(" started broker_id=0 " in line for line in lines) == 1
    assert sum("loaded 50 __consumer_offsets partition(s)" in line for line in lines) == 1
    assert not any("__consumer_offsets-" in line or "__transaction_state-" in line for line in lines)
    assert lines[-1].endswith("shutdown complete")


class _FakeServer:
    """A loopback server that does one thing to each connection, to see the health check's reasons."""

    def __init__(self, on_accept: Callable[[socket.socket], None] | None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.thread: threading.Thread | None = None
        if on_accept is not None:
            def run() -> None:
                conn, _ = self.sock.accept()
                with conn:
                    on_accept(conn)
            self.thread = threading.Thread(target=run, daemon=True)
            self.thread.start()

    def close(self) -> None:
        self.sock.close()
        if self.thread is not None:
            self.thread.join(5)


@pytest.fixture
def fake_server() -> Iterator[Callable[[Callable[[socket.socket], None] | None], _FakeServer]]:
    servers: list[_FakeServer] = []

    def make(on_accept: Callable[[socket.socket], None] | None) -> _FakeServer:
        servers.append(_FakeServer(on_accept))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _healthcheck(port: int, timeout: str = "5") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pykbroker", "healthcheck", "--bootstrap", f"127.0.0.1:{port}",
                           "--timeout", timeout], capture_output=True, text=True, timeout=30, env=_env())


def test_healthcheck_says_why(fake_server: Callable[[Callable[[socket.socket], None] | None], _FakeServer]) -> None:
    with socket.socket() as bound_not_listening:  # holds the port, so the refusal is certain
        bound_not_listening.bind(("127.0.0.1", 0))
        port = bound_not_listening.getsockname()[1]
        r = _healthcheck(port)
    assert (r.returncode, r.stdout) == (1, f"unhealthy: connection refused to 127.0.0.1:{port}\n")

    silent = fake_server(None)  # the kernel completes the connection, nobody answers
    started = time.monotonic()
    r = _healthcheck(silent.port, "0.5")
    assert (r.returncode, r.stdout) == (1, f"unhealthy: timed out after 0.5 s waiting for 127.0.0.1:{silent.port}\n")
    assert time.monotonic() - started < 20

    closing = fake_server(lambda conn: conn.recv(100))
    r = _healthcheck(closing.port)
    assert (r.returncode, r.stdout) == (
        1, f"unhealthy: 127.0.0.1:{closing.port} closed the connection without answering\n")

    http = fake_server(lambda conn: (conn.recv(100), conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")))
    r = _healthcheck(http.port)
    assert (r.returncode, r.stdout) == (1, f"unhealthy: 127.0.0.1:{http.port} is not a Kafka broker: "
                                           "its answer begins b'HTTP'\n")

    r = subprocess.run([sys.executable, "-m", "pykbroker", "healthcheck", "--bootstrap", "no-port"],
                       capture_output=True, text=True, timeout=30, env=_env())
    assert (r.returncode, r.stdout) == (1, "unhealthy: invalid bootstrap address 'no-port': expected HOST:PORT\n")


@pytest.mark.xdist_group("run-sh")  # the only test that may run scripts/install.sh
def test_run_sh_takes_the_data_directory_from_the_environment(tmp_path: Path) -> None:
    # With its stamp current install.sh returns at once; otherwise this installs once, here.
    subprocess.run(["bash", "scripts/install.sh"], cwd=ROOT, check=True, timeout=600, env=_env(),
                   stdout=subprocess.DEVNULL)
    for var, expect_note in (("PYKBROKER_LOG_DIRS", False), ("PYKBROKER_DATA", True)):
        port = free_port()
        data = tmp_path / var.lower()
        out = tmp_path / f"{var}.txt"
        with out.open("wb") as f:
            proc = subprocess.Popen(["bash", "scripts/run.sh", "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}"],
                                    cwd=ROOT, env=_env(**{var: str(data)}), stdout=f, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(proc, f"127.0.0.1:{port}", out, 30)
            assert (data / "meta.properties").is_file()
        finally:
            rc = _stop(proc)  # run.sh execs the broker, so SIGTERM reaches it directly
        text = out.read_text()
        assert rc == 0, text
        assert "install.sh:" not in text  # nothing to install: the stamp is current
        assert ("PYKBROKER_DATA is deprecated; use PYKBROKER_LOG_DIRS" in text) == expect_note
        assert "unknown configuration" not in text
        assert text.rstrip().endswith("shutdown complete")
