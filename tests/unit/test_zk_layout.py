"""Kafka's ZooKeeper znode JSON, encoded and decoded by pykbroker.metadata.zk_layout (no ZooKeeper needed).

The expected documents are the shapes Kafka's ZooKeeper mode writes (ZkData.scala), so a zkCli user or a
Kafka tool reading the same ZooKeeper sees familiar data.
"""

from __future__ import annotations

import json
import uuid

import pytest

from pykbroker.metadata import zk_layout as zl
from pykbroker.metadata.zk_layout import parse_connect, reassign_partition


def test_paths() -> None:
    assert zl.broker_path(3) == "/brokers/ids/3"
    assert zl.topic_path("t") == "/brokers/topics/t"
    assert zl.partition_state_path("t", 2) == "/brokers/topics/t/partitions/2/state"
    assert zl.topic_config_path("t") == "/config/topics/t"
    assert zl.delete_topic_path("t") == "/admin/delete_topics/t"
    assert zl.entity_config_path(4, "") == "/config/brokers/<default>"
    assert zl.entity_config_path(4, "7") == "/config/brokers/7"
    assert zl.entity_config_path(16, "sub") == "/config/client-metrics/sub"
    assert zl.entity_config_path(32, "g") == "/config/groups/g"
    assert zl.ELECTIONS in zl.PERSISTENT_PATHS and zl.CONTROLLED_SHUTDOWN in zl.PERSISTENT_PATHS


def test_kafka_uuid_text_form() -> None:
    u = uuid.UUID("7a1fb6b4-5b64-4a6c-9c7c-0f0d31b1a2e3")
    text = zl.uuid_to_kafka(u)
    assert len(text) == 22 and "=" not in text
    assert zl.uuid_from_kafka(text) == u


def test_broker_registration_v5() -> None:
    reg = zl.BrokerRegistration(1, (("PLAINTEXT", "127.0.0.1", 9092), ("REPL", "10.0.0.1", 9093)),
                                {"PLAINTEXT": "PLAINTEXT", "REPL": "PLAINTEXT"}, "rack-a")
    doc = json.loads(zl.encode_broker(reg))
    assert doc["version"] == 5
    assert doc["endpoints"] == ["PLAINTEXT://127.0.0.1:9092", "REPL://10.0.0.1:9093"]
    assert doc["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT", "REPL": "PLAINTEXT"}
    assert doc["host"] == "127.0.0.1" and doc["port"] == 9092 and doc["rack"] == "rack-a"
    assert doc["jmx_port"] == -1 and doc["timestamp"].isdigit()
    back = zl.decode_broker(1, zl.encode_broker(reg))
    assert back == reg and back.rack == "rack-a"
    # no rack: the key is absent, as Kafka writes it
    assert "rack" not in json.loads(zl.encode_broker(zl.BrokerRegistration(2, (("PLAINTEXT", "h", 1),))))


def test_decode_kafka_written_broker_with_ipv6() -> None:
    kafka = (b'{"features":{},"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},'
             b'"endpoints":["PLAINTEXT://[::1]:9092"],"jmx_port":-1,"port":9092,"host":"::1",'
             b'"timestamp":"1700000000000","version":5}')
    reg = zl.decode_broker(4, kafka)
    assert reg.endpoints == (("PLAINTEXT", "::1", 9092),) and reg.rack is None


def test_controller_and_epoch() -> None:
    assert zl.decode_controller(zl.encode_controller(3)) == 3
    assert json.loads(zl.encode_controller(3))["brokerid"] == 3
    assert zl.decode_controller(b'{"version":1,"brokerid":5,"timestamp":"1"}') == 5
    assert zl.decode_controller_epoch(zl.encode_controller_epoch(12)) == 12
    assert zl.encode_controller_epoch(12) == b"12"


def test_topic_assignment_v3() -> None:
    tid = uuid.uuid4()
    a = zl.TopicAssignment(tid, {0: [1, 2, 3], 1: [2, 3, 4]}, adding_replicas={1: [4]}, removing_replicas={1: [1]})
    doc = json.loads(zl.encode_topic_assignment(a))
    assert doc == {"version": 3, "topic_id": zl.uuid_to_kafka(tid),
                   "partitions": {"0": [1, 2, 3], "1": [2, 3, 4]},
                   "adding_replicas": {"1": [4]}, "removing_replicas": {"1": [1]}}
    assert zl.decode_topic_assignment(zl.encode_topic_assignment(a)) == a
    # Kafka before topic ids (version 1) has only partitions
    old = zl.decode_topic_assignment(b'{"version":1,"partitions":{"0":[1]}}')
    assert old.partitions == {0: [1]} and old.adding_replicas == {} and old.topic_id == uuid.UUID(int=0)


def test_partition_state() -> None:
    s = zl.PartitionState(leader=2, leader_epoch=5, isr=[2, 1], controller_epoch=3)
    doc = json.loads(zl.encode_partition_state(s))
    assert doc == {"controller_epoch": 3, "leader": 2, "version": 1, "leader_epoch": 5, "isr": [2, 1]}
    back = zl.decode_partition_state(zl.encode_partition_state(s), zk_version=9)
    assert (back.leader, back.leader_epoch, back.isr, back.controller_epoch, back.zk_version) == (2, 5, [2, 1], 3, 9)


def test_entity_config_and_change_notification() -> None:
    data = zl.encode_entity_config({"retention.ms": "1000", "cleanup.policy": "compact"})
    assert json.loads(data) == {"version": 1, "config": {"cleanup.policy": "compact", "retention.ms": "1000"}}
    assert zl.decode_entity_config(data) == {"retention.ms": "1000", "cleanup.policy": "compact"}
    assert zl.config_change_entity("/config/topics/t") == "topics/t"
    assert zl.config_change_entity("/config/users/a/clients/b") == "users/a/clients/b"
    assert json.loads(zl.encode_config_change("topics/t")) == {"version": 2, "entity_path": "topics/t"}


