"""Consumer groups with real clients: confluent-kafka, kafka-python, aiokafka and the AdminClient."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess

GROUP_OVERRIDES = {
    "group.min.session.timeout.ms": "1000",
    "offsets.topic.num.partitions": "5",
    "group.initial.rebalance.delay.ms": "0",
    "group.consumer.session.timeout.ms": "3000",
    "group.consumer.heartbeat.interval.ms": "300",
}
SESSION_MS = 3000


@pytest.fixture
def gbroker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", overrides=GROUP_OVERRIDES)
    b.start()
    try:
        yield b
    finally:
        b.kill()


def _topic(b: BrokerProcess, partitions: int = 6) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)
    return name


def _produce(b: BrokerProcess, topic: str, n: int, partitions: int = 6, start: int = 0) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    for i in range(start, start + n):
        p.produce(topic, key=str(i).encode(), value=str(i).encode(), partition=i % partitions)
    assert p.flush(15) == 0


def _consumer(b: BrokerProcess, group: str, protocol: str = "classic", **extra: Any) -> Consumer:
    conf: dict[str, Any] = {"bootstrap.servers": b.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, "topic.metadata.refresh.interval.ms": 1000}
    if protocol == "consumer":
        # KIP-848: timeouts and assignors are the broker's business.
        conf["group.protocol"] = "consumer"
    else:
        conf.update({"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 300})
    conf.update(extra)
    return Consumer(conf)


def _wait(pred: Callable[[], bool], timeout: float, poll: Callable[[], None] | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if poll is not None:
            poll()
        if pred():
            return
        if poll is None:
            time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _poll_all(consumers: list[Consumer], sink: dict[int, list[bytes]] | None = None) -> Callable[[], None]:
    def poll() -> None:
        for i, c in enumerate(consumers):
            m = c.poll(0.05)
            if m is not None and not m.error() and sink is not None:
                sink.setdefault(i, []).append(m.value())
    return poll


def _parts(c: Consumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


WORKER = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Consumer
    bootstrap, group, topic, protocol = sys.argv[1:5]
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False}
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"
    else:
        conf.update({"session.timeout.ms": SESSION, "heartbeat.interval.ms": 300})
    c = Consumer(conf)
    c.subscribe([topic])
    while True:
        m = c.poll(0.1)
        if m is None or m.error():
            continue
        print("MSG", m.partition(), m.value().decode(), flush=True)
        c.commit(message=m, asynchronous=False)
""").replace("SESSION", str(SESSION_MS))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_three_consumers_split_failover_and_leave(gbroker: BrokerProcess, protocol: str) -> None:
    """Three consumers get two partitions each; a SIGKILLed one's partitions move after the session timeout."""
    topic = _topic(gbroker)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _produce(gbroker, topic, 60)
    worker = subprocess.Popen([sys.executable, "-c", WORKER, gbroker.bootstrap, group, topic, protocol],
                              stdout=subprocess.PIPE, text=True)
    try:
        consumers = [_consumer(gbroker, group, protocol) for _ in range(2)]
        for c in consumers:
            c.subscribe([topic])
        got: dict[int, list[bytes]] = {}
        poll = _poll_all(consumers, got)
        _wait(lambda: [len(_parts(c)) for c in consumers] == [2, 2], 30, poll, "2+2+2 assignment")
        time.sleep(1.0)  # let the worker read something
        # Kill the worker: no LeaveGroup, its partitions move only after the session timeout.
        worker.kill()
        worker.wait(10)
        killed_at = time.monotonic()
        _wait(lambda: sorted(len(_parts(c)) for c in consumers) == [3, 3], 30, poll, "failover")
        failover_s = time.monotonic() - killed_at
        assert failover_s >= SESSION_MS / 1000 - 0.5, failover_s
        worker_msgs = [line.split()[2] for line in (worker.stdout.read() if worker.stdout else "").splitlines()
                       if line.startswith("MSG")]
        # Everything is read by someone: what the worker committed is not redelivered, the rest is.
        def seen() -> set[str]:
            return {v.decode() for vs in got.values() for v in vs} | set(worker_msgs)
        _wait(lambda: seen() >= {str(i) for i in range(60)}, 30, poll, "all messages")
        # A graceful leave (LeaveGroup) rebalances without waiting for the session timeout.
        consumers[1].close()
        left_at = time.monotonic()
        _wait(lambda: len(_parts(consumers[0])) == 6, 20, _poll_all(consumers[:1]), "leave rebalance")
        leave_s = time.monotonic() - left_at
        assert leave_s < SESSION_MS / 1000, leave_s
        print(f"REBALANCE protocol={protocol} failover_after_kill={failover_s:.2f}s after_leave={leave_s:.2f}s")
        consumers[0].close()
    finally:
        worker.kill()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_assignors(gbroker: BrokerProcess, assignor: str) -> None:
    topic = _topic(gbroker)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _produce(gbroker, topic, 30)
    revoked: list[list[int]] = []

    def on_revoke(_c: Consumer, parts: list[TopicPartition]) -> None:
        revoked.append([p.partition for p in parts])

    a = _consumer(gbroker, group, **{"partition.assignment.strategy": assignor})
    a.subscribe([topic], on_revoke=on_revoke)
    _wait(lambda: len(_parts(a)) == 6, 30, _poll_all([a]), "first assignment")
    b = _consumer(gbroker, group, **{"partition.assignment.strategy": assignor})
    b.subscribe([topic])
    both = [a, b]
    _wait(lambda: len(_parts(a)) == 3 and len(_parts(b)) == 3, 30, _poll_all(both), "3+3")
    assert _parts(a) | _parts(b) == set(range(6)) and not (_parts(a) & _parts(b))
    if assignor == "cooperative-sticky":
        # Incremental: a only gave up the three partitions that moved, never all six.
        assert all(len(r) <= 3 for r in revoked), revoked
    for c in both:
        c.close()


