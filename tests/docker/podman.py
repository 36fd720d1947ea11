"""Helpers for the container-image tests: run podman, wait for health, talk Kafka to the container.

Everything here is bounded in time: each podman call has a timeout and every wait loop has both a
deadline and a maximum number of rounds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
COMPOSE_FILE = REPO_ROOT / "docker" / "compose.yaml"
CONTAINERS_CONF = REPO_ROOT / "docker" / "containers.conf"
SETUP_SCRIPT = REPO_ROOT / "scripts" / "setup-podman.sh"
BASE_IMAGE = "docker.io/library/debian:bookworm-slim"
IMAGE = os.environ.get("PYKB_TEST_IMAGE", "localhost/pykbroker:test")
COMPOSE_VENV_BIN = Path("/opt/pykbroker-podman-compose/bin/podman-compose")
# Every name the tests create starts with this, so a leftover is recognisable.
PREFIX = "pykbtest"
FIGURES_FILE = Path(tempfile.gettempdir()) / "pykbroker-docker-figures.json"


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return e


def podman(*args: str, timeout: float = 60, check: bool = True,
           extra_env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = env()
    e.update(extra_env or {})
    try:
        cp = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=e,
                            stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as ex:
        raise AssertionError(f"podman {' '.join(args)} timed out after {timeout}s") from ex
    if check and cp.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {cp.returncode}:\n{cp.stdout}\n{cp.stderr}")
    return cp


def compose_binary() -> str | None:
    if os.environ.get("PODMAN_COMPOSE"):
        return os.environ["PODMAN_COMPOSE"]
    if COMPOSE_VENV_BIN.exists():
        return str(COMPOSE_VENV_BIN)
    return shutil.which("podman-compose")


def compose(project: str, *args: str, timeout: float = 120, check: bool = True,
            extra_env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    binary = compose_binary()
    assert binary, "podman-compose not found: run scripts/setup-podman.sh"
    e = env()
    e.update(extra_env or {})
    cmd = [binary, "-p", project, "-f", str(COMPOSE_FILE), *args]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e,
                            stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
    except subprocess.TimeoutExpired as ex:
        raise AssertionError(f"{' '.join(cmd)} timed out after {timeout}s") from ex
    if check and cp.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {cp.returncode}:\n{cp.stdout}\n{cp.stderr}")
    return cp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unique(kind: str) -> str:
    return f"{PREFIX}-{kind}-{uuid.uuid4().hex[:8]}"


def host_ca_bundle() -> str | None:
    """The host's CA bundle, handed to the build as a secret so pip inside it trusts what the host trusts."""
    for cand in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                 os.environ.get("REQUESTS_CA_BUNDLE"), "/etc/ssl/certs/ca-certificates.crt"):
        if cand and Path(cand).is_file():
            return cand
    return None


@contextlib.contextmanager
def file_lock(name: str, timeout: float = 900) -> Iterator[None]:
    """Serialise the image build across pytest-xdist workers."""
    path = Path(tempfile.gettempdir()) / name
    with path.open("w") as f:
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout * 4) + 1):
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"timed out waiting for lock {path}") from None
                time.sleep(0.25)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def record_figure(key: str, value: Any) -> None:
    """Keep a measured figure for the terminal summary (a file, so xdist workers can add to it)."""
    with file_lock("pykbroker-docker-figures.lock", timeout=30):
        data: dict[str, Any] = {}
        if FIGURES_FILE.exists():
            with contextlib.suppress(ValueError):
                data = json.loads(FIGURES_FILE.read_text())
        data[key] = value
        FIGURES_FILE.write_text(json.dumps(data, indent=1, sort_keys=True))


def inspect(name: str) -> dict[str, Any]:
    out = podman("inspect", "--type", "container", name).stdout
    data: list[dict[str, Any]] = json.loads(out)
    return data[0]


def health_status(name: str) -> str:
    state = inspect(name)["State"]
    health = state.get("Health") or state.get("Healthcheck") or {}
    return str(health.get("Status", ""))


def logs(name: str) -> str:
    cp = podman("logs", name, check=False, timeout=30)
    return cp.stdout + cp.stderr


def compose_containers(project: str) -> dict[str, str]:
    """The containers of a podman-compose project, by compose service name."""
    out = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={project}", "--format",
                 '{{index .Labels "com.docker.compose.service"}} {{.Names}}').stdout
    pairs = (line.split() for line in out.splitlines() if line.strip())
    return {service: name for service, name in pairs}


