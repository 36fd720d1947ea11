"""Dynamic configs without a broker: layering, validation, incremental operations, sources and synonyms.

The expected sources and synonym lists are Kafka 3.9's (ConfigHelper / DynamicBrokerConfig): for a
topic config, the topic override, then the broker synonyms set dynamically per broker, as the cluster
default, statically, and the non-null defaults, starting from the first entry that names the
config's own primary broker key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pykbroker.config import (
    BROKER_CONFIG_DEFS,
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    TOPIC_CONFIG_DEFS,
    BrokerConfig,
    ConfigError,
    ConfigRequestError,
    apply_incremental_ops,
    log_config_for,
    topic_config_default,
    validate_client_metrics_configs,
    validate_dynamic_broker_configs,
    validate_group_configs,
    validate_topic_configs,
)
from pykbroker.metadata.embedded import EmbeddedMetadataStore
from pykbroker.server.handlers.configs import (
    SOURCE_DEFAULT,
    SOURCE_DYNAMIC_BROKER,
    SOURCE_DYNAMIC_DEFAULT_BROKER,
    SOURCE_DYNAMIC_TOPIC,
    SOURCE_GROUP,
    SOURCE_STATIC_BROKER,
    describe_broker_configs,
    describe_client_metrics,
    describe_group_configs,
    describe_topic_configs,
)


def _one(entries: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (e,) = [e for e in entries if e["name"] == name]
    return e


def _syn(entry: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(s["name"], s["value"], s["source"]) for s in entry["synonyms"]]


# --- layering ---------------------------------------------------------------------------------------

def test_dynamic_layers_take_precedence_over_static_and_each_other() -> None:
    cfg = BrokerConfig({"log.segment.bytes": "100000", "message.max.bytes": "5000"})
    assert cfg["log.segment.bytes"] == 100000
    changed = cfg.apply_dynamic({"log.segment.bytes": "300000"}, {"log.segment.bytes": "200000",
                                                                   "message.max.bytes": "7000"})
    assert cfg["log.segment.bytes"] == 300000  # per broker beats the cluster default
    assert cfg["message.max.bytes"] == 7000  # the cluster default beats the static value
    assert changed == ["log.segment.bytes", "message.max.bytes"]
    lc = log_config_for(cfg, {"max.message.bytes": "100"})
    assert (lc.segment_bytes, lc.max_message_bytes) == (300000, 100)  # the topic override beats all
    assert cfg.apply_dynamic({}, {}) == ["log.segment.bytes", "message.max.bytes"]
    assert cfg["log.segment.bytes"] == 100000 and cfg["message.max.bytes"] == 5000


def test_a_dynamic_synonym_hides_the_static_synonyms() -> None:
    # Only log.retention.ms is dynamic (not .minutes or .hours): setting it dynamically overrides the
    # static minutes, and removing it brings them back.
    cfg = BrokerConfig({"log.retention.minutes": "10"})
    assert cfg.retention_ms == 600_000
    cfg.apply_dynamic({}, {"log.retention.ms": "5000"})
    assert cfg.retention_ms == 5000 and log_config_for(cfg, {}).retention_ms == 5000
    assert cfg["log.retention.minutes"] is None  # hidden, as Kafka drops the lower layers' synonyms
    cfg.apply_dynamic({}, {})
    assert cfg.retention_ms == 600_000


def test_invalid_stored_dynamic_values_are_ignored() -> None:
    cfg = BrokerConfig()
    cfg.apply_dynamic({"log.segment.bytes": "abc", "log.dirs": "/x", "log.retention.ms": "10"}, {})
    assert cfg["log.segment.bytes"] == 1073741824 and cfg.retention_ms == 10
    assert cfg.dynamic_broker_configs == {"log.retention.ms": "10"}


# --- validation -------------------------------------------------------------------------------------

def test_broker_config_validation_follows_kafka() -> None:
    cfg = BrokerConfig()
    assert validate_dynamic_broker_configs(cfg, {"log.cleanup.policy": "compact, delete"}, True) == \
        {"log.cleanup.policy": "compact,delete"}
    with pytest.raises(ConfigRequestError, match=r"^Cannot update these configs dynamically: Set\(log.dirs\)$"):
        validate_dynamic_broker_configs(cfg, {"log.dirs": "/tmp/x"}, True)
    with pytest.raises(ConfigRequestError, match="Cannot update these configs dynamically"):
        validate_dynamic_broker_configs(cfg, {"log.retention.hours": "1"}, False)  # not dynamic in Kafka
    with pytest.raises(ConfigRequestError, match="Invalid value abc for configuration log.retention.ms"):
        validate_dynamic_broker_configs(cfg, {"log.retention.ms": "abc"}, True)
    assert validate_dynamic_broker_configs(cfg, {"compression.type": "gzip"}, False) == {"compression.type": "gzip"}
    with pytest.raises(ConfigRequestError, match="max.connections cannot be updated dynamically on pykbroker"):
        validate_dynamic_broker_configs(cfg, {"max.connections": "10"}, False)
    # Kafka stores keys it does not know; pykbroker refuses the keys of features it lacks as a rejected config.
    with pytest.raises(ConfigError, match="Unknown broker config ssl.keymanager.algorithm.*ssl") as refused:
        validate_dynamic_broker_configs(cfg, {"ssl.keymanager.algorithm": "x"}, True)
    assert not isinstance(refused.value, ConfigRequestError)
    with pytest.raises(ConfigError, match="sasl.kerberos.min.time.before.relogin.*Kerberos .GSSAPI. is not impl"):
        validate_dynamic_broker_configs(cfg, {"sasl.kerberos.min.time.before.relogin": "60000"}, True)
    # Kafka updates keystores dynamically; pykbroker reads them at start only.
    with pytest.raises(ConfigRequestError, match=r"Cannot update these configs dynamically: Set\(ssl.keystore"):
        validate_dynamic_broker_configs(cfg, {"ssl.keystore.location": "/k"}, True)
    with pytest.raises(ConfigRequestError, match="should not be greater than double the current value 8"):
        validate_dynamic_broker_configs(cfg, {"num.io.threads": "17"}, False)
    assert validate_dynamic_broker_configs(cfg, {"num.io.threads": "16"}, False) == {"num.io.threads": "16"}


def test_topic_config_validation() -> None:
    cfg = BrokerConfig()
    with pytest.raises(ConfigError, match="^Unknown topic config name: retention.hours$"):
        validate_topic_configs({"retention.hours": "1"}, cfg)
    with pytest.raises(ConfigError, match="Invalid value -5 for configuration retention.ms"):
        validate_topic_configs({"retention.ms": "-5"}, cfg)
    with pytest.raises(ConfigError, match=r"^remote.storage.enable is not supported yet: tiered storage"):
        validate_topic_configs({"remote.storage.enable": "true"}, cfg)
    with pytest.raises(ConfigError, match=r"min.compaction.lag.ms \(100\) > max.compaction.lag.ms \(50\)"):
        validate_topic_configs({"min.compaction.lag.ms": "100", "max.compaction.lag.ms": "50"}, cfg)


def test_group_config_validation() -> None:
    cfg = BrokerConfig()
    assert validate_group_configs(cfg, {"consumer.session.timeout.ms": "50000"}) == \
        {"consumer.session.timeout.ms": "50000"}
    with pytest.raises(ConfigError, match="consumer.session.timeout.ms must be less than or equal to "
                                          "group.consumer.max.session.timeout.ms"):
        validate_group_configs(cfg, {"consumer.session.timeout.ms": "70000"})
    with pytest.raises(ConfigError, match="consumer.heartbeat.interval.ms must be greater than or equal to"):
        validate_group_configs(cfg, {"consumer.heartbeat.interval.ms": "10"})
    with pytest.raises(ConfigError, match="^Unknown group config name: foo$"):
        validate_group_configs(cfg, {"foo": "1"})
    assert validate_group_configs(cfg, {"share.auto.offset.reset": "earliest"}) == \
        {"share.auto.offset.reset": "earliest"}
    with pytest.raises(ConfigError, match="share.auto.offset.reset"):
        validate_group_configs(cfg, {"share.auto.offset.reset": "none"})
    with pytest.raises(ConfigError, match="legal topic name"):
        validate_group_configs(cfg, {"pykbroker.share.dlq.topic": "no spaces"})
    with pytest.raises(ConfigError, match="share.session.timeout.ms must be greater than"):
        validate_group_configs(cfg, {"share.session.timeout.ms": "5000"})
    wide = BrokerConfig({"group.consumer.min.session.timeout.ms": "1000",
                         "group.consumer.min.heartbeat.interval.ms": "1000"})
    with pytest.raises(ConfigError, match="consumer.session.timeout.ms must be greater than "
                                          "consumer.heartbeat.interval.ms"):
        validate_group_configs(wide, {"consumer.session.timeout.ms": "5000"})


def test_client_metrics_validation() -> None:
    ok = {"metrics": "org.apache.kafka.producer.", "interval.ms": "1000", "match": "client_id=app.*"}
    assert validate_client_metrics_configs("sub", ok) == ok
    with pytest.raises(ConfigRequestError, match="Unknown client metrics configuration: foo"):
        validate_client_metrics_configs("sub", {"foo": "x"})
    with pytest.raises(ConfigRequestError, match="interval must be between 100 and 3600000"):
        validate_client_metrics_configs("sub", {"interval.ms": "50"})
    with pytest.raises(ConfigError, match="Illegal client matching pattern: color=red"):
        validate_client_metrics_configs("sub", {"match": "color=red"})
    with pytest.raises(ConfigRequestError, match="Subscription name can't be empty"):
        validate_client_metrics_configs("", {"interval.ms": "1000"})


# --- incremental operations --------------------------------------------------------------------------

def _topic_ops(current: dict[str, str], *ops: tuple[str, int, str | None]) -> dict[str, str]:
    return apply_incremental_ops(current, list(ops), TOPIC_CONFIG_DEFS.get,
                                 lambda k: topic_config_default(k) if k in TOPIC_CONFIG_DEFS else None)


def test_incremental_operations() -> None:
    assert _topic_ops({}, ("cleanup.policy", OP_APPEND, "compact")) == {"cleanup.policy": "delete,compact"}
    assert _topic_ops({"cleanup.policy": "compact"}, ("cleanup.policy", OP_APPEND, "compact,delete")) == \
        {"cleanup.policy": "compact,delete"}
    assert _topic_ops({"cleanup.policy": "compact,delete"}, ("cleanup.policy", OP_SUBTRACT, "delete")) == \
        {"cleanup.policy": "compact"}
    assert _topic_ops({}, ("cleanup.policy", OP_SUBTRACT, "delete")) == {"cleanup.policy": ""}
    assert _topic_ops({"retention.ms": "5", "segment.bytes": "9999"},
                      ("retention.ms", OP_DELETE, None), ("segment.bytes", OP_SET, "20000")) == \
        {"segment.bytes": "20000"}
    with pytest.raises(ConfigError, match=r"^Can't APPEND to key retention.ms because its type is not LIST.$"):
        _topic_ops({}, ("retention.ms", OP_APPEND, "5"))
    with pytest.raises(ConfigError, match="Can't SUBTRACT to key nope because its type is not LIST."):
        _topic_ops({}, ("nope", OP_SUBTRACT, "5"))
    with pytest.raises(ConfigRequestError, match="Unknown operations type 7"):
        _topic_ops({}, ("retention.ms", 7, "5"))
    broker = apply_incremental_ops({}, [("log.cleanup.policy", OP_APPEND, "compact")], BROKER_CONFIG_DEFS.get,
                                   BrokerConfig.default_string)
    assert broker == {"log.cleanup.policy": "delete,compact"}


# --- sources and synonyms ----------------------------------------------------------------------------

def test_topic_defaults_list_no_synonym_for_a_null_default() -> None:
    cfg = BrokerConfig()
    entries = describe_topic_configs(cfg, {}, synonyms=True)
    retention = _one(entries, "retention.ms")
    # log.retention.ms has no default (null) and is set nowhere: Kafka lists no synonym at all.
    assert (retention["value"], retention["config_source"], _syn(retention)) == ("604800000", SOURCE_DEFAULT, [])
    seg = _one(entries, "segment.bytes")
    assert _syn(seg) == [("log.segment.bytes", "1073741824", SOURCE_DEFAULT)]
    assert seg["config_source"] == SOURCE_DEFAULT and seg["read_only"] is False and seg["config_type"] == 3
    assert _syn(_one(entries, "segment.ms")) == []  # log.roll.ms is null too
    assert _syn(_one(entries, "flush.ms")) == []


def test_topic_synonyms_in_kafka_order() -> None:
    cfg = BrokerConfig({"log.retention.hours": "100", "log.segment.bytes": "50000"})
    cfg.apply_dynamic({"log.retention.ms": "5000"}, {"log.retention.ms": "7000", "log.segment.bytes": "60000"})
    entries = describe_topic_configs(cfg, {"segment.bytes": "70000"}, synonyms=True)
    retention = _one(entries, "retention.ms")
    assert retention["value"] == "5000" and retention["config_source"] == SOURCE_DYNAMIC_BROKER
    assert _syn(retention) == [
        ("log.retention.ms", "5000", SOURCE_DYNAMIC_BROKER),
        ("log.retention.ms", "7000", SOURCE_DYNAMIC_DEFAULT_BROKER),
        ("log.retention.hours", "100", SOURCE_STATIC_BROKER),
        ("log.retention.hours", "168", SOURCE_DEFAULT),
    ]
    seg = _one(entries, "segment.bytes")
    assert seg["value"] == "70000" and seg["config_source"] == SOURCE_DYNAMIC_TOPIC
    assert _syn(seg) == [
        ("segment.bytes", "70000", SOURCE_DYNAMIC_TOPIC),
        ("log.segment.bytes", "60000", SOURCE_DYNAMIC_DEFAULT_BROKER),
        ("log.segment.bytes", "50000", SOURCE_STATIC_BROKER),
        ("log.segment.bytes", "1073741824", SOURCE_DEFAULT),
    ]
    # Without include_synonyms the list is empty but the source is the same.
    plain = _one(describe_topic_configs(cfg, {}), "retention.ms")
    assert plain["synonyms"] == [] and plain["config_source"] == SOURCE_DYNAMIC_BROKER
    assert plain["documentation"] is None
    documented = describe_topic_configs(cfg, {}, documentation=True)
    assert all(e["documentation"] for e in documented), [e["name"] for e in documented if not e["documentation"]]


def test_hours_alone_give_a_default_sourced_retention_ms() -> None:
    # Kafka drops synonyms until the first one named log.retention.ms: with only log.retention.hours set,
    # retention.ms reports DEFAULT_CONFIG and no synonyms, although its value comes from the hours.
    cfg = BrokerConfig({"log.retention.hours": "1"})
    retention = _one(describe_topic_configs(cfg, {}, synonyms=True), "retention.ms")
    assert (retention["value"], retention["config_source"], _syn(retention)) == ("3600000", SOURCE_DEFAULT, [])
    hours = _one(describe_broker_configs(cfg, True, ["log.retention.hours"], synonyms=True), "log.retention.hours")
    assert hours["config_source"] == SOURCE_STATIC_BROKER and hours["read_only"] is True
    assert _syn(hours) == [("log.retention.hours", "1", SOURCE_STATIC_BROKER),
                           ("log.retention.hours", "168", SOURCE_DEFAULT)]


def test_broker_describe_per_broker_and_cluster_default() -> None:
    cfg = BrokerConfig({"message.max.bytes": "5000"})
    cfg.apply_dynamic({"message.max.bytes": "9000"}, {"message.max.bytes": "7000", "log.retention.ms": "60000"})
    per_broker = describe_broker_configs(cfg, True, synonyms=True)
    assert {e["name"] for e in per_broker} == set(BROKER_CONFIG_DEFS)
    mmb = _one(per_broker, "message.max.bytes")
    assert (mmb["value"], mmb["config_source"], mmb["read_only"]) == ("9000", SOURCE_DYNAMIC_BROKER, False)
    assert _syn(mmb) == [("message.max.bytes", "9000", SOURCE_DYNAMIC_BROKER),
                         ("message.max.bytes", "7000", SOURCE_DYNAMIC_DEFAULT_BROKER),
                         ("message.max.bytes", "5000", SOURCE_STATIC_BROKER),
                         ("message.max.bytes", "1048588", SOURCE_DEFAULT)]
    assert _one(per_broker, "log.dirs")["read_only"] is True
    default = describe_broker_configs(cfg, False, synonyms=True)
    assert [(e["name"], e["value"], e["config_source"]) for e in default] == [
        ("log.retention.ms", "60000", SOURCE_DYNAMIC_DEFAULT_BROKER),
        ("message.max.bytes", "7000", SOURCE_DYNAMIC_DEFAULT_BROKER)]
    assert _syn(default[1]) == [("message.max.bytes", "7000", SOURCE_DYNAMIC_DEFAULT_BROKER)]
    # configuration_keys filters; an empty list means all, as in Kafka.
    assert [e["name"] for e in describe_broker_configs(cfg, True, ["message.max.bytes"])] == ["message.max.bytes"]
    assert len(describe_broker_configs(cfg, True, [])) == len(per_broker)


def test_group_and_client_metrics_describe() -> None:
    cfg = BrokerConfig()
    entries = describe_group_configs(cfg, {"consumer.session.timeout.ms": "50000"}, synonyms=True)
    share = {e["name"]: e["value"] for e in entries if "share." in e["name"]}
    assert share["share.auto.offset.reset"] == "latest" and share["share.record.lock.duration.ms"] == "30000"
    entries = [e for e in entries if e["name"].startswith("consumer.")]
    assert [(e["name"], e["value"], e["config_source"], _syn(e)) for e in entries] == [
        ("consumer.heartbeat.interval.ms", "5000", SOURCE_DEFAULT,
         [("consumer.heartbeat.interval.ms", "5000", SOURCE_DEFAULT)]),
        ("consumer.session.timeout.ms", "50000", SOURCE_GROUP,
         [("consumer.session.timeout.ms", "50000", SOURCE_GROUP)]),
    ]
    cm = describe_client_metrics({"interval.ms": "1000"})
    assert [(e["name"], e["value"], e["config_source"], e["config_type"]) for e in cm] == \
        [("interval.ms", "1000", 7, 0)]


# --- the store ---------------------------------------------------------------------------------------

def test_embedded_store_keeps_entity_configs(tmp_path: Path) -> None:
    store = EmbeddedMetadataStore(tmp_path, 0, [("PLAINTEXT", "127.0.0.1", 9092)])
    store.start()
    seen: list[tuple[int, str]] = []
    store.add_config_listener(lambda t, n: seen.append((t, n)))
    store.set_entity_configs(4, "", {"log.retention.ms": "1000"})
    store.set_entity_configs(4, "0", {"message.max.bytes": "2000"})
    store.set_entity_configs(16, "sub", {"interval.ms": "1000"})
    store.set_entity_configs(32, "g", {"consumer.session.timeout.ms": "50000"})
    store.set_entity_configs(32, "g", {})
    assert seen == [(4, ""), (4, "0"), (16, "sub"), (32, "g"), (32, "g")]
    again = EmbeddedMetadataStore(tmp_path, 0, [("PLAINTEXT", "127.0.0.1", 9092)])
    again.start()
    assert again.configs_of(4, "") == {"log.retention.ms": "1000"}
    assert again.configs_of(4, "0") == {"message.max.bytes": "2000"}
    assert again.client_metrics_configs() == {"sub": {"interval.ms": "1000"}}
    assert again.entity_configs(32) == {}


class _LaggingStore(EmbeddedMetadataStore):
    """A store whose cache has not yet seen a topic another broker created (the ZooKeeper watch lag)."""

    blocking = True

    def __init__(self, *args: Any, hidden: dict[str, dict[str, str]]) -> None:
        super().__init__(*args)
        self.hidden = hidden
        self.written: dict[str, dict[str, str]] = {}

    def read_topic_configs(self, name: str, *, fresh: bool = False) -> dict[str, str] | None:
        if name in self.hidden:
            return dict(self.hidden[name])
        return super().read_topic_configs(name, fresh=fresh)

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> Any:
        self.written[name] = dict(configs)


def test_configs_of_a_topic_the_cache_has_not_seen_come_from_the_store(tmp_path: Path) -> None:
    """DescribeConfigs / IncrementalAlterConfigs right after another broker created the topic: the answer
    comes from the store, not UNKNOWN_TOPIC_OR_PARTITION (seen with the Java admin client on 3 brokers)."""
    import types

    import anyio
    from kio.schema.errors import ErrorCode

    from pykbroker.server.handlers.configs import handle_describe_configs, handle_incremental_alter_configs

    store = _LaggingStore(tmp_path, 0, [("PLAINTEXT", "127.0.0.1", 9092)], hidden={"fresh": {"retention.ms": "5"}})
    store.start()
    svc: Any = types.SimpleNamespace(config=BrokerConfig(), store=store)
    ctx: Any = types.SimpleNamespace(authorizer=None)

    def res(name: str, keys: list[str] | None = None) -> Any:
        return types.SimpleNamespace(resource_type=2, resource_name=name, configuration_keys=keys)

    req = types.SimpleNamespace(resources=[res("fresh", ["retention.ms"]), res("absent")],
                                include_synonyms=False, include_documentation=False)
    out = anyio.run(handle_describe_configs, svc, ctx, req)
    fresh, absent = out["results"]
    assert fresh["error_code"] == ErrorCode.none
    assert [(c["name"], c["value"]) for c in fresh["configs"]] == [("retention.ms", "5")]
    assert absent["error_code"] == ErrorCode.unknown_topic_or_partition

    op = types.SimpleNamespace(name="cleanup.policy", config_operation=0, value="compact")
    alter = types.SimpleNamespace(resources=[types.SimpleNamespace(resource_type=2, resource_name="fresh",
                                                                   configs=[op])], validate_only=False)
    out = anyio.run(handle_incremental_alter_configs, svc, ctx, alter)
    assert out["responses"][0]["error_code"] == ErrorCode.none
    assert store.written["fresh"] == {"retention.ms": "5", "cleanup.policy": "compact"}
