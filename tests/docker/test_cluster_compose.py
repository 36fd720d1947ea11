"""The `cluster` profile of docker/compose.yaml, built and run for real with podman-compose.

One ZooKeeper (built from Debian's packages, docker/zookeeper/) and three brokers on the compose
network, each publishing its EXTERNAL listener on a free 127.0.0.1 port; the host talks to them with
confluent-kafka: a topic of 3 partitions replicated 3 times, produced to partition by partition with
acks=all, and read back through each broker's bootstrap address.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.docker import podman as pm
from tests.docker.test_image import METADATA_V0_SNIPPET

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    # Shares the broker image build with test_image.py; keep them on one xdist worker (--dist loadgroup).
    pytest.mark.xdist_group("docker"),
]

ZOOKEEPER_IMAGE = "localhost/pykbroker-zookeeper:test"
BROKER_IDS = (1, 2, 3)
SERVICES = ("zookeeper", *(f"broker-{i}" for i in BROKER_IDS))


@pytest.fixture(scope="module")
def zookeeper_image(image: str) -> str:
    """The ZooKeeper image, built by podman-compose from docker/zookeeper (the layer cache makes a rerun fast)."""
    project = pm.unique("zkbuild").replace("-", "")
    with pm.file_lock("pykbroker-docker-build.lock"):
        t0 = time.monotonic()
        pm.compose(project, "--profile", "cluster", "build", "zookeeper", timeout=900,
                   extra_env={"PYKB_IMAGE": image, "PYKB_ZOOKEEPER_IMAGE": ZOOKEEPER_IMAGE})
        elapsed = time.monotonic() - t0
    size = int(pm.podman("image", "inspect", "--format", "{{.Size}}", ZOOKEEPER_IMAGE).stdout.strip())
    pm.record_figure("zookeeper_build_seconds", round(elapsed, 1))
    pm.record_figure("zookeeper_image_size_mb", round(size / 1e6, 1))
    return ZOOKEEPER_IMAGE


class Cluster:
    """One podman-compose project running the cluster profile; `down -v` at teardown."""

    def __init__(self, image: str, zookeeper_image: str) -> None:
        self.project = pm.unique("cluster").replace("-", "")
        self.ports = {i: pm.free_port() for i in BROKER_IDS}
        self.env = {
            "PYKB_IMAGE": image,
            "PYKB_ZOOKEEPER_IMAGE": zookeeper_image,
            # The single broker is not started (services are named), but its port must not clash either.
            "PYKB_PORT": str(pm.free_port()),
            "PYKB_ADVERTISED_HOST": "127.0.0.1",
            **{f"PYKB_CLUSTER_PORT_{i}": str(port) for i, port in self.ports.items()},
        }
        self.names: dict[str, str] = {}

    def bootstrap(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.ports[broker_id]}"

    def compose(self, *args: str, timeout: float = 180, check: bool = True) -> Any:
        return pm.compose(self.project, "--profile", "cluster", *args, extra_env=self.env, timeout=timeout,
                          check=check)

    def up(self) -> None:
        self.compose("up", "-d", "--no-build", *SERVICES)
        self.names = pm.compose_containers(self.project)

    def all_logs(self) -> str:
        return "\n".join(f"----- {service} ({name})\n{pm.logs(name)[-6000:]}"
                         for service, name in sorted(self.names.items()))

    def down(self) -> Any:
        return self.compose("down", "-v", "-t", "30", timeout=300, check=False)

    def containers_left(self) -> list[str]:
        return sorted(pm.compose_containers(self.project).values())

    def volumes_left(self) -> list[str]:
        out = pm.podman("volume", "ls", "--filter", f"label=io.podman.compose.project={self.project}",
                        "--format", "{{.Name}}").stdout
        return out.split()


@pytest.fixture
def cluster(image: str, zookeeper_image: str) -> Iterator[Cluster]:
    c = Cluster(image, zookeeper_image)
    try:
        yield c
    finally:
        down = c.down()
        assert down.returncode == 0, down.stdout + down.stderr
        assert c.containers_left() == [], c.containers_left()
        assert c.volumes_left() == [], c.volumes_left()


def _topic_metadata(bootstrap: str, topic: str | None = None, timeout: float = 20) -> Any:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.list_topics(topic, timeout=timeout)


def _wait_for_brokers(cluster: Cluster, timeout: float = 60) -> None:
    """Until every broker's Metadata lists all three brokers (each has seen the others register)."""
    expected = {i: ("127.0.0.1", cluster.ports[i]) for i in BROKER_IDS}
    deadline = time.monotonic() + timeout
    seen: dict[int, Any] = {}
    for _ in range(int(timeout) + 1):
        for i in BROKER_IDS:
            try:
                md = _topic_metadata(cluster.bootstrap(i), timeout=5)
            except Exception as e:  # retried until the deadline
                seen[i] = repr(e)
                continue
            seen[i] = {b.id: (b.host, b.port) for b in md.brokers.values()}
        if all(seen.get(i) == expected for i in BROKER_IDS):
            return
        if time.monotonic() > deadline:
            break
        time.sleep(1)
    raise AssertionError(f"brokers never all saw each other: {seen}\n{cluster.all_logs()}")


