"""Delayed delivery in an in-process broker (no sockets, no sleeping): produce, deliver, restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.delay import service as delay_service
from pykbroker.delay.service import DelayService
from pykbroker.protocol.records import build_batch, decode_records, iter_batches
from pykbroker.server.broker import Broker
from tests.unit.test_dispatcher import call

# Records are stamped a minute ahead of the clock, so their due times are in the future for divert(),
# and the tests hand deliver_due() whatever "now" they need. Set anew for each test (the `_now` fixture):
# a value taken at import would be in the past for a test that runs minutes after collection.
NOW = time.time_ns() // 1_000_000 + 60_000


@pytest.fixture(autouse=True)
def _now() -> None:
    global NOW
    NOW = time.time_ns() // 1_000_000 + 60_000


class Crash(BaseException):
    """The process dies here: nothing after it runs (not an Exception, so no handler takes it)."""


def make_broker(path: Path) -> Broker:
    b = Broker(BrokerConfig({"log.dirs": str(path), "listeners": "PLAINTEXT://127.0.0.1:0",
                             "offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1",
                             "pykbroker.delay.enable": "true"}))
    b.startup()
    return b


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = make_broker(tmp_path)
    call(b, 19, 7, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1, "assignments": [],
                                "configs": []}], "timeout": 1000})
    try:
        yield b
    finally:
        b.log_manager.shutdown()


def delays(b: Broker) -> DelayService:
    assert b.delays is not None
    return b.delays


def produce(b: Broker, batch: bytes) -> Any:
    resp = call(b, 0, 9, {"acks": -1, "timeout": 1000, "transactional_id": None, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch}]}]})
    return resp.responses[0].partition_responses[0]


def target(b: Broker) -> list[tuple[bytes | None, int]]:
    """(key, timestamp) of every record in t-0, in offset order."""
    p = b.replicas.partition("t", 0)
    assert p is not None
    data = p.log.read(0, 1 << 24).records
    return [(r.key, r.timestamp) for h in iter_batches(data)
            for r in decode_records(memoryview(data)[h.position:h.position + h.size])]


def delayed(key: bytes, ms: int) -> tuple[bytes, bytes, list[tuple[str, bytes | None]]]:
    return key, b"v", [("pykbroker.delay.ms", str(ms).encode())]


def test_mixed_batch_is_split_and_delivered_in_due_order(broker: Broker) -> None:
    batch = build_batch([delayed(b"c", 3000), (b"now", b"v", []), delayed(b"a", 1000), delayed(b"b", 2000)],
                        timestamp_ms=NOW)
    part = produce(broker, batch)
    assert part.error_code == ErrorCode.none
    assert target(broker) == [(b"now", NOW)]
    d = delays(broker)
    assert len(d.schedule) == 3
    assert d.deliver_due(NOW + 999) and target(broker) == [(b"now", NOW)]
    assert d.deliver_due(NOW + 2500)
    assert d.deliver_due(NOW + 5000)
    assert target(broker) == [(b"now", NOW), (b"a", NOW), (b"b", NOW), (b"c", NOW)]
    assert len(d.schedule) == 0 and d.delivered == 3


def test_bad_header_refuses_the_batch(broker: Broker) -> None:
    part = produce(broker, build_batch([(b"x", b"v", []), (b"y", b"v", [("pykbroker.deliver.at.ms", b"x")])],
                                       timestamp_ms=NOW))
    assert part.error_code == ErrorCode.invalid_record
    assert [r.batch_index for r in part.record_errors] == [1]
    assert target(broker) == [] and len(delays(broker).schedule) == 0


def test_restart_keeps_the_schedule_and_settles_an_interrupted_delivery(broker: Broker, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    produce(broker, build_batch([delayed(b"a", 1000), delayed(b"b", 2000)], timestamp_ms=NOW))
    # Crash between the target append and the tombstones: the second append_records of a delivery fails.
    calls = {"n": 0}
    real = delay_service.append_records

    def flaky(*args: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise Crash
        real(*args)

    monkeypatch.setattr(delay_service, "append_records", flaky)
    with pytest.raises(Crash):
        delays(broker).deliver_due(NOW + 1500)
    monkeypatch.setattr(delay_service, "append_records", real)
    assert target(broker) == [(b"a", NOW)]
    broker.log_manager.shutdown()

    b2 = make_broker(tmp_path)
    try:
        d2 = delays(b2)
        # "a" reached the target before the crash: settled, not scheduled again; "b" still waits.
        assert [e.key for e in d2.schedule.pop_due(NOW + 10_000, 10)] == [b"b"]
    finally:
        b2.log_manager.shutdown()


def test_restart_redelivers_what_did_not_reach_the_target(broker: Broker, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    produce(broker, build_batch([delayed(b"a", 1000)], timestamp_ms=NOW))
    p = broker.replicas.partition("t", 0)
    assert p is not None

    def failing_append(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("crash before the target append")

    monkeypatch.setattr(p.log, "append", failing_append)
    assert not delays(broker).deliver_due(NOW + 1500)  # failed, put back
    monkeypatch.undo()
    broker.log_manager.shutdown()
    b2 = make_broker(tmp_path)
    try:
        d2 = delays(b2)
        assert len(d2.schedule) == 1
        assert d2.deliver_due(NOW + 1500)
        assert target(b2) == [(b"a", NOW)]
    finally:
        b2.log_manager.shutdown()


def test_idempotent_batch_keeps_the_producer_in_sequence_across_a_restart(broker: Broker, tmp_path: Path) -> None:
    pid = 4242

    def idem(seq: int, recs: list[Any]) -> bytes:
        return build_batch(recs, timestamp_ms=NOW, producer_id=pid, producer_epoch=0, base_sequence=seq)

    assert produce(broker, idem(0, [(b"first", b"v", [])])).error_code == ErrorCode.none
    scheduled = idem(1, [delayed(b"late", 1000), (b"with-it", b"v", [])])
    part = produce(broker, scheduled)
    assert part.error_code == ErrorCode.none and part.base_offset == -1
    # A retry of that batch is a duplicate: nothing scheduled twice.
    assert produce(broker, scheduled).error_code == ErrorCode.none
    assert len(delays(broker).schedule) == 2
    broker.log_manager.shutdown()
    b2 = make_broker(tmp_path)
    try:
        # After the restart the producer's next batch is still in sequence, a gap is still refused.
        assert produce(b2, idem(3, [(b"next", b"v", [])])).error_code == ErrorCode.none
        assert produce(b2, idem(9, [(b"gap", b"v", [])])).error_code == ErrorCode.out_of_order_sequence_number
        d2 = delays(b2)
        assert d2.deliver_due(NOW + 5)  # the undelayed record of the scheduled batch is due at once
        assert d2.deliver_due(NOW + 5000)
        assert [k for k, _ in target(b2)] == [b"first", b"next", b"with-it", b"late"]
    finally:
        b2.log_manager.shutdown()


def test_clients_cannot_produce_to_the_scheduled_log(broker: Broker) -> None:
    """Only brokers forward records to __delayed_records (in a cluster, on the inter-broker listener)."""
    from pykbroker.delay.serde import Entry, entry_key, entry_value

    e = Entry(NOW + 1000, 1, "t", 0, NOW, b"k", b"v", ())
    resp = call(broker, 0, 9, {"acks": -1, "timeout": 1000, "transactional_id": None, "topic_data": [
        {"name": "__delayed_records", "partition_data": [
            {"index": 0, "records": build_batch([(entry_key(e), entry_value(e), [])], timestamp_ms=NOW)}]}]})
    assert resp.responses[0].partition_responses[0].error_code == ErrorCode.invalid_topic_exception
    assert len(delays(broker).schedule) == 0
