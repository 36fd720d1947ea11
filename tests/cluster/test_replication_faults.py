"""Replication faults: leaders killed, followers and leaders paused, divergent tails,
leader-epoch fencing, under-replicated and offline partitions, unclean leader election.

Each test starts its own cluster (real ZooKeeper, brokers as subprocesses) so that it can SIGKILL,
SIGSTOP and restart any broker. Replicas are compared byte for byte by reading each broker's
segment files of the partition; every wait is bounded.
"""

from __future__ import annotations

import datetime
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from pykbroker.protocol.records import build_batch, parse_batch_header
from tests.cluster.steady import SteadyProducer, assert_nothing_lost, read_all
from tests.support.cluster import Cluster, metadata, raw_request, wait_for

pytestmark = [pytest.mark.timeout(300)]

NONE, NOT_LEADER_OR_FOLLOWER = 0, 6
NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND, LEADER_NOT_AVAILABLE = 19, 20, 5
FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 74, 75
FETCH, LIST_OFFSETS, PRODUCE, OFFSET_FOR_LEADER_EPOCH, DESCRIBE_TOPIC_PARTITIONS, DELETE_RECORDS = 1, 2, 0, 23, 75, 21
LATEST = -1


# --- raw requests and on-disk batches -------------------------------------------------------------


def _request(bootstrap: str, api_key: int, version: int, body: dict[str, Any], timeout: float = 15.0) -> Any:
    return raw_request(bootstrap, api_key, version, body, timeout=timeout, client_id="replication-test")


def _produce(bootstrap: str, topic: str, values: list[bytes], acks: int, timeout_ms: int = 5000) -> tuple[int, int]:
    """One batch to partition 0 with Produce v9: (error code, base offset)."""
    batch = build_batch([(v, v, []) for v in values], timestamp_ms=int(time.time() * 1000))
    resp = _request(bootstrap, PRODUCE, 9, {
        "transactional_id": None, "acks": acks, "timeout": datetime.timedelta(milliseconds=timeout_ms),
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]},
        timeout=timeout_ms / 1000 + 10)
    part = resp.responses[0].partition_responses[0]
    return int(part.error_code), int(part.base_offset)


