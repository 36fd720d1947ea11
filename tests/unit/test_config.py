"""server.properties parsing, validation and the environment mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from pykbroker.config import (
    BrokerConfig,
    ConfigError,
    env_to_key,
    load_config,
    log_config_for,
    parse_properties,
    validate_topic_configs,
)


def test_defaults_are_kafkas() -> None:
    c = BrokerConfig({})
    assert c["num.partitions"] == 1
    assert c["log.segment.bytes"] == 1073741824
    assert c.retention_ms == 168 * 3_600_000
    assert c["message.max.bytes"] == 1048588
    assert c["auto.create.topics.enable"] is True


def test_retention_precedence() -> None:
    assert BrokerConfig({"log.retention.hours": "1"}).retention_ms == 3_600_000
    assert BrokerConfig({"log.retention.hours": "1", "log.retention.minutes": "2"}).retention_ms == 120_000
    assert BrokerConfig({"log.retention.minutes": "2", "log.retention.ms": "5"}).retention_ms == 5


def test_unknown_key_named() -> None:
    with pytest.raises(ConfigError, match="log.segmnet.bytes"):
        BrokerConfig({"log.segmnet.bytes": "1"})


@pytest.mark.parametrize(
    ("key", "value"),
    [("num.partitions", "zero"), ("num.partitions", "0"), ("listeners", "localhost:9092"),
     ("auto.create.topics.enable", "maybe"), ("log.message.timestamp.type", "Now")],
)
def test_invalid_value_named(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        BrokerConfig({key: value})


def test_properties_file_and_precedence(tmp_path: Path) -> None:
    f = tmp_path / "server.properties"
    f.write_text("# comment\nbroker.id=3\nnum.partitions = 4\nlog.dirs=/a,\\\n  /b\n")
    c = load_config(f, ["num.partitions=5"], environ={"PYKBROKER_BROKER_ID": "7"})
    assert c.broker_id == 7
    assert c["num.partitions"] == 5
    assert [str(p) for p in c.log_dirs] == ["/a", "/b"]


def test_parse_properties_separators() -> None:
    assert parse_properties("a=1\nb: 2\nc 3\n! x\n") == {"a": "1", "b": "2", "c": "3"}


def test_env_mapping() -> None:
    assert env_to_key("PYKBROKER_LOG_RETENTION_HOURS") == "log.retention.hours"
    assert env_to_key("PYKBROKER_SOME__UNDERSCORE___DASH") == "some_underscore-dash"


def test_advertised_defaults_to_listener() -> None:
    c = BrokerConfig({"listeners": "PLAINTEXT://0.0.0.0:9093"})
    assert c.advertised_listeners[0].port == 9093
    assert c.advertised_listeners[0].host == "127.0.0.1"
    with pytest.raises(ConfigError, match="advertised.listeners"):
        BrokerConfig({"advertised.listeners": "OTHER://h:1"})


def test_topic_configs() -> None:
    assert validate_topic_configs({"retention.ms": "1000"}) == {"retention.ms": "1000"}
    with pytest.raises(ConfigError, match="Unknown topic config"):
        validate_topic_configs({"retention.msx": "1"})
    with pytest.raises(ConfigError, match="cleanup.policy"):
        validate_topic_configs({"cleanup.policy": "forever"})
    lc = log_config_for(BrokerConfig({"log.segment.bytes": "2048"}), {"retention.bytes": "10"})
    assert lc.segment_bytes == 2048 and lc.retention_bytes == 10


def test_inter_broker_listener_by_kafkas_rules() -> None:
    two = {"listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093", "ssl.keystore.type": "PEM"}
    assert BrokerConfig(two).inter_broker_listener == "PLAINTEXT"  # Kafka's default protocol
    assert BrokerConfig({**two, "security.inter.broker.protocol": "SSL"}).inter_broker_listener == "SSL"
    assert BrokerConfig({**two, "security.inter.broker.protocol": "ssl"}).inter_broker_listener == "SSL"
    assert BrokerConfig({**two, "inter.broker.listener.name": "ssl"}).inter_broker_listener == "SSL"
    # Not both (Kafka: "Only one of inter.broker.listener.name and security.inter.broker.protocol should be set").
    with pytest.raises(ConfigError, match="only one of 'inter.broker.listener.name' and 'security.inter.broker"):
        BrokerConfig({**two, "inter.broker.listener.name": "SSL", "security.inter.broker.protocol": "SSL"})
    # The protocol names the listener; there must be one of that name, using that protocol.
    with pytest.raises(ConfigError, match="listener named SASL_SSL, which is not in 'listeners'"):
        BrokerConfig({**two, "security.inter.broker.protocol": "SASL_SSL"})
    with pytest.raises(ConfigError, match="listener SSL uses PLAINTEXT"):
        BrokerConfig({**two, "security.inter.broker.protocol": "SSL",
                      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:PLAINTEXT"})
    with pytest.raises(ConfigError, match="security.inter.broker.protocol"):
        BrokerConfig({**two, "security.inter.broker.protocol": "KERBEROS"})
    with pytest.raises(ConfigError, match="names INTERNAL, which is not in 'listeners'"):
        BrokerConfig({**two, "inter.broker.listener.name": "INTERNAL"})
    # Neither set and no PLAINTEXT listener: the first listener (Kafka would refuse to start).
    named = {"listeners": "EXTERNAL://127.0.0.1:9092,INTERNAL://127.0.0.1:9093",
             "listener.security.protocol.map": "EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT"}
    assert BrokerConfig(named).inter_broker_listener == "EXTERNAL"


def test_other_listener_keys_of_kafka() -> None:
    two = {"listeners": "PLAINTEXT://127.0.0.1:9092,CONTROL://127.0.0.1:9093",
           "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROL:PLAINTEXT"}
    cfg = BrokerConfig({**two, "control.plane.listener.name": "CONTROL", "early.start.listeners": "CONTROL",
                        "inter.broker.protocol.version": "3.9-IV0"})
    assert cfg["control.plane.listener.name"] == "CONTROL"
    assert BrokerConfig({"inter.broker.protocol.version": "2.8"})["inter.broker.protocol.version"] == "2.8"
    with pytest.raises(ConfigError, match="must differ from the inter-broker listener"):
        BrokerConfig({**two, "control.plane.listener.name": "PLAINTEXT"})
    with pytest.raises(ConfigError, match="'control.plane.listener.name' names NOPE"):
        BrokerConfig({**two, "control.plane.listener.name": "NOPE"})
    with pytest.raises(ConfigError, match="'early.start.listeners' names NOPE"):
        BrokerConfig({**two, "early.start.listeners": "CONTROL,NOPE"})
    with pytest.raises(ConfigError, match="inter.broker.protocol.version"):
        BrokerConfig({"inter.broker.protocol.version": "latest"})
