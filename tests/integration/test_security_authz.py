"""Authorization end to end: the ACL authorizer, ACLs made through CreateAcls, and real clients refused
with Kafka's errors.  Principals come from SASL PLAIN (User:alice, User:admin) on the broker's second
listener; the first stays PLAINTEXT (ANONYMOUS, a super user here so the health check and setup work)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.support.broker import BrokerProcess, free_port
from tests.support.cluster import wait_for

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
TIMEOUT = 30.0
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    sasl_port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("authz"), {})
    b.overrides.update({
        "listeners": f"PLAINTEXT://127.0.0.1:{b.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": AUTHORIZER,
        "super.users": "User:admin;User:ANONYMOUS",
    })
    b.start()
    try:
        yield b, f"127.0.0.1:{sasl_port}"
    finally:
        b.stop()


def conf(sasl: str, user: str) -> dict[str, Any]:
    return {"bootstrap.servers": sasl, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": user, "sasl.password": f"{user}-secret"}


def new_topic(b: BrokerProcess, prefix: str = "authz-") -> str:
    name = f"{prefix}{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})  # kept referenced until the result is in
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(TIMEOUT)
    return name


def grant(sasl: str, rtype: ResourceType, name: str, op: AclOperation, *,
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          permission: AclPermissionType = AclPermissionType.ALLOW, principal: str = "User:alice") -> None:
    """Made by the super user admin over SASL."""
    admin = AdminClient(conf(sasl, "admin"))
    binding = AclBinding(rtype, name, pattern, principal, "*", op, permission)
    for f in admin.create_acls([binding]).values():
        f.result(TIMEOUT)


def produce_error(sasl: str, user: str, topic: str) -> KafkaError | None:
    """The delivery outcome of one message (None: delivered)."""
    outcome: list[KafkaError | None] = []
    p = Producer({**conf(sasl, user), "message.timeout.ms": 10000, "retries": 0})
    p.produce(topic, b"v", on_delivery=lambda err, _msg: outcome.append(err))
    p.flush(TIMEOUT)
    assert outcome, "no delivery report"
    return outcome[0]




def test_producer_without_write_is_refused(broker: tuple[BrokerProcess, str]) -> None:
    b, sasl = broker
    topic = new_topic(b)
    err = produce_error(sasl, "alice", topic)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(sasl, ResourceType.TOPIC, topic, AclOperation.WRITE)
    assert wait_for(lambda: produce_error(sasl, "alice", topic) is None, what="WRITE to take effect")


def test_super_user_needs_no_acls(broker: tuple[BrokerProcess, str]) -> None:
    b, sasl = broker
    topic = new_topic(b)
    assert produce_error(sasl, "admin", topic) is None


def test_prefixed_acl_and_deny_overrides_allow(broker: tuple[BrokerProcess, str]) -> None:
    b, sasl = broker
    prefix = f"pre{uuid.uuid4().hex[:6]}-"
    ok, blocked = new_topic(b, prefix), new_topic(b, prefix)
    grant(sasl, ResourceType.TOPIC, prefix, AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED)
    assert wait_for(lambda: produce_error(sasl, "alice", ok) is None, what="the prefixed ACL")
    grant(sasl, ResourceType.TOPIC, blocked, AclOperation.WRITE, permission=AclPermissionType.DENY)
    err = produce_error(sasl, "alice", blocked)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_error(sasl, "alice", ok) is None


def test_consumer_without_group_read_is_refused(broker: tuple[BrokerProcess, str]) -> None:
    b, sasl = broker
    topic = new_topic(b)
    grant(sasl, ResourceType.TOPIC, topic, AclOperation.READ)
    group = f"g-{topic}"
    c = Consumer({**conf(sasl, "alice"), "group.id": group, "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + TIMEOUT
        seen = None
        while time.monotonic() < deadline and seen is None:
            m = c.poll(0.5)
            err = m.error() if m is not None else None
            if err is not None:
                seen = err.code()
        assert seen == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        c.close()


def test_admin_without_alter_is_refused(broker: tuple[BrokerProcess, str]) -> None:
    b, sasl = broker
    topic = new_topic(b)
    admin = AdminClient(conf(sasl, "alice"))
    with pytest.raises(KafkaException) as e:
        admin.create_partitions([NewPartitions(topic, 2)])[topic].result(TIMEOUT)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(sasl, ResourceType.TOPIC, topic, AclOperation.ALTER)
    admin.create_partitions([NewPartitions(topic, 2)])[topic].result(TIMEOUT)
    # Metadata lists only what alice may DESCRIBE (ALTER implies it); a topic she has no ACL on is hidden.
    hidden = new_topic(b)
    listed = admin.list_topics(timeout=TIMEOUT).topics
    assert topic in listed and hidden not in listed


def test_transactional_producer_needs_write_on_its_id(broker: tuple[BrokerProcess, str]) -> None:
    b, sasl = broker
    topic = new_topic(b)
    grant(sasl, ResourceType.TOPIC, topic, AclOperation.WRITE)
    txn_id = f"tx-{topic}"
    p = Producer({**conf(sasl, "alice"), "transactional.id": txn_id})
    with pytest.raises(KafkaException) as e:
        p.init_transactions(TIMEOUT)
    assert e.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    grant(sasl, ResourceType.TRANSACTIONAL_ID, txn_id, AclOperation.WRITE)
    p = Producer({**conf(sasl, "alice"), "transactional.id": txn_id})
    p.init_transactions(TIMEOUT)
    p.begin_transaction()
    p.produce(topic, b"in-txn")
    p.commit_transaction(TIMEOUT)


def test_kafka_python_consumer_needs_read(broker: tuple[BrokerProcess, str]) -> None:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP
    from kafka.errors import TopicAuthorizationFailedError

    b, sasl = broker
    topic = new_topic(b)
    grant(sasl, ResourceType.TOPIC, topic, AclOperation.DESCRIBE)  # visible, not readable
    c = KafkaConsumer(bootstrap_servers=sasl, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                      sasl_plain_username="alice", sasl_plain_password="alice-secret", consumer_timeout_ms=5000)
    try:
        c.assign([KTP(topic, 0)])
        c.seek(KTP(topic, 0), 0)
        with pytest.raises(TopicAuthorizationFailedError):
            for _ in range(20):  # bounded: the error surfaces on the first fetch response
                c.poll(timeout_ms=500)
    finally:
        c.close()
