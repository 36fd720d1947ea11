"""Pipelined produce acknowledgements (pykbroker.max.inflight.requests.per.connection).

An acks=all produce that waits for the ISR is parked: the connection goes on processing its next requests,
while responses still come back in request order.  A real three-broker cluster on a real ZooKeeper; a
paused follower holds the high watermark back for replica.lag.time.max.ms, which is what parks the produce
long enough to watch the next request being processed meanwhile.  Every wait is bounded.
"""

from __future__ import annotations

import datetime
import select
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pykbroker.protocol import codec
from pykbroker.protocol.records import build_batch, iter_batches
from tests.cluster.steady import read_all
from tests.support.cluster import Cluster, metadata, raw_request, recv_exact, request_frame, wait_for

pytestmark = [pytest.mark.timeout(240)]

PRODUCE, LIST_OFFSETS, METADATA = 0, 2, 3
NONE = 0
LAG_MS = 6000  # how long a paused follower holds acks=all back: the window in which we look
DROPPING_BROKER = 2  # answers its first produce requests by closing the connection after the append
DROPS = 3


@pytest.fixture(scope="module")
def pipelining_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # A long session: the leader's own ISR shrink (after the lag time), not session expiry, takes a paused
    # follower out.
    c = Cluster(tmp_path_factory.mktemp("pipelining"), 3,
                overrides={"replica.lag.time.max.ms": str(LAG_MS), "zookeeper.session.timeout.ms": "30000",
                           "pykbroker.max.inflight.requests.per.connection": "5",
                           "pykbroker.log.levels": "pykbroker.produce=DEBUG"},
                broker_overrides={DROPPING_BROKER: {"pykbroker.fault.drop.produce.response": str(DROPS)}})
    with c:
        yield c


def _create(cluster: Cluster, assignment: list[int], configs: dict[str, str] | None = None) -> str:
    name = f"pipe-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.any_bootstrap()})
    admin.create_topics([NewTopic(name, 1, replica_assignment=[assignment], config=configs or {})],
                        operation_timeout=30)[name].result(30)
    cluster.wait_leaders(name, 1)
    return name


def _isr(cluster: Cluster, topic: str, via: int) -> list[int]:
    return sorted(metadata(cluster.broker(via).bootstrap, [topic]).topics[0].partitions[0].isr_nodes)


def _produce_frame(topic: str, value: bytes, acks: int, correlation_id: int) -> bytes:
    batch = build_batch([(None, value, [])], timestamp_ms=int(time.time() * 1000))
    return request_frame(PRODUCE, 9, {
        "transactional_id": None, "acks": acks, "timeout": datetime.timedelta(milliseconds=30000),
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}, correlation_id)


def _end_offset(bootstrap: str, topic: str) -> int:
    resp = raw_request(bootstrap, LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}]})
    return int(resp.topics[0].partitions[0].offset)


def _read_response(s: socket.socket, api_key: int, version: int) -> tuple[int, Any]:
    """The next response on the connection: (correlation id, decoded body)."""
    (size,) = struct.unpack(">i", recv_exact(s, 4))
    payload = recv_exact(s, size)
    (corr,) = struct.unpack_from(">i", payload, 0)
    return corr, codec.decode_response(api_key, version, payload, 5 if codec.is_flexible(api_key, version) else 4)


