"""pytest fixtures backed by a real pykbroker (docs/testing.md). Enabled with ``-p pykbroker.testing.pytest_plugin``,
``pytest_plugins = ["pykbroker.testing.pytest_plugin"]`` in the root conftest.py, ``--pykbroker`` or the ini
option ``pykbroker = true``.

One broker per test session (per pytest-xdist worker), a fresh topic per test, clients of the Kafka libraries
that are installed (a fixture whose library is absent skips the test that asks for it), and a cluster of three
brokers with ZooKeeper where Debian's ZooKeeper is installed. Nothing starts unless a test asks for it."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

from pykbroker.testing.broker import Broker
from pykbroker.testing.cluster import Cluster, ZooKeeperUnavailable

TopicFactory = Callable[..., str]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pykbroker_topic(partitions=1, config=None): how the pykbroker_topic fixture creates the topic")


def _library(module: str, package: str, fixture: str) -> Any:
    """The client library, or a skip naming it (before a broker is started for a test that cannot run)."""
    return pytest.importorskip(module, reason=f"the fixture {fixture} needs {package} (pip install {package}), "
                                              f"which is not installed")


def _bootstrap(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("pykbroker_bootstrap_servers"))


def _unique(request: pytest.FixtureRequest, prefix: str = "test") -> str:
    """A name that says which test made it and is new on every run (Kafka's topic and group name rules)."""
    stem = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name).strip("-.")[:80]
    return f"{prefix}-{stem}-{uuid.uuid4().hex[:8]}"


# --- brokers -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def pykbroker_overrides() -> dict[str, object]:
    """Broker settings for ``pykbroker_broker``: override this fixture in a conftest.py to change them."""
    return {}


