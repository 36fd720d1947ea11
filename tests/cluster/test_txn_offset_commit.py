"""TxnOffsetCommit in a cluster, where the group's coordinator is usually not the transaction's coordinator.

Kafka's group coordinator asks the transaction's coordinator (AddPartitionsToTxn v4 ``verify_only``, KIP-890)
whether the group's offsets partition is in the producer's ongoing transaction before it writes transactional
offsets; pykbroker does the same, so every broker gives the same answer: the coordinators on two brokers or on
one.  Raw requests for the error codes, and confluent-kafka's send_offsets_to_transaction for the real thing.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from tests.support.cluster import Cluster, raw_request, wait_for

pytestmark = pytest.mark.timeout(300)

FIND_COORDINATOR, INIT_PRODUCER_ID, ADD_OFFSETS_TO_TXN, TXN_OFFSET_COMMIT = 10, 22, 25, 28
GROUP, TXN = 0, 1


def _coordinator(cluster: Cluster, key: str, key_type: int) -> int | None:
    resp = raw_request(cluster.broker(1).bootstrap, FIND_COORDINATOR, 4, {"key_type": key_type,
                                                                          "coordinator_keys": [key]})
    c = resp.coordinators[0]
    return int(c.node_id) if int(c.error_code) == 0 else None


def _ids(cluster: Cluster, apart: bool) -> tuple[str, str, int, int]:
    """A group id and a transactional id whose coordinators are on two brokers (``apart``) or on one."""
    for _ in range(200):  # bounded: each id lands on one of 3 brokers
        group, txn = f"g-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
        gc = wait_for(lambda g=group: _coordinator(cluster, g, GROUP), timeout=30, what="a group coordinator")
        tc = wait_for(lambda t=txn: _coordinator(cluster, t, TXN), timeout=30, what="a transaction coordinator")
        if (gc != tc) == apart:
            return group, txn, gc, tc
    raise AssertionError("no such ids in 200 tries")


def _commit(cluster: Cluster, node: int, version: int, txn: str, group: str, pid: int, epoch: int,
            topic: str) -> list[int]:
    resp = raw_request(cluster.broker(node).bootstrap, TXN_OFFSET_COMMIT, version, {
        "transactional_id": txn, "group_id": group, "producer_id": pid, "producer_epoch": epoch,
        "generation_id": -1, "member_id": "", "group_instance_id": None,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                    "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
    return [int(p.error_code) for t in resp.topics for p in t.partitions]


def _init_producer(cluster: Cluster, node: int, txn: str) -> tuple[int, int]:
    def init() -> Any:
        r = raw_request(cluster.broker(node).bootstrap, INIT_PRODUCER_ID, 4, {
            "transactional_id": txn, "transaction_timeout": 60000, "producer_id": -1, "producer_epoch": -1})
        return r if int(r.error_code) == 0 else None
    r = wait_for(init, timeout=30, what="InitProducerId")
    return int(r.producer_id), int(r.producer_epoch)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    overrides = {"offsets.topic.replication.factor": "3", "transaction.state.log.replication.factor": "3",
                 "transaction.state.log.min.isr": "2"}
    with Cluster(tmp_path_factory.mktemp("txnoffsets"), 3, overrides=overrides) as c:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("in", 1, 3), NewTopic("out", 1, 3)])["in"].result(30)
        c.wait_leaders("in", 1)
        c.wait_leaders("out", 1)
        yield c


@pytest.mark.parametrize("apart", [True, False], ids=["coordinators-apart", "coordinators-together"])
def test_txn_offset_commit_is_checked_with_the_transaction_coordinator(cluster: Cluster, apart: bool) -> None:
    group, txn, gc, tc = _ids(cluster, apart)
    # A producer id the transactional id never had: refused, wherever the coordinators are.
    assert _commit(cluster, gc, 3, txn, group, 4242, 0, "in") == [ErrorCode.invalid_producer_id_mapping]
    pid, epoch = _init_producer(cluster, tc, txn)
    # The right producer, but the offsets partition was not added to its transaction (no AddOffsetsToTxn).
    assert _commit(cluster, gc, 3, txn, group, pid, epoch, "in") == [ErrorCode.invalid_txn_state]
    assert _commit(cluster, gc, 4, txn, group, pid, epoch, "in") == [ErrorCode.transaction_abortable]
    r = raw_request(cluster.broker(tc).bootstrap, ADD_OFFSETS_TO_TXN, 3, {
        "transactional_id": txn, "producer_id": pid, "producer_epoch": epoch, "group_id": group})
    assert int(r.error_code) == 0
    # A stale or future epoch of that producer: fenced, as Kafka answers a failed verification.
    assert _commit(cluster, gc, 3, txn, group, pid, epoch + 1, "in") == [ErrorCode.invalid_producer_epoch]
    assert _commit(cluster, gc, 3, txn, group, pid, epoch, "in") == [ErrorCode.none]


def test_send_offsets_to_transaction_with_the_coordinators_apart(cluster: Cluster) -> None:
    group, txn, _gc, _tc = _ids(cluster, apart=True)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("out", b"transformed", partition=0)
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        p.send_offsets_to_transaction([TopicPartition("in", 0, 7)], c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        got = wait_for(lambda: (r := c.committed([TopicPartition("in", 0)], timeout=10))[0].offset == 7 and r,
                       timeout=30, what="the transaction's offsets committed")
        assert got[0].offset == 7
    finally:
        c.close()
