"""Three pykbroker processes and a ZooKeeper are one Kafka cluster to every client.

Each client (confluent-kafka, kafka-python, aiokafka, kafkajs and the Java client, through the compat
suite's drivers) bootstraps from one broker only, creates a topic with 6 partitions led by different
brokers, produces to and consumes from every partition, runs a consumer group and a transaction that
spans partitions on several brokers.
"""

from __future__ import annotations

import uuid

import pytest

from compat.clients import make_client
from compat.clients.base import Client, Msg
from tests.support.cluster import Cluster, metadata, wait_for

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("cluster-clients")]

CLIENTS = ["confluent-kafka", "kafka-python", "aiokafka", "kafkajs", "java"]
PARTITIONS = 6


def _topic(cluster: Cluster, tag: str, *, rf: int = 3) -> str:
    """A topic created through confluent-kafka's admin client, with leaders agreed by every broker."""
    name = f"{tag}-{uuid.uuid4().hex[:8]}"
    admin = make_client("confluent-kafka", cluster.broker(1).bootstrap)
    try:
        admin.create_topic(name, PARTITIONS, rf)
    finally:
        admin.close()
    cluster.wait_leaders(name, PARTITIONS)
    return name


def test_every_broker_shows_the_same_cluster(cluster: Cluster) -> None:
    topic = _topic(cluster, "view")
    views = [metadata(cluster.broker(i).bootstrap, [topic]) for i in cluster.brokers]
    for md in views:
        assert sorted((b.node_id, b.port) for b in md.brokers) == sorted(
            (i, b.port) for i, b in cluster.brokers.items()), "every live broker with its advertised port"
        assert md.controller_id == views[0].controller_id and md.controller_id in cluster.brokers
        assert md.cluster_id == views[0].cluster_id and md.cluster_id
    parts = [sorted((p.partition_index, p.leader_id, p.leader_epoch, tuple(p.replica_nodes), tuple(sorted(p.isr_nodes)))
                    for t in md.topics for p in t.partitions) for md in views]
    assert parts[0] == parts[1] == parts[2]
    leaders = {leader for _, leader, _, _, _ in parts[0]}
    assert leaders == {1, 2, 3}, f"6 partitions over 3 brokers are led by all of them: {parts[0]}"
    for _, leader, _, replicas, isr in parts[0]:
        assert len(replicas) == 3 and len(set(replicas)) == 3 and replicas[0] == leader
        assert set(isr) == set(replicas)


def _client(cluster: Cluster, name: str, via: int) -> Client:
    return make_client(name, cluster.broker(via).bootstrap)


@pytest.mark.parametrize("name", CLIENTS)
def test_produce_and_consume_on_every_partition(cluster: Cluster, name: str) -> None:
    topic = _topic(cluster, f"pc-{name}")
    via = 1 + CLIENTS.index(name) % 3  # bootstrap from different brokers
    client = _client(cluster, name, via)
    try:
        msgs = [Msg(f"{name}-{p}-{i}".encode(), key=f"k{i}".encode(), partition=p)
                for p in range(PARTITIONS) for i in range(5)]
        deliveries = client.produce(topic, msgs, acks="all")
        assert len(deliveries) == len(msgs)
        for p in range(PARTITIONS):
            got = client.consume(topic, [p], count=5, timeout=30)
            assert [r.value for r in got] == [f"{name}-{p}-{i}".encode() for i in range(5)], f"partition {p}"
            assert [r.offset for r in got] == list(range(5))
    finally:
        client.close()


@pytest.mark.parametrize("name", CLIENTS)
def test_consumer_group_across_brokers(cluster: Cluster, name: str) -> None:
    topic = _topic(cluster, f"grp-{name}")
    group = f"g-{name}-{uuid.uuid4().hex[:8]}"
    client = _client(cluster, name, 2)
    helper = _client(cluster, "confluent-kafka", 3)
    try:
        helper.produce(topic, [Msg(f"v{p}-{i}".encode(), partition=p) for p in range(PARTITIONS) for i in range(4)])
        member = client.start_member(group, [topic], auto_commit=False)
        try:
            wait_for(lambda: len(member.records()) >= 4 * PARTITIONS or member.failed, timeout=60,
                     what="the member to read every partition")
            assert not member.failed, member.error
            assert sorted(r.value for r in member.records()) == sorted(
                f"v{p}-{i}".encode() for p in range(PARTITIONS) for i in range(4))
        finally:
            member.close()
        client.commit_offsets(group, topic, dict.fromkeys(range(PARTITIONS), 4))
        assert helper.committed_offsets(group, topic, list(range(PARTITIONS))) == dict.fromkeys(range(PARTITIONS), 4)
    finally:
        client.close()
        helper.close()


@pytest.mark.parametrize("name", ["confluent-kafka", "kafka-python", "aiokafka", "kafkajs", "java"])
def test_transaction_spanning_brokers(cluster: Cluster, name: str) -> None:
    topic = _topic(cluster, f"txn-{name}")
    client = _client(cluster, name, 3)
    try:
        committed = [Msg(f"c{p}".encode(), partition=p) for p in range(PARTITIONS)]
        aborted = [Msg(f"a{p}".encode(), partition=p) for p in range(PARTITIONS)]
        client.produce_transactions(topic, [(committed, True), (aborted, False)],
                                    f"tid-{name}-{uuid.uuid4().hex[:6]}")
        for p in range(PARTITIONS):
            got = client.consume(topic, [p], count=2, isolation="read_committed", idle=3.0, timeout=30)
            assert [r.value for r in got] == [f"c{p}".encode()], f"partition {p}: only the committed record"
    finally:
        client.close()
