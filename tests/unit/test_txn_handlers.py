"""The transaction APIs through the dispatcher of an in-process broker (no sockets)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.protocol.records import build_batch, iter_batches
from pykbroker.server.broker import Broker
from tests.unit.test_dispatcher import call


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0",
                             "transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2"}))
    b.startup()
    for p in range(2):
        anyio.run(b.txn._load, p)
        anyio.run(b.groups._load, p)
    try:
        yield b
    finally:
        b.log_manager.shutdown()


def produce(b: Broker, topic: str, partition: int, batch: bytes) -> int:
    resp = call(b, 0, 9, {"acks": -1, "timeout": 1000, "transactional_id": "tx", "topic_data": [
        {"name": topic, "partition_data": [{"index": partition, "records": batch}]}]})
    part = resp.responses[0].partition_responses[0]
    assert part.error_code == ErrorCode.none, part
    return int(part.base_offset)


def test_transaction_apis_end_to_end(broker: Broker) -> None:
    call(broker, 19, 7, {"topics": [{"name": "t", "num_partitions": 2, "replication_factor": 1,
                                     "assignments": [], "configs": []}], "timeout": 1000})
    found = call(broker, 10, 4, {"key_type": 1, "coordinator_keys": ["tx"]})
    assert found.coordinators[0].error_code == ErrorCode.none and found.coordinators[0].node_id == 0

    init = call(broker, 22, 4, {"transactional_id": "tx", "transaction_timeout": datetime.timedelta(seconds=30),
                                "producer_id": -1, "producer_epoch": -1})
    assert init.error_code == ErrorCode.none
    pid, epoch = int(init.producer_id), int(init.producer_epoch)
    bad = call(broker, 22, 4, {"transactional_id": "tx2", "transaction_timeout": datetime.timedelta(hours=1),
                               "producer_id": -1, "producer_epoch": -1})
    assert bad.error_code == ErrorCode.invalid_transaction_timeout

    added = call(broker, 24, 3, {"v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": pid,
                                 "v3_and_below_producer_epoch": epoch,
                                 "v3_and_below_topics": [{"name": "t", "partitions": [0, 1]},
                                                         {"name": "nope", "partitions": [0]}]})
    codes = {(t.name, r.partition_index): r.partition_error_code for t in added.results_by_topic_v3_and_below
             for r in t.results_by_partition}
    assert codes == {("t", 0): ErrorCode.operation_not_attempted, ("t", 1): ErrorCode.operation_not_attempted,
                     ("nope", 0): ErrorCode.unknown_topic_or_partition}
    added = call(broker, 24, 3, {"v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": pid,
                                 "v3_and_below_producer_epoch": epoch,
                                 "v3_and_below_topics": [{"name": "t", "partitions": [0, 1]}]})
    assert all(r.partition_error_code == ErrorCode.none for t in added.results_by_topic_v3_and_below
               for r in t.results_by_partition)

    batch = build_batch([(None, b"a", []), (None, b"b", [])], timestamp_ms=1_700_000_000_000, producer_id=pid,
                        producer_epoch=epoch, base_sequence=0, is_transactional=True)
    assert produce(broker, "t", 0, batch) == 0
    p0 = broker.replicas.partition("t", 0)
    assert p0 is not None and p0.last_stable_offset == 0 and p0.high_watermark == 2

    producers = call(broker, 61, 0, {"topics": [{"name": "t", "partition_indexes": [0, 1]}]})
    (part0, part1) = producers.topics[0].partitions
    assert [(a.producer_id, a.producer_epoch, a.last_sequence, a.current_txn_start_offset)
            for a in part0.active_producers] == [(pid, epoch, 1, 0)]
    assert part1.active_producers == ()

    described = call(broker, 65, 0, {"transactional_ids": ["tx", "unknown"]})
    tx, unknown = described.transaction_states
    assert tx.error_code == ErrorCode.none and tx.transaction_state == "Ongoing"
    assert tx.producer_id == pid and [(t.topic, list(t.partitions)) for t in tx.topics] == [("t", [0, 1])]
    assert unknown.error_code == ErrorCode.transactional_id_not_found

    listed = call(broker, 66, 1, {"state_filters": ["Ongoing", "Bogus"], "producer_id_filters": [],
                                  "duration_filter": -1})
    assert [s.transactional_id for s in listed.transaction_states] == ["tx"]
    assert list(listed.unknown_state_filters) == ["Bogus"]

    ended = call(broker, 26, 3, {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch,
                                 "committed": True})
    assert ended.error_code == ErrorCode.none
    # Markers in both partitions; the last stable offset caught up.
    for idx in (0, 1):
        p = broker.replicas.partition("t", idx)
        assert p is not None
        last = list(iter_batches(p.log.read(p.log.log_end_offset - 1, 1 << 20).records))[-1]
        assert last.is_control and last.producer_id == pid
        assert p.last_stable_offset == p.high_watermark
    assert call(broker, 65, 0, {"transactional_ids": ["tx"]}).transaction_states[0].transaction_state \
        == "CompleteCommit"
    fenced = call(broker, 26, 3, {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch - 1,
                                  "committed": True})
    assert fenced.error_code == ErrorCode.producer_fenced
    old = call(broker, 26, 1, {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch - 1,
                               "committed": True})
    assert old.error_code == ErrorCode.invalid_producer_epoch  # pre-2.7 clients


def test_write_txn_markers_aborts(broker: Broker) -> None:
    # A batch written as a coordinator elsewhere would have had it added: no KIP-890 check here.
    broker.config.set("transaction.partition.verification.enable", "false")
    call(broker, 19, 7, {"topics": [{"name": "w", "num_partitions": 1, "replication_factor": 1,
                                     "assignments": [], "configs": []}], "timeout": 1000})
    batch = build_batch([(None, b"x", [])], timestamp_ms=1_700_000_000_000, producer_id=77, producer_epoch=0,
                        base_sequence=0, is_transactional=True)
    produce(broker, "w", 0, batch)
    p = broker.replicas.partition("w", 0)
    assert p is not None and p.last_stable_offset == 0
    resp = call(broker, 27, 1, {"markers": [{"producer_id": 77, "producer_epoch": 0, "transaction_result": False,
                                             "topics": [{"name": "w", "partition_indexes": [0]}],
                                             "coordinator_epoch": 0}]})
    assert resp.markers[0].topics[0].partitions[0].error_code == ErrorCode.none
    assert p.last_stable_offset == p.high_watermark == 2
    assert p.log.collect_aborted_transactions(0, 2) == [(77, 0)]