@pytest.mark.timeout(120)
def test_static_member_restart_without_rebalance(gbroker: BrokerProcess) -> None:
    topic = _topic(gbroker)
    group = f"g-{uuid.uuid4().hex[:8]}"
    events: list[str] = []
    a = _consumer(gbroker, group, **{"group.instance.id": "static-a", "session.timeout.ms": 6000})
    a.subscribe([topic], on_revoke=lambda _c, p: events.append("revoke"),
                on_assign=lambda _c, p: events.append("assign"))
    b = _consumer(gbroker, group, **{"group.instance.id": "static-b", "session.timeout.ms": 6000})
    b.subscribe([topic])
    both = [a, b]
    _wait(lambda: len(_parts(a)) == 3 and len(_parts(b)) == 3, 30, _poll_all(both), "3+3")
    before_b = _parts(b)
    events.clear()
    b.close()  # a static member sends no LeaveGroup
    b = _consumer(gbroker, group, **{"group.instance.id": "static-b", "session.timeout.ms": 6000})
    b.subscribe([topic])
    _wait(lambda: len(_parts(b)) == 3, 20, _poll_all([a, b]), "static member back")
    assert _parts(b) == before_b
    # Keep polling a while: a sees no rebalance at all.
    end = time.monotonic() + 2
    while time.monotonic() < end:
        _poll_all([a, b])()
    assert events == [], events
    a.close()
    b.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("how", "protocol"), [("stop", "classic"), ("kill", "classic"), ("kill", "consumer")])
def test_commit_survives_consumer_and_broker_restart(tmp_path: Path, how: str, protocol: str) -> None:
    b = BrokerProcess(tmp_path / "broker", overrides=GROUP_OVERRIDES).start()
    try:
        topic = _topic(b, 3)
        group = f"g-{uuid.uuid4().hex[:8]}"
        _produce(b, topic, 30, 3)
        c = _consumer(b, group, protocol)
        c.subscribe([topic])
        got: list[Any] = []

        def poll() -> None:
            m = c.poll(0.1)
            if m is not None and not m.error():
                got.append(m)
        _wait(lambda: len(got) >= 12, 30, poll, "some messages")
        commits = {}
        for m in got:
            commits[m.partition()] = m.offset() + 1
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in commits.items()], asynchronous=False)
        c.close()
        if how == "kill":
            b.kill()
            b.start()
        else:
            b.restart()
        c2 = _consumer(b, group, protocol)
        committed = {}

        def fetched() -> bool:
            try:
                res = c2.committed([TopicPartition(topic, p) for p in range(3)], timeout=5)
            except KafkaException:
                return False
            committed.update({tp.partition: tp.offset for tp in res})
            return all(committed.get(p) == o for p, o in commits.items())
        _wait(fetched, 30, None, "committed offsets after restart")
        c2.subscribe([topic])
        first: dict[int, int] = {}

        def poll2() -> None:
            m = c2.poll(0.1)
            if m is not None and not m.error():
                first.setdefault(m.partition(), m.offset())
        unfinished = {p for p in range(3) if commits.get(p, 0) < 10}
        _wait(lambda: set(first) >= unfinished, 30, poll2, "resume")
        for p in unfinished:
            assert first[p] == commits.get(p, 0), (p, first, commits)
        c2.close()
    finally:
        b.kill()


