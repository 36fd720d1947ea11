"""ACLs in a ZooKeeper cluster: stored in Kafka's ZooKeeper layout, followed by every broker's authorizer.

An ACL created through one broker is described by another and enforced by a third (bounded waits for the
change notification); a deletion is seen everywhere too; the znodes are what Kafka's ZooKeeper-era
authorizer writes (/kafka-acl/<Type>/<name>, /kafka-acl-extended/prefixed/..., change notifications).
The PLAINTEXT connections (clients here, and the brokers' own replica fetches) are User:ANONYMOUS, a super
user; SASL PLAIN users are what the ACLs are about.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kazoo.client import KazooClient

from tests.support.broker import free_port
from tests.support.cluster import Cluster, raw_request, wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("cluster-acls")]

TIMEOUT = 30.0
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base: Path = tmp_path_factory.mktemp("cluster-acls")
    sasl_ports = {i: free_port() for i in (1, 2, 3)}
    c = Cluster(base, 3, overrides={
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:ANONYMOUS;User:admin",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "inter.broker.listener.name": "PLAINTEXT",
    })
    for i, b in c.brokers.items():  # a SASL_PLAINTEXT listener beside each broker's PLAINTEXT one
        plain = b.overrides["listeners"]
        b.overrides["listeners"] = f"{plain},SASL_PLAINTEXT://127.0.0.1:{sasl_ports[i]}"
    c.sasl_ports = sasl_ports  # type: ignore[attr-defined]
    with c:
        yield c


def _admin(cluster: Cluster, via: int) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.broker(via).bootstrap, "broker.address.family": "v4"})


def _alice_producer(cluster: Cluster, via: int) -> Producer:
    port = cluster.sasl_ports[via]  # type: ignore[attr-defined]
    return Producer({"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
                     "sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret",
                     "broker.address.family": "v4", "message.timeout.ms": 10000, "retries": 0})


def _write_acl(topic: str, pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, topic, pattern, "User:alice", "*", AclOperation.WRITE,
                      AclPermissionType.ALLOW)


def _topic_filter(name: str, pattern: ResourcePatternType) -> AclBindingFilter:
    none: Any = None
    return AclBindingFilter(ResourceType.TOPIC, name, pattern, none, none, AclOperation.ANY, AclPermissionType.ANY)


def _described(cluster: Cluster, via: int, name: str, pattern: ResourcePatternType) -> list[Any]:
    """The topic ACLs broker ``via`` itself answers with (a raw DescribeAcls on its PLAINTEXT listener:
    an admin client would send it to whichever broker it likes, so could not tell what ``via`` knows)."""
    resp = raw_request(cluster.broker(via).bootstrap, 29, 3, {
        "resource_type_filter": ResourceType.TOPIC.value, "resource_name_filter": name,
        "pattern_type_filter": pattern.value, "principal_filter": None, "host_filter": None,
        "operation": AclOperation.ANY.value, "permission_type": AclPermissionType.ANY.value}, timeout=TIMEOUT)
    assert resp.error_code == 0, resp
    return [acl for r in resp.resources for acl in r.acls]


def _produce_error(cluster: Cluster, via: int, topic: str) -> KafkaError | None:
    p = _alice_producer(cluster, via)
    errors: list[KafkaError | None] = []
    p.produce(topic, b"v", on_delivery=lambda err, msg: errors.append(err))
    p.flush(TIMEOUT)
    assert errors, "no delivery report"
    return errors[0]


def test_an_acl_made_on_one_broker_is_described_and_enforced_by_the_others(cluster: Cluster) -> None:
    topic = f"acl-{uuid.uuid4().hex[:8]}"
    admin = _admin(cluster, 1)
    for f in admin.create_topics([NewTopic(topic, 1, 3)], request_timeout=TIMEOUT).values():
        f.result(timeout=TIMEOUT)
    cluster.wait_leaders(topic, 1)
    leader = cluster.leaders(topic)[0]
    err = _produce_error(cluster, leader, topic)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    for f in admin.create_acls([_write_acl(topic)], request_timeout=TIMEOUT).values():
        f.result(timeout=TIMEOUT)
    for via in (1, 2, 3):  # every broker's authorizer follows the change notification
        def known(b: int = via) -> list[Any]:
            return _described(cluster, b, topic, ResourcePatternType.LITERAL)

        wait_for(known, timeout=TIMEOUT, what=f"broker {via} describing the new ACL")
    assert _produce_error(cluster, leader, topic) is None

    # Kafka's ZooKeeper layout, readable by Kafka's own tools.
    zk = KazooClient(hosts=cluster.zk.connect)
    zk.start(timeout=10)
    try:
        doc = json.loads(zk.get(f"/kafka-acl/Topic/{topic}")[0])
        assert doc == {"version": 1, "acls": [{"principal": "User:alice", "permissionType": "Allow",
                                               "operation": "Write", "host": "*"}]}
        changes = [zk.get(f"/kafka-acl-changes/{c}")[0] for c in zk.get_children("/kafka-acl-changes")]
        assert f"Topic:{topic}".encode() in changes
    finally:
        zk.stop()
        zk.close()

    admin3 = _admin(cluster, 3)
    deleted = admin3.delete_acls([_topic_filter(topic, ResourcePatternType.LITERAL)],
                                             request_timeout=TIMEOUT)
    for f in deleted.values():
        assert len(f.result(timeout=TIMEOUT)) == 1
    wait_for(lambda: all(not _described(cluster, b, topic, ResourcePatternType.LITERAL) for b in (1, 2, 3)),
             timeout=TIMEOUT, what="the deletion seen by every broker")
    err = _produce_error(cluster, leader, topic)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err


def test_prefixed_acls_are_stored_under_kafka_acl_extended(cluster: Cluster) -> None:
    prefix = f"pfx-{uuid.uuid4().hex[:6]}-"
    admin = _admin(cluster, 2)
    for f in admin.create_acls([_write_acl(prefix, ResourcePatternType.PREFIXED)], request_timeout=TIMEOUT).values():
        f.result(timeout=TIMEOUT)
    wait_for(lambda: _described(cluster, 1, prefix, ResourcePatternType.PREFIXED), timeout=TIMEOUT,
             what="broker 1 describing the prefixed ACL")
    zk = KazooClient(hosts=cluster.zk.connect)
    zk.start(timeout=10)
    try:
        assert zk.exists(f"/kafka-acl-extended/prefixed/Topic/{prefix}") is not None
        notes = [json.loads(zk.get(f"/kafka-acl-extended-changes/{c}")[0])
                 for c in zk.get_children("/kafka-acl-extended-changes")]
        assert {"version": 1, "resourceType": "Topic", "name": prefix, "patternType": "Prefixed"} in notes
    finally:
        zk.stop()
        zk.close()
    # A restarted broker reads the ACLs back from ZooKeeper.
    cluster.broker(3).stop()
    cluster.broker(3).start()
    wait_for(lambda: _described(cluster, 3, prefix, ResourcePatternType.PREFIXED), timeout=TIMEOUT,
             what="the restarted broker 3 describing the prefixed ACL")
