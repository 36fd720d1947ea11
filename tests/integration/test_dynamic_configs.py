"""AlterConfigs, IncrementalAlterConfigs and DescribeConfigs with real clients against a broker subprocess.

confluent-kafka's AdminClient (incremental_alter_configs, alter_configs, describe_configs) and
kafka-python's KafkaAdminClient (alter_configs, describe_configs with include_synonyms) drive the
changes; their effect is observed on disk and through producers, without restarting the broker.
Neither client can address the cluster-default broker resource (name ""), so that one goes over a
raw socket with kio-encoded requests.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka.admin import ConfigResource as KpResource
from kafka.admin import ConfigResourceType as KpType
from kafka.admin import KafkaAdminClient

from tests.integration.conftest import (
    CLIENT_TIMEOUT,
    BrokerFactory,
    RawConnection,
    admin_for,
    create_topic,
    make_producer,
    produce_all,
    unique_topic,
    wait_until,
    watermarks,
)
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.timeout(180)

OVERRIDES = {
    "log.retention.check.interval.ms": "200",
    "log.segment.delete.delay.ms": "0",
    "log.retention.hours": "100",  # a static synonym of retention.ms, for the synonym lists
}
INVALID_CONFIG = 40
INVALID_REQUEST = 42
UNKNOWN_TOPIC_OR_PARTITION = 3


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory(OVERRIDES)


def _segments(b: BrokerProcess, topic: str) -> list[Path]:
    return sorted((b.data_dir / "logs" / f"{topic}-0").glob("*.log"))


def _incremental(b: BrokerProcess, rtype: ResourceType, name: str, *ops: tuple[str, AlterConfigOpType, str | None],
                 validate_only: bool = False) -> None:
    """One IncrementalAlterConfigs through confluent-kafka; raises KafkaException on a resource error."""
    admin = admin_for(b)
    res = ConfigResource(rtype, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, op, v in ops])
    admin.incremental_alter_configs([res], validate_only=validate_only,
                                    request_timeout=CLIENT_TIMEOUT)[res].result(timeout=CLIENT_TIMEOUT)


def _describe(b: BrokerProcess, rtype: ResourceType, name: str) -> dict[str, Any]:
    admin = admin_for(b)
    res = ConfigResource(rtype, name)
    return admin.describe_configs([res], request_timeout=CLIENT_TIMEOUT)[res].result(timeout=CLIENT_TIMEOUT)


def _kp_admin(b: BrokerProcess) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=int(CLIENT_TIMEOUT * 1000))


def _kp_describe(b: BrokerProcess, rtype: KpType, name: str) -> dict[str, Any]:
    admin = _kp_admin(b)
    try:
        got = admin.describe_configs([KpResource(rtype, name)], include_synonyms=True, config_filter="all")
        result: dict[str, Any] = got[rtype.name.lower()][name]
        return result
    finally:
        admin.close()


def _kp_synonyms(entry: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(s["name"], s["value"], s["source"]) for s in entry["synonyms"]]


def _raw(b: BrokerProcess, api_key: int, version: int, body: dict[str, Any]) -> Any:
    with RawConnection(b) as c:
        return c.request(api_key, version, body)


def _raw_alter_default(b: BrokerProcess, configs: dict[str, str]) -> Any:
    """Legacy AlterConfigs v2 of the cluster-default broker resource (""): replaces all its configs."""
    r = _raw(b, 33, 2, {"resources": [{"resource_type": 4, "resource_name": "", "configs": [
        {"name": k, "value": v} for k, v in configs.items()]}], "validate_only": False})
    return r.responses[0]


def _error_code(exc: KafkaException) -> int:
    err: KafkaError = exc.args[0]
    return int(err.code())


# --- applied without a restart ---------------------------------------------------------------------

def test_retention_ms_change_deletes_segments_without_restart(broker: BrokerProcess) -> None:
    topic = unique_topic("dc-ret")
    create_topic(broker, topic, config={"segment.bytes": "1024"})
    p = make_producer(broker, **{"linger.ms": 0, "batch.num.messages": 1})
    assert all(r.error is None for r in produce_all(p, topic, [{"value": b"x" * 300} for _ in range(20)]))
    assert len(_segments(broker, topic)) >= 5
    assert watermarks(broker, topic) == (0, 20)

    _incremental(broker, ResourceType.TOPIC, topic, ("retention.ms", AlterConfigOpType.SET, "1"))
    # Every segment but the active one is past a 1 ms retention: the next retention pass deletes them.
    low = wait_until(lambda: watermarks(broker, topic)[0] or None, timeout=15, what="retention to delete")
    assert 0 < low <= 20
    wait_until(lambda: len(_segments(broker, topic)) == 1, timeout=15, what="only the active segment left")
    entry = _describe(broker, ResourceType.TOPIC, topic)["retention.ms"]
    assert entry.value == "1" and entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def test_segment_bytes_change_rolls_at_the_new_size(broker: BrokerProcess) -> None:
    topic = unique_topic("dc-seg")
    create_topic(broker, topic)
    p = make_producer(broker, **{"linger.ms": 0, "batch.num.messages": 1})
    produce_all(p, topic, [{"value": b"y" * 300} for _ in range(10)])
    assert len(_segments(broker, topic)) == 1

    admin = _kp_admin(broker)  # kafka-python, legacy AlterConfigs: the topic's configs become exactly these
    try:
        result = admin.alter_configs([KpResource(KpType.TOPIC, topic, configs={"segment.bytes": "1024"})],
                                     incremental=False)
    finally:
        admin.close()
    assert result == {"topic": {topic: "OK"}} or "OK" in str(result), result
    produce_all(p, topic, [{"value": b"z" * 300} for _ in range(20)])
    segments = _segments(broker, topic)
    assert len(segments) >= 5, segments
    assert all(s.stat().st_size <= 1024 for s in segments[1:]), [s.stat().st_size for s in segments]
    entry = _kp_describe(broker, KpType.TOPIC, topic)["segment.bytes"]
    assert entry["value"] == "1024" and entry["config_source"] == "DYNAMIC_TOPIC_CONFIG"


def test_max_message_bytes_change_rejects_a_big_batch_at_once(broker: BrokerProcess) -> None:
    topic = unique_topic("dc-mmb")
    create_topic(broker, topic)
    p = make_producer(broker, **{"linger.ms": 0})
    (ok,) = produce_all(p, topic, [{"value": b"v" * 5000}])
    assert ok.error is None

    _incremental(broker, ResourceType.TOPIC, topic, ("max.message.bytes", AlterConfigOpType.SET, "1000"))
    (big,) = produce_all(p, topic, [{"value": b"v" * 5000}])
    assert big.error is not None and big.error.code() == KafkaError.MSG_SIZE_TOO_LARGE, big.error
    (small,) = produce_all(p, topic, [{"value": b"v" * 100}])
    assert small.error is None


def test_append_and_subtract_on_cleanup_policy(broker: BrokerProcess) -> None:
    topic = unique_topic("dc-pol")
    create_topic(broker, topic)
    p = make_producer(broker, **{"linger.ms": 0})
    (keyless,) = produce_all(p, topic, [{"value": b"no key"}])
    assert keyless.error is None

    _incremental(broker, ResourceType.TOPIC, topic, ("cleanup.policy", AlterConfigOpType.APPEND, "compact"))
    assert _describe(broker, ResourceType.TOPIC, topic)["cleanup.policy"].value == "delete,compact"
    # Compaction applies at once: a compacted topic refuses records without a key.
    (refused,) = produce_all(p, topic, [{"value": b"no key"}])
    assert refused.error is not None, "a keyless record must be refused by a compacted topic"

    _incremental(broker, ResourceType.TOPIC, topic, ("cleanup.policy", AlterConfigOpType.SUBTRACT, "delete"))
    entry = _describe(broker, ResourceType.TOPIC, topic)["cleanup.policy"]
    assert entry.value == "compact" and entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value

    with pytest.raises(KafkaException) as exc:
        _incremental(broker, ResourceType.TOPIC, topic, ("retention.ms", AlterConfigOpType.APPEND, "5"))
    assert _error_code(exc.value) == INVALID_CONFIG
    assert "because its type is not LIST" in str(exc.value)


def test_delete_reverts_to_the_default(broker: BrokerProcess) -> None:
    topic = unique_topic("dc-del")
    create_topic(broker, topic, config={"segment.bytes": "50000", "retention.bytes": "1000000"})
    _incremental(broker, ResourceType.TOPIC, topic, ("segment.bytes", AlterConfigOpType.DELETE, None))
    configs = _describe(broker, ResourceType.TOPIC, topic)
    assert configs["segment.bytes"].value == "1073741824"
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["retention.bytes"].value == "1000000"  # untouched by an incremental change


def test_validate_only_changes_nothing(broker: BrokerProcess) -> None:
    topic = unique_topic("dc-val")
    create_topic(broker, topic)
    _incremental(broker, ResourceType.TOPIC, topic, ("retention.ms", AlterConfigOpType.SET, "1"),
                 validate_only=True)
    entry = _describe(broker, ResourceType.TOPIC, topic)["retention.ms"]
    assert entry.value == str(100 * 3_600_000) and entry.source == ConfigSource.DEFAULT_CONFIG.value
    with pytest.raises(KafkaException) as exc:  # validation still happens
        _incremental(broker, ResourceType.TOPIC, topic, ("retention.ms", AlterConfigOpType.SET, "soon"),
                     validate_only=True)
    assert _error_code(exc.value) == INVALID_CONFIG
    admin = _kp_admin(broker)
    try:
        admin.alter_configs([KpResource(KpType.TOPIC, topic, configs={"retention.ms": "1"})], validate_only=True,
                            incremental=False)
    finally:
        admin.close()
    assert _kp_describe(broker, KpType.TOPIC, topic)["retention.ms"]["config_source"] == "DEFAULT_CONFIG"
    time.sleep(0.5)  # two retention passes: nothing may be deleted from a topic that was only validated
    assert watermarks(broker, topic) == (0, 0)


def test_errors_as_kafka_answers_them(broker: BrokerProcess) -> None:
    topic = unique_topic("dc-err")
    create_topic(broker, topic)
    cases: list[tuple[ResourceType, str, tuple[str, AlterConfigOpType, str | None], int, str]] = [
        (ResourceType.TOPIC, unique_topic("dc-missing"), ("retention.ms", AlterConfigOpType.SET, "1000"),
         UNKNOWN_TOPIC_OR_PARTITION, "does not exist"),
        (ResourceType.TOPIC, topic, ("retention.ms", AlterConfigOpType.SET, "a while"), INVALID_CONFIG,
         "Invalid value a while for configuration retention.ms"),
        (ResourceType.TOPIC, topic, ("retention.hours", AlterConfigOpType.SET, "1"), INVALID_CONFIG,
         "Unknown topic config name: retention.hours"),
        (ResourceType.TOPIC, topic, ("remote.storage.enable", AlterConfigOpType.SET, "true"), INVALID_CONFIG,
         "remote.storage.enable is not supported yet"),
        (ResourceType.BROKER, "0", ("log.dirs", AlterConfigOpType.SET, "/tmp/elsewhere"), INVALID_REQUEST,
         "Cannot update these configs dynamically: Set(log.dirs)"),
        (ResourceType.BROKER, "0", ("log.retention.ms", AlterConfigOpType.SET, "soon"), INVALID_REQUEST,
         "Invalid value soon for configuration log.retention.ms"),
        (ResourceType.BROKER, "0", ("max.connections", AlterConfigOpType.SET, "5"), INVALID_REQUEST,
         "cannot be updated dynamically on pykbroker"),
        # Kafka stores a key of a feature pykbroker lacks; pykbroker refuses it as a rejected config, naming
        # the feature (validate_only too).
        (ResourceType.BROKER, "0", ("sasl.kerberos.min.time.before.relogin", AlterConfigOpType.SET, "60000"),
         INVALID_CONFIG, "Kerberos (GSSAPI) is not implemented"),
        (ResourceType.BROKER, "0", ("sasl.oauthbearer.jwks.endpoint.url", AlterConfigOpType.SET, "https://idp/k"),
         INVALID_CONFIG, "OAUTHBEARER with an identity provider"),
    ]
    for rtype, name, op, code, text in cases:
        with pytest.raises(KafkaException) as exc:
            _incremental(broker, rtype, name, op)
        assert (_error_code(exc.value), text in str(exc.value)) == (code, True), (name, op, str(exc.value))
    with pytest.raises(KafkaException) as exc:
        _incremental(broker, ResourceType.BROKER, "0",
                     ("sasl.kerberos.min.time.before.relogin", AlterConfigOpType.SET, "60000"), validate_only=True)
    assert _error_code(exc.value) == INVALID_CONFIG
    # The legacy AlterConfigs (confluent-kafka's alter_configs) answers the same.
    res = ConfigResource(ResourceType.BROKER, "0", set_config={"sasl.kerberos.min.time.before.relogin": "60000"})
    legacy = admin_for(broker)  # keep a reference: a destroyed client fails its pending futures
    with pytest.raises(KafkaException) as exc:
        legacy.alter_configs([res], request_timeout=CLIENT_TIMEOUT)[res].result(timeout=CLIENT_TIMEOUT)
    assert _error_code(exc.value) == INVALID_CONFIG and "Kerberos (GSSAPI)" in str(exc.value), str(exc.value)
    # CreateTopics validates topic configs the same way.
    admin = admin_for(broker)
    bad = unique_topic("dc-bad")
    fs = admin.create_topics([NewTopic(bad, 1, 1, config={"min.compaction.lag.ms": "100",
                                                           "max.compaction.lag.ms": "50"})],
                             request_timeout=CLIENT_TIMEOUT)
    with pytest.raises(KafkaException) as exc:
        fs[bad].result(timeout=CLIENT_TIMEOUT)
    assert _error_code(exc.value) == INVALID_CONFIG and "min.compaction.lag.ms (100)" in str(exc.value)
    # The legacy API, several resources in one request (clients route broker resources to that broker).
    with RawConnection(broker) as c:
        r = c.request(33, 1, {"resources": [
            {"resource_type": 2, "resource_name": topic, "configs": [{"name": "retention.ms", "value": "-7"}]},
            {"resource_type": 4, "resource_name": "0", "configs": [{"name": "log.dirs", "value": "/x"}]},
            {"resource_type": 2, "resource_name": "", "configs": []},
            {"resource_type": 8, "resource_name": "0", "configs": []},
            {"resource_type": 4, "resource_name": "7", "configs": [{"name": "log.retention.ms", "value": "1"}]},
        ], "validate_only": False})
    assert [int(x.error_code) for x in r.responses] == [INVALID_CONFIG, INVALID_REQUEST, INVALID_REQUEST,
                                                         INVALID_REQUEST, INVALID_REQUEST]
    assert r.responses[2].error_message == "Default topic resources are not allowed."
    assert r.responses[4].error_message == "Unexpected broker id, expected 0, but received 7"


# --- broker-level dynamic configs: precedence, synonyms, restart --------------------------------------

def test_broker_default_and_per_broker_precedence_and_synonyms(broker_factory: BrokerFactory) -> None:
    b = broker_factory(OVERRIDES)
    topic = unique_topic("dc-brk")
    create_topic(b, topic)
    # Nothing dynamic yet: retention.ms comes from log.retention.hours, which Kafka does not list.
    entry = _kp_describe(b, KpType.TOPIC, topic)["retention.ms"]
    assert (entry["value"], entry["config_source"], _kp_synonyms(entry)) == \
        (str(100 * 3_600_000), "DEFAULT_CONFIG", [])

    assert int(_raw_alter_default(b, {"log.retention.ms": "7000", "message.max.bytes": "3000"}).error_code) == 0
    _incremental(b, ResourceType.BROKER, "0", ("log.retention.ms", AlterConfigOpType.SET, "5000"))
    entry = _kp_describe(b, KpType.TOPIC, topic)["retention.ms"]
    assert (entry["value"], entry["config_source"]) == ("5000", "DYNAMIC_BROKER_CONFIG")
    assert _kp_synonyms(entry) == [
        ("log.retention.ms", "5000", "DYNAMIC_BROKER_CONFIG"),
        ("log.retention.ms", "7000", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
        ("log.retention.hours", "100", "STATIC_BROKER_CONFIG"),
        ("log.retention.hours", "168", "DEFAULT_CONFIG"),
    ]
    broker_cfg = _describe(b, ResourceType.BROKER, "0")
    assert broker_cfg["log.retention.ms"].value == "5000"
    assert broker_cfg["log.retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert broker_cfg["message.max.bytes"].value == "3000"
    assert broker_cfg["message.max.bytes"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    assert broker_cfg["log.dirs"].is_read_only and not broker_cfg["log.retention.ms"].is_read_only
    default = _raw(b, 32, 4, {"resources": [{"resource_type": 4, "resource_name": "", "configuration_keys": None}],
                              "include_synonyms": True, "include_documentation": False}).results[0]
    assert sorted((c.name, c.value, c.config_source) for c in default.configs) == [
        ("log.retention.ms", "7000", 3), ("message.max.bytes", "3000", 3)]

    # The cluster default applies to every log at once: message.max.bytes=3000 refuses a 5000-byte batch.
    p = make_producer(b, **{"linger.ms": 0})
    (big,) = produce_all(p, topic, [{"value": b"m" * 5000}])
    assert big.error is not None and big.error.code() == KafkaError.MSG_SIZE_TOO_LARGE, big.error

    # Removing the per-broker value falls back to the cluster default.
    _incremental(b, ResourceType.BROKER, "0", ("log.retention.ms", AlterConfigOpType.DELETE, None))
    entry = _kp_describe(b, KpType.TOPIC, topic)["retention.ms"]
    assert (entry["value"], entry["config_source"]) == ("7000", "DYNAMIC_DEFAULT_BROKER_CONFIG")

    # Everything survives a restart, and is applied before the first request.
    b.stop()
    b.start()
    entry = _kp_describe(b, KpType.TOPIC, topic)["retention.ms"]
    assert (entry["value"], entry["config_source"]) == ("7000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    p = make_producer(b, **{"linger.ms": 0})
    (big,) = produce_all(p, topic, [{"value": b"m" * 5000}])
    assert big.error is not None and big.error.code() == KafkaError.MSG_SIZE_TOO_LARGE, big.error
    assert int(_raw_alter_default(b, {}).error_code) == 0  # legacy AlterConfigs with nothing: all removed
    (ok,) = produce_all(p, topic, [{"value": b"m" * 5000}])
    assert ok.error is None


def test_topic_change_survives_restart(broker_factory: BrokerFactory) -> None:
    b = broker_factory(OVERRIDES)
    topic = unique_topic("dc-rst")
    create_topic(b, topic, config={"segment.bytes": "1024"})
    _incremental(b, ResourceType.TOPIC, topic, ("retention.ms", AlterConfigOpType.SET, "86400000"),
                 ("max.message.bytes", AlterConfigOpType.SET, "2000"))
    b.stop()
    b.start()
    configs = _describe(b, ResourceType.TOPIC, topic)
    assert {k: configs[k].value for k in ("retention.ms", "max.message.bytes", "segment.bytes")} == \
        {"retention.ms": "86400000", "max.message.bytes": "2000", "segment.bytes": "1024"}
    (big,) = produce_all(make_producer(b, **{"linger.ms": 0}), topic, [{"value": b"r" * 3000}])
    assert big.error is not None and big.error.code() == KafkaError.MSG_SIZE_TOO_LARGE


# --- GROUP and CLIENT_METRICS resources (Kafka 4) ----------------------------------------------------

def test_group_configs(broker: BrokerProcess) -> None:
    group = unique_topic("dc-group")
    admin = _kp_admin(broker)
    try:
        result = admin.alter_configs([KpResource(KpType.GROUP, group, configs={
            "consumer.session.timeout.ms": "50000"})])
        assert "OK" in str(result), result
        bad = admin.alter_configs([KpResource(KpType.GROUP, group, configs={
            "consumer.heartbeat.interval.ms": "60000"})], raise_on_unknown=False)
        assert "InvalidConfiguration" in str(bad) or "INVALID_CONFIG" in str(bad).upper(), bad
    finally:
        admin.close()
    # The KIP-848 coordinator hands out the group's own heartbeat interval.
    hb = {"consumer.heartbeat.interval.ms": "7000"}
    admin = _kp_admin(broker)
    try:
        assert "OK" in str(admin.alter_configs([KpResource(KpType.GROUP, group, configs=hb)])), "heartbeat"
    finally:
        admin.close()
    topic = unique_topic("dc-gt")
    create_topic(broker, topic)
    with RawConnection(broker) as c:
        fc = c.request(10, 4, {"key_type": 0, "coordinator_keys": [group]})
        assert int(fc.coordinators[0].error_code) == 0
        r = c.request(68, 0, {"group_id": group, "member_id": "", "member_epoch": 0, "instance_id": None,
                              "rack_id": None, "rebalance_timeout": 10000, "subscribed_topic_names": [topic],
                              "server_assignor": None, "topic_partitions": []})
    assert int(r.error_code) == 0, r
    assert int(r.heartbeat_interval.total_seconds() * 1000) == 7000
    configs = _kp_describe(broker, KpType.GROUP, group)
    assert configs["consumer.heartbeat.interval.ms"]["value"] == "7000"
    assert configs["consumer.session.timeout.ms"]["value"] == "50000"
    assert configs["consumer.session.timeout.ms"]["config_source"] == "DYNAMIC_GROUP_CONFIG"
    assert configs["consumer.heartbeat.interval.ms"]["config_source"] == "DYNAMIC_GROUP_CONFIG"


def test_client_metrics_subscriptions(broker: BrokerProcess) -> None:
    name = unique_topic("dc-sub")
    r = _raw(broker, 44, 1, {"resources": [{"resource_type": 16, "resource_name": name, "configs": [
        {"name": "metrics", "config_operation": 0, "value": "org.apache.kafka.producer."},
        {"name": "interval.ms", "config_operation": 0, "value": "1000"},
    ]}], "validate_only": False})
    assert int(r.responses[0].error_code) == 0, r
    r = _raw(broker, 44, 0, {"resources": [{"resource_type": 16, "resource_name": name, "configs": [
        {"name": "interval.ms", "config_operation": 0, "value": "10"}]}], "validate_only": False})
    assert int(r.responses[0].error_code) == INVALID_REQUEST and "between 100 and 3600000" in \
        r.responses[0].error_message
    got = _raw(broker, 32, 3, {"resources": [{"resource_type": 16, "resource_name": name,
                                              "configuration_keys": None}],
                               "include_synonyms": True, "include_documentation": False}).results[0]
    assert sorted((c.name, c.value, c.config_source) for c in got.configs) == [
        ("interval.ms", "1000", 7), ("metrics", "org.apache.kafka.producer.", 7)]