@pytest.mark.timeout(120)
def test_kafka_python_aiokafka_and_two_groups(gbroker: BrokerProcess) -> None:
    from kafka import KafkaConsumer

    topic = _topic(gbroker, 4)
    _produce(gbroker, topic, 40, 4)
    g1, g2 = f"kp-{uuid.uuid4().hex[:6]}", f"aio-{uuid.uuid4().hex[:6]}"
    # Group 1: kafka-python, two members.
    kcs = [KafkaConsumer(topic, bootstrap_servers=gbroker.bootstrap, group_id=g1, auto_offset_reset="earliest",
                         session_timeout_ms=6000, heartbeat_interval_ms=500, consumer_timeout_ms=500)
           for _ in range(2)]
    seen1: set[bytes] = set()
    deadline = time.monotonic() + 40
    while len(seen1) < 40 and time.monotonic() < deadline:
        for kc in kcs:
            for recs in kc.poll(timeout_ms=200).values():
                seen1.update(r.value for r in recs)
    assert len(seen1) == 40
    assert sum(len(kc.assignment()) for kc in kcs) == 4
    for kc in kcs:
        kc.commit()
        kc.close()

    # Group 2: aiokafka reads everything too, independently of group 1.
    async def aio() -> set[bytes]:
        from aiokafka import AIOKafkaConsumer
        c = AIOKafkaConsumer(topic, bootstrap_servers=gbroker.bootstrap, group_id=g2, auto_offset_reset="earliest",
                             session_timeout_ms=6000, heartbeat_interval_ms=500)
        await c.start()
        seen: set[bytes] = set()
        try:
            end = time.monotonic() + 40
            while len(seen) < 40 and time.monotonic() < end:
                batch = await c.getmany(timeout_ms=500)
                for recs in batch.values():
                    seen.update(r.value for r in recs if r.value is not None)
            await c.commit()
        finally:
            await c.stop()
        return seen

    assert len(asyncio.run(aio())) == 40
    # Both groups committed their position at the end of every partition.
    c = _consumer(gbroker, g1)
    for g in (g1, g2):
        c2 = _consumer(gbroker, g)
        offs = c2.committed([TopicPartition(topic, p) for p in range(4)], timeout=10)
        assert [tp.offset for tp in offs] == [10, 10, 10, 10], (g, offs)
        c2.close()
    c.close()


@pytest.mark.timeout(120)
def test_admin_client_group_operations(gbroker: BrokerProcess) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions

    topic = _topic(gbroker, 3)
    _produce(gbroker, topic, 30, 3)
    group = f"g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": gbroker.bootstrap})
    c = _consumer(gbroker, group, **{"client.id": "the-client"})
    c.subscribe([topic])
    _wait(lambda: len(_parts(c)) == 3, 30, _poll_all([c]), "assignment")
    c.commit(offsets=[TopicPartition(topic, 0, 4), TopicPartition(topic, 1, 10)], asynchronous=False)

    listed = admin.list_consumer_groups().result(10)
    ids = {g.group_id: g for g in listed.valid}
    assert group in ids and str(ids[group].state).endswith("STABLE")
    desc = admin.describe_consumer_groups([group])[group].result(10)
    assert str(desc.state).endswith("STABLE") and desc.partition_assignor == "range"
    assert len(desc.members) == 1 and desc.members[0].client_id == "the-client"
    assert {tp.partition for tp in desc.members[0].assignment.topic_partitions} == {0, 1, 2}

    offs = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    committed = {tp.partition: tp.offset for tp in offs.topic_partitions}
    assert committed == {0: 4, 1: 10}
    # Lag = end offset - committed offset.
    _lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    assert hi - committed[0] == 6

    # A non-empty group can be neither altered nor deleted.
    res = admin.delete_consumer_groups([group])[group]
    with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
        res.result(10)
    c.close()
    fut = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 2, 7)])])[group]
    fut.result(10)
    offs = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    assert {tp.partition: tp.offset for tp in offs.topic_partitions} == {0: 4, 1: 10, 2: 7}
    listed = admin.list_consumer_groups().result(10)
    assert str({g.group_id: g for g in listed.valid}[group].state).endswith("EMPTY")
    admin.delete_consumer_groups([group])[group].result(10)
    assert group not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    offs = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    assert all(tp.offset < 0 for tp in offs.topic_partitions)