def wait_healthy(name: str, timeout: float = 60) -> float:
    """Run the image's HEALTHCHECK until it passes (podman runs it on demand here: no systemd timers).

    Returns the seconds waited.  Fails early if the container stops.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    last = ""
    for _ in range(int(timeout / 0.25) + 1):
        cp = podman("healthcheck", "run", name, check=False, timeout=30)
        if cp.returncode == 0:
            return time.monotonic() - t0
        last = (cp.stdout + cp.stderr).strip()
        status = inspect(name)["State"]["Status"]
        if status not in ("running", "created", "configured"):
            raise AssertionError(f"container {name} is {status} before becoming healthy:\n{logs(name)}")
        if time.monotonic() > deadline:
            break
        time.sleep(0.25)
    raise AssertionError(f"container {name} not healthy after {timeout}s (last: {last}):\n{logs(name)}")


def wait_stopped(name: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.2) + 1):
        state: dict[str, Any] = inspect(name)["State"]
        if state["Status"] in ("exited", "stopped"):
            return state
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    raise AssertionError(f"container {name} still running after {timeout}s:\n{logs(name)}")


@dataclass
class Containers:
    """Containers and volumes a test made; removed at teardown."""

    names: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)

    def run(self, *, env: Mapping[str, str] | None = None, volume: str | None = None,
            port: int | None = None, args: Sequence[str] = (), command: Sequence[str] = (),
            name: str | None = None) -> tuple[str, int]:
        """``podman run -d`` the image with the broker port published on 127.0.0.1; returns (name, port)."""
        name = name or unique("broker")
        port = port or free_port()
        cmd = ["run", "-d", "--name", name, "--pull=never", "-p", f"127.0.0.1:{port}:9092"]
        # The client on the host reaches the broker at the published port, so that is what the broker
        # must advertise (the host-vs-container address problem, docs/deploy.md).
        full_env = {"PYKBROKER_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{port}", **(env or {})}
        for k, v in full_env.items():
            cmd += ["-e", f"{k}={v}"]
        if volume:
            cmd += ["-v", f"{volume}:/var/lib/pykbroker"]
            if volume not in self.volumes:
                self.volumes.append(volume)
        cmd += [*args, IMAGE, *command]
        self.names.append(name)
        podman(*cmd, timeout=60)
        return name, port

    def cleanup(self) -> None:
        for n in self.names:
            podman("rm", "-f", "-v", "-t", "0", n, check=False, timeout=60)
        for v in self.volumes:
            podman("volume", "rm", "-f", v, check=False, timeout=60)


# --- Kafka from the host -----------------------------------------------------------------------------

def create_topic(bootstrap: str, topic: str, partitions: int = 1, timeout: float = 30,
                 replication_factor: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, replication_factor)], operation_timeout=timeout,
                                  request_timeout=timeout)
    futures[topic].result(timeout=timeout)


def produce(bootstrap: str, topic: str, messages: Sequence[tuple[bytes, bytes]], timeout: float = 30,
            partition: int | None = None) -> None:
    """acks=all; ``partition`` pins every message to one partition (else the key decides)."""
    from confluent_kafka import Producer

    errors: list[str] = []
    delivered: list[int] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered.append(msg.offset())

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": int(timeout * 1000)})
    for key, value in messages:
        if partition is None:
            p.produce(topic, value=value, key=key, on_delivery=on_delivery)
        else:
            p.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
    remaining = p.flush(timeout)
    assert remaining == 0, f"{remaining} messages not delivered in {timeout}s"
    assert not errors, errors[:5]
    assert len(delivered) == len(messages)


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 30,
                partitions: int = 1) -> list[tuple[bytes, bytes]]:
    """Read ``expected`` records from the beginning of every partition (assigned, no group coordination)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("group"),
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    out: list[tuple[bytes, bytes]] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.5) + 1):
            if len(out) >= expected or time.monotonic() > deadline:
                break
            for msg in c.consume(num_messages=1000, timeout=0.5):
                if msg.error():
                    raise AssertionError(f"consume error: {msg.error()}")
                out.append((msg.key() or b"", msg.value() or b""))
    finally:
        c.close()
    assert len(out) == expected, f"consumed {len(out)} of {expected} records from {topic}"
    return out


def describe_broker_configs(bootstrap: str, broker_id: str = "0", timeout: float = 30) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ResourceType.BROKER, broker_id)
    futures = admin.describe_configs([res], request_timeout=timeout)
    entries: dict[str, Any] = futures[res].result(timeout=timeout)
    return entries
