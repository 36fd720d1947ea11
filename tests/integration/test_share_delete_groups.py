"""DeleteGroups (API 42) on share groups (KIP-932), as Kafka 4.2 answers it, with real admin clients.

An unknown group is GROUP_ID_NOT_FOUND; a share group with a live ShareConsumer is NON_EMPTY_GROUP; an
empty one is deleted with its persisted share-partition state, so a consumer joining a group of the same
name starts over, and a restarted broker has nothing of it left. A share group known after a restart only
by its state in ``__share_group_state`` (membership is in memory) can be deleted too.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, KafkaError, KafkaException, ShareConsumer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
from kafka.admin import KafkaAdminClient

from tests.integration.conftest import (
    BrokerFactory,
    RawConnection,
    admin_for,
    create_topic,
    make_producer,
    unique_topic,
    wait_until,
)
from tests.support.broker import BrokerProcess

SHARE = {"group.share.enable": "true"}
CLIENT_TIMEOUT = 20


def earliest(b: BrokerProcess, group: str) -> None:
    admin = admin_for(b)
    res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=CLIENT_TIMEOUT)


def produce(b: BrokerProcess, topic: str, n: int) -> None:
    p = make_producer(b)
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
    assert p.flush(CLIENT_TIMEOUT) == 0


def consume_and_accept(b: BrokerProcess, group: str, topic: str, want: int, close: bool = True
                       ) -> tuple[ShareConsumer, list[int]]:
    """A ShareConsumer that acknowledges (ACCEPT, committed) what it gets until ``want`` records (bounded)."""
    c = ShareConsumer({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4", "group.id": group,
                       "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    got: list[int] = []
    deadline = time.monotonic() + 30
    while len(got) < want and time.monotonic() < deadline:
        msgs = c.poll(0.5)
        for m in msgs:
            assert m.error() is None, m.error()
            c.acknowledge(m, AcknowledgeType.ACCEPT)
            got.append(m.offset())
        if msgs:
            c.commit_sync(CLIENT_TIMEOUT)
    if close:
        c.close()
    return c, got


def confluent_delete(b: BrokerProcess, group: str) -> KafkaError | None:
    """DeleteGroups through confluent-kafka's admin; a coordinator still loading its partitions right after the
    broker started answers COORDINATOR_LOAD_IN_PROGRESS (retriable, as in Kafka): asked again, bounded."""
    admin = admin_for(b)
    err: KafkaError | None = None
    for _ in range(50):  # bounded: 10 s at most
        try:
            admin.delete_consumer_groups([group], request_timeout=CLIENT_TIMEOUT)[group].result(timeout=CLIENT_TIMEOUT)
        except KafkaException as e:
            err = e.args[0]
            if err is not None and err.code() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS:
                time.sleep(0.2)
                continue
            return err
        return None
    return err


def kafka_python_delete(b: BrokerProcess, group: str) -> str:
    admin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=CLIENT_TIMEOUT * 1000)
    try:
        result: dict[str, Any] = admin.delete_groups([group])
    finally:
        admin.close()
    return str(result[group])


def delete_retrying(b: BrokerProcess, group: str) -> str:
    """kafka-python's DeleteGroups, again while the group coordinator is loading (bounded)."""
    result = ""
    deadline = time.monotonic() + 30
    for _ in range(300):
        result = kafka_python_delete(b, group)
        if result != "CoordinatorLoadInProgressError" or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return result


def listed_share_groups(b: BrokerProcess) -> set[str]:
    with RawConnection(b) as conn:
        res = conn.request(16, 5, {"states_filter": [], "types_filter": ["share"]}, 1)
        return {g.group_id for g in res.groups}


def share_state_topics(b: BrokerProcess, group: str) -> list[str]:
    """DescribeShareGroupOffsets: the topics the group has persisted state for."""
    with RawConnection(b) as conn:
        res = conn.request(90, 1, {"groups": [{"group_id": group, "topics": None}]}, 1)
        return [t.topic_name for t in res.groups[0].topics]


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory(SHARE)


def test_unknown_group_is_not_found(broker: BrokerProcess) -> None:
    err = confluent_delete(broker, unique_topic("nope"))
    assert err is not None and err.code() == KafkaError.GROUP_ID_NOT_FOUND, err
    # Another group id maps to another __consumer_offsets partition, which may still be loading.
    assert delete_retrying(broker, unique_topic("nope")) == "GroupIdNotFoundError"


def test_member_makes_it_non_empty_then_delete_starts_over(broker: BrokerProcess) -> None:
    topic, group = unique_topic("share"), unique_topic("g")
    create_topic(broker, topic, 1)
    earliest(broker, group)
    produce(broker, topic, 5)
    live, got = consume_and_accept(broker, group, topic, 5, close=False)
    try:
        assert sorted(got) == [0, 1, 2, 3, 4]
        err = confluent_delete(broker, group)
        assert err is not None and err.code() == KafkaError.NON_EMPTY_GROUP, err
        assert kafka_python_delete(broker, group) == "NonEmptyGroupError"
        assert group in listed_share_groups(broker)
    finally:
        live.close()
    assert share_state_topics(broker, group) == [topic]
    assert confluent_delete(broker, group) is None
    assert group not in listed_share_groups(broker)
    assert share_state_topics(broker, group) == []
    err = confluent_delete(broker, group)
    assert err is not None and err.code() == KafkaError.GROUP_ID_NOT_FOUND, "deleted once"
    # The state went with the group: a new group of the same name reads everything again.
    earliest(broker, group)
    _, again = consume_and_accept(broker, group, topic, 5)
    assert sorted(again) == [0, 1, 2, 3, 4]


def test_delete_after_restart_removes_persisted_state(broker_factory: BrokerFactory) -> None:
    b = broker_factory(SHARE)
    topic, group, kept = unique_topic("share"), unique_topic("g"), unique_topic("kept")
    create_topic(b, topic, 2)
    for g in (group, kept):
        earliest(b, g)
    produce(b, topic, 6)
    for g in (group, kept):
        _, got = consume_and_accept(b, g, topic, 6)
        assert len(got) == 6
    b.kill()
    b.restart()
    # At once after the restart: the broker waits for __share_group_state's replay before deleting (else the
    # group's state would stay behind); only the group coordinator's own loading is answered, and retried.
    assert delete_retrying(b, group) == "OK"
    assert share_state_topics(b, group) == []
    assert share_state_topics(b, kept) == [topic], "another group's state is untouched"
    assert kafka_python_delete(b, group) == "GroupIdNotFoundError"
    b.kill()
    b.restart()
    # DescribeShareGroupOffsets answers from what is replayed so far: wait for the other group's state.
    wait_until(lambda: share_state_topics(b, kept) == [topic], timeout=30, what="the state replay")
    assert share_state_topics(b, group) == [], "the tombstones survive a kill -9"
    earliest(b, group)
    _, again = consume_and_accept(b, group, topic, 6)
    assert len(again) == 6