@pytest.mark.timeout(60)
def test_simple_assign_commits(gbroker: BrokerProcess) -> None:
    """assign() plus commits without group membership, as Spark does."""
    topic = _topic(gbroker, 2)
    _produce(gbroker, topic, 10, 2)
    group = f"spark-{uuid.uuid4().hex[:6]}"
    c = _consumer(gbroker, group)
    c.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    n = 0
    end = time.monotonic() + 20
    while n < 10 and time.monotonic() < end:
        m = c.poll(0.2)
        if m is not None and not m.error():
            n += 1
    c.commit(offsets=[TopicPartition(topic, 0, 5), TopicPartition(topic, 1, 3)], asynchronous=False)
    res = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=10)
    assert [tp.offset for tp in res] == [5, 3]
    c.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_topic_gains_partitions_while_stable(gbroker: BrokerProcess, protocol: str) -> None:
    from confluent_kafka.admin import NewPartitions

    topic = _topic(gbroker, 2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    cs = [_consumer(gbroker, group, protocol) for _ in range(2)]
    for c in cs:
        c.subscribe([topic])
    _wait(lambda: [len(_parts(c)) for c in cs] == [1, 1], 30, _poll_all(cs), "1+1")
    admin = AdminClient({"bootstrap.servers": gbroker.bootstrap})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(10)
    _wait(lambda: [len(_parts(c)) for c in cs] == [2, 2], 30, _poll_all(cs), "2+2 after growth")
    assert _parts(cs[0]) | _parts(cs[1]) == {0, 1, 2, 3}
    _produce(gbroker, topic, 8, 4)
    got: dict[int, list[bytes]] = {}
    _wait(lambda: sum(len(v) for v in got.values()) >= 8, 30, _poll_all(cs, got), "messages on new partitions")
    for c in cs:
        c.close()


@pytest.mark.timeout(60)
def test_consumer_protocol_describe(gbroker: BrokerProcess) -> None:
    topic = _topic(gbroker, 3)
    group = f"g-{uuid.uuid4().hex[:8]}"
    c = _consumer(gbroker, group, "consumer", **{"client.id": "kip848"})
    c.subscribe([topic])
    _wait(lambda: len(_parts(c)) == 3, 30, _poll_all([c]), "assignment")
    admin = AdminClient({"bootstrap.servers": gbroker.bootstrap})
    listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
    assert group in listed
    desc = admin.describe_consumer_groups([group])[group].result(10)
    assert len(desc.members) == 1 and desc.members[0].client_id == "kip848"
    assert {tp.partition for tp in desc.members[0].assignment.topic_partitions} == {0, 1, 2}
    c.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["stop", "kill"])
