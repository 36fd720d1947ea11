"""A broker whose wall clock steps (an NTP step: CLOCK_REALTIME jumps, CLOCK_MONOTONIC does not) keeps its
groups' session timeouts: they are measured on the monotonic clock, as Kafka's timers are, so a step forward
expires nobody and a step back does not keep a dead member in its group. LogAppendTime follows the wall clock
(that is what it is), and the time index keeps its largest timestamp when the clock goes back.

The broker runs under Debian's libfaketime (tests/support/faketime.py)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from tests.integration.conftest import BrokerFactory, RawConnection, create_topic, make_producer, wait_until
from tests.support.faketime import WallClock

JUMP_S = 120.0
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
SESSION_MS = 6000


def _join_and_sync(conn: RawConnection, group: str) -> str:
    """A classic-protocol member that joins, syncs and then never heartbeats (a client that died)."""
    def join() -> Any:
        conn.request(10, 0, {"key": group}, 20)  # FindCoordinator: creates and loads __consumer_offsets
        joined = conn.request(11, 3, {"group_id": group, "session_timeout": SESSION_MS,
                                      "rebalance_timeout": SESSION_MS, "member_id": "", "protocol_type": "consumer",
                                      "protocols": [{"name": "range", "metadata": b""}]}, 21)
        if int(joined.error_code) in (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE):
            return None
        return joined
    joined = wait_until(join, timeout=30, interval=0.2, what="the group coordinator loaded")
    assert int(joined.error_code) == 0, joined
    synced = conn.request(14, 1, {"group_id": group, "generation_id": joined.generation_id,
                                  "member_id": joined.member_id,
                                  "assignments": [{"member_id": joined.member_id, "assignment": b""}]}, 22)
    assert int(synced.error_code) == 0, synced
    return str(joined.member_id)


def _members(conn: RawConnection, group: str, correlation_id: int) -> list[str]:
    described = conn.request(15, 0, {"groups": [group]}, correlation_id)
    return [str(m.member_id) for m in described.groups[0].members]


def test_group_sessions_ignore_wall_clock_steps(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    clock = WallClock(tmp_path / "faketime")
    b = broker_factory({"group.min.session.timeout.ms": "1000"}, start=False)
    clock.attach(b)
    b.start()
    topic = f"clock-{uuid.uuid4().hex[:8]}"
    create_topic(b, topic, partitions=2, config={"message.timestamp.type": "LogAppendTime"})

    # The step really reaches the broker: LogAppendTime is its wall clock.
    clock.set(JUMP_S)
    stamps: list[int] = []
    producer = make_producer(b)
    producer.produce(topic, b"ahead", partition=0, on_delivery=lambda e, m: stamps.append(m.timestamp()[1]))
    assert producer.flush(20) == 0
    assert abs(stamps[0] / 1000 - (time.time() + JUMP_S)) < 10, (stamps, time.time())

    # A member that stops heartbeating is expired one session timeout later, though the clock stepped back
    # since its last heartbeat.
    group = f"dead-{uuid.uuid4().hex[:8]}"
    with RawConnection(b) as conn:
        member = _join_and_sync(conn, group)
        clock.set(-JUMP_S)
        assert _members(conn, group, 23) == [member]
        wait_until(lambda: not _members(conn, group, 24), timeout=SESSION_MS / 1000 + 8, interval=0.5,
                   what="the silent member expired after its session timeout")

    # A live member stays in its group when the clock steps forward past its session timeout.
    events: list[str] = []
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4",
                         "group.id": f"live-{uuid.uuid4().hex[:8]}", "session.timeout.ms": SESSION_MS,
                         "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic], on_assign=lambda _c, ps: events.append("assign"),
                           on_revoke=lambda _c, ps: events.append("revoke"),
                           on_lost=lambda _c, ps: events.append("lost"))
        wait_until(lambda: consumer.poll(0.2) is not None and "assign" in events, timeout=30,
                   what="the consumer assigned and reading")
        clock.set(JUMP_S)
        deadline = time.monotonic() + 4 * 500 / 1000 + 2  # several heartbeats and timer ticks after the step
        for _ in range(100):
            if time.monotonic() >= deadline:
                break
            consumer.poll(0.1)
        assert events == ["assign"], events
        assert [tp.partition for tp in consumer.assignment()] == [0, 1]
    finally:
        consumer.close()

    # The time index keeps the largest timestamp: a record stamped after the step back does not lower it.
    clock.set(-JUMP_S)
    producer.produce(topic, b"behind", partition=0)
    assert producer.flush(20) == 0
    with RawConnection(b) as conn:
        latest = conn.request(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                            "timestamp": -3}]}]}, 31)  # MAX_TIMESTAMP
        part = latest.topics[0].partitions[0]
        assert (int(part.error_code), int(part.offset), int(part.timestamp)) == (0, 0, stamps[0])
