"""Topic administration: create (with configs), describe, delete, create partitions, and their errors."""

from __future__ import annotations

from compat import scenario as s
from compat.check import expect_error, text_msgs
from compat.clients import base
from compat.clients.base import Client, ClientError, retry_on, wait_until
from compat.cluster import ClusterInfo
from compat.conftest import unique_topic, wait_known_everywhere

ADMIN = (base.ADMIN,)


def _gone(client: Client, name: str) -> bool:
    try:
        client.describe_topic(name)
    except ClientError as e:
        return e.name == "UNKNOWN_TOPIC_OR_PARTITION"
    return False


def _partitions(client: Client, name: str) -> int:
    try:
        return client.describe_topic(name)
    except ClientError:
        return -1


@s.scenario("topic.create-describe-delete", "topic admin", needs=ADMIN, apis=(19, 20), consumes=False)
def test_create_describe_delete(client: Client, helper: Client) -> None:
    name = unique_topic("create-describe-delete")
    client.create_topic(name, partitions=3)
    # Creation is asynchronous in Kafka: metadata may lag the CreateTopics response briefly.
    wait_until(lambda: _partitions(client, name) == 3, 20, what=f"{name} to have 3 partitions")
    client.delete_topic(name)
    # Checked through the helper: asking with a client whose metadata requests auto-create topics
    # would bring it back on a cluster with auto.create.topics.enable.
    wait_until(lambda: _gone(helper, name), 30, what=f"{name} to be gone")


@s.scenario("topic.create-with-configs", "topic admin", needs=(base.ADMIN, base.DESCRIBE_CONFIGS),
            apis=(19, 32), consumes=False)
def test_create_with_configs(client: Client, helper: Client, cluster: ClusterInfo) -> None:
    name = unique_topic("create-with-configs")
    configs = {"cleanup.policy": "compact", "retention.ms": "86400000", "max.message.bytes": "200000",
               "min.cleanable.dirty.ratio": "0.25"}
    client.create_topic(name, partitions=2, configs=configs)
    try:
        wait_until(lambda: _partitions(client, name) == 2, 20, what=f"{name} to exist")
        # The client may ask any broker for the configs: in a cluster, one that has not learnt the topic
        # yet answers UNKNOWN_TOPIC_OR_PARTITION.
        wait_known_everywhere(cluster, name, 2)
        got = client.topic_configs(name)
        for k, v in configs.items():
            assert got.get(k) == v, f"{k}: described {got.get(k)!r}, created with {v!r}"
        # Configs that were not set are described too, with their defaults.
        assert got.get("segment.bytes"), "segment.bytes is not described"
    finally:
        helper.delete_topic(name)


@s.scenario("topic.create-partitions", "topic admin", needs=ADMIN, apis=(19, 37, 0), consumes=False)
def test_create_partitions(client: Client, helper: Client) -> None:
    name = unique_topic("create-partitions")
    client.create_topic(name, partitions=1)
    try:
        wait_until(lambda: _partitions(client, name) == 1, 20, what=f"{name} to exist")
        client.create_partitions(name, 4)
        wait_until(lambda: _partitions(client, name) == 4, 20, what=f"{name} to have 4 partitions")
        # The new partitions take writes.  In a cluster each broker learns of them on its own (Kafka's
        # UpdateMetadata, our ZooKeeper watches), so a fresh producer may first ask a broker that still
        # has 1 partition; librdkafka then fails the message locally with UNKNOWN_PARTITION, nothing sent.
        d = retry_on(("UNKNOWN_PARTITION", "UNKNOWN_TOPIC_OR_PARTITION"),
                     lambda: helper.produce(name, text_msgs(2, partition=3)), timeout=20)
        assert [x.partition for x in d] == [3, 3]
        # Kafka cannot shrink a topic.
        expect_error("INVALID_PARTITIONS", client.create_partitions, name, 2)
        expect_error("INVALID_PARTITIONS", client.create_partitions, name, 4)
    finally:
        helper.delete_topic(name)


@s.scenario("topic.create-duplicate", "topic admin", needs=ADMIN, apis=(19,), consumes=False)
def test_create_duplicate(client: Client, helper: Client) -> None:
    name = unique_topic("create-duplicate")
    client.create_topic(name, partitions=1)
    try:
        expect_error("TOPIC_ALREADY_EXISTS", client.create_topic, name, 2)
    finally:
        helper.delete_topic(name)


@s.scenario("topic.invalid-names", "topic admin", needs=ADMIN, apis=(19,), consumes=False)
def test_invalid_names(client: Client) -> None:
    for bad in ["bad name!", "slash/inside", "..", "x" * 250]:
        expect_error("INVALID_TOPIC_EXCEPTION", client.create_topic, bad, 1)
    # 249 characters is the longest legal name; such a topic can be created and deleted like any other.
    ok = unique_topic("n")
    ok = ok + "x" * (249 - len(ok))
    try:
        client.create_topic(ok, 1)
    except ClientError as e:
        raise AssertionError(f"creating a topic with a 249-character name (legal in Kafka) failed: {e}") from e
    try:
        client.delete_topic(ok)
    except ClientError as e:
        raise AssertionError(f"deleting a topic with a 249-character name (legal in Kafka) failed: {e}") from e


@s.scenario("topic.invalid-settings", "topic admin", needs=ADMIN, apis=(19, 3), consumes=False)
def test_invalid_settings(client: Client, helper: Client) -> None:
    brokers = len(helper.metadata()["brokers"])
    expect_error("INVALID_REPLICATION_FACTOR", client.create_topic, unique_topic("rf"), 1, brokers + 1)
    expect_error("INVALID_CONFIG", client.create_topic, unique_topic("cfg"), 1, 1, {"cleanup.policy": "bogus"})
    expect_error("INVALID_CONFIG", client.create_topic, unique_topic("cfg"), 1, 1, {"no.such.config": "1"})


@s.scenario("metadata.topics-brokers", "topic admin", apis=(3,), consumes=False)
def test_metadata(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    name = new_topic(partitions=3)
    md: dict = {}

    def seen() -> bool:
        md.update(client.metadata())
        return md["topics"].get(name) == 3

    wait_until(seen, 20, what=f"{name} with 3 partitions in metadata")
    assert md["brokers"], "metadata lists no brokers"


@s.scenario("records.delete", "topic admin", needs=(base.DELETE_RECORDS, base.LIST_OFFSETS), apis=(21, 2, 0, 1))
def test_delete_records(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    name = new_topic(partitions=1)
    client.produce(name, text_msgs(10, partition=0))
    assert client.delete_records(name, 0, 4) == 4
    assert client.list_offset(name, 0, "earliest") == 4
    assert client.list_offset(name, 0, "latest") == 10
    recs = client.consume(name, [0], start="earliest", count=6)
    assert [r.offset for r in recs] == list(range(4, 10))
