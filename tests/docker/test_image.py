"""The container image, built from this working tree and run for real with podman.

The image is built once per session (see conftest.py); each test starts its own containers with the
broker port published on a free 127.0.0.1 port and talks to it with confluent-kafka from the host.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.docker import podman as pm

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    # All of these share one image build; keep them on one xdist worker (with --dist loadgroup).
    pytest.mark.xdist_group("docker"),
]


# Run inside a container: a Metadata v0 request to argv[1]:argv[2]; prints each broker as "id host port".
METADATA_V0_SNIPPET = """
import socket, struct, sys
host, port = sys.argv[1], int(sys.argv[2])
req = struct.pack(">hhih", 3, 0, 7, 4) + b"test" + struct.pack(">i", 0)
with socket.create_connection((host, port), timeout=10) as s:
    s.sendall(struct.pack(">i", len(req)) + req)
    def read(n):
        b = b""
        while len(b) < n:
            c = s.recv(n - len(b))
            if not c:
                raise SystemExit("connection closed")
            b += c
        return b
    body = read(struct.unpack(">i", read(4))[0])
corr, n = struct.unpack_from(">ii", body, 0)
off = 8
for _ in range(n):
    node, hlen = struct.unpack_from(">ih", body, off)
    off += 6
    h = body[off:off + hlen].decode()
    off += hlen
    (p,) = struct.unpack_from(">i", body, off)
    off += 4
    print(node, h, p)
"""


def _messages(prefix: str, n: int) -> list[tuple[bytes, bytes]]:
    return [(f"k{i}".encode(), f"{prefix}-{i}".encode() * 10) for i in range(n)]


def test_image_metadata(image: str) -> None:
    """Non-root user, declared volume, exposed port, a HEALTHCHECK that runs `pykbroker healthcheck`."""
    cfg = pm.podman("image", "inspect", "--format", "json", image).stdout
    import json

    info = json.loads(cfg)[0]
    config = info["Config"]
    assert config["User"].split(":")[0] == "pykbroker"
    assert "/var/lib/pykbroker" in config["Volumes"]
    assert "9092/tcp" in config["ExposedPorts"]
    assert config["StopSignal"] in ("SIGTERM", "15", "TERM")
    assert config["Entrypoint"] == ["pykbroker"]
    # podman shows the Docker-format healthcheck at the top level (docker: Config.Healthcheck); it is only
    # kept with `podman build --format docker`.
    hc = config.get("Healthcheck") or info.get("Healthcheck") or {}
    assert hc, f"no HEALTHCHECK in the image config: {config}"
    assert "healthcheck" in " ".join(hc["Test"])
    for k in config.get("Env", []):
        # `pykbroker serve` treats every PYKBROKER_* variable as a config key: the image must set none.
        assert not k.startswith("PYKBROKER_"), k
    # Debian bookworm's python3, from a Debian base.
    out = pm.podman("run", "--rm", "--pull=never", "--network=none", "--entrypoint", "sh", image, "-c",
                    "id -u; id -un; python3 --version; . /etc/os-release; echo $VERSION_CODENAME; "
                    "pykbroker --version; ls -ld /var/lib/pykbroker/data").stdout.split("\n")
    uid, user, py, codename, version, datadir = out[:6]
    assert uid != "0" and user == "pykbroker"
    assert py.startswith("Python 3.11"), py
    assert codename == "bookworm"
    assert version.startswith("pykbroker "), version
    assert " pykbroker pykbroker " in datadir, datadir


def test_run_produce_consume_restart(containers: pm.Containers) -> None:
    """The main path: run with a volume, become healthy, produce/consume from the host, `stop` cleanly,
    start again and find the data."""
    volume = pm.unique("data")
    t0 = time.monotonic()
    name, port = containers.run(volume=volume)
    waited = pm.wait_healthy(name, timeout=60)
    pm.record_figure("start_to_healthy_seconds", round(time.monotonic() - t0, 2))
    assert pm.health_status(name) == "healthy"

    # The broker is PID 1 in the container, as the image's user: `docker stop`'s SIGTERM reaches it.
    top = pm.podman("top", name, "pid", "user", "args").stdout.splitlines()
    pid1 = [line for line in top[1:] if line.split()[0] == "1"]
    assert pid1 and "pykbroker" in pid1[0] and "serve" in pid1[0], top
    assert pid1[0].split()[1] != "root", top

    bootstrap = f"127.0.0.1:{port}"
    topic = "docker-orders"
    pm.create_topic(bootstrap, topic, partitions=2)
    first = _messages("first", 200)
    pm.produce(bootstrap, topic, first)
    got = pm.consume_all(bootstrap, topic, len(first), partitions=2)
    assert sorted(got) == sorted(first)

    # docker stop: SIGTERM, then a clean exit well before the kill timeout.
    t_stop = time.monotonic()
    pm.podman("stop", "-t", "30", name, timeout=60)
    stop_seconds = time.monotonic() - t_stop
    state = pm.wait_stopped(name)
    pm.record_figure("stop_seconds", round(stop_seconds, 2))
    assert state["ExitCode"] == 0, f"exit code {state['ExitCode']} (137 = SIGKILLed):\n{pm.logs(name)}"
    assert stop_seconds < 25, f"stop took {stop_seconds:.1f}s: SIGTERM did not reach the broker?"
    first_logs = pm.logs(name)
    assert "received SIGTERM" in first_logs, first_logs
    assert "shutdown complete" in first_logs, first_logs

    # The clean-shutdown marker (Kafka's file name) is in the volume ...
    listing = pm.podman("run", "--rm", "--pull=never", "--network=none", "-v", f"{volume}:/var/lib/pykbroker",
                        "--entrypoint", "ls", pm.IMAGE, "-a", "/var/lib/pykbroker/data").stdout.split()
    assert ".kafka_cleanshutdown" in listing, listing

    # ... so starting the same container again finds the data without a recovery scan.
    t0 = time.monotonic()
    pm.podman("start", name, timeout=60)
    pm.wait_healthy(name, timeout=60)
    pm.record_figure("restart_to_healthy_seconds", round(time.monotonic() - t0, 2))
    loads = re.findall(r"Loaded (\d+) partition log\(s\).*\((\d+) recovered", pm.logs(name))
    assert len(loads) == 2, pm.logs(name)  # the first start, then this one
    loaded, recovered = (int(x) for x in loads[-1])
    # The topic's 2 partitions (and __consumer_offsets, if the consumer made it), none recovered.
    assert loaded >= 2 and recovered == 0, loads
    got = pm.consume_all(bootstrap, topic, len(first), partitions=2)
    assert sorted(got) == sorted(first)

    # And the data outlives the container: a new one on the same volume sees it too.
    pm.podman("rm", "-f", "-v", "-t", "30", name, timeout=60)
    name2, port2 = containers.run(volume=volume)
    pm.wait_healthy(name2, timeout=60)
    bootstrap2 = f"127.0.0.1:{port2}"
    second = _messages("second", 50)
    pm.produce(bootstrap2, topic, second)
    got = pm.consume_all(bootstrap2, topic, len(first) + len(second), partitions=2)
    assert sorted(got) == sorted(first + second)
    assert waited < 60


def test_env_config_visible_in_describe_configs(containers: pm.Containers) -> None:
    """PYKBROKER_LOG_RETENTION_HOURS -> log.retention.hours, as DescribeConfigs reports it."""
    name, port = containers.run(env={"PYKBROKER_LOG_RETENTION_HOURS": "42",
                                     "PYKBROKER_NUM_PARTITIONS": "3"})
    pm.wait_healthy(name, timeout=60)
    entries = pm.describe_broker_configs(f"127.0.0.1:{port}")
    assert entries["log.retention.hours"].value == "42"
    assert entries["num.partitions"].value == "3"
    # The image's own defaults are still in force underneath.
    assert entries["log.dirs"].value == "/var/lib/pykbroker/data"


def test_mounted_properties_file_and_env_precedence(containers: pm.Containers, tmp_path: Path) -> None:
    """A mounted server.properties replaces the image's; environment variables still win over it."""
    props = tmp_path / "server.properties"
    props.write_text(
        "broker.id=7\n"
        "listeners=PLAINTEXT://0.0.0.0:9092\n"
        "log.dirs=/var/lib/pykbroker/data\n"
        "log.retention.hours=5\n"
        "log.segment.bytes=1048576\n"
    )
    props.chmod(0o644)
    name, port = containers.run(env={"PYKBROKER_LOG_RETENTION_HOURS": "9"},
                                args=["-v", f"{props}:/etc/pykbroker/server.properties:ro"])
    pm.wait_healthy(name, timeout=60)
    entries = pm.describe_broker_configs(f"127.0.0.1:{port}", broker_id="7")
    assert entries["log.segment.bytes"].value == "1048576"  # from the file
    assert entries["log.retention.hours"].value == "9"  # the environment beats the file


