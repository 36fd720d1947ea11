"""The admin CLI against a 3-broker ZooKeeper cluster: what it shows of brokers, replicas and ISR, and that
changes made through one broker are seen through the others."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.integration.conftest import unique_topic
from tests.integration.test_admin_cli import cli, unique
from tests.integration.test_admin_records import cli as records_cli
from tests.integration.test_admin_records import cli_json as records_json
from tests.integration.test_admin_records import new_topic, produce_json
from tests.integration.test_admin_wire import cli as wire_cli
from tests.integration.test_admin_wire import doc as wire_doc
from tests.support.cluster import Cluster, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three brokers for this module; no automatic preferred-leader elections, which would race the
    elections the tests ask for."""
    with Cluster(tmp_path_factory.mktemp("admin-cluster"), 3,
                 overrides={"auto.leader.rebalance.enable": "false"}) as c:
        yield c


def test_cluster_info_shows_every_broker_and_the_controller(cluster: Cluster) -> None:
    doc = cli("cluster", "info", "-o", "json", bootstrap=cluster.bootstrap).doc
    ids = sorted(cluster.running())
    assert [b["id"] for b in doc["brokers"]] == ids == [1, 2, 3]
    assert doc["controller"] == cluster.controller_id()
    assert [b["controller"] for b in doc["brokers"]] == [b == doc["controller"] for b in ids]


def test_topics_with_three_replicas_and_configs_through_another_broker(cluster: Cluster) -> None:
    t = unique("admin-rf3")
    first, other = cluster.broker(1).bootstrap, cluster.broker(3).bootstrap
    cli("topic", "create", t, "-p", "3", "-r", "3", "-c", "min.insync.replicas=2", bootstrap=first)
    cluster.wait_leaders(t, 3)

    def described() -> dict | None:
        (doc,) = cli("topic", "describe", t, "-o", "json", bootstrap=other).doc
        in_sync = all(sorted(p["isr"]) == [1, 2, 3] for p in doc["partitions"])
        return doc if len(doc["partitions"]) == 3 and in_sync else None

    doc = wait_for(described, timeout=30, what="three partitions with all three replicas in sync")
    assert doc["configs"] == {"min.insync.replicas": "2"}
    assert all(sorted(p["replicas"]) == [1, 2, 3] and p["leader"] in (1, 2, 3) for p in doc["partitions"])
    assert sorted(p["leader"] for p in doc["partitions"]) == [1, 2, 3]  # leaders spread, one per broker

    cli("config", "set", "topic", t, "retention.ms=60000", bootstrap=other)
    got = cli("config", "get", "topic", t, "retention.ms", "-o", "json", bootstrap=first).doc
    assert got["configs"][0]["value"] == "60000"
    too_many = cli("topic", "create", unique("admin-rf4"), "-r", "4", "-o", "json", bootstrap=first, expect=1)
    assert too_many.doc[0]["error"] == "INVALID_REPLICATION_FACTOR"
    cli("topic", "delete", t, bootstrap=other)
    wait_for(lambda: cli("topic", "list", t, "-o", "json", bootstrap=first).doc == [], timeout=30,
             what="the deleted topic gone from every broker's answer")


def test_a_broker_config_set_on_one_broker(cluster: Cluster) -> None:
    broker_id = 2
    b = cluster.bootstrap
    cli("config", "set", "broker", str(broker_id), "log.cleaner.threads=3", bootstrap=b)
    got = cli("config", "get", "broker", str(broker_id), "log.cleaner.threads", "-o", "json",
              bootstrap=cluster.broker(broker_id).bootstrap).doc
    assert got["configs"][0]["value"] == "3" and got["configs"][0]["source"] == "DYNAMIC_BROKER_CONFIG"
    cli("config", "delete", "broker", str(broker_id), "log.cleaner.threads", bootstrap=b)


def test_group_describe_on_three_brokers(cluster: Cluster, tmp_path: Path) -> None:
    b = cluster.bootstrap
    topic = new_topic(b, partitions=3, rf=3)
    group = unique("g")
    produce_json(b, topic, [{"value": f"v{i}", "partition": i % 3} for i in range(6)])
    assert sorted(records_cli(b, "consume", topic, "-g", group, "--to", "end").stdout.splitlines()) == \
        [b"v0", b"v1", b"v2", b"v3", b"v4", b"v5"]
    doc = records_json(b, "group", "describe", group)[0]
    assert doc["coordinator"] in (1, 2, 3) and doc["state"] == "Empty" and doc["total_lag"] == 0
    assert [(p["partition"], p["committed_offset"], p["log_end_offset"]) for p in doc["partitions"]] == \
        [(0, 2, 2), (1, 2, 2), (2, 2, 2)]


