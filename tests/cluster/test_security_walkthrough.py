"""docs/security.md's walk-through, run as written: its ```sh blocks, in order, in one bash, with the
variables of its first block pointed at a temp dir and free ports; then a real client checks the end state
(the application user may use one topic and is denied another) and the last block stops everything."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

import pykbroker
from tests.support.broker import free_ports
from tests.support.consume import poll_values

ROOT = Path(pykbroker.__file__).resolve().parents[1]
DOC = ROOT / "docs" / "security.md"
SECTION = "## Walk-through: from nothing to SASL_SSL, SCRAM and ACLs on three brokers"
STOP = "### Stopping the cluster"
VARIABLES = ["SEC", "ZK_PORT", "FIRST_PORT", "PYKBROKER", "PYTHON"]
TIMEOUT = 30.0


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", text, re.M | re.S)


def walkthrough() -> tuple[str, list[str], list[str]]:
    """(the variables block, the blocks up to the stopping step, the stopping step's blocks)."""
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end] if end > 0 else text[start:]
    stop = section.index(STOP)
    run, after = _blocks(section[:stop]), _blocks(section[stop:])
    assert len(run) >= 6 and after, "the walk-through lost its shell blocks"
    return run[0], run[1:], after


def _assignments(block: str) -> list[str]:
    return [line.split("=", 1)[0] for line in block.splitlines() if re.match(r"^[A-Z_]+=", line)]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A ``pykbroker`` command that runs this checkout, whatever the venv's entry point is installed from."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "pykbroker"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m pykbroker "$@"\n')
    shim.chmod(0o755)
    return {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}


class Shell:
    """The bash sessions the walk-through runs in; every process they leave behind is killed at the end."""

    def __init__(self, cwd: Path, env: dict[str, str], prelude: str) -> None:
        self.cwd, self.env, self.prelude = cwd, env, prelude
        self.groups: list[int] = []

    def run(self, blocks: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        script = "\n".join([self.prelude, *blocks])
        proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=self.cwd, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        self.groups.append(proc.pid)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=10)
            raise AssertionError(f"the walk-through did not finish within {timeout}s:\n{out[-6000:]}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")

    def kill_all(self) -> None:
        for pgid in self.groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def shell(tmp_path: Path, env: dict[str, str]) -> Iterator[Shell]:
    first = free_ports(3)
    zk_port = free_ports(1)
    variables = "\n".join([
        f'SEC="{tmp_path / "secure-cluster"}"', f"ZK_PORT={zk_port}", f"FIRST_PORT={first}",
        f'PYKBROKER="{tmp_path / "bin" / "pykbroker"}"', f'PYTHON="{sys.executable}"'])
    sh = Shell(tmp_path, env, variables)
    try:
        yield sh
    finally:
        sh.kill_all()


def _logs(sec: Path) -> str:
    return "\n".join(f"==== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(sec.glob("broker-*.log")))


def _client(sec: Path, user: str, **extra: object) -> dict[str, object]:
    with open(sec / f"{user}.properties") as f:
        pairs = [line.strip().split("=", 1) for line in f if "=" in line]
    return {**{k: v for k, v in pairs}, "broker.address.family": "v4", **extra}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_security_walkthrough_runs_and_its_acls_hold(tmp_path: Path, shell: Shell) -> None:
    variables, blocks, stop_blocks = walkthrough()
    assert _assignments(variables) == VARIABLES, "the walk-through's variables changed: update this test"
    sec = tmp_path / "secure-cluster"

    done = shell.run(blocks, timeout=300)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{_logs(sec)}"
    out = done.stdout
    assert "broker-1.crt: OK" in out and "broker-3.crt: OK" in out
    assert "Completed updating config for user admin." in out
    assert "SCRAM credential configs for user-principal 'admin' are SCRAM-SHA-512=iterations=4096" in out
    assert " 3 brokers:" in out
    assert "created orders, payments, user app and 3 ACLs" in out
    assert "\norder-1\norder-2\n" in out  # kcat consumed what it produced, in order
    assert "payments: denied, as it should be" in out and "Topic authorization failed" in out
    # no listener but SASL_SSL, and the brokers replicate to each other as admin over it
    for i in (1, 2, 3):
        props = (sec / f"broker-{i}.properties").read_text()
        assert re.search(r"^listeners=SASL_SSL://[^,\n]+$", props, re.M) and "PLAINTEXT" not in props
        assert "ANONYMOUS" not in props

    # the end state, checked with a client of our own: app writes and reads orders in group orders-app...
    p = Producer(_client(sec, "app"))
    for i in range(5):
        p.produce("orders", f"check-{i}".encode())
    assert p.flush(TIMEOUT) == 0
    c = Consumer(_client(sec, "app", **{"group.id": "orders-app", "auto.offset.reset": "earliest"}))
    c.subscribe(["orders"])
    expected = {b"order-1", b"order-2"} | {f"check-{i}".encode() for i in range(5)}
    try:
        got = set(poll_values(c, lambda values: expected <= set(values), TIMEOUT))
    finally:
        c.close()
    assert expected <= got
    # ... but may not write payments, nor use another group
    errors: list[KafkaError] = []
    denied = Producer(_client(sec, "app", **{"message.timeout.ms": 10000, "retries": 0}))
    denied.produce("payments", b"x", on_delivery=lambda err, _m: errors.append(err) if err else None)
    denied.flush(TIMEOUT)
    assert errors and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    other = Consumer(_client(sec, "app", **{"group.id": f"other-{uuid.uuid4().hex[:6]}",
                                             "auto.offset.reset": "earliest"}))
    other.subscribe(["orders"])
    failures: list[KafkaError] = []
    try:
        for _ in range(int(TIMEOUT / 0.2) + 1):
            if failures:
                break
            m = other.poll(0.2)
            error = m.error() if m is not None else None
            if error is not None:
                failures.append(error)
    finally:
        other.close()
    assert failures and failures[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    # a wrong password is refused
    auth: list[KafkaError] = []
    wrong = Producer(_client(sec, "app", **{"sasl.password": "not-the-password",
                                             "error_cb": lambda e: auth.append(e)}))
    for _ in range(100):
        if auth:
            break
        wrong.poll(0.1)
    assert auth and auth[0].code() == KafkaError._AUTHENTICATION

    pids = [int((sec / f"{name}.pid").read_text()) for name in ("broker-1", "broker-2", "broker-3", "zookeeper")]
    stopped = shell.run(stop_blocks, timeout=120)
    assert stopped.returncode == 0, stopped.stdout[-4000:]
    deadline = time.monotonic() + 30
    for _ in range(300):
        if not any(_alive(pid) for pid in pids) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not [pid for pid in pids if _alive(pid)], "the stopping step left processes running"
    for i in (1, 2, 3):
        assert "cannot start" not in (sec / f"broker-{i}.log").read_text()
