"""KIP-890 and the newest transaction and ListOffsets versions, through the dispatcher of an in-process broker.

AddPartitionsToTxn v4-5 (batched, ``verify_only``), InitProducerId v5, AddOffsetsToTxn v4, the
partition leader's transaction verification on Produce, ListOffsets v9-10 and ApiVersions v4.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from kio.schema.errors import ErrorCode

from pykbroker.config import BrokerConfig
from pykbroker.coordinator.group.serde import OffsetValue, encode_offset_key, encode_offset_value
from pykbroker.coordinator.transaction.markers import append_internal, write_marker
from pykbroker.coordinator.transaction.state import TxnState
from pykbroker.protocol.records import build_batch
from pykbroker.server.broker import Broker
from pykbroker.server.dispatcher import supported_features
from pykbroker.storage.log import LogStartOffsetIncrementReason
from tests.unit.test_dispatcher import call, frame_for

TS = 1_700_000_000_000

DELETE_RECORDS = LogStartOffsetIncrementReason.CLIENT_RECORD_DELETION


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(BrokerConfig({"log.dirs": str(tmp_path), "listeners": "PLAINTEXT://127.0.0.1:0",
                             "transaction.state.log.num.partitions": "1", "offsets.topic.num.partitions": "1"}))
    b.startup()
    anyio.run(b.txn._load, 0)
    anyio.run(b.groups._load, 0)
    call(b, 19, 7, {"topics": [{"name": "t", "num_partitions": 3, "replication_factor": 1,
                                "assignments": [], "configs": []}], "timeout": 1000})
    try:
        yield b
    finally:
        b.log_manager.shutdown()


def init(b: Broker, tid: str, version: int = 5) -> tuple[int, int]:
    r = call(b, 22, version, {"transactional_id": tid, "transaction_timeout": datetime.timedelta(seconds=30),
                              "producer_id": -1, "producer_epoch": -1})
    assert r.error_code == ErrorCode.none
    return int(r.producer_id), int(r.producer_epoch)


def add_v3(b: Broker, tid: str, pid: int, epoch: int, topics: dict[str, list[int]]) -> dict[tuple[str, int], int]:
    r = call(b, 24, 3, {"v3_and_below_transactional_id": tid, "v3_and_below_producer_id": pid,
                        "v3_and_below_producer_epoch": epoch,
                        "v3_and_below_topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]})
    return {(t.name, int(p.partition_index)): int(p.partition_error_code) for t in r.results_by_topic_v3_and_below
            for p in t.results_by_partition}


def add_batched(b: Broker, version: int, txns: list[dict[str, Any]]) -> dict[str, dict[tuple[str, int], int]]:
    r = call(b, 24, version, {"transactions": txns})
    assert r.error_code == ErrorCode.none
    return {x.transactional_id: {(t.name, int(p.partition_index)): int(p.partition_error_code)
                                 for t in x.topic_results for p in t.results_by_partition}
            for x in r.results_by_transaction}


def txn(tid: str, pid: int, epoch: int, verify: bool, topics: dict[str, list[int]]) -> dict[str, Any]:
    return {"transactional_id": tid, "producer_id": pid, "producer_epoch": epoch, "verify_only": verify,
            "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}


def produce(b: Broker, version: int, tid: str | None, partition: int, pid: int, epoch: int, seq: int = 0) -> Any:
    batch = build_batch([(None, b"v%d" % seq, [])], timestamp_ms=TS, producer_id=pid, producer_epoch=epoch,
                        base_sequence=seq, is_transactional=True)
    r = call(b, 0, version, {"acks": -1, "timeout": 1000, "transactional_id": tid, "topic_data": [
        {"name": "t", "partition_data": [{"index": partition, "records": batch}]}]})
    return r.responses[0].partition_responses[0]


def test_add_partitions_v4_v5_batched_add_and_verify(broker: Broker) -> None:
    pa, ea = init(broker, "a")
    pb, eb = init(broker, "b")
    # One request, two transactions: "a" adds t-0 and t-1; "b" only asks whether t-0 is in its transaction.
    got = add_batched(broker, 5, [txn("a", pa, ea, False, {"t": [0, 1]}), txn("b", pb, eb, True, {"t": [0]})])
    assert got == {"a": {("t", 0): ErrorCode.none, ("t", 1): ErrorCode.none},
                   "b": {("t", 0): ErrorCode.transaction_abortable}}
    # verify_only changed nothing for "b"; "a" now verifies per partition.
    assert broker.txn.sm.txns["b"].partitions == frozenset()
    got = add_batched(broker, 5, [txn("a", pa, ea, True, {"t": [0, 2]})])
    assert got == {"a": {("t", 0): ErrorCode.none, ("t", 2): ErrorCode.transaction_abortable}}
    # v4 predates TRANSACTION_ABORTABLE: INVALID_TXN_STATE, as Kafka 3.6-3.7 answered.
    got = add_batched(broker, 4, [txn("a", pa, ea, True, {"t": [0, 2]})])
    assert got == {"a": {("t", 0): ErrorCode.none, ("t", 2): ErrorCode.invalid_txn_state}}
    # Producer checks fail every partition of that transaction only.
    got = add_batched(broker, 5, [txn("a", pa, ea + 1, True, {"t": [0]}), txn("zz", 123, 0, True, {"t": [0]}),
                                  txn("b", pb, eb, True, {"t": [1], "nope": [0]})])
    assert got == {"a": {("t", 0): ErrorCode.producer_fenced},
                   "zz": {("t", 0): ErrorCode.invalid_producer_id_mapping},
                   "b": {("t", 1): ErrorCode.operation_not_attempted,
                         ("nope", 0): ErrorCode.unknown_topic_or_partition}}
    # Brokers verify __consumer_offsets too (v4+); producers may not add internal topics (v0-3).
    offsets_tp = ("__consumer_offsets", 0)
    got = add_batched(broker, 5, [txn("a", pa, ea, True, {"__consumer_offsets": [0]})])
    assert got == {"a": {offsets_tp: ErrorCode.transaction_abortable}}
    assert add_v3(broker, "a", pa, ea, {"__consumer_offsets": [0], "t": [0]}) == {
        offsets_tp: ErrorCode.topic_authorization_failed, ("t", 0): ErrorCode.operation_not_attempted}
    r = call(broker, 25, 4, {"transactional_id": "a", "producer_id": pa, "producer_epoch": ea, "group_id": "g"})
    assert r.error_code == ErrorCode.none
    got = add_batched(broker, 5, [txn("a", pa, ea, True, {"__consumer_offsets": [0]})])
    assert got == {"a": {offsets_tp: ErrorCode.none}}
    # A transaction being completed answers CONCURRENT_TRANSACTIONS to verification.
    broker.txn.sm.txns["a"].state = broker.txn.sm.txns["a"].state.PREPARE_COMMIT
    got = add_batched(broker, 5, [txn("a", pa, ea, True, {"t": [0]})])
    assert got == {"a": {("t", 0): ErrorCode.concurrent_transactions}}


def test_add_partitions_v4_empty_batch(broker: Broker) -> None:
    r = call(broker, 24, 4, {"transactions": []})
    assert r.error_code == ErrorCode.none and r.results_by_transaction == ()


@pytest.mark.parametrize(("version", "expected"), [(9, ErrorCode.invalid_txn_state),
                                                   (11, ErrorCode.transaction_abortable),
                                                   (3, ErrorCode.invalid_txn_state)])
def test_produce_refuses_a_batch_outside_the_transaction(broker: Broker, version: int, expected: ErrorCode) -> None:
    pid, epoch = init(broker, "p")
    p0 = broker.replicas.partition("t", 0)
    assert p0 is not None
    part = produce(broker, version, "p", 0, pid, epoch)
    assert part.error_code == expected
    # Nothing appended and no transaction opened: the last stable offset is not pinned.
    assert p0.high_watermark == 0 and p0.log.producer_state.last_entry(pid) is None
    assert add_v3(broker, "p", pid, epoch, {"t": [0]}) == {("t", 0): ErrorCode.none}
    assert produce(broker, version, "p", 0, pid, epoch).error_code == ErrorCode.none
    assert p0.high_watermark == 1 and p0.last_stable_offset == 0
    # A stale epoch is refused as the producer expects (INVALID_PRODUCER_EPOCH), on another partition.
    assert produce(broker, version, "p", 1, pid, epoch - 1 if epoch else epoch + 1).error_code \
        == ErrorCode.invalid_producer_epoch


def test_a_late_batch_after_commit_cannot_hang_a_transaction(broker: Broker) -> None:
    pid, epoch = init(broker, "late")
    assert add_v3(broker, "late", pid, epoch, {"t": [2]}) == {("t", 2): ErrorCode.none}
    assert produce(broker, 11, "late", 2, pid, epoch, seq=0).error_code == ErrorCode.none
    # Further batches of the open transaction need no coordinator round trip and pass.
    assert produce(broker, 11, "late", 2, pid, epoch, seq=1).error_code == ErrorCode.none
    r = call(broker, 26, 4, {"transactional_id": "late", "producer_id": pid, "producer_epoch": epoch,
                             "committed": True})
    assert r.error_code == ErrorCode.none
    p2 = broker.replicas.partition("t", 2)
    assert p2 is not None and p2.last_stable_offset == p2.high_watermark == 3
    # A delayed retry of the committed transaction's producer: refused, the partition stays stable.
    assert produce(broker, 11, "late", 2, pid, epoch, seq=2).error_code == ErrorCode.transaction_abortable
    assert p2.last_stable_offset == p2.high_watermark == 3


def test_verification_can_be_turned_off_and_needs_a_transactional_id(broker: Broker) -> None:
    pid, epoch = init(broker, "off")
    # Coordinator not loaded for the id: retriable for every producer (NOT_ENOUGH_REPLICAS), not fatal.
    broker.txn.sm.partitions[0].loading = True
    part = produce(broker, 9, "off", 0, pid, epoch)
    assert part.error_code == ErrorCode.not_enough_replicas and "COORDINATOR_LOAD_IN_PROGRESS" in part.error_message
    broker.txn.sm.partitions[0].loading = False
    broker.config.set("transaction.partition.verification.enable", "false")
    # Transactional records without the request's transactional id are refused as Kafka's
    # authorization of the id refuses them, verification or not.
    assert produce(broker, 9, None, 0, pid, epoch).error_code == ErrorCode.transactional_id_authorization_failed
    assert produce(broker, 9, "off", 0, pid, epoch).error_code == ErrorCode.none


def test_init_producer_id_v5_and_add_offsets_v4(broker: Broker) -> None:
    pid, epoch = init(broker, "v5", version=5)
    again = call(broker, 22, 5, {"transactional_id": "v5", "transaction_timeout": datetime.timedelta(seconds=30),
                                 "producer_id": pid, "producer_epoch": epoch})
    assert (again.error_code, again.producer_id, again.producer_epoch) == (ErrorCode.none, pid, epoch + 1)
    stale = call(broker, 25, 4, {"transactional_id": "v5", "producer_id": pid, "producer_epoch": epoch,
                                 "group_id": "g"})
    assert stale.error_code == ErrorCode.producer_fenced


def test_list_offsets_v9_v10_tiered_and_local_specs(broker: Broker) -> None:
    for i in range(3):
        call(broker, 0, 9, {"acks": -1, "timeout": 1000, "transactional_id": None, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": build_batch([(None, b"x", [])],
                                                                                timestamp_ms=TS + i)}]}]})
    p0 = broker.replicas.partition("t", 0)
    assert p0 is not None
    p0.log.delete_records_before(1, reason=DELETE_RECORDS, high_watermark=p0.high_watermark)

    def lo(version: int, ts: int, partition: int = 0) -> tuple[int, int, int, int]:
        body: dict[str, Any] = {"replica_id": -1, "isolation_level": 0, "timeout": datetime.timedelta(seconds=1),
                                "topics": [{"name": "t", "partitions": [{"partition_index": partition,
                                                                         "current_leader_epoch": -1,
                                                                         "timestamp": ts}]}]}
        p = call(broker, 2, version, body).topics[0].partitions[0]
        return int(p.error_code), int(p.timestamp), int(p.offset), int(p.leader_epoch)

    for v in (8, 9, 10):
        if v >= 9:
            assert lo(v, -5) == (0, -1, -1, -1), "nothing is tiered: no offset, no epoch"
        assert lo(v, -4) == (0, -1, 1, 0) == lo(v, -2), "the local log is the whole log"
        assert lo(v, -1) == (0, -1, 3, 0)
        assert lo(v, TS + 1) == (0, TS + 1, 1, 0)
        # The epoch cache is given the leader's epoch at election, as Kafka's makeLeader does.
        assert lo(v, -2, partition=1) == (0, -1, 0, 0)
    # Each special timestamp needs the version that introduced it; an unknown one is never supported.
    unsupported = (ErrorCode.unsupported_version, -1, -1, -1)
    assert lo(8, -5) == unsupported and lo(7, -4) == unsupported and lo(6, -3) == unsupported
    assert lo(10, -6) == unsupported and lo(10, -100) == unsupported
    assert lo(7, -3) == (0, TS + 2, 3 - 1, 0)


def test_api_versions_v4_and_feature_filter(broker: Broker) -> None:
    v3 = call(broker, 18, 3, {"client_software_name": "unit", "client_software_version": "1"})
    v4 = call(broker, 18, 4, {"client_software_name": "unit", "client_software_version": "1"})
    def table(r: Any) -> list[tuple[int, int, int]]:
        return [(int(k.api_key), int(k.min_version), int(k.max_version)) for k in r.api_keys]
    assert v4.error_code == ErrorCode.none and table(v4) == table(v3)
    assert v4.supported_features == () and v4.finalized_features_epoch == -1 and v4.finalized_features == ()
    keys = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in v4.api_keys}
    assert {k: keys[k] for k in (2, 18, 22, 24, 25)} == {2: (0, 10), 18: (0, 4), 22: (0, 5), 24: (0, 5), 25: (0, 4)}
    feats = (("kraft.version", 0, 1), ("metadata.version", 1, 21))
    assert [f["name"] for f in supported_features(3, feats)] == ["metadata.version"]
    assert [f["name"] for f in supported_features(4, feats)] == ["kraft.version", "metadata.version"]


def test_txn_offset_commit_needs_the_offsets_partition_in_the_transaction(broker: Broker) -> None:
    pid, epoch = init(broker, "oc")
    assert add_v3(broker, "oc", pid, epoch, {"t": [0]}) == {("t", 0): ErrorCode.none}

    def commit(version: int) -> int:
        r = call(broker, 28, version, {"transactional_id": "oc", "group_id": "g", "producer_id": pid,
                                       "producer_epoch": epoch, "generation_id": -1, "member_id": "",
                                       "group_instance_id": None,
                                       "topics": [{"name": "t", "partitions": [{
                                           "partition_index": 0, "committed_offset": 5, "committed_leader_epoch": -1,
                                           "committed_metadata": ""}]}]})
        return int(r.topics[0].partitions[0].error_code)

    # Without AddOffsetsToTxn: refused, with TRANSACTION_ABORTABLE only for v4.
    assert (commit(3), commit(4)) == (ErrorCode.invalid_txn_state, ErrorCode.transaction_abortable)
    r = call(broker, 25, 4, {"transactional_id": "oc", "producer_id": pid, "producer_epoch": epoch, "group_id": "g"})
    assert r.error_code == ErrorCode.none
    assert commit(4) == ErrorCode.none


def txn_offset_commit(b: Broker, version: int, tid: str, pid: int, epoch: int, *, group: str = "g",
                      offset: int = 5, generation: int = -1, member: str = "", instance: str | None = None) -> int:
    r = call(b, 28, version, {"transactional_id": tid, "group_id": group, "producer_id": pid, "producer_epoch": epoch,
                              "generation_id": generation, "member_id": member, "group_instance_id": instance,
                              "topics": [{"name": "t", "partitions": [{
                                  "partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
                                  "committed_metadata": ""}]}]})
    return int(r.topics[0].partitions[0].error_code)


def fetch_stable(b: Broker, group: str = "g") -> tuple[int, int]:
    """OffsetFetch with require_stable: (error, committed offset) of t-0."""
    r = call(b, 9, 8, {"groups": [{"group_id": group, "topics": [{"name": "t", "partition_indexes": [0]}]}],
                       "require_stable": True})
    g = r.groups[0]
    part = g.topics[0].partitions[0]
    return int(g.error_code or part.error_code), int(part.committed_offset)


@pytest.mark.parametrize("version", [3, 4])
def test_txn_offset_commit_is_verified_with_the_transaction_coordinator(broker: Broker, version: int) -> None:
    pid, epoch = init(broker, "v")
    # The coordinator's verify_only answers, as a partition leader reports them.
    assert txn_offset_commit(broker, version, "never-initialized", pid, epoch) == ErrorCode.invalid_producer_id_mapping
    assert txn_offset_commit(broker, version, "v", pid + 1000, epoch) == ErrorCode.invalid_producer_id_mapping
    assert txn_offset_commit(broker, version, "v", pid, epoch + 1) == ErrorCode.invalid_producer_epoch
    assert fetch_stable(broker) == (ErrorCode.none, -1), "nothing refused was staged in the group"
    r = call(broker, 25, 4, {"transactional_id": "v", "producer_id": pid, "producer_epoch": epoch, "group_id": "g"})
    assert r.error_code == ErrorCode.none
    # KIP-447: a generation or member the group does not have is refused once the producer passed.
    assert txn_offset_commit(broker, version, "v", pid, epoch, generation=3, member="m") == ErrorCode.unknown_member_id
    assert txn_offset_commit(broker, version, "v", pid, epoch, generation=0, instance="i1") \
        == ErrorCode.unknown_member_id
    assert txn_offset_commit(broker, version, "v", pid, epoch) == ErrorCode.none
    assert fetch_stable(broker) == (ErrorCode.unstable_offset_commit, -1)
    # The transaction is open on the offsets partition: a stale epoch meets the partition's producer state.
    assert txn_offset_commit(broker, version, "v", pid, epoch - 1 if epoch else epoch + 1) \
        == ErrorCode.invalid_producer_epoch
    r = call(broker, 26, 4, {"transactional_id": "v", "producer_id": pid, "producer_epoch": epoch, "committed": True})
    assert r.error_code == ErrorCode.none
    assert fetch_stable(broker) == (ErrorCode.none, 5)
    # A late commit of the finished transaction: its offsets partition is no longer in a transaction.
    late = ErrorCode.transaction_abortable if version >= 4 else ErrorCode.invalid_txn_state
    assert txn_offset_commit(broker, version, "v", pid, epoch, offset=9) == late
    assert fetch_stable(broker) == (ErrorCode.none, 5)
    offsets = broker.replicas.partition("__consumer_offsets", 0)
    assert offsets is not None and offsets.last_stable_offset == offsets.high_watermark


def test_txn_offset_commit_without_verification_checks_only_the_producer_state(broker: Broker) -> None:
    broker.config.set("transaction.partition.verification.enable", "false")
    # As Kafka with verification off: the transaction coordinator is not asked at all.
    assert txn_offset_commit(broker, 4, "nobody", 4242, 3, offset=7) == ErrorCode.none
    assert fetch_stable(broker) == (ErrorCode.unstable_offset_commit, -1)
    assert txn_offset_commit(broker, 4, "nobody", 4242, 2) == ErrorCode.invalid_producer_epoch


def test_a_marker_between_verification_and_append_refuses_the_commit(broker: Broker) -> None:
    """The transaction verified for a TxnOffsetCommit ends (its marker reaches the offsets partition)
    before the offsets are appended: the append would open a transaction no marker ends, so it is refused."""
    pid, epoch = init(broker, "race")
    r = call(broker, 25, 4, {"transactional_id": "race", "producer_id": pid, "producer_epoch": epoch, "group_id": "g"})
    assert r.error_code == ErrorCode.none
    offsets = broker.groups.txn_offsets
    assert offsets is not None and offsets.verify is not None
    verify = offsets.verify

    async def verify_then_commit(tid: str, p: int, e: int, tp: tuple[str, int]) -> ErrorCode:
        code = await verify(tid, p, e, tp)
        # The transaction is committed by its producer while this answer is on its way back.
        resp = await broker.dispatcher.handle(frame_for(26, 4, {"transactional_id": "race", "producer_id": pid,
                                                                "producer_epoch": epoch, "committed": True}))
        assert resp is not None
        return code

    offsets.verify = verify_then_commit
    assert txn_offset_commit(broker, 4, "race", pid, epoch) == ErrorCode.invalid_txn_state
    assert broker.txn.sm.txns["race"].state == TxnState.COMPLETE_COMMIT
    p = broker.replicas.partition("__consumer_offsets", 0)
    assert p is not None and p.last_stable_offset == p.high_watermark, "no transaction left open"
    assert fetch_stable(broker) == (ErrorCode.none, -1)


def test_a_stale_marker_job_does_not_end_the_next_transaction(broker: Broker) -> None:
    """A marker job taken while a transaction was prepared (the retry loop's list, a load) and run after that
    transaction completed must write nothing: the producer's next transaction has the same producer id and epoch,
    so a second commit marker would commit records the producer has not committed (an aborted read once the
    producer aborts) and end its transactional offset commit early."""
    pid, epoch = init(broker, "stale")
    assert add_v3(broker, "stale", pid, epoch, {"t": [0]}) == {("t", 0): 0}
    assert produce(broker, 5, "stale", 0, pid, epoch, seq=0).error_code == ErrorCode.none
    prepared = broker.txn.sm.txns["stale"]
    stale_job = broker.txn.sm._job(prepared.transition(TxnState.PREPARE_COMMIT, 0))
    r = call(broker, 26, 4, {"transactional_id": "stale", "producer_id": pid, "producer_epoch": epoch,
                             "committed": True})
    assert r.error_code == ErrorCode.none
    assert broker.txn.sm.txns["stale"].state == TxnState.COMPLETE_COMMIT
    # The next transaction of the same producer: ongoing, its record not committed.
    assert add_v3(broker, "stale", pid, epoch, {"t": [0]}) == {("t", 0): 0}
    assert produce(broker, 5, "stale", 0, pid, epoch, seq=1).error_code == ErrorCode.none
    partition = broker.replicas.partition("t", 0)
    assert partition is not None
    log = partition.log
    end_before = log.log_end_offset
    assert not anyio.run(broker.txn.finish, stale_job)
    assert log.log_end_offset == end_before  # no marker written
    assert log.producer_state.has_ongoing_transactions
    assert broker.txn.sm.txns["stale"].state == TxnState.ONGOING


def test_a_regained_offsets_partition_forgets_what_was_pending_before(broker: Broker) -> None:
    """A TxnOffsetCommit left pending when this broker stopped leading the group's offsets partition is settled
    by the next leader (its marker lands there). When this broker leads the partition again, it must rebuild the
    pending offsets from the log alone: an entry kept from before was applied by the producer's next commit
    marker, and moved the group's committed offsets back (campaign seed 19)."""
    pid, epoch = init(broker, "regain")
    r = call(broker, 25, 4, {"transactional_id": "regain", "producer_id": pid, "producer_epoch": epoch,
                             "group_id": "g"})
    assert r.error_code == ErrorCode.none
    assert txn_offset_commit(broker, 3, "regain", pid, epoch, offset=5) == ErrorCode.none
    # The broker stops leading __consumer_offsets-0, as on a leadership change.
    groups = broker.groups
    groups.manager.unload(0)
    for unloaded in groups.unload_listeners:
        unloaded(0)
    # Meanwhile, elsewhere: the transaction commits (its marker replicated here) and the group commits t-0 at 9.
    offsets_partition = broker.replicas.partition("__consumer_offsets", 0)
    assert offsets_partition is not None
    assert write_marker(broker.replicas, "__consumer_offsets", 0, pid, epoch, True, 0) == ErrorCode.none
    append_internal(offsets_partition, bytearray(build_batch(
        [(encode_offset_key("g", "t", 0), encode_offset_value(OffsetValue(9)), [])], timestamp_ms=TS)))
    code, job = broker.txn.sm.end_txn("regain", pid, epoch, True)
    assert code == ErrorCode.none and job is not None and broker.txn.sm.complete(job)
    # Leading it again: the group's offsets come from the log.
    groups.manager.begin_loading(0)
    anyio.run(groups._load, 0)
    assert fetch_stable(broker) == (ErrorCode.none, 9)
    # The producer's next transaction commits t-1 only; t-0 stays at 9.
    r = call(broker, 25, 4, {"transactional_id": "regain", "producer_id": pid, "producer_epoch": epoch,
                             "group_id": "g"})
    assert r.error_code == ErrorCode.none
    r = call(broker, 28, 3, {"transactional_id": "regain", "group_id": "g", "producer_id": pid,
                             "producer_epoch": epoch, "generation_id": -1, "member_id": "", "group_instance_id": None,
                             "topics": [{"name": "t", "partitions": [{
                                 "partition_index": 1, "committed_offset": 3, "committed_leader_epoch": -1,
                                 "committed_metadata": ""}]}]})
    assert r.topics[0].partitions[0].error_code == ErrorCode.none
    r = call(broker, 26, 4, {"transactional_id": "regain", "producer_id": pid, "producer_epoch": epoch,
                             "committed": True})
    assert r.error_code == ErrorCode.none
    assert fetch_stable(broker) == (ErrorCode.none, 9)