def test_partition_move_wait_status_and_elect(cluster: Cluster, tmp_path: Path) -> None:
    b = cluster.bootstrap
    topic = unique_topic("mv")
    wire_cli("topic", "create", topic, "--replica-assignment", "1:2", "-b", b)  # librdkafka's partition count
    producer = Producer({"bootstrap.servers": b, "broker.address.family": "v4"})
    for i in range(50):
        producer.produce(topic, b"m%d" % i)
    assert producer.flush(20) == 0
    assert wire_doc("partition", "move", topic, "0", "--replicas", "3,2", "--wait", "-b", b) == {
        "topic": topic, "partition": 0, "replicas": [3, 2], "state": "done"}
    assert wire_doc("partition", "status", topic, "-b", b) == []
    [p] = wire_doc("topic", "describe", topic, "-b", b)[0]["partitions"]
    assert p["replicas"] == [3, 2] and p["end_offset"] == 50

    # The preferred replica (3) leads after a preferred election, whoever led before.
    elected = wire_doc("partition", "elect", topic, "-b", b)
    assert [(e["topic"], e["partition"], e["error"]) for e in elected] == [(topic, 0, None)]
    assert elected[0]["result"] in ("elected", "already-elected")
    assert wire_doc("topic", "describe", topic, "-b", b)[0]["partitions"][0]["leader"] == 3
    assert wire_doc("partition", "elect", topic, "0", "-b", b) == [
        {"topic": topic, "partition": 0, "result": "already-elected", "error": None}]
    refused = wire_cli("partition", "move", topic, "0", "--replicas", "3,9", "-b", b, expect=1)
    assert "INVALID_REPLICA_ASSIGNMENT" in refused.stderr or "BROKER_NOT_AVAILABLE" in refused.stderr
    assert len(wire_doc("cluster", "info", "-b", b)["brokers"]) == 3


def test_the_other_commands_through_any_broker(cluster: Cluster) -> None:
    """Users, ACLs, quotas, records, transactions and share groups on three brokers: each asked through one
    broker and checked through another, since the answer must be the cluster's, not one broker's."""
    one, other = cluster.broker(2).bootstrap, cluster.broker(3).bootstrap
    name = unique("ops")
    cli("user", "create", name, "--password-stdin", stdin="ops-secret\n", bootstrap=one)
    assert wait_for(lambda: cli("user", "list", name, "-o", "json", bootstrap=other, expect=None).code == 0 or None,
                    timeout=30, what="the user seen through another broker")
    cli("user", "delete", name, bootstrap=other)

    cli("quota", "set", "--client-id", name, "producer_byte_rate=2048", bootstrap=one)
    assert wait_for(lambda: cli("quota", "list", "--client-id", name, "--strict", "-o", "json", bootstrap=other).doc
                    or None, timeout=30, what="the quota seen through another broker") == \
        [{"entity": {"client-id": name}, "quotas": {"producer_byte_rate": 2048.0}}]
    cli("quota", "set", "--client-id", name, "--delete", "producer_byte_rate", bootstrap=other)

    t = unique("ops-records")
    cli("topic", "create", t, "-p", "2", "-r", "3", bootstrap=one)
    cluster.wait_leaders(t, 2)
    produced = cli("produce", t, "-k", ":", "-o", "json", stdin="a:1\nb:2\nc:3\n", bootstrap=one).doc
    assert produced["delivered"] == 3 and produced["failed"] == 0
    consumed = cli("consume", t, "--to", "end", "-k", ":", bootstrap=other).stdout.splitlines()
    assert sorted(consumed) == ["a:1", "b:2", "c:3"]
    assert cli("txn", "list", "-o", "json", bootstrap=other).doc is not None
    assert isinstance(cli("share-group", "list", "-o", "json", bootstrap=one).doc, list)
    assert cli("partition", "status", "-o", "json", bootstrap=other).doc == []
