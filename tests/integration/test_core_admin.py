"""Topic administration through confluent-kafka's AdminClient: create/describe/delete topics and configs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from tests.integration.conftest import CLIENT_TIMEOUT, BrokerFactory, admin_for, unique_topic, wait_until
from tests.support.broker import BrokerProcess

BROKER_OVERRIDES = {
    "num.partitions": "2",
    "log.retention.check.interval.ms": "12345",
}


@pytest.fixture(scope="module")
def admin_broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory(BROKER_OVERRIDES)


@pytest.fixture
def admin(admin_broker: BrokerProcess) -> Iterator[AdminClient]:
    yield admin_for(admin_broker)


def _create(admin: AdminClient, topics: list[NewTopic], validate_only: bool = False) -> dict[str, KafkaError | None]:
    """Create topics; returns each topic's error (None on success)."""
    fs = admin.create_topics(topics, validate_only=validate_only, operation_timeout=10,
                             request_timeout=CLIENT_TIMEOUT)
    out: dict[str, KafkaError | None] = {}
    for name, f in fs.items():
        try:
            f.result(timeout=CLIENT_TIMEOUT)
            out[name] = None
        except KafkaException as e:
            out[name] = e.args[0]
    return out


def _topic_names(admin: AdminClient) -> set[str]:
    return set(admin.list_topics(timeout=CLIENT_TIMEOUT).topics)


def _describe_configs(admin: AdminClient, resource: ConfigResource) -> dict[str, object]:
    fs = admin.describe_configs([resource], request_timeout=CLIENT_TIMEOUT)
    (f,) = fs.values()
    result: dict[str, object] = f.result(timeout=CLIENT_TIMEOUT)
    return result


def test_create_describe_and_delete_topic(admin: AdminClient) -> None:
    name = unique_topic("adm")
    assert _create(admin, [NewTopic(name, num_partitions=3, replication_factor=1)]) == {name: None}

    md = admin.list_topics(timeout=CLIENT_TIMEOUT)
    assert name in md.topics
    tmd = md.topics[name]
    assert tmd.error is None
    assert sorted(tmd.partitions) == [0, 1, 2]
    for p in tmd.partitions.values():
        assert p.leader == 0
        assert list(p.replicas) == [0]
        assert list(p.isrs) == [0]

    desc = admin.describe_topics(TopicCollection([name]), request_timeout=CLIENT_TIMEOUT)[name].result(
        timeout=CLIENT_TIMEOUT)
    assert desc.name == name
    assert not desc.is_internal
    assert [p.id for p in desc.partitions] == [0, 1, 2]
    assert all(p.leader is not None and p.leader.id == 0 for p in desc.partitions)

    fs = admin.delete_topics([name], operation_timeout=10, request_timeout=CLIENT_TIMEOUT)
    fs[name].result(timeout=CLIENT_TIMEOUT)
    wait_until(lambda: name not in _topic_names(admin), what=f"{name} gone from metadata")

    # Deleting it again: the topic is unknown now.
    fs = admin.delete_topics([name], operation_timeout=10, request_timeout=CLIENT_TIMEOUT)
    with pytest.raises(KafkaException) as ei:
        fs[name].result(timeout=CLIENT_TIMEOUT)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_default_partition_count_comes_from_broker_config(admin: AdminClient) -> None:
    name = unique_topic("adm-default")
    assert _create(admin, [NewTopic(name)]) == {name: None}  # -1 partitions / replication: broker defaults
    md = admin.list_topics(topic=name, timeout=CLIENT_TIMEOUT)
    assert sorted(md.topics[name].partitions) == [0, 1]  # num.partitions=2 on this broker


def test_create_with_configs_and_describe_topic_configs(admin: AdminClient) -> None:
    name = unique_topic("adm-cfg")
    configs = {"retention.ms": "123456", "cleanup.policy": "delete", "max.message.bytes": "200000"}
    assert _create(admin, [NewTopic(name, num_partitions=1, replication_factor=1, config=configs)]) == {name: None}

    entries = _describe_configs(admin, ConfigResource(ResourceType.TOPIC, name))
    assert "segment.bytes" in entries and "retention.bytes" in entries
    for key, value in configs.items():
        e = entries[key]
        assert e.value == value, key  # type: ignore[attr-defined]
        assert e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, key  # type: ignore[attr-defined]
        assert not e.is_default, key  # type: ignore[attr-defined]
    seg = entries["segment.bytes"]
    assert seg.value == "1073741824"  # type: ignore[attr-defined]
    assert seg.source == ConfigSource.DEFAULT_CONFIG.value  # type: ignore[attr-defined]
    assert seg.is_default  # type: ignore[attr-defined]

    # A topic without overrides reports the defaults.
    plain = unique_topic("adm-plain")
    assert _create(admin, [NewTopic(plain, 1, 1)]) == {plain: None}
    plain_entries = _describe_configs(admin, ConfigResource(ResourceType.TOPIC, plain))
    assert plain_entries["retention.ms"].value == "604800000"  # type: ignore[attr-defined]
    assert plain_entries["cleanup.policy"].value == "delete"  # type: ignore[attr-defined]


def test_describe_broker_configs(admin: AdminClient, admin_broker: BrokerProcess) -> None:
    entries = _describe_configs(admin, ConfigResource(ResourceType.BROKER, "0"))
    npart = entries["num.partitions"]
    assert npart.value == "2"  # type: ignore[attr-defined]
    assert npart.source == ConfigSource.STATIC_BROKER_CONFIG.value  # type: ignore[attr-defined]
    check = entries["log.retention.check.interval.ms"]
    assert check.value == "12345"  # type: ignore[attr-defined]
    mmb = entries["message.max.bytes"]
    assert mmb.value == "1048588"  # type: ignore[attr-defined]
    assert mmb.source == ConfigSource.DEFAULT_CONFIG.value  # type: ignore[attr-defined]
    assert entries["log.dirs"].value == str(admin_broker.data_dir / "logs")  # type: ignore[attr-defined]


