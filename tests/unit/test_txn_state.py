"""The transaction coordinator's state machine and log records, without sockets or files."""

from __future__ import annotations

import itertools

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.coordinator.transaction.log_serde import (
    TxnLogValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from pykbroker.coordinator.transaction.markers import CONTROL_COMMIT, build_marker, parse_control_key
from pykbroker.coordinator.transaction.state import (
    MAX_EPOCH,
    TransactionStateMachine,
    TxnConfig,
    TxnState,
    partition_for,
)
from pykbroker.protocol.records import decode_records, parse_batch_header


class Harness:
    def __init__(self, *, num_partitions: int = 4, max_timeout_ms: int = 60_000, expiration_ms: int = 3_600_000):
        self.now = 1_000_000
        self.log: list[tuple[int, bytes, bytes | None]] = []
        self.fail_writes = False
        self.pids = itertools.count(1000)
        self.sm = TransactionStateMachine(
            TxnConfig(num_partitions=num_partitions, max_timeout_ms=max_timeout_ms, id_expiration_ms=expiration_ms),
            self.write, lambda: self.now, lambda: next(self.pids))
        for p in range(num_partitions):
            self.sm.begin_loading(p, coordinator_epoch=7)
            self.sm.finish_loading(p)

    def write(self, partition: int, key: bytes, value: bytes | None) -> None:
        if self.fail_writes:
            raise OSError("disk full")
        self.log.append((partition, key, value))

    def init(self, txn: str = "tx", timeout: int = 10_000, pid: int = -1, epoch: int = -1) -> tuple[int, int]:
        r = self.sm.init_producer_id(txn, timeout, pid, epoch)
        assert r.error == ErrorCode.none, r
        return r.producer_id, r.producer_epoch


def test_log_records_round_trip() -> None:
    v = TxnLogValue(42, 3, 60_000, int(TxnState.ONGOING), {"a": [0, 2], "b": [1]}, 123, 100)
    assert decode_value(encode_value(v)) == v
    assert decode_key(encode_key("my-txn")) == "my-txn"
    # Kafka's layout: int16 key version 0, then an int16-length string.
    assert encode_key("x") == b"\x00\x00\x00\x01x"


def test_partition_for_matches_java_hash() -> None:
    # "abc".hashCode() == 96354
    assert partition_for("abc", 50) == 96354 % 50


def test_marker_batch_layout() -> None:
    data = build_marker(9, 4, True, 7, 1000)
    h = parse_batch_header(data, 0)
    assert h.is_control and h.is_transactional and h.producer_id == 9 and h.producer_epoch == 4
    (rec,) = decode_records(data)
    assert parse_control_key(rec.key) == CONTROL_COMMIT
    assert rec.value == b"\x00\x00\x00\x00\x00\x07"


def test_idempotent_init_gets_fresh_ids() -> None:
    h = Harness()
    a = h.sm.init_producer_id(None, 0)
    b = h.sm.init_producer_id(None, 0, a.producer_id, a.producer_epoch)
    assert (a.error, a.producer_epoch, b.producer_epoch) == (ErrorCode.none, 0, 0)
    assert a.producer_id != b.producer_id
    assert h.log == []


def test_init_validates_timeout_and_id() -> None:
    h = Harness(max_timeout_ms=5000)
    assert h.sm.init_producer_id("tx", 5001).error == ErrorCode.invalid_transaction_timeout
    assert h.sm.init_producer_id("tx", 0).error == ErrorCode.invalid_transaction_timeout
    assert h.sm.init_producer_id("", 1000).error == ErrorCode.invalid_request


def test_full_commit_cycle() -> None:
    h = Harness()
    pid, epoch = h.init()
    assert epoch == 0
    assert h.sm.add_partitions("tx", pid, epoch, [("t", 0), ("t", 1)]) == ErrorCode.none
    md = h.sm.txns["tx"]
    assert md.state == TxnState.ONGOING and md.start_ms == h.now
    writes = len(h.log)
    assert h.sm.add_partitions("tx", pid, epoch, [("t", 1)]) == ErrorCode.none
    assert len(h.log) == writes  # nothing new: no write
    code, job = h.sm.end_txn("tx", pid, epoch, commit=True)
    assert code == ErrorCode.none and job is not None
    assert job.commit and job.partitions == {("t", 0), ("t", 1)} and job.coordinator_epoch == 7
    assert h.sm.txns["tx"].state == TxnState.PREPARE_COMMIT
    # While prepared: the client's retry and new work wait.
    assert h.sm.end_txn("tx", pid, epoch, True)[0] == ErrorCode.concurrent_transactions
    assert h.sm.end_txn("tx", pid, epoch, False)[0] == ErrorCode.invalid_txn_state
    assert h.sm.add_partitions("tx", pid, epoch, [("t", 2)]) == ErrorCode.concurrent_transactions
    assert h.sm.init_producer_id("tx", 10_000).error == ErrorCode.concurrent_transactions
    assert h.sm.complete(job)
    md = h.sm.txns["tx"]
    assert md.state == TxnState.COMPLETE_COMMIT and md.partitions == frozenset()
    assert h.sm.end_txn("tx", pid, epoch, True)[0] == ErrorCode.none  # retried EndTxn
    assert h.sm.end_txn("tx", pid, epoch, False)[0] == ErrorCode.invalid_txn_state
    # Every transition was written, in order, to the id's partition.
    states = [decode_value(v).status for p, k, v in h.log if v is not None]
    assert states == [TxnState.EMPTY, TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT]
    assert {p for p, _, _ in h.log} == {partition_for("tx", 4)}


def test_end_txn_errors() -> None:
    h = Harness()
    assert h.sm.end_txn("nope", 1, 0, True)[0] == ErrorCode.invalid_producer_id_mapping
    pid, epoch = h.init()
    assert h.sm.end_txn("tx", pid, epoch, True)[0] == ErrorCode.invalid_txn_state  # Empty
    assert h.sm.end_txn("tx", pid + 1, epoch, True)[0] == ErrorCode.invalid_producer_id_mapping
    assert h.sm.add_partitions("tx", pid, epoch + 1, [("t", 0)]) == ErrorCode.producer_fenced


def test_new_producer_fences_ongoing_transaction() -> None:
    h = Harness()
    pid, epoch = h.init()
    h.sm.add_partitions("tx", pid, epoch, [("t", 0)])
    r = h.sm.init_producer_id("tx", 10_000)
    assert r.error == ErrorCode.concurrent_transactions and r.job is not None
    assert not r.job.commit and r.job.producer_epoch == epoch + 1  # markers carry the bumped epoch
    assert h.sm.txns["tx"].state == TxnState.PREPARE_ABORT
    # The old producer is fenced everywhere.
    assert h.sm.end_txn("tx", pid, epoch, True)[0] == ErrorCode.producer_fenced
    assert h.sm.add_partitions("tx", pid, epoch, [("t", 1)]) == ErrorCode.producer_fenced
    assert h.sm.complete(r.job)
    pid2, epoch2 = h.init()
    assert (pid2, epoch2) == (pid, epoch + 2)


def test_init_with_expected_epoch_kip360() -> None:
    h = Harness()
    pid, epoch = h.init()
    pid2, epoch2 = h.init(pid=pid, epoch=epoch)
    assert (pid2, epoch2) == (pid, epoch + 1)
    # A retry of that bump (response lost) gets the same epoch back.
    assert h.init(pid=pid, epoch=epoch) == (pid, epoch + 1)
    assert h.sm.init_producer_id("tx", 10_000, pid, epoch - 5).error == ErrorCode.producer_fenced
    assert h.sm.init_producer_id("tx", 10_000, 999_999, 0).error == ErrorCode.producer_fenced


def test_epoch_exhaustion_rotates_producer_id() -> None:
    h = Harness()
    pid, _ = h.init()
    h.sm.txns["tx"].producer_epoch = MAX_EPOCH - 1
    pid2, epoch2 = h.init()
    assert pid2 != pid and epoch2 == 0
    assert h.sm.txns["tx"].last_producer_id == pid


def test_timeout_aborts_with_bumped_epoch() -> None:
    h = Harness()
    pid, epoch = h.init(timeout=5000)
    h.sm.add_partitions("tx", pid, epoch, [("t", 0)])
    h.now += 4000
    assert h.sm.abort_timed_out() == []
    h.now += 1001
    (job,) = h.sm.abort_timed_out()
    assert not job.commit and job.producer_epoch == epoch + 1
    assert h.sm.end_txn("tx", pid, epoch, True)[0] == ErrorCode.producer_fenced
    assert h.sm.complete(job)
    assert h.sm.txns["tx"].state == TxnState.COMPLETE_ABORT


def test_failed_write_changes_nothing() -> None:
    h = Harness()
    pid, epoch = h.init()
    h.fail_writes = True
    with pytest.raises(OSError):
        h.sm.add_partitions("tx", pid, epoch, [("t", 0)])
    assert h.sm.txns["tx"].state == TxnState.EMPTY


def test_reload_finishes_prepared_and_keeps_ongoing() -> None:
    h = Harness(num_partitions=1)
    pid, epoch = h.init("a")
    h.sm.add_partitions("a", pid, epoch, [("t", 0)])
    h.sm.end_txn("a", pid, epoch, True)  # crash after PrepareCommit
    pid_b, epoch_b = h.init("b")
    h.sm.add_partitions("b", pid_b, epoch_b, [("t", 1)])  # crash with b ongoing
    records = [(k, v) for _, k, v in h.log]

    h2 = Harness(num_partitions=1)
    h2.sm.begin_loading(0, coordinator_epoch=8)
    assert h2.sm.init_producer_id("a", 1000).error == ErrorCode.coordinator_load_in_progress
    assert h2.sm.load(0, records) == 2
    (job,) = h2.sm.finish_loading(0)
    assert job.transactional_id == "a" and job.commit and job.coordinator_epoch == 8
    assert h2.sm.txns["b"].state == TxnState.ONGOING
    h2.now = h.now + 10_001
    (abort,) = h2.sm.abort_timed_out()
    assert abort.transactional_id == "b" and abort.partitions == {("t", 1)}


def test_unowned_partition_is_not_coordinator() -> None:
    h = Harness()
    h.sm.unload(partition_for("tx", 4))
    assert h.sm.init_producer_id("tx", 1000).error == ErrorCode.not_coordinator


def test_expiration_tombstones_idle_ids() -> None:
    h = Harness(expiration_ms=1000)
    h.init("old")
    pid, epoch = h.init("busy")
    h.sm.add_partitions("busy", pid, epoch, [("t", 0)])
    h.now += 1001
    assert h.sm.expire_transactional_ids() == ["old"]
    assert h.log[-1][2] is None and decode_key(h.log[-1][1]) == "old"
    assert "old" not in h.sm.txns and "busy" in h.sm.txns
    # A tombstone removes the id on reload too.
    h2 = Harness(num_partitions=4)
    for p in range(4):
        h2.sm.begin_loading(p, 1)
        h2.sm.load(p, [(k, v) for q, k, v in h.log if q == p])
    assert "old" not in h2.sm.txns


def test_list_and_describe() -> None:
    h = Harness()
    pid, epoch = h.init("a")
    h.sm.add_partitions("a", pid, epoch, [("t", 0)])
    h.init("b")
    assert [m.transactional_id for m in h.sm.list({TxnState.ONGOING}, None)] == ["a"]
    assert [m.transactional_id for m in h.sm.list(None, {pid})] == ["a"]
    assert len(h.sm.list(None, None)) == 2
    assert h.sm.describe("zzz")[0] == ErrorCode.transactional_id_not_found
    code, md = h.sm.describe("a")
    assert code == ErrorCode.none and md is not None and md.state.display == "Ongoing"
