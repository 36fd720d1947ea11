"""Delayed delivery (docs/queues.md "Delayed delivery", "In a ZooKeeper cluster") with three brokers.

confluent-kafka produces records with delay headers to a replicated topic whose partitions are led by
different brokers; each leader either schedules them in the ``__delayed_records`` partition it leads or
forwards them to that partition's leader, which delivers them when due. A consumer must see every record
once, never before its due time, with its headers, also when the leader of a ``__delayed_records``
partition or of a target partition is killed with SIGKILL while records wait or fall due.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pykbroker.coordinator.internal_topic import partition_for
from pykbroker.protocol.records import build_batch
from tests.support.cluster import Cluster, raw_request, wait_for

pytestmark = [pytest.mark.timeout(600)]

DELAYED = "__delayed_records"
DELAYED_PARTITIONS = 8
PARTITIONS = 3
TIMEOUT = 30
DELAY = {"pykbroker.delay.enable": "true", "min.insync.replicas": "2"}
# How late a record may appear after its due time with every broker up (timer, intent and batch
# replication, consumer long poll) on this shared 2-core machine running three brokers.
LATE_S = 3.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("delay-cluster"), 3, overrides=DELAY)
    with c:
        c.wait_leaders(DELAYED, DELAYED_PARTITIONS, timeout=60)
        yield c


def healthy(cluster: Cluster) -> None:
    """Every broker running and registered, every partition of __delayed_records led (a test may kill one)."""
    for i, b in cluster.brokers.items():
        if i not in cluster.running():
            b.start()
    cluster.wait_registered(list(cluster.brokers), timeout=60)
    cluster.wait_leaders(DELAYED, DELAYED_PARTITIONS, timeout=60)


def delayed_leader(cluster: Cluster, topic: str, partition: int) -> int:
    """The broker delivering this target's delayed records: the leader of its __delayed_records partition."""
    return cluster.leaders(DELAYED)[partition_for(f"{topic}-{partition}", DELAYED_PARTITIONS)]


def create_topic(cluster: Cluster, *, forwarded: bool = True) -> str:
    """An RF 3 topic with 3 partitions; with ``forwarded``, one whose delayed records are scheduled both
    on the target's leader and forwarded to another broker (tried with a few names, bounded)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4"})
    for _ in range(10):
        topic = f"delay-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, PARTITIONS, 3)])[topic].result(timeout=TIMEOUT)
        leaders = cluster.wait_leaders(topic, PARTITIONS, timeout=60)
        remote = [leaders[i] != delayed_leader(cluster, topic, i) for i in range(PARTITIONS)]
        if not forwarded or (any(remote) and len(set(leaders.values())) > 1):
            return topic
    raise AssertionError("no topic whose delayed records are forwarded in 10 tries")


def produce(cluster: Cluster, topic: str, delays: dict[int, list[int]]) -> dict[bytes, tuple[int, int]]:
    """Records with a pykbroker.delay.ms header (every 5th with pykbroker.deliver.at.ms) and one header of
    their own; key -> (partition, due ms)."""
    p = Producer({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4", "acks": "all",
                  "linger.ms": 5, "message.timeout.ms": 60_000})
    errors: list[Any] = []
    due: dict[bytes, tuple[int, int]] = {}
    for partition, ms_list in delays.items():
        for n, ms in enumerate(ms_list):
            key = b"p%d-%d" % (partition, n)
            ts = now_ms()
            if n % 5 == 4:
                headers = [("pykbroker.deliver.at.ms", str(ts + ms).encode()), ("own", key)]
            else:
                headers = [("pykbroker.delay.ms", str(ms).encode()), ("own", key)]
            due[key] = (partition, ts + ms)
            p.produce(topic, key=key, value=b"v" + key, partition=partition, timestamp=ts, headers=headers,
                      on_delivery=lambda err, _m: errors.append(err) if err is not None else None)
    assert p.flush(60) == 0
    assert errors == []
    return due


def consume(cluster: Cluster, topic: str, expected: int, timeout: float) -> list[tuple[int, Any]]:
    """Every record of ``topic`` from the start until ``expected`` arrived (bounded), plus a grace period
    for extras; each with the wall-clock ms it arrived at."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4",
                  "group.id": f"g-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False, "fetch.wait.max.ms": 50,
                  "topic.metadata.refresh.interval.ms": 1000})
    out: list[tuple[int, Any]] = []
    try:
        c.assign([TopicPartition(topic, i, 0) for i in range(PARTITIONS)])
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.05) + 100):
            if len(out) >= expected or time.monotonic() >= deadline:
                break
            for m in c.consume(num_messages=500, timeout=0.05):
                if m.error() is None:
                    out.append((now_ms(), m))
        grace = time.monotonic() + 3
        for _ in range(100):
            if time.monotonic() >= grace:
                break
            out.extend((now_ms(), m) for m in c.consume(num_messages=500, timeout=0.1) if m.error() is None)
    finally:
        c.close()
    return out


