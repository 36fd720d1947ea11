"""The supervisor of ``pykbroker serve --processes N`` with stand-in children (no ZooKeeper): which child
deaths it restarts, when it gives up and with which status, and that it stops the other children then.

The stand-in listens on its derived listener port like a broker, exits 0 on SIGTERM, and takes its
behaviour from its command line; the supervisor runs in its own process, as `serve --processes` does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.broker import free_port_pair
from tests.support.cluster import wait_for

pytestmark = [pytest.mark.timeout(120)]

CHILD = textwrap.dedent("""
    import signal, socket, sys, time
    args = sys.argv[1:]
    mode = args[0]
    port = int([a for a in args if a.startswith("listeners=")][-1].rsplit(":", 1)[1])
    broker = int([a for a in args if a.startswith("broker.id=")][-1].split("=")[1])
    if mode == "refused" and broker == 2:
        sys.exit(2)
    if mode == "cannot-start" and broker == 2:
        sys.exit(1)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # before listening: a listening child stops cleanly
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    for _ in range(600):
        time.sleep(0.1)
""")

PARENT = textwrap.dedent("""
    import logging, sys
    from pykbroker.config import BrokerConfig
    from pykbroker.multiprocess.plan import plan_processes
    from pykbroker.multiprocess.supervisor import Supervisor
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    child, mode, port, max_restarts = sys.argv[1:5]
    config = BrokerConfig({"zookeeper.connect": "127.0.0.1:1", "broker.id": "1",
                           "listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    plans = plan_processes(config, 2, "h")
    sys.exit(Supervisor(plans, [sys.executable, child, mode], max_restarts=int(max_restarts)).run())
""")



def _supervise(tmp_path: Path, mode: str, max_restarts: int = 5) -> tuple[subprocess.Popen[str], int]:
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    port = free_port_pair()
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(child), mode, str(port), str(max_restarts)],
                            cwd=repo, stderr=subprocess.PIPE, text=True)
    return proc, port


def _children(pid: int) -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        rest = stat[stat.rfind(b")") + 2:].split()
        if int(rest[1]) == pid and rest[0] != b"Z":
            ids = [a for a in args if a.startswith(b"broker.id=")]
            if ids:
                out[int(ids[-1].split(b"=")[1])] = int(name)
    return out


def test_a_refused_configuration_stops_the_host_with_status_2(tmp_path: Path) -> None:
    proc, _ = _supervise(tmp_path, "refused")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err
    assert "broker 2 (pid" in err and "is not restarted: exit status 2: its configuration was refused" in err
    assert "broker 1 (pid" in err and "stopped: exit status 0" in err, "the sibling was stopped with SIGTERM"


def test_a_child_that_cannot_start_is_not_restarted(tmp_path: Path) -> None:
    proc, _ = _supervise(tmp_path, "cannot-start")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert "exit status 1 before it listened: it cannot start" in err
    assert "restart 1" not in err


def test_restarts_then_gives_up_after_max_restarts(tmp_path: Path) -> None:
    proc, _ = _supervise(tmp_path, "serve", max_restarts=1)
    try:
        first = wait_for(lambda: (c := _children(proc.pid)).get(2) and c, timeout=20, what="two children")
        time.sleep(0.5)  # let the parent see it listening
        os.kill(first[2], signal.SIGKILL)
        second = wait_for(lambda: (c := _children(proc.pid)).get(2, first[2]) != first[2] and c.get(2),
                          timeout=20, what="broker 2 restarted")
        os.kill(second, signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert f"broker 2 (pid {first[2]}) died (killed by SIGKILL); restart 1 in 1.0 s" in err
    assert f"broker 2 (pid {second}) is not restarted: killed by SIGKILL, after 1 restarts within 300 s" in err
    assert f"broker 1 (pid {first[1]}) stopped: exit status 0" in err


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_sigint_is_forwarded_and_the_parent_exits_0(tmp_path: Path) -> None:
    proc, port = _supervise(tmp_path, "serve")
    try:
        pids = wait_for(lambda: len(c := _children(proc.pid)) == 2 and c, timeout=20, what="two children")
        # Both children ready (their SIGTERM handler is set before they listen), as brokers that serve.
        wait_for(lambda: _listening(port) and _listening(port + 1), timeout=30, what="both children listening")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopping every broker: received SIGINT" in err
    assert all(f"broker {b} (pid {p}) stopped: exit status 0" in err for b, p in pids.items())
