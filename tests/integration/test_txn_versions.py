"""The newest transaction and ListOffsets versions as real clients send them, through the compat suite's
recording proxy.

Measured with the recording proxy (compat/proxy.py):

- the Java client 3.9 (the compat driver) sends ApiVersions v4, InitProducerId v5, AddOffsetsToTxn v4,
  EndTxn v4, TxnOffsetCommit v4, Produce v11 (so KIP-890 verification errors reach it as
  TRANSACTION_ABORTABLE), AddPartitionsToTxn v3 (v4+ is the brokers' form) and ListOffsets v9;
- kafka-python 3.0 sends ApiVersions v4, ListOffsets v10 (and asks for EARLIEST_LOCAL / LATEST_TIERED),
  InitProducerId v4, AddPartitionsToTxn v3, AddOffsetsToTxn v3, Produce v9;
- confluent-kafka 2.16 (librdkafka 2.16) sends none of the new versions (ApiVersions v3, ListOffsets v7,
  InitProducerId v4, AddPartitionsToTxn v0, AddOffsetsToTxn v0), so it is the control: its transactions
  must still pass the leader's transaction verification.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.admin import KafkaAdminClient, OffsetSpec
from kafka.structs import TopicPartition as KTopicPartition

from compat.clients.base import Client, Msg
from compat.clients.confluent import ConfluentClient
from compat.clients.java import JavaClient
from compat.clients.kafka_python import KafkaPythonClient
from tests.integration.conftest import (
    CLIENT_TIMEOUT,
    BrokerFactory,
    create_topic,
    make_producer,
    unique_topic,
    wait_until,
)
from tests.support.recording_proxy import Proxied, proxied_broker

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def proxied(module_broker_factory: BrokerFactory) -> Iterator[Proxied]:
    small = {"transaction.state.log.num.partitions": "3", "offsets.topic.num.partitions": "3"}
    with proxied_broker(module_broker_factory.base, "txn-versions", small, module_broker_factory.brokers.append,
                        wait_until) as p:
        yield p


CLIENTS: dict[str, tuple[type[Client], str, set[tuple[int, int]]]] = {
    # name: (client, client.id prefix, versions it must have sent)
    "java": (JavaClient, "compat-java-producer", {(18, 4), (22, 5), (25, 4), (0, 11), (26, 4), (28, 4)}),
    "kafka-python": (KafkaPythonClient, "compat-kafka-python", {(18, 4), (24, 3), (25, 3)}),
    "confluent-kafka": (ConfluentClient, "compat-confluent", {(22, 4), (24, 0), (25, 0)}),
}


@pytest.mark.parametrize("name", list(CLIENTS))
def test_transactions_with_offsets_through_each_client(proxied: Proxied, name: str) -> None:
    """A committed and an aborted transaction, each with records and a group offset: read_committed
    readers and the group see only the committed one, and the client used the versions it should."""
    cls, prefix, expected = CLIENTS[name]
    topic, group = unique_topic(f"txv-{name}"), f"g-{uuid.uuid4().hex[:8]}"
    create_topic(proxied.broker, topic)
    client = cls(proxied.bootstrap)
    try:
        for i, commit in enumerate((True, False)):
            client.transactional_offsets(topic, [Msg(f"{name}-{i}-{j}".encode(), partition=0) for j in range(3)],
                                         f"tid-{name}-{uuid.uuid4().hex[:6]}", group, topic, {0: 10 + i}, commit)
        got = [r.value for r in client.consume(topic, [0], count=4, isolation="read_committed", idle=3.0)]
        assert got == [f"{name}-0-{j}".encode() for j in range(3)], "only the committed transaction is visible"
        assert client.committed_offsets(group, topic, [0]) == {0: 10}, "only the committed offset counts"
    finally:
        client.close()
    sent = proxied.versions(prefix, prefix=True)
    assert expected <= sent, f"{name} sent {sorted(sent)}"


def test_list_offsets_v9_v10_through_kafka_python_and_java(proxied: Proxied) -> None:
    """EARLIEST_LOCAL (-4) is the log start offset on a broker without tiered storage, and LATEST_TIERED
    (-5) finds nothing, with no error (Kafka's answer when nothing is in remote storage)."""
    topic = unique_topic("txv-lo")
    create_topic(proxied.broker, topic)
    p = make_producer(proxied.broker)
    for i in range(3):
        p.produce(topic, value=b"x%d" % i, partition=0)
    assert p.flush(CLIENT_TIMEOUT) == 0
    tp = KTopicPartition(topic, 0)
    admin = KafkaAdminClient(bootstrap_servers=proxied.bootstrap, client_id="txv-kafka-python-admin",
                             request_timeout_ms=int(CLIENT_TIMEOUT * 1000))
    try:
        admin.delete_records({tp: 1})
        got = {spec: admin.list_partition_offsets({tp: spec})[tp].offset
               for spec in (OffsetSpec.EARLIEST, OffsetSpec.EARLIEST_LOCAL, OffsetSpec.LATEST_TIERED,
                            OffsetSpec.LATEST)}
    finally:
        admin.close()
    assert got == {OffsetSpec.EARLIEST: 1, OffsetSpec.EARLIEST_LOCAL: 1, OffsetSpec.LATEST_TIERED: -1,
                   OffsetSpec.LATEST: 3}
    assert (2, 10) in proxied.versions("txv-kafka-python-admin", prefix=True)
    java = JavaClient(proxied.bootstrap)
    try:
        assert (java.list_offset(topic, 0, "earliest"), java.list_offset(topic, 0, "latest")) == (1, 3)
    finally:
        java.close()
    assert (2, 9) in proxied.versions("compat-java-admin", prefix=True)
