"""TxnOffsetCommit in a cluster: the group coordinator that receives it checks the producer with the
transactional id's coordinator (KIP-890 verification of the group's ``__consumer_offsets`` partition), and
answers the same whether that coordinator is itself or another broker.

The ids are chosen so that the two coordinators are on different brokers, or on one, from the leaders of
the internal topics' partitions (confirmed by FindCoordinator); raw requests send each case to the group
coordinator. A confluent-kafka consume-transform-produce pipeline runs with its two coordinators apart.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.internal_topic import partition_for
from tests.support.cluster import Cluster, raw_request, wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("cluster-txn-offsets")]

INTERNAL_PARTITIONS = 6  # offsets.topic.num.partitions / transaction.state.log.num.partitions (CLUSTER_DEFAULTS)
GROUP, TXN = 0, 1  # FindCoordinator key types


def _request(bootstrap: str, api_key: int, version: int, body: dict[str, Any]) -> Any:
    return raw_request(bootstrap, api_key, version, body, timeout=30.0, client_id="txn-offsets-test")


def _create_topics(cluster: Cluster, names: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for f in admin.create_topics([NewTopic(n, partitions, 3) for n in names], operation_timeout=30).values():
        f.result(60)
    for n in names:
        cluster.wait_leaders(n, partitions)


def _coordinator(bootstrap: str, key: str, key_type: int) -> int | None:
    c = _request(bootstrap, 10, 4, {"key_type": key_type, "coordinator_keys": [key]}).coordinators[0]
    return int(c.node_id) if int(c.error_code) == 0 else None


def _ids(cluster: Cluster, same: bool, count: int) -> tuple[str, int, list[str]]:
    """A fresh group, the broker coordinating it, and ``count`` transactional ids coordinated by that
    broker (``same``) or by another one."""
    tag = uuid.uuid4().hex[:6]
    bs = cluster.broker(1).bootstrap
    group = f"g-{tag}"
    node = wait_for(lambda: _coordinator(bs, group, GROUP), timeout=60, what="the group's coordinator")
    wait_for(lambda: _coordinator(bs, f"t-{tag}", TXN), timeout=60, what="__transaction_state to exist")
    leaders = cluster.wait_leaders("__transaction_state", INTERNAL_PARTITIONS)
    ids = [t for t in (f"t-{tag}-{i}" for i in range(500))
           if (leaders[partition_for(t, INTERNAL_PARTITIONS)] == node) == same][:count]
    assert len(ids) == count, f"transactional ids coordinated {'by' if same else 'away from'} broker {node}"
    for t in ids:
        got = wait_for(lambda t=t: _coordinator(bs, t, TXN), timeout=30, what=f"the coordinator of {t}")
        assert (got == node) == same, f"{t}: coordinator {got}, group coordinator {node}"
    return group, node, ids


def _init(bootstrap: str, txn_id: str) -> tuple[int, int]:
    body = {"transactional_id": txn_id, "transaction_timeout": 60000, "producer_id": -1, "producer_epoch": -1}
    r = _request(bootstrap, 22, 4, body)
    assert int(r.error_code) == 0, ErrorCode(int(r.error_code))
    return int(r.producer_id), int(r.producer_epoch)


def _txn_offset_commit(bootstrap: str, version: int, txn_id: str, group: str, pid: int, epoch: int, topic: str,
                       offset: int) -> ErrorCode:
    body = {"transactional_id": txn_id, "group_id": group, "producer_id": pid, "producer_epoch": epoch,
            "generation_id": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                                       "committed_leader_epoch": -1, "committed_metadata": ""}]}]}
    return ErrorCode(int(_request(bootstrap, 28, version, body).topics[0].partitions[0].error_code))


def _fetch_stable(bootstrap: str, group: str, topic: str) -> tuple[ErrorCode, int]:
    """OffsetFetch with require_stable: (error, committed offset) of partition 0."""
    body = {"groups": [{"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}]}],
            "require_stable": True}
    g = _request(bootstrap, 9, 8, body).groups[0]
    part = g.topics[0].partitions[0]
    return ErrorCode(int(g.error_code) or int(part.error_code)), int(part.committed_offset)


def _txn_coordinator_call(bootstrap: str, api_key: int, version: int, body: dict[str, Any]) -> ErrorCode:
    """AddOffsetsToTxn / EndTxn, retried while the coordinator answers CONCURRENT_TRANSACTIONS (bounded)."""
    code = ErrorCode.unknown_server_error
    for _ in range(50):
        code = ErrorCode(int(_request(bootstrap, api_key, version, body).error_code))
        if code != ErrorCode.concurrent_transactions:
            break
        time.sleep(0.1)
    return code


# What Kafka's group coordinator answers (TxnOffsetCommit v3, v4), wherever the transaction coordinator is.
REFUSED = {
    "transactional id never initialized": (ErrorCode.invalid_producer_id_mapping,) * 2,
    "unknown producer id": (ErrorCode.invalid_producer_id_mapping,) * 2,
    "wrong producer epoch": (ErrorCode.invalid_producer_epoch,) * 2,
    "offsets partition not added": (ErrorCode.invalid_txn_state, ErrorCode.transaction_abortable),
}


@pytest.fixture(scope="module")
def topic(cluster: Cluster) -> str:
    name = f"src-{uuid.uuid4().hex[:8]}"
    _create_topics(cluster, [name], 1)
    return name


@pytest.mark.parametrize("arrangement", ["coordinators on two brokers", "coordinators on one broker"])
def test_txn_offset_commit_answers_the_same_wherever_the_transaction_coordinator_is(
        cluster: Cluster, topic: str, arrangement: str) -> None:
    group, node, (txn_id, never_initialized) = _ids(cluster, arrangement.endswith("one broker"), 2)
    gc = cluster.broker(node).bootstrap
    tc = cluster.broker(wait_for(lambda: _coordinator(gc, txn_id, TXN), what="the transaction coordinator")).bootstrap
    pid, epoch = _init(tc, txn_id)
    got: dict[str, tuple[ErrorCode, ...]] = {}

    def both(case: str, tid: str, p: int, e: int, offset: int) -> None:
        got[case] = tuple(_txn_offset_commit(gc, v, tid, group, p, e, topic, offset) for v in (3, 4))

    both("transactional id never initialized", never_initialized, pid, epoch, 11)
    both("unknown producer id", txn_id, pid + 100_000, epoch, 12)
    both("wrong producer epoch", txn_id, pid, epoch + 1, 13)
    both("offsets partition not added", txn_id, pid, epoch, 14)
    assert got == REFUSED
    assert _fetch_stable(gc, group, topic) == (ErrorCode.none, -1), "refused commits leave nothing pending"
    got.clear()
    assert _txn_coordinator_call(tc, 25, 3, {"transactional_id": txn_id, "producer_id": pid,
                                             "producer_epoch": epoch, "group_id": group}) == ErrorCode.none
    both("after AddOffsetsToTxn", txn_id, pid, epoch, 5)
    assert _txn_coordinator_call(tc, 26, 3, {"transactional_id": txn_id, "producer_id": pid,
                                             "producer_epoch": epoch, "committed": True}) == ErrorCode.none
    wait_for(lambda: _fetch_stable(gc, group, topic) == (ErrorCode.none, 5), timeout=30,
             what="the committed transaction's offset")
    both("after the transaction committed", txn_id, pid, epoch, 20)
    assert got == {"after AddOffsetsToTxn": (ErrorCode.none,) * 2,
                   "after the transaction committed": (ErrorCode.invalid_txn_state, ErrorCode.transaction_abortable)}
    assert _fetch_stable(gc, group, topic) == (ErrorCode.none, 5)


def test_consume_transform_produce_with_the_coordinators_on_two_brokers(cluster: Cluster) -> None:
    """confluent-kafka's send_offsets_to_transaction to a group coordinator that must ask another broker."""
    tag = uuid.uuid4().hex[:6]
    src, dst, partitions, n = f"in-{tag}", f"out-{tag}", 3, 60
    _create_topics(cluster, [src, dst], partitions)
    group, node, (txn_id,) = _ids(cluster, False, 1)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(n):
        producer.produce(src, f"v{i}".encode(), partition=i % partitions)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    txn = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    done = 0
    try:
        txn.init_transactions(30)
        consumer.subscribe([src])
        deadline = time.monotonic() + 120
        for _ in range(1000):
            if done >= n or time.monotonic() > deadline:
                break
            msgs = [m for m in consumer.consume(20, 1.0) if m.error() is None]
            if not msgs:
                continue
            txn.begin_transaction()
            for m in msgs:
                txn.produce(dst, (m.value() or b"") + b"!", partition=m.partition())
            txn.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                            consumer.consumer_group_metadata(), 30)
            txn.commit_transaction(30)
            done += len(msgs)
        assert done == n, f"{done} of {n} records processed"
        committed = consumer.committed([TopicPartition(src, p) for p in range(partitions)], timeout=30)
        assert sorted((tp.partition, tp.offset) for tp in committed) == [(p, n // partitions)
                                                                        for p in range(partitions)]
    finally:
        consumer.close()
    reader = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"r-{tag}", "auto.offset.reset": "earliest",
                       "enable.auto.commit": False, "isolation.level": "read_committed"})
    out: list[bytes] = []
    try:
        reader.assign([TopicPartition(dst, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + 60
        for _ in range(1000):
            if len(out) >= n or time.monotonic() > deadline:
                break
            out += [m.value() or b"" for m in reader.consume(50, 0.5) if m.error() is None]
    finally:
        reader.close()
    assert sorted(out) == sorted(f"v{i}!".encode() for i in range(n)), "every record transformed exactly once"
    bs = cluster.broker(1).bootstrap
    assert _coordinator(bs, group, GROUP) == node != _coordinator(bs, txn_id, TXN), "still two coordinators"