def test_bad_config_fails_fast(image: str) -> None:
    """A misspelt PYKBROKER_* variable stops the container with a message, not a silent default."""
    cp = pm.podman("run", "--rm", "--pull=never", "--network=none", "-e", "PYKBROKER_LOG_RETENTION_HOUR=1",
                   image, timeout=60, check=False)
    assert cp.returncode != 0
    assert "log.retention.hour" in cp.stderr + cp.stdout


def test_compose_up_down(image: str) -> None:
    """docker/compose.yaml with podman-compose: up, healthy, produce/consume, down -v."""
    project = pm.unique("compose").replace("-", "")
    port = pm.free_port()
    env = {"PYKB_IMAGE": image, "PYKB_PORT": str(port), "PYKB_ADVERTISED_HOST": "127.0.0.1"}
    label = f"label=io.podman.compose.project={project}"
    try:
        pm.compose(project, "up", "-d", "--no-build", extra_env=env, timeout=180)
        names = pm.podman("ps", "-a", "--filter", label, "--format", "{{.Names}}").stdout.split()
        assert len(names) == 1, names
        name = names[0]
        pm.wait_healthy(name, timeout=60)
        bootstrap = f"127.0.0.1:{port}"
        msgs = _messages("compose", 20)
        pm.produce(bootstrap, "compose-topic", msgs)
        assert sorted(pm.consume_all(bootstrap, "compose-topic", len(msgs))) == sorted(msgs)
        # Host clients were told the EXTERNAL address; containers on the compose network reach the
        # INTERNAL listener by service name and are told broker:29092 (a raw Metadata v0 request).
        from confluent_kafka.admin import AdminClient

        brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20).brokers
        assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", port)]
        network = f"{project}_pykbroker"
        out = pm.podman("run", "--rm", "--pull=never", "--network", network, "--entrypoint", "python3",
                        image, "-c", METADATA_V0_SNIPPET, "broker", "29092", timeout=60).stdout
        assert out.split() == ["0", "broker", "29092"], out
        volumes = pm.podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
        assert f"{project}_broker-data" in volumes, volumes
        ps = pm.compose(project, "ps", extra_env=env, timeout=60).stdout
        assert name in ps, ps
    finally:
        down = pm.compose(project, "down", "-v", "-t", "30", extra_env=env, timeout=180, check=False)
    assert down.returncode == 0, down.stdout + down.stderr
    assert pm.podman("ps", "-a", "--filter", label, "--format", "{{.Names}}").stdout.split() == []
    assert f"{project}_broker-data" not in pm.podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