def _wait_fully_replicated(bootstrap: str, topic: str, partitions: int, timeout: float = 60) -> Any:
    """Until Metadata shows every partition with a leader and all three replicas in sync."""
    deadline = time.monotonic() + timeout
    last: Any = None
    for _ in range(int(timeout / 0.5) + 1):
        md = _topic_metadata(bootstrap, topic)
        t = md.topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            last = {p.id: (p.leader, sorted(p.replicas), sorted(p.isrs)) for p in t.partitions.values()}
            if all(leader in BROKER_IDS and replicas == list(BROKER_IDS) and isr == list(BROKER_IDS)
                   for leader, replicas, isr in last.values()):
                return t
        else:
            last = t.error if t is not None else "missing"
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    raise AssertionError(f"{topic} not fully replicated after {timeout}s: {last}")


def _messages(tag: str, partition: int, n: int = 40) -> list[tuple[bytes, bytes]]:
    return [(f"{tag}-p{partition}-k{i}".encode(), f"{tag}-p{partition}-v{i}".encode() * 8) for i in range(n)]


def _up_and_healthy(cluster: Cluster) -> None:
    t0 = time.monotonic()
    cluster.up()
    assert sorted(cluster.names) == sorted(SERVICES), cluster.names
    # ZooKeeper first: its check is the compose file's (`srvr` over bash's /dev/tcp); then the brokers,
    # whose check is the image's ApiVersions round trip.
    pm.wait_healthy(cluster.names["zookeeper"], timeout=90)
    for i in BROKER_IDS:
        pm.wait_healthy(cluster.names[f"broker-{i}"], timeout=90)
    pm.record_figure("cluster_up_to_healthy_seconds", round(time.monotonic() - t0, 2))
    # Every broker registered and each knows the others by the address host clients use.
    _wait_for_brokers(cluster)


# Each named broker's kafka_controller_kafkacontroller_activecontrollercount, from its /metrics on port 9404.
CONTROLLER_GAUGE_SNIPPET = """
import sys, urllib.request
for host in sys.argv[1:]:
    body = urllib.request.urlopen(f"http://{host}:9404/metrics", timeout=10).read().decode()
    print(next(line.split()[1] for line in body.splitlines()
               if line.startswith("kafka_controller_kafkacontroller_activecontrollercount ")).split(".")[0])
"""