@pytest.fixture(scope="session")
def pykbroker_broker(pykbroker_overrides: Mapping[str, object],
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One pykbroker for the session, stopped and its data removed at the end; its log stays in pytest's
    temporary directory (``pykbroker0/broker.log``)."""
    log_path = tmp_path_factory.mktemp("pykbroker") / "broker.log"
    with Broker(pykbroker_overrides, log_path=log_path) as broker:
        yield broker


@pytest.fixture(scope="session")
def pykbroker_bootstrap_servers(pykbroker_broker: Broker) -> str:
    """``bootstrap.servers`` of the session's broker."""
    return pykbroker_broker.bootstrap_servers


@pytest.fixture(scope="session")
def pykbroker_cluster_overrides() -> dict[str, object]:
    """Settings for every broker of ``pykbroker_cluster``: override this fixture in a conftest.py."""
    return {}


@pytest.fixture(scope="session")
def pykbroker_cluster(pykbroker_cluster_overrides: Mapping[str, object]) -> Iterator[Cluster]:
    """Three brokers (ids 1, 2, 3) and ZooKeeper for the session; skips where ZooKeeper is not installed."""
    cluster = Cluster(3, pykbroker_cluster_overrides)
    try:
        cluster.start()
    except ZooKeeperUnavailable as e:
        pytest.skip(f"pykbroker_cluster needs ZooKeeper (Debian: apt-get install zookeeper): {e}")
    try:
        yield cluster
    finally:
        cluster.stop()


# --- topics ------------------------------------------------------------------------------------------------

@pytest.fixture
def pykbroker_topic_factory(request: pytest.FixtureRequest, pykbroker_broker: Broker) -> Iterator[TopicFactory]:
    """``make(partitions=1, config=None, name=None) -> name``: topics on the session's broker, deleted after
    the test."""
    made: list[str] = []

    def make(partitions: int = 1, config: Mapping[str, object] | None = None, name: str | None = None) -> str:
        topic = pykbroker_broker.create_topic(name or _unique(request), partitions, config)
        made.append(topic)
        return topic

    yield make
    if pykbroker_broker.running():
        for topic in made:
            pykbroker_broker.delete_topic(topic)


@pytest.fixture
def pykbroker_topic(request: pytest.FixtureRequest, pykbroker_topic_factory: TopicFactory) -> str:
    """A new topic for this test (one partition unless ``@pytest.mark.pykbroker_topic(partitions=N,
    config={...})`` says otherwise), deleted after it."""
    marker = request.node.get_closest_marker("pykbroker_topic")
    options: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    unknown = set(options) - {"partitions", "config"}
    if unknown:
        raise TypeError(f"pykbroker_topic marker: unknown arguments {sorted(unknown)} "
                        f"(it takes partitions= and config=)")
    return pykbroker_topic_factory(**options)


@pytest.fixture
def pykbroker_group_id(request: pytest.FixtureRequest) -> str:
    """A consumer group id of this test alone."""
    return _unique(request, "group")


# --- confluent-kafka ---------------------------------------------------------------------------------------

@pytest.fixture
def pykbroker_confluent_producer(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A ``confluent_kafka.Producer``; what it still holds is flushed (10 s at most) after the test."""
    ck = _library("confluent_kafka", "confluent-kafka", "pykbroker_confluent_producer")
    producer = ck.Producer({"bootstrap.servers": _bootstrap(request)})
    yield producer
    producer.flush(10)


@pytest.fixture
def pykbroker_confluent_consumer(request: pytest.FixtureRequest, pykbroker_group_id: str) -> Iterator[Any]:
    """A ``confluent_kafka.Consumer`` in a group of its own, reading from the earliest offset; closed after."""
    ck = _library("confluent_kafka", "confluent-kafka", "pykbroker_confluent_consumer")
    consumer = ck.Consumer({"bootstrap.servers": _bootstrap(request), "group.id": pykbroker_group_id,
                            "auto.offset.reset": "earliest"})
    yield consumer
    consumer.close()


@pytest.fixture
def pykbroker_confluent_admin(request: pytest.FixtureRequest) -> Any:
    """A ``confluent_kafka.admin.AdminClient``."""
    admin = _library("confluent_kafka.admin", "confluent-kafka", "pykbroker_confluent_admin")
    return admin.AdminClient({"bootstrap.servers": _bootstrap(request)})


# --- kafka-python ------------------------------------------------------------------------------------------

@pytest.fixture
def pykbroker_kafka_python_producer(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A ``kafka.KafkaProducer``; flushed and closed after the test."""
    kafka = _library("kafka", "kafka-python", "pykbroker_kafka_python_producer")
    producer = kafka.KafkaProducer(bootstrap_servers=_bootstrap(request))
    yield producer
    producer.close(timeout=10)


@pytest.fixture
def pykbroker_kafka_python_consumer(request: pytest.FixtureRequest, pykbroker_group_id: str) -> Iterator[Any]:
    """A ``kafka.KafkaConsumer`` in a group of its own, reading from the earliest offset; closed after."""
    kafka = _library("kafka", "kafka-python", "pykbroker_kafka_python_consumer")
    consumer = kafka.KafkaConsumer(bootstrap_servers=_bootstrap(request), group_id=pykbroker_group_id,
                                   auto_offset_reset="earliest")
    yield consumer
    consumer.close()


@pytest.fixture
def pykbroker_kafka_python_admin(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A ``kafka.KafkaAdminClient``; closed after the test."""
    kafka = _library("kafka", "kafka-python", "pykbroker_kafka_python_admin")
    admin = kafka.KafkaAdminClient(bootstrap_servers=_bootstrap(request))
    yield admin
    admin.close()


# --- aiokafka ----------------------------------------------------------------------------------------------

class AiokafkaClients:
    """aiokafka clients as async context managers, started and stopped in the caller's event loop (aiokafka
    binds a client to the loop it starts in, so a fixture cannot start one for a test's loop)."""

    def __init__(self, aiokafka: Any, bootstrap_servers: str, group_id: str) -> None:
        self._aiokafka = aiokafka
        self.bootstrap_servers = bootstrap_servers
        self.group_id = group_id

    @asynccontextmanager
    async def producer(self, **config: Any) -> AsyncIterator[Any]:
        """A started ``AIOKafkaProducer``; stopped (what it holds sent) on exit."""
        producer = self._aiokafka.AIOKafkaProducer(bootstrap_servers=self.bootstrap_servers, **config)
        await producer.start()
        try:
            yield producer
        finally:
            await producer.stop()

    @asynccontextmanager
    async def consumer(self, *topics: str, **config: Any) -> AsyncIterator[Any]:
        """A started ``AIOKafkaConsumer`` of ``topics``, in the test's group, from the earliest offset."""
        options = {"group_id": self.group_id, "auto_offset_reset": "earliest", **config}
        consumer = self._aiokafka.AIOKafkaConsumer(*topics, bootstrap_servers=self.bootstrap_servers, **options)
        await consumer.start()
        try:
            yield consumer
        finally:
            await consumer.stop()


@pytest.fixture
def pykbroker_aiokafka(request: pytest.FixtureRequest, pykbroker_group_id: str) -> AiokafkaClients:
    """``async with pykbroker_aiokafka.producer() as p`` / ``.consumer(topic) as c``: aiokafka clients of the
    session's broker."""
    aiokafka = _library("aiokafka", "aiokafka", "pykbroker_aiokafka")
    return AiokafkaClients(aiokafka, _bootstrap(request), pykbroker_group_id)
