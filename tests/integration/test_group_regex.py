"""KIP-848 regex subscriptions with confluent-kafka (``group.protocol=consumer``) against a broker subprocess.

Kafka 4 resolves a member's ``SubscribedTopicRegex`` off the heartbeat path and assigns from literal
topic names meanwhile; these tests check what a real client sees: a regex subscription converges,
a topic created later that matches is picked up, and a subscription changed many times in a row
settles on the last one within a few heartbeats.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.errors import ErrorCode

from tests.integration.conftest import RawConnection
from tests.support.broker import BrokerProcess

HEARTBEAT_MS = 300
OVERRIDES = {
    "offsets.topic.num.partitions": "3",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.heartbeat.interval.ms": str(HEARTBEAT_MS),
}


@pytest.fixture
def rbroker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", overrides=OVERRIDES)
    b.start()
    try:
        yield b
    finally:
        b.kill()


def _create(b: BrokerProcess, topics: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    futures = admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()])
    for f in futures.values():
        f.result(15)


def _consumer(b: BrokerProcess, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "group.protocol": "consumer",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     })


def _assigned(c: Consumer) -> set[tuple[str, int]]:
    return {(tp.topic, tp.partition) for tp in c.assignment()}


def _wait_assigned(c: Consumer, want: set[tuple[str, int]], timeout: float) -> float:
    """Poll until the assignment is exactly ``want``; returns the seconds it took (bounded)."""
    start = time.monotonic()
    deadline = start + timeout
    for _ in range(int(timeout / 0.05) + 2):
        c.poll(0.05)
        if _assigned(c) == want:
            return time.monotonic() - start
        if time.monotonic() >= deadline:
            break
    raise AssertionError(f"assignment {sorted(_assigned(c))} did not become {sorted(want)} within {timeout}s")


def _parts(topics: dict[str, int], *names: str) -> set[tuple[str, int]]:
    return {(t, p) for t in names for p in range(topics[t])}


class RawMember:
    """A KIP-848 member speaking ConsumerGroupHeartbeat v1 itself: the second client of these tests."""

    def __init__(self, conn: RawConnection, group: str, ids: dict[uuid.UUID, str]) -> None:
        self.conn, self.group, self.ids = conn, group, ids
        self.member_id, self.epoch = uuid.uuid4().hex, 0
        self.owned: dict[uuid.UUID, list[int]] = {}
        self.corr = 0

    def heartbeat(self, names: list[str] | None = None, regex: str | None = None) -> Any:
        self.corr += 1
        r = self.conn.request(68, 1, {
            "group_id": self.group, "member_id": self.member_id, "member_epoch": self.epoch, "instance_id": None,
            "rack_id": None, "rebalance_timeout": 30000 if self.epoch == 0 else -1,
            "subscribed_topic_names": names, "subscribed_topic_regex": regex, "server_assignor": None,
            "topic_partitions": [{"topic_id": t, "partitions": ps} for t, ps in self.owned.items()]},
            correlation_id=self.corr)
        if r.error_code == ErrorCode.none:
            self.epoch = r.member_epoch
            if r.assignment is not None:
                self.owned = {tp.topic_id: sorted(tp.partitions) for tp in r.assignment.topic_partitions
                              if tp.partitions}
        return r

    def topics(self) -> set[tuple[str, int]]:
        return {(self.ids[t], p) for t, ps in self.owned.items() for p in ps}

    def beat_until(self, want: set[tuple[str, int]], timeout: float) -> int:
        """Heartbeat every 100 ms until the member owns ``want``; returns how many heartbeats it took."""
        deadline = time.monotonic() + timeout
        for n in range(1, int(timeout / 0.1) + 2):
            r = self.heartbeat()
            assert r.error_code == ErrorCode.none, r
            if self.topics() == want:
                return n
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        raise AssertionError(f"owns {sorted(self.topics())}, not {sorted(want)}, after {timeout}s")


def _topic_ids(b: BrokerProcess, names: list[str]) -> dict[uuid.UUID, str]:
    with RawConnection(b) as c:
        r = c.request(3, 12, {"topics": [{"topic_id": uuid.UUID(int=0), "name": n} for n in names],
                              "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
    return {t.topic_id: t.name for t in r.topics}


@pytest.mark.timeout(60)
def test_raw_heartbeat_gets_literal_topics_first_then_the_regex(rbroker: BrokerProcess) -> None:
    uid = uuid.uuid4().hex[:8]
    topics = {f"lit-{uid}": 2, f"rx-{uid}-a": 2, f"rx-{uid}-b": 1}
    _create(rbroker, topics)
    ids = _topic_ids(rbroker, list(topics))
    group = f"raw-{uid}"
    with RawConnection(rbroker) as conn:
        m = RawMember(conn, group, ids)
        for _ in range(100):  # the coordinator may still be loading its partition (bounded: 10 s)
            r = m.heartbeat([f"lit-{uid}"], "")
            if r.error_code not in (ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator,
                                    ErrorCode.coordinator_not_available):
                break
            time.sleep(0.1)
        assert r.error_code == ErrorCode.none, r
        m.beat_until(_parts(topics, f"lit-{uid}"), 10)

        # Add a regex: the answer to this very heartbeat comes from the literal topics only.
        r = m.heartbeat([f"lit-{uid}"], f"rx-{uid}-.*")
        assert r.error_code == ErrorCode.none, r
        assert m.topics() == _parts(topics, f"lit-{uid}")
        # A later heartbeat gets the regex's partitions, once the coordinator has resolved it.
        m.beat_until(_parts(topics, f"lit-{uid}", f"rx-{uid}-a", f"rx-{uid}-b"), 10)

        # Regex only, and a regex never seen in this group: this heartbeat revokes everything...
        r = m.heartbeat([], f"rx-{uid}-b")
        assert r.error_code == ErrorCode.none, r
        assert r.assignment is not None and m.topics() == set()
        # ...and the next ones bring the regex's topic.
        m.beat_until(_parts(topics, f"rx-{uid}-b"), 10)

        r = m.heartbeat(None, "rx-(")
        assert r.error_code == ErrorCode.invalid_regular_expression, r
        assert "rx-(" in (r.error_message or "")

        d = conn.request(69, 0, {"group_ids": [group], "include_authorized_operations": False}, correlation_id=999)
        (g,) = d.groups
        assert g.error_code == ErrorCode.none
        (member,) = g.members
        assert member.subscribed_topic_regex == f"rx-{uid}-b" and tuple(member.subscribed_topic_names) == ()
        assert {(tp.topic_name, p) for tp in member.assignment.topic_partitions for p in tp.partitions} == \
            _parts(topics, f"rx-{uid}-b")


@pytest.mark.timeout(90)
def test_regex_subscription_and_topic_created_later(rbroker: BrokerProcess) -> None:
    uid = uuid.uuid4().hex[:8]
    topics = {f"rx-{uid}-a": 2, f"rx-{uid}-b": 3, f"other-{uid}": 2}
    _create(rbroker, topics)
    c = _consumer(rbroker, f"g-{uid}")
    try:
        c.subscribe([f"^rx-{uid}-.*"])
        _wait_assigned(c, _parts(topics, f"rx-{uid}-a", f"rx-{uid}-b"), 20)
        # A topic created later that matches the regex joins the assignment (Kafka resolves the regexes
        # again when the metadata has new topics, at most every 10 s per group); one that does not match
        # is left alone.
        later = {f"rx-{uid}-c": 2, f"nomatch-{uid}": 1}
        _create(rbroker, later)
        topics.update(later)
        _wait_assigned(c, _parts(topics, f"rx-{uid}-a", f"rx-{uid}-b", f"rx-{uid}-c"), 30)
        admin = AdminClient({"bootstrap.servers": rbroker.bootstrap})
        desc = admin.describe_consumer_groups([f"g-{uid}"])[f"g-{uid}"].result(10)
        assert len(desc.members) == 1
        assert {(tp.topic, tp.partition) for tp in desc.members[0].assignment.topic_partitions} == \
            _parts(topics, f"rx-{uid}-a", f"rx-{uid}-b", f"rx-{uid}-c")
    finally:
        c.close()


@pytest.mark.timeout(120)
def test_many_subscription_changes_converge(rbroker: BrokerProcess) -> None:
    """Literal -> regex -> other regex -> literal ... 16 times in a row, without waiting in between;
    after the last change the assignment reaches the last subscription within a few heartbeats."""
    uid = uuid.uuid4().hex[:8]
    topics = {f"lit1-{uid}": 2, f"lit2-{uid}": 3, f"ra-{uid}-x": 2, f"ra-{uid}-y": 1, f"rb-{uid}-z": 4}
    _create(rbroker, topics)
    ra, rb = f"^ra-{uid}-.*", f"^rb-{uid}-.*"
    subscriptions: list[tuple[list[str], set[tuple[str, int]]]] = [
        ([f"lit1-{uid}"], _parts(topics, f"lit1-{uid}")),
        ([ra], _parts(topics, f"ra-{uid}-x", f"ra-{uid}-y")),
        ([rb], _parts(topics, f"rb-{uid}-z")),
        ([f"lit2-{uid}"], _parts(topics, f"lit2-{uid}")),
        ([ra], _parts(topics, f"ra-{uid}-x", f"ra-{uid}-y")),
        ([f"lit1-{uid}", f"lit2-{uid}"], _parts(topics, f"lit1-{uid}", f"lit2-{uid}")),
        ([rb], _parts(topics, f"rb-{uid}-z")),
        ([ra], _parts(topics, f"ra-{uid}-x", f"ra-{uid}-y")),
    ]
    c = _consumer(rbroker, f"g-{uid}")
    try:
        # Settle once, so the changes below start from a member that owns partitions.
        c.subscribe(subscriptions[0][0])
        _wait_assigned(c, subscriptions[0][1], 20)
        sequence = (subscriptions[1:] * 3)[:16]
        for i, (sub, _want) in enumerate(sequence):
            c.subscribe(sub)
            # Vary how long each subscription lives: from a single poll to a few heartbeats.
            for _ in range(1 + (i % 4) * 3):
                c.poll(0.05)
        final = sequence[-1][1]
        took = _wait_assigned(c, final, 20)
        # "A few heartbeats": the regex is resolved off the heartbeat path and assigned on a later one.
        assert took < 10, f"took {took:.1f}s to converge"
        # And it stays there.
        for _ in range(10):
            c.poll(0.05)
        assert _assigned(c) == final
    finally:
        c.close()