def test_cluster_profile_round_trip(cluster: Cluster) -> None:
    """compose --profile cluster up: ZooKeeper and 3 brokers, a RF-3 topic, every partition produced to
    (acks=all) and consumed back through each broker's bootstrap address, then down -v."""
    try:
        _up_and_healthy(cluster)
        # ZooKeeper runs in the foreground as PID 1, not as root.
        top = pm.podman("top", cluster.names["zookeeper"], "pid", "user", "args").stdout.splitlines()
        pid1 = [line for line in top[1:] if line.split()[0] == "1"]
        assert pid1 and pid1[0].split()[1] == "zookeeper" and "QuorumPeerMain" in pid1[0], top

        t1 = time.monotonic()
        topic = "cluster-orders"
        pm.create_topic(cluster.bootstrap(1), topic, partitions=3, replication_factor=3)
        t = _wait_fully_replicated(cluster.bootstrap(2), topic, 3)
        # Kafka's assignment puts the 3 partitions' leaders on 3 different brokers, so producing to every
        # partition writes through every broker.
        leaders = sorted(p.leader for p in t.partitions.values())
        assert leaders == list(BROKER_IDS), leaders

        sent: list[tuple[bytes, bytes]] = []
        for p in range(3):
            msgs = _messages("trip", p)
            pm.produce(cluster.bootstrap(1 + p), topic, msgs, partition=p)
            sent += msgs
        for i in BROKER_IDS:
            got = pm.consume_all(cluster.bootstrap(i), topic, len(sent), partitions=3)
            assert sorted(got) == sorted(sent), f"through broker {i}"
        pm.record_figure("cluster_round_trip_seconds", round(time.monotonic() - t1, 2))

        # Replication kept every replica in sync while the data went in.
        _wait_fully_replicated(cluster.bootstrap(3), topic, 3, timeout=30)

        # Containers on the compose network use the INTERNAL listener, and are told broker-N:29092.
        out = pm.podman("run", "--rm", "--pull=never", "--network", f"{cluster.project}_pykbroker",
                        "--entrypoint", "python3", cluster.env["PYKB_IMAGE"], "-c", METADATA_V0_SNIPPET,
                        "broker-2", "29092", timeout=60).stdout
        assert sorted(out.strip().splitlines()) == [f"{i} broker-{i} 29092" for i in BROKER_IDS], out

        # Every broker serves its metrics on the compose network, where the monitoring profile's
        # Prometheus scrapes them (docker/monitoring/prometheus.yml); one of them is the controller.
        out = pm.podman("run", "--rm", "--pull=never", "--network", f"{cluster.project}_pykbroker",
                        "--entrypoint", "python3", cluster.env["PYKB_IMAGE"], "-c", CONTROLLER_GAUGE_SNIPPET,
                        *(f"broker-{i}" for i in BROKER_IDS), timeout=60).stdout
        assert sorted(out.split()) == ["0", "0", "1"], out
    except Exception as e:
        raise AssertionError(f"{e}\n{cluster.all_logs()}") from e


def test_cluster_rolling_restart(cluster: Cluster) -> None:
    """`stop` one broker (SIGTERM: controlled shutdown moves its leaderships first), keep producing and
    consuming through the other two, `start` it again: it catches up and rejoins every ISR."""
    try:
        _up_and_healthy(cluster)
        topic = "cluster-rolling"
        pm.create_topic(cluster.bootstrap(1), topic, partitions=3, replication_factor=3)
        t = _wait_fully_replicated(cluster.bootstrap(1), topic, 3)
        sent: list[tuple[bytes, bytes]] = []
        for p in range(3):
            sent += _messages("before", p)
            pm.produce(cluster.bootstrap(1), topic, sent[-40:], partition=p)

        victim = t.partitions[0].leader
        name = cluster.names[f"broker-{victim}"]
        survivor = next(i for i in BROKER_IDS if i != victim)
        t_stop = time.monotonic()
        pm.podman("stop", "-t", "60", name, timeout=90)
        stop_seconds = time.monotonic() - t_stop
        state = pm.wait_stopped(name)
        pm.record_figure("cluster_controlled_stop_seconds", round(stop_seconds, 2))
        assert state["ExitCode"] == 0, f"exit code {state['ExitCode']} (137 = SIGKILLed)"
        stopped_logs = pm.logs(name)
        assert "controlled shutdown: no leadership left" in stopped_logs, stopped_logs[-4000:]
        assert "shutdown complete" in stopped_logs, stopped_logs[-4000:]

        # The other two lead everything and accept acks=all writes (ISR 2 = min.insync.replicas).
        deadline = time.monotonic() + 30
        leaders: list[int] = []
        for _ in range(60):
            md = _topic_metadata(cluster.bootstrap(survivor), topic)
            leaders = sorted(p.leader for p in md.topics[topic].partitions.values())
            if all(leader in BROKER_IDS and leader != victim for leader in leaders) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert all(leader in BROKER_IDS and leader != victim for leader in leaders), (victim, leaders)
        for p in range(3):
            sent += _messages("during", p)
            pm.produce(cluster.bootstrap(survivor), topic, sent[-40:], partition=p)
        got = pm.consume_all(cluster.bootstrap(survivor), topic, len(sent), partitions=3)
        assert sorted(got) == sorted(sent)

        # Back again: it fetches what it missed and is in every ISR; all of it can be read through it.
        t_start = time.monotonic()
        pm.podman("start", name, timeout=60)
        pm.wait_healthy(name, timeout=90)
        _wait_fully_replicated(cluster.bootstrap(victim), topic, 3, timeout=90)
        pm.record_figure("cluster_rejoin_seconds", round(time.monotonic() - t_start, 2))
        got = pm.consume_all(cluster.bootstrap(victim), topic, len(sent), partitions=3)
        assert sorted(got) == sorted(sent)
    except Exception as e:
        raise AssertionError(f"{e}\n{cluster.all_logs()}") from e