def check(arrivals: list[tuple[int, Any]], due: dict[bytes, tuple[int, int]], late_s: float) -> None:
    got = [m.key() for _, m in arrivals]
    missing = sorted(set(due) - set(got))
    doubled = sorted({k for k in got if got.count(k) > 1})
    assert not missing and not doubled and len(got) == len(due), f"missing {missing}, doubled {doubled}"
    per_partition: dict[int, list[int]] = {}
    for at, m in arrivals:
        partition, d = due[m.key()]
        assert m.partition() == partition
        assert at >= d, f"{m.key()!r} arrived {d - at} ms before its due time"
        assert at - d <= late_s * 1000, f"{m.key()!r} arrived {at - d} ms after its due time"
        assert m.value() == b"v" + m.key() and dict(m.headers())["own"] == m.key()
        per_partition.setdefault(partition, []).append(d)
    for partition, dues in per_partition.items():  # arrival order in a partition is offset order
        assert dues == sorted(dues), f"partition {partition}: not in due order"


def test_delayed_records_through_every_broker_on_time_once(cluster: Cluster) -> None:
    healthy(cluster)
    topic = create_topic(cluster)
    leaders = cluster.leaders(topic)
    delays = {i: [1500 + (n * 397) % 4000 for n in range(20)] for i in range(PARTITIONS)}
    due = produce(cluster, topic, delays)
    check(consume(cluster, topic, len(due), timeout=40), due, LATE_S)
    assert len(set(leaders.values())) > 1


def test_kill_delayed_records_leader_with_records_scheduled(cluster: Cluster) -> None:
    healthy(cluster)
    topic = create_topic(cluster)
    delays = {i: [3000 + (n * 577) % 9000 for n in range(30)] for i in range(PARTITIONS)}
    # The broker leading the __delayed_records partition of a target it does not lead itself.
    leaders = cluster.leaders(topic)
    victim = next((delayed_leader(cluster, topic, i) for i in range(PARTITIONS)
                   if delayed_leader(cluster, topic, i) != leaders[i]), delayed_leader(cluster, topic, 0))
    due = produce(cluster, topic, delays)
    first_due = min(d for _, d in due.values())
    time.sleep(max(0.0, (first_due - now_ms()) / 1000 + 1.0))  # some delivered, most still waiting
    cluster.kill(victim)
    # Records due while it is down are delivered by the new leader once it has taken over (ZooKeeper
    # session expiry, then replay): late, but never early, lost or doubled.
    arrivals = consume(cluster, topic, len(due), timeout=60)
    cluster.broker(victim).start()
    check(arrivals, due, late_s=30)
    healthy(cluster)


def test_kill_target_leader_while_deliveries_are_due(cluster: Cluster) -> None:
    healthy(cluster)
    topic = create_topic(cluster)
    delays = {i: [2000 + (n * 113) % 9000 for n in range(60)] for i in range(PARTITIONS)}
    leaders = cluster.leaders(topic)
    # A target leader that does not lead the target's __delayed_records partition: deliveries to it are
    # remote produces that fail mid-stream and must go to the new leader exactly once.
    victim = next((leaders[i] for i in range(PARTITIONS) if delayed_leader(cluster, topic, i) != leaders[i]),
                  leaders[0])
    due = produce(cluster, topic, delays)
    first_due = min(d for _, d in due.values())
    time.sleep(max(0.0, (first_due - now_ms()) / 1000 + 2.0))  # deliveries are under way
    cluster.kill(victim)
    wait_for(lambda: all(v != victim for v in cluster.leaders(topic, via=next(
        i for i in cluster.running())).values()), timeout=60, what="new target leaders")
    arrivals = consume(cluster, topic, len(due), timeout=60)
    cluster.broker(victim).start()
    check(arrivals, due, late_s=30)
    healthy(cluster)


def test_new_leader_settles_the_delivery_in_flight(cluster: Cluster) -> None:
    """The leader of a __delayed_records partition dies while its delivery to a (paused) target leader is
    in flight: its successor re-sends exactly that batch, which the target appends once."""
    healthy(cluster)
    topic = create_topic(cluster)
    leaders = cluster.leaders(topic)
    i = next(i for i in range(PARTITIONS) if delayed_leader(cluster, topic, i) != leaders[i])
    deliverer, target = delayed_leader(cluster, topic, i), leaders[i]
    delays = {p: [2000 + n * 100 for n in range(60)] for p in range(PARTITIONS)}
    due = produce(cluster, topic, delays)
    first_due = min(d for _, d in due.values())
    time.sleep(max(0.0, (first_due - now_ms()) / 1000 + 1.0))  # deliveries are under way
    cluster.pause(target)  # the next delivery to it hangs
    time.sleep(1.5)
    cluster.kill(deliverer)
    time.sleep(2.0)
    cluster.resume(target)
    cluster.broker(deliverer).start()
    arrivals = consume(cluster, topic, len(due), timeout=90)
    check(arrivals, due, late_s=60)
    logs = "\n".join(cluster.broker(b).log() for b in cluster.brokers)
    assert re.search(r"[1-9]\d* delivery\(ies\) to settle", logs), "no delivery was in flight at the takeover"
    healthy(cluster)