def test_describe_configs_of_unknown_topic(admin: AdminClient) -> None:
    with pytest.raises(KafkaException) as ei:
        _describe_configs(admin, ConfigResource(ResourceType.TOPIC, unique_topic("missing")))
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_validate_only_creates_nothing(admin: AdminClient) -> None:
    name = unique_topic("adm-validate")
    assert _create(admin, [NewTopic(name, 2, 1, config={"retention.ms": "1000"})], validate_only=True) == {name: None}
    assert name not in _topic_names(admin)
    # Validation still applies: a bad config fails in validate-only mode too.
    errors = _create(admin, [NewTopic(name, 2, 1, config={"retention.ms": "soon"})], validate_only=True)
    err = errors[name]
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG
    # And the real creation afterwards works (validate-only left no trace).
    assert _create(admin, [NewTopic(name, 2, 1)]) == {name: None}
    assert name in _topic_names(admin)


def test_duplicate_topic_is_rejected(admin: AdminClient) -> None:
    name = unique_topic("adm-dup")
    assert _create(admin, [NewTopic(name, 1, 1)]) == {name: None}
    err = _create(admin, [NewTopic(name, 1, 1)])[name]
    assert err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS
    # validate_only also sees the existing topic
    err = _create(admin, [NewTopic(name, 1, 1)], validate_only=True)[name]
    assert err is not None and err.code() == KafkaError.TOPIC_ALREADY_EXISTS


@pytest.mark.parametrize("bad_name", ["bad name", "slash/topic", "..", ".", "x" * 250, "caf\u00e9"])
def test_invalid_topic_name_is_rejected(admin: AdminClient, bad_name: str) -> None:
    err = _create(admin, [NewTopic(bad_name, 1, 1)])[bad_name]
    assert err is not None and err.code() == KafkaError.TOPIC_EXCEPTION, err
    assert bad_name not in _topic_names(admin)


def test_bad_partition_count_is_rejected(admin: AdminClient) -> None:
    name = unique_topic("adm-parts")
    err = _create(admin, [NewTopic(name, num_partitions=0, replication_factor=1)])[name]
    assert err is not None and err.code() == KafkaError.INVALID_PARTITIONS
    assert name not in _topic_names(admin)


def test_bad_replication_factor_is_rejected(admin: AdminClient) -> None:
    name = unique_topic("adm-rf")
    err = _create(admin, [NewTopic(name, num_partitions=1, replication_factor=3)])[name]
    assert err is not None and err.code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert name not in _topic_names(admin)


@pytest.mark.parametrize("config", [
    {"no.such.config": "1"},
    {"retention.ms": "not-a-number"},
    {"cleanup.policy": "shred"},
    {"segment.bytes": "1"},  # below the minimum of 14
    {"message.timestamp.type": "WallClock"},
])
def test_bad_config_is_rejected(admin: AdminClient, config: dict[str, str]) -> None:
    name = unique_topic("adm-badcfg")
    err = _create(admin, [NewTopic(name, 1, 1, config=config)])[name]
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG, err
    assert name not in _topic_names(admin)


def test_one_bad_topic_does_not_fail_the_others(admin: AdminClient) -> None:
    good, bad = unique_topic("adm-good"), unique_topic("adm-bad")
    errors = _create(admin, [NewTopic(good, 1, 1), NewTopic(bad, 1, 1, config={"retention.ms": "x"})])
    assert errors[good] is None
    bad_err = errors[bad]
    assert bad_err is not None and bad_err.code() == KafkaError.INVALID_CONFIG
    names = _topic_names(admin)
    assert good in names and bad not in names


def test_create_partitions_errors(admin: AdminClient) -> None:
    name = unique_topic("adm-cp")
    assert _create(admin, [NewTopic(name, 2, 1)]) == {name: None}
    for count in (1, 2):  # fewer, or the same number: INVALID_PARTITIONS
        fs = admin.create_partitions([NewPartitions(name, count)], request_timeout=CLIENT_TIMEOUT)
        with pytest.raises(KafkaException) as ei:
            fs[name].result(timeout=CLIENT_TIMEOUT)
        assert ei.value.args[0].code() == KafkaError.INVALID_PARTITIONS
    missing = unique_topic("adm-cp-missing")
    fs = admin.create_partitions([NewPartitions(missing, 3)], request_timeout=CLIENT_TIMEOUT)
    with pytest.raises(KafkaException) as ei:
        fs[missing].result(timeout=CLIENT_TIMEOUT)
    assert ei.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    # validate_only leaves the count alone
    fs = admin.create_partitions([NewPartitions(name, 5)], validate_only=True, request_timeout=CLIENT_TIMEOUT)
    fs[name].result(timeout=CLIENT_TIMEOUT)
    md = admin.list_topics(topic=name, timeout=CLIENT_TIMEOUT)
    assert sorted(md.topics[name].partitions) == [0, 1]


def test_topic_deletion_disabled(broker_factory: BrokerFactory) -> None:
    b = broker_factory({"delete.topic.enable": "false"})
    admin = admin_for(b)
    name = unique_topic("adm-nodelete")
    assert _create(admin, [NewTopic(name, 1, 1)]) == {name: None}
    fs = admin.delete_topics([name], operation_timeout=10, request_timeout=CLIENT_TIMEOUT)
    with pytest.raises(KafkaException) as ei:
        fs[name].result(timeout=CLIENT_TIMEOUT)
    assert ei.value.args[0].code() == KafkaError.TOPIC_DELETION_DISABLED
    assert name in _topic_names(admin)