def _closed(s: socket.socket, timeout: float) -> bool:
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_a_parked_acks_all_produce_does_not_hold_back_the_next_requests(pipelining_cluster: Cluster) -> None:
    cluster = pipelining_cluster
    replicated = _create(cluster, [1, 2, 3], {"min.insync.replicas": "2"})
    single = _create(cluster, [1])  # led by the same broker, no followers: acks=1 answers at once
    wait_for(lambda: _isr(cluster, replicated, 1) == [1, 2, 3], timeout=30, what="a full ISR")
    leader = cluster.broker(1)
    cluster.pause(3)
    try:
        with socket.create_connection(("127.0.0.1", leader.port), timeout=30) as s:
            sent = time.monotonic()
            s.sendall(_produce_frame(replicated, b"parked", -1, 1)  # waits for the ISR to shrink
                      + _produce_frame(single, b"behind it", 1, 2)
                      + request_frame(METADATA, 12, {"topics": [{"name": single, "topic_id": None}],
                                                     "allow_auto_topic_creation": False,
                                                     "include_topic_authorized_operations": False}, 3)
                      # acks=0 to a topic that does not exist: Kafka's answer is to close the connection,
                      # which must come after the three responses before it.
                      + _produce_frame(f"missing-{uuid.uuid4().hex[:6]}", b"x", 0, 4))
            # The request behind the parked one is processed while the parked one still waits.
            wait_for(lambda: _end_offset(leader.bootstrap, single) == 1, timeout=LAG_MS / 1000 / 2,
                     interval=0.05, what="the acks=1 produce behind the parked one to be appended")
            assert time.monotonic() - sent < LAG_MS / 1000
            readable, _, _ = select.select([s], [], [], 0)
            assert not readable, "a response arrived before the follower left the ISR"
            assert _isr(cluster, replicated, 1) == [1, 2, 3]  # so the parked produce is indeed still waiting

            corr, first = _read_response(s, PRODUCE, 9)
            assert corr == 1 and int(first.responses[0].partition_responses[0].error_code) == NONE
            assert time.monotonic() - sent >= LAG_MS / 1000 * 0.5  # it did wait for the shrink
            corr, second = _read_response(s, PRODUCE, 9)
            part = second.responses[0].partition_responses[0]
            assert corr == 2 and int(part.error_code) == NONE and int(part.base_offset) == 0
            corr, md = _read_response(s, METADATA, 12)
            assert corr == 3 and [t.name for t in md.topics] == [single]
            assert _closed(s, 10), "the failed acks=0 produce should close the connection after the responses"
        assert "acks=0 produce failed" in leader.log()
    finally:
        cluster.resume(3)
    wait_for(lambda: _isr(cluster, replicated, 1) == [1, 2, 3], timeout=60, what="the follower to rejoin")


def test_idempotent_producer_keeps_every_record_once_and_in_order(pipelining_cluster: Cluster) -> None:
    """Up to five produce requests in flight, each parked for the ISR; the leader drops the connection
    after appending its first few, so requests processed behind them are retried and deduplicated."""
    cluster = pipelining_cluster
    topic = _create(cluster, [DROPPING_BROKER, 1, 3], {"min.insync.replicas": "2"})
    wait_for(lambda: _isr(cluster, topic, DROPPING_BROKER) == [1, 2, 3], timeout=30, what="a full ISR")
    producer = Producer({"bootstrap.servers": cluster.broker(DROPPING_BROKER).bootstrap,
                         "enable.idempotence": True, "acks": "all", "max.in.flight.requests.per.connection": 5,
                         "linger.ms": 2, "batch.size": 4096, "message.timeout.ms": 60000,
                         "retry.backoff.ms": 50})
    errors: list[str] = []
    acked: list[tuple[bytes, int]] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append((msg.value(), msg.offset()))

    count = 20_000
    values = [f"v{i:06d}".encode() for i in range(count)]
    for v in values:
        for _ in range(1000):  # bounded: a full queue drains as acknowledgements come
            try:
                producer.produce(topic, v, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]
    assert len(acked) == count
    log = cluster.broker(DROPPING_BROKER).log()
    assert log.count("fault injection: dropping the connection after the append") == DROPS
    seen = read_all(cluster.broker(DROPPING_BROKER).bootstrap, topic, 1)
    dupes = {v: where for v, where in seen.items() if len(where) > 1}
    assert not dupes, f"{len(dupes)} records written twice, e.g. {list(dupes.items())[:3]}"
    by_offset = sorted((where[0][1], v) for v, where in seen.items())
    assert [v for _, v in by_offset] == values  # every record once, in the order produced
    assert [o for o, _ in by_offset] == list(range(count))
    assert dict(acked) == {v: where[0][1] for v, where in seen.items()}  # acknowledged where they are


def _set_min_isr(cluster: Cluster, topic: str, value: int) -> None:
    """Topic min.insync.replicas, written through the leader (broker 1) and waited for there."""
    leader = cluster.broker(1).bootstrap
    resp = raw_request(leader, 44, 1, {"validate_only": False, "resources": [
        {"resource_type": 2, "resource_name": topic, "configs": [
            {"name": "min.insync.replicas", "config_operation": 0, "value": str(value)}]}]})
    assert [int(r.error_code) for r in resp.responses] == [NONE], resp

    def applied() -> bool:
        described = raw_request(leader, 32, 4, {"include_synonyms": False, "include_documentation": False,
                                                "resources": [{"resource_type": 2, "resource_name": topic,
                                                               "configuration_keys": ["min.insync.replicas"]}]})
        return [c.value for c in described.results[0].configs] == [str(value)]
    wait_for(applied, timeout=30, interval=0.05, what=f"min.insync.replicas={value} on the leader")