def test_idempotent_producer_with_forwarded_batches(cluster: Cluster) -> None:
    """An idempotent producer's delayed batches are scheduled whole, forwarded where another broker leads
    their __delayed_records partition; its later batches stay in sequence and nothing comes twice."""
    healthy(cluster)
    topic = create_topic(cluster)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "broker.address.family": "v4", "enable.idempotence": True,
                  "linger.ms": 5})
    errors: list[Any] = []
    due: dict[bytes, tuple[int, int]] = {}
    for rnd in range(3):
        for partition in range(PARTITIONS):
            ts = now_ms()
            for n in range(5):
                key = b"r%d-p%d-%d" % (rnd, partition, n)
                delayed = rnd == 1 and n % 2 == 0
                headers = [("own", key)] + ([("pykbroker.delay.ms", b"2500")] if delayed else [])
                due[key] = (partition, ts + 2500 if delayed else ts)
                p.produce(topic, key=key, value=b"v" + key, partition=partition, timestamp=ts, headers=headers,
                          on_delivery=lambda err, _m: errors.append(err) if err is not None else None)
        assert p.flush(60) == 0
    assert errors == []
    arrivals = consume(cluster, topic, len(due), timeout=40)
    got = [m.key() for _, m in arrivals]
    assert sorted(got) == sorted(due), f"expected each once, got {sorted(got)}"
    for at, m in arrivals:
        partition, d = due[m.key()]
        assert m.partition() == partition and at >= d, f"{m.key()!r} early or misplaced"
        assert at - d <= LATE_S * 1000 + 2500, f"{m.key()!r} arrived {at - d} ms after its due time"


def test_idempotent_retry_after_a_target_failover_is_scheduled_once(cluster: Cluster) -> None:
    """An idempotent batch scheduled whole (its records forwarded), then retried on the target's new leader
    after the old one died: the leader of __delayed_records knows it, so it is scheduled once, and the
    producer's next batch is in sequence on the new leader."""
    healthy(cluster)
    topic = create_topic(cluster)
    leaders = cluster.leaders(topic)
    i = next(i for i in range(PARTITIONS) if delayed_leader(cluster, topic, i) != leaders[i])
    victim = leaders[i]
    pid, ts = 777_000 + int(uuid.uuid4().int % 1000), now_ms()
    delayed = build_batch([(b"late", b"v", [("pykbroker.delay.ms", b"8000"), ("own", b"late")])], timestamp_ms=ts,
                          producer_id=pid, producer_epoch=0, base_sequence=0)

    def send(broker: int, batch: bytes) -> Any:
        body = {"transactional_id": None, "acks": -1, "timeout": 10_000,
                "topic_data": [{"name": topic, "partition_data": [{"index": i, "records": batch}]}]}
        return raw_request(cluster.broker(broker).bootstrap, 0, 9, body).responses[0].partition_responses[0]

    first = send(victim, delayed)
    assert first.error_code == 0 and first.base_offset == -1
    cluster.kill(victim)
    survivor = next(b for b in cluster.running())

    def new_leader() -> int | None:
        leader = cluster.leaders(topic, via=survivor)[i]
        return leader if leader not in (victim, -1) else None

    leader = wait_for(new_leader, timeout=60, what="a new target leader")

    def retried() -> Any:
        try:
            r = send(leader, delayed)
        except OSError:
            return None
        return r if r.error_code == 0 else None  # NOT_LEADER / NOT_ENOUGH_REPLICAS until it has settled

    retry = wait_for(retried, timeout=30, what="the retry accepted")
    assert retry.base_offset == -1
    after = build_batch([(b"next", b"v", [("own", b"next")])], timestamp_ms=now_ms(), producer_id=pid,
                        producer_epoch=0, base_sequence=1)
    assert send(leader, after).error_code == 0
    cluster.broker(victim).start()
    arrivals = consume(cluster, topic, 2, timeout=30)
    got = [m.key() for _, m in arrivals]
    assert sorted(got) == [b"late", b"next"], got
    late_at = next(at for at, m in arrivals if m.key() == b"late")
    assert late_at >= ts + 8000
    healthy(cluster)