def _latest(bootstrap: str, topic: str, replica_id: int) -> tuple[int, int]:
    """ListOffsets v7 LATEST of partition 0 as ``replica_id`` asks: (error code, offset)."""
    resp = _request(bootstrap, LIST_OFFSETS, 7, {"replica_id": replica_id, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": LATEST}]}]})
    part = resp.topics[0].partitions[0]
    return int(part.error_code), int(part.offset)


def _batches(cluster: Cluster, broker_id: int, topic: str, partition: int = 0) -> list[tuple[int, int, bytes]]:
    """(base offset, last offset, batch bytes) of every whole batch in the broker's segment files."""
    d = cluster.broker(broker_id).data_dir / "logs" / f"{topic}-{partition}"
    out: list[tuple[int, int, bytes]] = []
    for seg in sorted(d.glob("*.log")):
        buf = seg.read_bytes()
        pos = 0
        for _ in range(len(buf) // 61 + 1):
            if len(buf) - pos < 61:
                break
            length = struct.unpack_from(">i", buf, pos + 8)[0]
            if length < 49 or len(buf) - pos < 12 + length:  # preallocated zeros or a batch being written
                break
            h = parse_batch_header(buf, pos)
            out.append((h.base_offset, h.last_offset, bytes(buf[pos:pos + h.size])))
            pos += h.size
    return out


def _assert_contiguous(batches: list[tuple[int, int, bytes]]) -> None:
    expected = 0
    for base, last, _ in batches:
        assert base == expected, f"batch at {base}, expected {expected}: offsets are not contiguous"
        expected = last + 1


def _wait_identical_replicas(cluster: Cluster, topic: str, brokers: list[int], timeout: float = 30.0) -> list[Any]:
    """Until every replica's log holds the same batches, byte for byte; returns them."""
    def same() -> list[Any] | None:
        logs = [_batches(cluster, b, topic) for b in brokers]
        return logs[0] if logs[0] and all(lg == logs[0] for lg in logs[1:]) else None
    try:
        return wait_for(same, timeout=timeout, what=f"identical replicas of {topic} on {brokers}")
    except AssertionError:
        logs = {b: [(base, last) for base, last, _ in _batches(cluster, b, topic)] for b in brokers}
        for b, lg in logs.items():
            print(f"broker {b}: {len(lg)} batches, last {lg[-3:]}")
        raise


def _create(cluster: Cluster, *, rf: int = 3, partitions: int = 1, configs: dict[str, str] | None = None,
            assignment: list[list[int]] | None = None) -> str:
    name = f"r-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.any_bootstrap()})
    new = (NewTopic(name, len(assignment), replica_assignment=assignment, config=configs or {}) if assignment
           else NewTopic(name, partitions, rf, config=configs or {}))
    admin.create_topics([new], operation_timeout=30)[name].result(30)
    cluster.wait_leaders(name, len(assignment) if assignment else partitions)
    return name


def _state(cluster: Cluster, topic: str, via: int) -> Any:
    """Partition 0 of ``topic`` in one broker's Metadata v12 answer."""
    md = metadata(cluster.broker(via).bootstrap, [topic])
    return md.topics[0].partitions[0]


def _wait_isr(cluster: Cluster, topic: str, isr: list[int], timeout: float = 30.0,
              via: list[int] | None = None) -> None:
    """Until the metadata of ``via`` (default: every running broker) shows ``isr`` for partition 0."""
    def ok() -> bool:
        try:
            return all(sorted(_state(cluster, topic, b).isr_nodes) == sorted(isr) for b in via or cluster.running())
        except (OSError, ConnectionError):
            return False
    wait_for(ok, timeout=timeout, what=f"isr of {topic} to be {sorted(isr)}")


def _wait_leader(cluster: Cluster, topic: str, via: list[int], *, not_: int | None = None,
                 timeout: float = 30.0) -> int:
    """Until the brokers ``via`` agree on a leader of partition 0 (other than ``not_``, and not -1)."""
    def agreed() -> int | None:
        try:
            leaders = {int(_state(cluster, topic, b).leader_id) for b in via}
        except (OSError, ConnectionError):
            return None
        leader = leaders.pop() if len(leaders) == 1 else -1
        return leader if leader >= 0 and leader != not_ else None
    return wait_for(agreed, timeout=timeout, what=f"a leader of {topic} other than {not_}")


# --- 1. the leader killed ten times under an idempotent acks=all load ---------------------------


def test_kill_leader_ten_times_loses_nothing(tmp_path: Path) -> None:
    overrides = {"min.insync.replicas": "2", "zookeeper.session.timeout.ms": "4000",
                 "replica.lag.time.max.ms": "3000"}
    with Cluster(tmp_path, 3, overrides=overrides) as cluster:
        topic = _create(cluster)
        producer = SteadyProducer(cluster.bootstrap, topic, rate=100, max_seconds=240).start()
        try:
            wait_for(lambda: producer.acked_count() > 100, timeout=30, what="acknowledged produce")
            for round_ in range(10):
                _wait_isr(cluster, topic, [1, 2, 3], timeout=60)
                leader = cluster.wait_leaders(topic, 1)[0]
                acked = producer.acked_count()
                wait_for(lambda a=acked: producer.acked_count() > a + 50, timeout=60,
                         what=f"produce before kill {round_}")
                cluster.kill(leader)
                new = cluster.wait_leaders(topic, 1, exclude=(leader,), timeout=30)[0]
                assert new != leader
                acked = producer.acked_count()
                wait_for(lambda a=acked: producer.acked_count() > a + 50, timeout=60,
                         what=f"produce to go on after kill {round_}")
                cluster.broker(leader).start()
            _wait_isr(cluster, topic, [1, 2, 3], timeout=60)
        finally:
            producer.stop()
        assert not producer.errors, producer.errors[:5]
        batches = _wait_identical_replicas(cluster, topic, [1, 2, 3])
        _assert_contiguous(batches)
        end = batches[-1][1] + 1
        seen = read_all(cluster.any_bootstrap(), topic, 1)
        assert_nothing_lost(producer, seen)
        # Exactly once: every offset of the log holds a distinct value, and all of them were acknowledged.
        assert sum(len(w) for w in seen.values()) == end, (len(seen), end)
        assert set(seen) == set(producer.acked), set(seen) ^ set(producer.acked)


# --- 2 and 5. paused followers leave the ISR, come back; min ISR; under-replicated partitions ----


def test_paused_followers_leave_and_rejoin_the_isr(tmp_path: Path) -> None:
    # A short lag time and a long session: the leader's own ISR shrink, not the controller's reaction
    # to an expired session, takes the paused followers out.
    overrides = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "2000",
                 "zookeeper.session.timeout.ms": "20000"}
    with Cluster(tmp_path, 3, overrides=overrides) as cluster:
        topic = _create(cluster)
        leader = cluster.wait_leaders(topic, 1)[0]
        f1, f2 = (b for b in cluster.brokers if b != leader)
        lb = cluster.broker(leader).bootstrap
        acked: list[bytes] = []

        def produce(acks: int, n: int, expect: int = NONE, timeout_ms: int = 5000) -> None:
            values = [f"{acks}-{uuid.uuid4().hex[:8]}".encode() for _ in range(n)]
            err, _ = _produce(lb, topic, values, acks, timeout_ms)
            assert err == expect, (acks, err)
            if err in (NONE, NOT_ENOUGH_REPLICAS_AFTER_APPEND):  # the latter is in the log too
                acked.extend(values)

        produce(-1, 5)
        cluster.pause(f1)
        try:
            _wait_isr(cluster, topic, [leader, f2], via=[leader, f2], timeout=20)
            produce(-1, 5)  # two in sync is enough
            # Under-replicated, visibly: the ISR is shorter than the replicas, no replica is offline.
            p = _state(cluster, topic, leader)
            assert sorted(p.replica_nodes) == [1, 2, 3] and list(p.offline_replicas) == [] and p.error_code == NONE
            dtp = _request(lb, DESCRIBE_TOPIC_PARTITIONS, 0, {"topics": [{"name": topic}],
                                                                "response_partition_limit": 10, "cursor": None})
            dp = dtp.topics[0].partitions[0]
            assert sorted(dp.isr_nodes) == sorted([leader, f2]) and sorted(dp.replica_nodes) == [1, 2, 3]
            assert f"Shrinking ISR of {topic}-0" in cluster.broker(leader).log()
        finally:
            cluster.resume(f1)
        _wait_isr(cluster, topic, [1, 2, 3], timeout=30)
        assert f"Expanding ISR of {topic}-0" in cluster.broker(leader).log()
        produce(-1, 5)

        cluster.pause(f1)
        cluster.pause(f2)
        try:
            # Appended while the ISR was whole, then the ISR fell below min.insync.replicas: the
            # delayed produce answers once the shrink lets the HW pass it.
            produce(-1, 5, expect=NOT_ENOUGH_REPLICAS_AFTER_APPEND, timeout_ms=15000)
            _wait_isr(cluster, topic, [leader], via=[leader], timeout=20)
            produce(-1, 5, expect=NOT_ENOUGH_REPLICAS)
            produce(1, 5)
        finally:
            cluster.resume(f1)
            cluster.resume(f2)
        _wait_isr(cluster, topic, [1, 2, 3], timeout=30)
        produce(-1, 5)
        batches = _wait_identical_replicas(cluster, topic, [1, 2, 3])
        _assert_contiguous(batches)
        assert sorted(read_all(cluster.any_bootstrap(), topic, 1)) == sorted(acked)

        # A follower that comes back below the leader's log start offset (DeleteRecords meanwhile) is
        # out of range: it starts over at the leader's log start, and rejoins.
        cluster.pause(f1)
        try:
            _wait_isr(cluster, topic, [leader, f2], via=[leader, f2], timeout=20)
            produce(-1, 5)
            end = _latest(lb, topic, -1)[1]
            resp = _request(lb, DELETE_RECORDS, 2, {"timeout": datetime.timedelta(seconds=10), "topics": [
                {"name": topic, "partitions": [{"partition_index": 0, "offset": end}]}]})
            assert int(resp.topics[0].partitions[0].low_watermark) == end
            produce(-1, 5)
            # Each replica's log line gives its own reason: the request on the leader, the leader's log
            # start on the follower that follows it.
            assert f"Incremented log start offset of {topic}-0 to {end} (DeleteRecords)" in cluster.broker(leader).log()
            wait_for(lambda: f"Incremented log start offset of {topic}-0 to {end} (following the leader's log start "
                             "offset)" in cluster.broker(f2).log(), timeout=20, what="the follower's log start line")
            assert "(DeleteRecords)" not in cluster.broker(f2).log()
        finally:
            cluster.resume(f1)
        _wait_isr(cluster, topic, [1, 2, 3], timeout=30)
        assert f"Restarting {topic}-0 at the leader's log start {end}" in cluster.broker(f1).log()

        def from_start(b: int) -> list[Any]:
            return [x for x in _batches(cluster, b, topic) if x[0] >= end]
        wait_for(lambda: from_start(f1) and all(from_start(b) == from_start(f1) for b in (leader, f2)),
                 timeout=30, what="the restarted follower's log to match from the log start")
        assert _batches(cluster, f1, topic)[0][0] == end
        assert len(read_all(cluster.any_bootstrap(), topic, 1)) == 5


# --- 3 and 4. a partitioned leader's divergent tail; leader epochs fence stale clients -------------


def test_partitioned_leader_truncates_its_divergent_tail(tmp_path: Path) -> None:
    # A lag time longer than the brief follower pauses: the ISR stays whole until the leader is gone.
    overrides = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "20000",
                 "zookeeper.session.timeout.ms": "4000"}
    with Cluster(tmp_path, 3, overrides=overrides) as cluster:
        topic = _create(cluster)
        old = cluster.wait_leaders(topic, 1)[0]
        a, b = (x for x in cluster.brokers if x != old)
        epoch0 = int(_state(cluster, topic, old).leader_epoch)
        committed = [f"c{i}".encode() for i in range(10)]
        assert _produce(cluster.broker(old).bootstrap, topic, committed, -1) == (NONE, 0)
        _wait_identical_replicas(cluster, topic, [1, 2, 3])

        # Only the leader gets the tail: its followers are stopped while it takes acks=1 writes. The
        # leader's answer to a fetch the followers sent before they stopped may still reach them with
        # the first tail batch; the later two batches are the leader's alone.
        tail = [f"tail{i}".encode() for i in range(6)]
        cluster.pause(a)
        cluster.pause(b)
        try:
            for i in range(3):
                assert _produce(cluster.broker(old).bootstrap, topic, tail[2 * i:2 * i + 2], 1) == (NONE, 10 + 2 * i)
            # Consumers see the high watermark, replicas (any replica id but -1) the log end offset.
            ob = cluster.broker(old).bootstrap
            assert _latest(ob, topic, -1) == (NONE, 10) and _latest(ob, topic, a) == (NONE, 16)
            cluster.pause(old)
        finally:
            cluster.resume(a)
            cluster.resume(b)
        try:
            # The old leader's session expires; a follower that has everything committed takes over.
            new = _wait_leader(cluster, topic, [a, b], not_=old, timeout=30)
            after = [f"n{i}".encode() for i in range(10)]
            err, diverged_at = _produce(cluster.broker(new).bootstrap, topic, after, -1, timeout_ms=10000)
            assert err == NONE and diverged_at in (10, 12), (err, diverged_at)
        finally:
            cluster.resume(old)
        _wait_isr(cluster, topic, [1, 2, 3], timeout=60)
        batches = _wait_identical_replicas(cluster, topic, [1, 2, 3])
        _assert_contiguous(batches)
        assert f"Truncating {topic}-0 to {diverged_at}" in cluster.broker(old).log()
        seen = read_all(cluster.any_bootstrap(), topic, 1)
        assert sorted(seen) == sorted(committed + tail[:diverged_at - 10] + after), sorted(seen)
        end = diverged_at + len(after)

        # Leader epochs (KIP-320): the new leader fences the old epoch and does not know a future one.
        epoch1 = int(_state(cluster, topic, new).leader_epoch)
        assert epoch1 > epoch0
        for via in cluster.brokers:
            assert int(_state(cluster, topic, via).leader_epoch) == epoch1
        follower = old
        nb, fb = cluster.broker(new).bootstrap, cluster.broker(follower).bootstrap

        def fetch(bootstrap: str, epoch: int) -> Any:
            resp = _request(bootstrap, FETCH, 12, {
                "replica_id": -1, "max_wait": datetime.timedelta(0), "min_bytes": 0, "max_bytes": 1 << 20,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [],
                "rack_id": "", "topics": [{"topic": topic, "partitions": [{
                    "partition": 0, "current_leader_epoch": epoch, "fetch_offset": 0, "last_fetched_epoch": -1,
                    "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}]})
            return resp.responses[0].partitions[0]

        assert int(fetch(nb, epoch0).error_code) == FENCED_LEADER_EPOCH
        assert int(fetch(nb, epoch1 + 1).error_code) == UNKNOWN_LEADER_EPOCH
        ok = fetch(nb, epoch1)
        assert int(ok.error_code) == NONE and int(ok.high_watermark) == end and ok.records
        assert int(fetch(nb, -1).error_code) == NONE
        # A follower checks the epoch before leadership, as Kafka does.
        assert int(fetch(fb, epoch0).error_code) == FENCED_LEADER_EPOCH
        assert int(fetch(fb, epoch1 + 1).error_code) == UNKNOWN_LEADER_EPOCH

        def list_offsets(bootstrap: str, epoch: int) -> Any:
            resp = _request(bootstrap, LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
                {"name": topic, "partitions": [
                    {"partition_index": 0, "current_leader_epoch": epoch, "timestamp": LATEST}]}]})
            return resp.topics[0].partitions[0]

        assert int(list_offsets(nb, epoch0).error_code) == FENCED_LEADER_EPOCH
        assert int(list_offsets(nb, epoch1 + 1).error_code) == UNKNOWN_LEADER_EPOCH
        lo = list_offsets(nb, epoch1)
        assert (int(lo.error_code), int(lo.offset), int(lo.leader_epoch)) == (NONE, end, epoch1)
        assert int(list_offsets(fb, epoch1).error_code) == NOT_LEADER_OR_FOLLOWER
        assert int(list_offsets(fb, epoch0).error_code) == FENCED_LEADER_EPOCH  # Kafka checks the epoch first
        assert _latest(fb, topic, -2) == (NONE, end)  # the debugging replica id may ask a follower

        def end_offset(bootstrap: str, current: int, epoch: int) -> tuple[int, int, int]:
            resp = _request(bootstrap, OFFSET_FOR_LEADER_EPOCH, 4, {"replica_id": -1, "topics": [
                {"topic": topic, "partitions": [
                    {"partition": 0, "current_leader_epoch": current, "leader_epoch": epoch}]}]})
            p = resp.topics[0].partitions[0]
            return int(p.error_code), int(p.leader_epoch), int(p.end_offset)

        # The old epoch ended where the new leader's log diverged from the old leader's tail.
        assert end_offset(nb, epoch1, epoch0) == (NONE, epoch0, diverged_at)
        assert end_offset(nb, epoch1, epoch1) == (NONE, epoch1, end)
        assert end_offset(nb, epoch0, epoch0)[0] == FENCED_LEADER_EPOCH
        assert end_offset(nb, epoch1 + 1, epoch0)[0] == UNKNOWN_LEADER_EPOCH
        assert end_offset(fb, epoch1, epoch0)[0] == NOT_LEADER_OR_FOLLOWER


# --- 5 and 6. offline partitions; unclean leader election only where the topic allows it ---------


def test_unclean_leader_election_only_when_enabled(tmp_path: Path) -> None:
    with Cluster(tmp_path, 3, overrides={"zookeeper.session.timeout.ms": "4000"}) as cluster:
        clean = _create(cluster, assignment=[[1, 2]])
        unclean = _create(cluster, assignment=[[1, 2]], configs={"unclean.leader.election.enable": "true"})
        later = _create(cluster, assignment=[[1, 2]])  # allows it only once it is offline
        b1 = cluster.broker(1).bootstrap
        first = [f"first{i}".encode() for i in range(3)]
        only_on_1 = [f"only1-{i}".encode() for i in range(3)]
        for t in (clean, unclean, later):
            assert _produce(b1, t, first, -1) == (NONE, 0)
        cluster.kill(2)
        for t in (clean, unclean, later):
            _wait_isr(cluster, t, [1], timeout=30)
            assert _produce(b1, t, only_on_1, 1) == (NONE, 3)
        cluster.kill(1)
        for t in (clean, unclean, later):
            def offline(t: str = t) -> bool:
                p = _state(cluster, t, 3)
                return int(p.leader_id) == -1 and sorted(p.offline_replicas) == [1, 2]
            wait_for(offline, timeout=30, what=f"{t} offline")
            p = _state(cluster, t, 3)
            assert int(p.error_code) == LEADER_NOT_AVAILABLE and list(p.isr_nodes) == [1]
            dtp = _request(cluster.broker(3).bootstrap, DESCRIBE_TOPIC_PARTITIONS, 0, {
                "topics": [{"name": t}], "response_partition_limit": 10, "cursor": None})
            dp = dtp.topics[0].partitions[0]
            assert int(dp.leader_id) == -1 and sorted(dp.offline_replicas) == [1, 2]

        # Broker 2 is back, but out of the ISR: only the topic that allows it elects it.
        cluster.broker(2).start()
        assert _wait_leader(cluster, unclean, [2, 3], timeout=30) == 2
        assert "unclean leader election" in cluster.broker(cluster.controller_id()).log()
        for via in (2, 3):
            for t in (clean, later):
                p = _state(cluster, t, via)
                assert int(p.leader_id) == -1 and list(p.offline_replicas) == [1] and list(p.isr_nodes) == [1], p
        # Enabling it on an offline topic elects at once, as Kafka's controller does.
        admin = AdminClient({"bootstrap.servers": cluster.broker(3).bootstrap})
        resource = ConfigResource(ConfigResource.Type.TOPIC, later, incremental_configs=[
            ConfigEntry("unclean.leader.election.enable", "true",
                        incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result(30)
        assert _wait_leader(cluster, later, [2, 3], timeout=30) == 2
        assert int(_state(cluster, clean, 3).leader_id) == -1
        assert _produce(cluster.broker(2).bootstrap, unclean, [b"after"], -1) == (NONE, 3)
        assert sorted(read_all(cluster.broker(2).bootstrap, unclean, 1)) == sorted([*first, b"after"])

        # Broker 1 returns: it leads the clean topic again with nothing lost, and follows the new leader
        # of the other one, its own tail truncated.
        cluster.broker(1).start()
        assert _wait_leader(cluster, clean, [1, 2, 3], timeout=30) == 1
        assert sorted(read_all(b1, clean, 1)) == sorted(first + only_on_1)
        _wait_isr(cluster, unclean, [1, 2], timeout=30)
        _assert_contiguous(_wait_identical_replicas(cluster, unclean, [1, 2]))