def test_producer_id_block() -> None:
    doc = json.loads(zl.encode_producer_id_block(1, 1000, 1999))
    assert doc == {"version": 1, "broker": 1, "block_start": "1000", "block_end": "1999"}
    assert zl.decode_producer_id_block(zl.encode_producer_id_block(1, 1000, 1999)) == (1000, 1999)


def test_partition_lists_and_elections() -> None:
    data = zl.encode_partition_list([("a", 0), ("b", 3)])
    assert json.loads(data) == {"version": 1, "partitions": [{"topic": "a", "partition": 0},
                                                             {"topic": "b", "partition": 3}]}
    assert zl.decode_partition_list(data) == [("a", 0), ("b", 3)]
    req = zl.encode_election_request([("a", 1)], zl.UNCLEAN_ELECTION)
    assert json.loads(req) == {"version": 1, "election_type": 1, "partitions": [{"topic": "a", "partition": 1}]}
    assert zl.decode_election_request(req) == (1, [("a", 1)])
    legacy = zl.encode_reassignment({("t", 0): [3, 1]})
    assert json.loads(legacy) == {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [3, 1]}]}
    assert zl.decode_reassignment(legacy) == {("t", 0): [3, 1]}


@pytest.mark.parametrize(("name", "sanitized"), [
    ("alice", "alice"), ("a.b-c_d", "a.b-c_d"), ("user@example.com", "user%40example.com"),
    ("a b", "a%20b"), ("x*y", "x%2Ay"), ("CN=a,O=b", "CN%3Da%2CO%3Db"), ("ü~", "%C3%BC%7E"), ("a/b", "a%2Fb"),
])
def test_sanitize_as_kafka(name: str, sanitized: str) -> None:
    assert zl.sanitize(name) == sanitized
    assert zl.desanitize(sanitized) == name


def test_quota_entity_paths() -> None:
    cases = {
        (("user", "alice"),): "/config/users/alice",
        (("user", None),): "/config/users/<default>",
        (("client-id", "c 1"),): "/config/clients/c%201",
        (("client-id", "c"), ("user", "u@x")): "/config/users/u%40x/clients/c",
        (("client-id", None), ("user", None)): "/config/users/<default>/clients/<default>",
        (("ip", "10.0.0.1"),): "/config/ips/10.0.0.1",
        (("ip", None),): "/config/ips/<default>",
    }
    for entity, path in cases.items():
        assert zl.quota_entity_path(entity) == path
        assert zl.quota_entity_from_path(path) == entity
    assert zl.quota_entity_from_path("/config/topics/t") is None
    with pytest.raises(ValueError):
        zl.quota_entity_path((("ip", "1.2.3.4"), ("user", "u")))


def test_quota_values_as_kafka_stores_them() -> None:
    assert zl.encode_quota_value("producer_byte_rate", 1024.0) == "1024"
    assert zl.encode_quota_value("connection_creation_rate", 7.0) == "7"
    assert zl.encode_quota_value("request_percentage", 50.0) == "50.0"
    assert zl.decode_quota_values({"producer_byte_rate": "1024", "SCRAM-SHA-256": "salt=..."}) == {
        "producer_byte_rate": 1024.0}


def test_parse_connect() -> None:
    assert parse_connect("h1:1,h2:2") == ("h1:1,h2:2", "")
    assert parse_connect("h1:1,h2:2/kafka/c1") == ("h1:1,h2:2", "/kafka/c1")
    assert parse_connect("h1:1/kafka/") == ("h1:1", "/kafka")
    assert parse_connect("h1:1/") == ("h1:1", "")


def _assignment(replicas: list[int], adding: list[int] | None = None) -> zl.TopicAssignment:
    a = zl.TopicAssignment(uuid.uuid4(), {0: replicas})
    if adding:
        a.adding_replicas[0] = adding
    return a


def test_reassignment_kip455_shape() -> None:
    a = _assignment([1, 2, 3])
    reassign_partition(a, 0, [4, 5, 1])
    assert a.partitions[0] == [4, 5, 1, 2, 3]
    assert a.adding_replicas == {0: [4, 5]} and a.removing_replicas == {0: [2, 3]}
    # a new target while one is in progress is computed from the original replicas, not the full set
    reassign_partition(a, 0, [2, 6])
    assert a.partitions[0] == [2, 6, 1, 3]
    assert a.adding_replicas == {0: [6]} and a.removing_replicas == {0: [1, 3]}
    # cancel: back to the original replicas (Kafka's originReplicas: replicas minus adding, in order)
    reassign_partition(a, 0, None)
    assert a.partitions[0] == [2, 1, 3] and a.adding_replicas == {} and a.removing_replicas == {}
    b = _assignment([1, 2, 3])
    reassign_partition(b, 0, [4])
    reassign_partition(b, 0, None)
    assert b.partitions[0] == [1, 2, 3] and b.adding_replicas == {} and b.removing_replicas == {}
    # same set, new order: just reordered, nothing pending
    reassign_partition(a, 0, [3, 2, 1])
    assert a.partitions[0] == [3, 2, 1] and a.adding_replicas == {} and a.removing_replicas == {}
    doc = json.loads(zl.encode_topic_assignment(_with_move([1, 2], [2, 3])))
    assert doc["partitions"] == {"0": [2, 3, 1]}
    assert doc["adding_replicas"] == {"0": [3]} and doc["removing_replicas"] == {"0": [1]}


def _with_move(replicas: list[int], target: list[int]) -> zl.TopicAssignment:
    a = _assignment(replicas)
    reassign_partition(a, 0, target)
    return a