def test_consumer_protocol_member_survives_broker_restart(tmp_path: Path, how: str) -> None:
    """KIP-848 state is in __consumer_offsets: after a restart the member keeps its id, epoch and partitions."""
    b = BrokerProcess(tmp_path / "broker", overrides=GROUP_OVERRIDES).start()
    try:
        topic = _topic(b, 4)
        group = f"g-{uuid.uuid4().hex[:8]}"
        _produce(b, topic, 20, 4)
        events: list[str] = []
        c = _consumer(b, group, "consumer")
        c.subscribe([topic], on_assign=lambda _c, p: events.append(f"assign {len(p)}"),
                    on_revoke=lambda _c, p: events.append(f"revoke {len(p)}"),
                    on_lost=lambda _c, p: events.append(f"lost {len(p)}"))
        got: list[Any] = []

        def poll() -> None:
            m = c.poll(0.1)
            if m is not None and not m.error():
                got.append(m)
                c.commit(message=m, asynchronous=False)
        _wait(lambda: len(got) >= 20, 30, poll, "first messages")
        member_id = c.memberid()
        assert member_id and _parts(c) == {0, 1, 2, 3}
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        epoch_before = admin.describe_consumer_groups([group])[group].result(10)
        events.clear()
        if how == "kill":
            b.kill()
        else:
            b.stop()
        b.start()
        _produce(b, topic, 20, 4, start=20)
        _wait(lambda: len(got) >= 40, 40, poll, "messages after the restart")
        # Keep heartbeating a few intervals: nothing is revoked, lost or reassigned.
        end = time.monotonic() + 2
        while time.monotonic() < end:
            poll()
        assert events == [], events
        assert c.memberid() == member_id and _parts(c) == {0, 1, 2, 3}
        # Every message exactly once: consumption resumed at the committed offsets.
        values = sorted(int(m.value()) for m in got)
        assert values == list(range(40)), values
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        desc = admin.describe_consumer_groups([group])[group].result(10)
        assert [m.member_id for m in desc.members] == [member_id]
        assert len(epoch_before.members) == 1
        c.close()
    finally:
        b.kill()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_mixed_group_online_upgrade_and_downgrade(gbroker: BrokerProcess, assignor: str) -> None:
    """Kafka 4.0 migration: a classic group upgrades when a consumer-protocol member joins, and back."""
    topic = _topic(gbroker, 4)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _produce(gbroker, topic, 40, 4)
    classic = _consumer(gbroker, group, "classic", **{"partition.assignment.strategy": assignor})
    classic.subscribe([topic])
    got: dict[int, list[bytes]] = {}
    _wait(lambda: len(_parts(classic)) == 4, 30, _poll_all([classic], got), "classic member alone")
    admin = AdminClient({"bootstrap.servers": gbroker.bootstrap})

    def group_type() -> str:
        listed = {g.group_id: g for g in admin.list_consumer_groups().result(10).valid}
        t = listed[group].type
        return str(getattr(t, "name", t)).lower()

    assert "classic" in group_type()
    modern = _consumer(gbroker, group, "consumer")
    modern.subscribe([topic])
    both = [classic, modern]
    _wait(lambda: [len(_parts(c)) for c in both] == [2, 2], 40, _poll_all(both, got), "2+2 in the upgraded group")
    assert _parts(classic) | _parts(modern) == {0, 1, 2, 3}
    assert "consumer" in group_type()
    desc = admin.describe_consumer_groups([group])[group].result(10)
    assert len(desc.members) == 2
    _wait(lambda: sum(len(v) for v in got.values()) >= 40, 30, _poll_all(both, got), "all messages")
    # The consumer-protocol member leaves: the group goes back to classic and the classic member takes all.
    modern.close()
    _wait(lambda: len(_parts(classic)) == 4, 40, _poll_all([classic], got), "classic member alone again")
    _wait(lambda: "classic" in group_type(), 10, None, "downgraded group")
    classic.close()


@pytest.mark.timeout(60)
def test_require_stable_offset_fetch_waits_for_the_transaction(gbroker: BrokerProcess) -> None:
    """KIP-447: a read_committed consumer's OffsetFetch(require_stable) sees UNSTABLE_OFFSET_COMMIT until commit."""
    topic = _topic(gbroker, 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    p = Producer({"bootstrap.servers": gbroker.bootstrap, "transactional.id": f"tx-{group}"})
    p.init_transactions(20)
    p.begin_transaction()
    p.produce(topic, value=b"x", partition=0)
    c = _consumer(gbroker, group, "classic", **{"isolation.level": "read_committed"})
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], c.consumer_group_metadata(), 20)
    with pytest.raises(KafkaException) as ei:
        c.committed([TopicPartition(topic, 0)], timeout=2)
    assert "UNSTABLE_OFFSET_COMMIT" in str(ei.value) or "TIMED_OUT" in str(ei.value), ei.value
    p.commit_transaction(20)
    res = c.committed([TopicPartition(topic, 0)], timeout=10)
    assert res[0].offset == 7
    c.close()
