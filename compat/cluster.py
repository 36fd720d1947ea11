"""The cluster under test: an existing one (--bootstrap) or a pykbroker subprocess behind a recording proxy."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from compat import wire

REPO = Path(__file__).resolve().parent.parent

# Kafka's single-broker settings (the ones any one-node Kafka needs, e.g. the apache/kafka image's
# defaults): internal topics with one replica, and no delay before the first rebalance.
SINGLE_NODE_OVERRIDES = {
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ClusterInfo:
    bootstrap: str
    label: str
    api_versions: dict[int, tuple[int, int]]
    managed: bool
    record_file: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({
            "bootstrap": self.bootstrap, "label": self.label, "managed": self.managed,
            "record_file": self.record_file,
            "api_versions": {str(k): list(v) for k, v in self.api_versions.items()},
        })

    @classmethod
    def from_json(cls, s: str) -> ClusterInfo:
        d = json.loads(s)
        return cls(d["bootstrap"], d["label"], {int(k): (v[0], v[1]) for k, v in d["api_versions"].items()},
                   d["managed"], d.get("record_file"))


def _wait_api_versions(bootstrap: str, proc: subprocess.Popen[bytes] | None, timeout: float,
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


class ManagedPykbroker:
    """pykbroker on a private port, advertised as the recording proxy's port."""

    def __init__(self, workdir: Path | None = None, overrides: dict[str, str] | None = None,
                 trace_file: Path | None = None) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="compat-pykbroker-"))
        self.broker_port = free_port()
        self.proxy_port = free_port()
        self.overrides = {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.broker_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.proxy_port}",
            # Two log dirs, as a JBOD broker has: moving a replica between them (AlterReplicaLogDirs)
            # is then possible; with one, that scenario reports "not possible on this cluster".
            "log.dirs": f"{self.workdir / 'data'},{self.workdir / 'data2'}",
            **SINGLE_NODE_OVERRIDES,
            **(overrides or {}),
        }
        self.record_file = self.workdir / "requests.jsonl"
        self.trace_file = trace_file
        self.log_file = self.workdir / "broker.log"
        self.broker: subprocess.Popen[bytes] | None = None
        self.proxy: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy_port}"

    def start(self, timeout: float = 60.0) -> ClusterInfo:
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
        try:
            _wait_api_versions(f"127.0.0.1:{self.broker_port}", self.broker, timeout, self.log_file)
            versions = _wait_api_versions(self.bootstrap, self.proxy, 20.0, self.workdir / "proxy.log")
        except BaseException:
            self.stop()
            raise
        return ClusterInfo(self.bootstrap, pykbroker_version(), versions, managed=True,
                           record_file=str(self.record_file))

    def stop(self) -> None:
        for p in (self.proxy, self.broker):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (self.proxy, self.broker):
            if p is not None:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)

    def cleanup(self) -> None:
        for d in ("data", "data2"):
            shutil.rmtree(self.workdir / d, ignore_errors=True)


def external(bootstrap: str, label: str | None) -> ClusterInfo:
    versions = _wait_api_versions(bootstrap, None, 30.0)
    return ClusterInfo(bootstrap, label or f"external cluster at {bootstrap}", versions, managed=False)