def _appended(cluster: Cluster, broker: int, topic: str) -> int:
    """Records in the broker's own log of partition 0, read from its segment files (beyond the HW too)."""
    total = 0
    for path in sorted((cluster.broker(broker).data_dir / "logs" / f"{topic}-0").glob("*.log")):
        total += sum(h.last_offset_delta + 1 for h in iter_batches(path.read_bytes()))
    return total


def test_a_refused_batch_does_not_leave_a_gap_for_the_requests_behind_it(pipelining_cluster: Cluster) -> None:
    """librdkafka answers an OUT_OF_ORDER_SEQUENCE_NUMBER for a batch behind the first unacknowledged one by
    bumping its producer epoch and renumbering every record it still holds, including a batch the broker did
    append but could not acknowledge: that batch is then appended twice.  Requests read behind a parked produce
    are checked as they arrive, so a batch refused there (NOT_ENOUGH_REPLICAS while the ISR looked too small)
    and the next one accepted (the ISR enough again) would leave exactly that gap; the batches behind a refused
    one of the same producer on the connection get the same refusal instead, as they would if they had waited
    for the parked produce."""
    cluster = pipelining_cluster
    topic = _create(cluster, [1, 2, 3], {"min.insync.replicas": "2"})
    wait_for(lambda: _isr(cluster, topic, 1) == [1, 2, 3], timeout=30, what="a full ISR")
    leader = cluster.broker(1)
    producer = Producer({"bootstrap.servers": leader.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 0, "request.timeout.ms": 60000, "message.timeout.ms": 120000,
                         "retry.backoff.ms": 100})
    errors: list[str] = []
    acked: dict[bytes, int] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked[msg.value()] = msg.offset()

    producer.produce(topic, b"m0", on_delivery=delivered)
    assert producer.flush(30) == 0 and acked == {b"m0": 0}, errors
    cluster.pause(2)
    cluster.pause(3)
    try:
        # m1 is appended and waits for followers that do not fetch: after replica.lag.time.max.ms the ISR
        # shrinks to the leader alone and m1 is answered NOT_ENOUGH_REPLICAS_AFTER_APPEND (possibly persisted).
        producer.produce(topic, b"m1", on_delivery=delivered)
        producer.poll(0)
        wait_for(lambda: _appended(cluster, 1, topic) == 2, timeout=LAG_MS / 1000 / 3, interval=0.02,
                 what="m1 appended on the leader")
        # m2, read behind it while min.insync.replicas is above the ISR: refused before the append.
        _set_min_isr(cluster, topic, 4)
        producer.produce(topic, b"m2", on_delivery=delivered)
        producer.poll(0)
        wait_for(lambda: f"NOT_ENOUGH_REPLICAS for {topic}-0: the ISR [1, 2, 3]" in leader.log(), timeout=10,
                 interval=0.02, what="m2 refused")
        # m3, read behind both once the ISR is enough again: it continues m2's sequence, which is not in the log.
        _set_min_isr(cluster, topic, 2)
        producer.produce(topic, b"m3", on_delivery=delivered)
        producer.poll(0)
        answers = ("out_of_order_sequence_number", "as the batch before it")
        wait_for(lambda: any(topic in line and any(a in line for a in answers)
                             for line in leader.log().lower().splitlines()), timeout=10, interval=0.02,
                 what="m3 answered")
        assert _isr(cluster, topic, 1) == [1, 2, 3], "the ISR shrank before m3 was read: the scenario did not happen"
        # The answers come in order once the ISR shrinks; the producer's next attempts are refused (ISR [1]).
        wait_for(lambda: f"NOT_ENOUGH_REPLICAS for {topic}-0: the ISR [1] " in leader.log(), timeout=60,
                 what="the producer's attempts after the answers")
    finally:
        cluster.resume(2)
        cluster.resume(3)
    assert producer.flush(60) == 0
    assert not errors, errors
    seen = read_all(leader.bootstrap, topic, 1)
    twice = {v: where for v, where in seen.items() if len(where) > 1}
    assert not twice, f"appended twice: {twice}"
    assert sorted(seen) == [b"m0", b"m1", b"m2", b"m3"]
    assert acked == {v: where[0][1] for v, where in seen.items()}
    wait_for(lambda: _isr(cluster, topic, 1) == [1, 2, 3], timeout=60, what="the followers to rejoin")
