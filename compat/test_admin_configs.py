"""Dynamic configs: IncrementalAlterConfigs (set, append, subtract, delete) and AlterConfigs on topics,
DescribeConfigs sources and synonyms, a broker's and the cluster default's dynamic configs, and
CLIENT_METRICS subscriptions.

Everything asserted is what a single-node Kafka 3.9 answers; values the cluster's own static settings
could change (a broker's defaults) are compared only by source, never by value.
"""

from __future__ import annotations

import fcntl
import hashlib
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compat import scenario as s
from compat.check import expect_error
from compat.clients import base
from compat.clients.base import Client, ClientError, ConfigValue, wait_until
from compat.cluster import ClusterInfo
from compat.conftest import unique_topic

BROKER_SOURCES = {"DYNAMIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG", "STATIC_BROKER_CONFIG", "DEFAULT_CONFIG"}
# A broker setting Kafka 3.9 updates dynamically, per broker and cluster-wide, that changes nothing a
# test on a shared cluster can notice: how long tombstones of compacted topics are kept.
BROKER_KEY = "log.cleaner.delete.retention.ms"
TOPIC_SYNONYM = "delete.retention.ms"
KAFKA_DEFAULT = "86400000"


def _configs(client: Client, rtype: str, name: str, synonyms: bool = False) -> dict[str, ConfigValue]:
    return client.describe_configs(rtype, name, synonyms=synonyms)


def _settled(client: Client, rtype: str, name: str, want: dict[str, tuple[str | None, str]],
             synonyms: bool = False, timeout: float = 20.0) -> dict[str, ConfigValue]:
    """DescribeConfigs until every key has the wanted (value, source). Kafka applies an alteration on
    the controller and the brokers learn it from the metadata log a moment later."""
    got: dict[str, ConfigValue] = {}

    def ok() -> bool:
        got.clear()
        got.update(_configs(client, rtype, name, synonyms))
        return all(k in got and (got[k].value, got[k].source) == v for k, v in want.items())

    try:
        wait_until(ok, timeout, what=f"{rtype} {name!r} configs {want}")
    except TimeoutError:
        seen = {k: (got[k].value, got[k].source) if k in got else "absent" for k in want}
        raise AssertionError(f"{rtype} {name!r}: wanted {want}, described {seen}") from None
    return dict(got)


# --- topics ---------------------------------------------------------------------------------------

@s.scenario("configs.topic-incremental", "dynamic configs", needs=(base.INCREMENTAL_ALTER_CONFIGS,),
            apis=(44, 32), consumes=False)
def test_topic_incremental(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1)
    before = _configs(client, "topic", topic)
    assert before["retention.ms"].source != "DYNAMIC_TOPIC_CONFIG", before["retention.ms"]
    assert before["cleanup.policy"].value == "delete", before["cleanup.policy"]

    client.alter_configs("topic", topic, [("set", "retention.ms", "3600000"), ("append", "cleanup.policy", "compact")])
    _settled(client, "topic", topic, {"retention.ms": ("3600000", "DYNAMIC_TOPIC_CONFIG"),
                                      "cleanup.policy": ("delete,compact", "DYNAMIC_TOPIC_CONFIG")})

    client.alter_configs("topic", topic, [("subtract", "cleanup.policy", "delete")])
    _settled(client, "topic", topic, {"cleanup.policy": ("compact", "DYNAMIC_TOPIC_CONFIG"),
                                      "retention.ms": ("3600000", "DYNAMIC_TOPIC_CONFIG")})

    # validate_only checks and changes nothing.
    client.alter_configs("topic", topic, [("set", "retention.ms", "7200000")], validate_only=True)
    expect_error("INVALID_CONFIG", client.alter_configs, "topic", topic, [("set", "retention.ms", "soon")],
                 validate_only=True)

    # Errors: a value of the wrong type, append to a non-list config, an unknown key, an unknown topic.
    expect_error("INVALID_CONFIG", client.alter_configs, "topic", topic, [("set", "retention.ms", "soon")])
    expect_error("INVALID_CONFIG", client.alter_configs, "topic", topic, [("append", "retention.ms", "1")])
    expect_error("INVALID_CONFIG", client.alter_configs, "topic", topic, [("set", "no.such.config", "1")])
    expect_error("UNKNOWN_TOPIC_OR_PARTITION", client.alter_configs, "topic", unique_topic("absent"),
                 [("set", "retention.ms", "1000")])

    client.alter_configs("topic", topic, [("delete", "retention.ms", None)])
    got: dict[str, ConfigValue] = {}

    def reverted() -> bool:
        got.update(_configs(client, "topic", topic))
        return got["retention.ms"].source != "DYNAMIC_TOPIC_CONFIG"

    wait_until(reverted, 20, what="retention.ms to lose its topic override")
    assert got["retention.ms"].value == before["retention.ms"].value, (got["retention.ms"], before["retention.ms"])
    assert got["cleanup.policy"] == ConfigValue("compact", "DYNAMIC_TOPIC_CONFIG",
                                                got["cleanup.policy"].synonyms, got["cleanup.policy"].read_only)


@s.scenario("configs.topic-synonyms", "dynamic configs",
            needs=(base.INCREMENTAL_ALTER_CONFIGS, base.CONFIG_SYNONYMS), apis=(44, 32), consumes=False)
def test_topic_synonyms(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1, configs={"retention.ms": "3600000"})
    got = _configs(client, "topic", topic, synonyms=True)
    ret = got["retention.ms"]
    assert (ret.value, ret.source) == ("3600000", "DYNAMIC_TOPIC_CONFIG"), ret
    # The topic's own value comes first; after it only the broker settings it overrides, by their names.
    assert ret.synonyms, "no synonyms although they were asked for"
    assert ret.synonyms[0] == ("retention.ms", "3600000", "DYNAMIC_TOPIC_CONFIG"), ret.synonyms
    for name, _value, source in ret.synonyms[1:]:
        assert name in {"log.retention.ms", "log.retention.minutes", "log.retention.hours"}, ret.synonyms
        assert source in BROKER_SOURCES, ret.synonyms
    # Without the flag there are none.
    assert not _configs(client, "topic", topic)["retention.ms"].synonyms

    client.alter_configs("topic", topic, [("delete", "retention.ms", None)])
    wait_until(lambda: _configs(client, "topic", topic)["retention.ms"].source != "DYNAMIC_TOPIC_CONFIG", 20,
               what="retention.ms to lose its topic override")
    after = _configs(client, "topic", topic, synonyms=True)["retention.ms"]
    assert after.source in BROKER_SOURCES, after
    assert all(src != "DYNAMIC_TOPIC_CONFIG" for _n, _v, src in after.synonyms), after.synonyms
    if after.synonyms:
        assert after.source == after.synonyms[0][2], after


@s.scenario("configs.topic-alter", "dynamic configs", needs=(base.ALTER_CONFIGS, base.DESCRIBE_CONFIGS),
            apis=(33, 32), consumes=False)
def test_topic_alter_configs(client: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=1)
    baseline = client.topic_configs(topic)
    client.alter_configs("topic", topic, [("set", "retention.ms", "7200000"), ("set", "max.message.bytes", "200000")],
                         incremental=False)

    def described(want: dict[str, str]) -> bool:
        got = client.topic_configs(topic)
        return all(got.get(k) == v for k, v in want.items())

    wait_until(lambda: described({"retention.ms": "7200000", "max.message.bytes": "200000"}), 20,
               what="both configs set")
    # AlterConfigs replaces the topic's whole set of overrides: retention.ms, not named, goes back.
    client.alter_configs("topic", topic, [("set", "max.message.bytes", "300000")], incremental=False)
    wait_until(lambda: described({"retention.ms": baseline["retention.ms"], "max.message.bytes": "300000"}), 20,
               what="retention.ms back to its default, max.message.bytes 300000")
    expect_error("INVALID_CONFIG", client.alter_configs, "topic", topic, [("set", "retention.ms", "soon")],
                 incremental=False)
    expect_error("UNKNOWN_TOPIC_OR_PARTITION", client.alter_configs, "topic", unique_topic("absent"),
                 [("set", "retention.ms", "1000")], incremental=False)


# --- brokers --------------------------------------------------------------------------------------

@contextmanager
def _broker_config_lock(cluster: ClusterInfo) -> Iterator[None]:
    """One broker-config scenario at a time against a cluster: they change the same broker setting."""
    digest = hashlib.sha256(cluster.bootstrap.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"compat-broker-config-{digest}.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _restore_broker(client: Client, names: list[str]) -> None:
    for name in names:
        try:
            client.alter_configs("broker", name, [("delete", BROKER_KEY, None)])
        except ClientError:
            pass


def _every_broker(helper: Client, first: str) -> list[str]:
    """``first`` and the cluster's other brokers. Kafka describes a topic's configs with the settings of
    the broker that answers, which in a cluster can be any broker the client picks: a per-broker value
    meant to show in a topic's description is set on all of them (on one node, just ``first``)."""
    return [first, *sorted({str(b) for b in helper.metadata()["brokers"]} - {first})]


def _static(client: Client, broker: str) -> ConfigValue:
    """The broker setting once no dynamic value is left (an interrupted run may have left one)."""
    got: dict[str, ConfigValue] = {}

    def ok() -> bool:
        got.update(_configs(client, "broker", broker, synonyms=base.CONFIG_SYNONYMS in client.caps))
        return got[BROKER_KEY].source in {"STATIC_BROKER_CONFIG", "DEFAULT_CONFIG"}

    wait_until(ok, 20, what=f"{BROKER_KEY} without dynamic values")
    start = got[BROKER_KEY]
    if base.CONFIG_SYNONYMS in client.caps:
        # Kafka's own default is the last, least specific synonym.
        assert start.synonyms and start.synonyms[-1] == (BROKER_KEY, KAFKA_DEFAULT, "DEFAULT_CONFIG"), start.synonyms
    return start


@s.scenario("configs.broker-dynamic", "dynamic configs", needs=(base.INCREMENTAL_ALTER_CONFIGS, base.BROKER_CONFIGS),
            apis=(44, 32), consumes=False)
def test_broker_dynamic(client: Client, helper: Client, cluster: ClusterInfo, new_topic) -> None:  # type: ignore[no-untyped-def]
    """A per-broker dynamic setting: set, seen by the broker's topics, refused when read-only or invalid, removed."""
    topic = new_topic(partitions=1)
    broker = str(helper.partition_leaders(topic)[0])
    brokers = _every_broker(helper, broker)
    with _broker_config_lock(cluster):
        _restore_broker(client, brokers)
        start = _static(client, broker)
        value = "86400123"
        try:
            for b in brokers:
                client.alter_configs("broker", b, [("set", BROKER_KEY, value)])
            got = _settled(client, "broker", broker, {BROKER_KEY: (value, "DYNAMIC_BROKER_CONFIG")},
                           synonyms=base.CONFIG_SYNONYMS in client.caps)[BROKER_KEY]
            if base.CONFIG_SYNONYMS in client.caps:
                assert got.synonyms[0] == (BROKER_KEY, value, "DYNAMIC_BROKER_CONFIG"), got.synonyms
                assert got.synonyms[-1] == (BROKER_KEY, KAFKA_DEFAULT, "DEFAULT_CONFIG"), got.synonyms
            # A topic without its own value inherits the broker's, and says so.
            _settled(client, "topic", topic, {TOPIC_SYNONYM: (value, "DYNAMIC_BROKER_CONFIG")})
            # A read-only setting cannot change without a restart, and an invalid value is refused: Kafka
            # answers INVALID_REQUEST for both on broker resources (its KAFKA-13609 keeps it so).
            expect_error("INVALID_REQUEST", client.alter_configs, "broker", broker, [("set", "log.dirs", "/nowhere")])
            expect_error("INVALID_REQUEST", client.alter_configs, "broker", broker, [("set", BROKER_KEY, "soon")])
        finally:
            _restore_broker(client, brokers)
        _settled(client, "broker", broker, {BROKER_KEY: (start.value, start.source)})
        _settled(client, "topic", topic, {TOPIC_SYNONYM: (start.value, start.source)})


@s.scenario("configs.broker-default", "dynamic configs",
            needs=(base.INCREMENTAL_ALTER_CONFIGS, base.BROKER_CONFIGS, base.BROKER_DEFAULT_CONFIGS), apis=(44, 32),
            consumes=False)
def test_broker_default(client: Client, helper: Client, cluster: ClusterInfo, new_topic) -> None:  # type: ignore[no-untyped-def]
    """The cluster-wide default (broker resource ""), under a per-broker value that overrides it."""
    topic = new_topic(partitions=1)
    broker = str(helper.partition_leaders(topic)[0])
    brokers = _every_broker(helper, broker)
    with _broker_config_lock(cluster):
        _restore_broker(client, [*brokers, ""])
        start = _static(client, broker)
        per_broker, default = "86400123", "86400456"
        try:
            client.alter_configs("broker", "", [("set", BROKER_KEY, default)])
            _settled(client, "broker", "", {BROKER_KEY: (default, "DYNAMIC_DEFAULT_BROKER_CONFIG")})
            _settled(client, "broker", broker, {BROKER_KEY: (default, "DYNAMIC_DEFAULT_BROKER_CONFIG")})
            _settled(client, "topic", topic, {TOPIC_SYNONYM: (default, "DYNAMIC_DEFAULT_BROKER_CONFIG")})

            for b in brokers:
                client.alter_configs("broker", b, [("set", BROKER_KEY, per_broker)])
            got = _settled(client, "broker", broker, {BROKER_KEY: (per_broker, "DYNAMIC_BROKER_CONFIG")},
                           synonyms=base.CONFIG_SYNONYMS in client.caps)[BROKER_KEY]
            if base.CONFIG_SYNONYMS in client.caps:
                # Most specific first: this broker's value, the cluster default, (static,) Kafka's default.
                assert got.synonyms[:2] == [(BROKER_KEY, per_broker, "DYNAMIC_BROKER_CONFIG"),
                                            (BROKER_KEY, default, "DYNAMIC_DEFAULT_BROKER_CONFIG")], got.synonyms
                assert got.synonyms[-1] == (BROKER_KEY, KAFKA_DEFAULT, "DEFAULT_CONFIG"), got.synonyms
            _settled(client, "topic", topic, {TOPIC_SYNONYM: (per_broker, "DYNAMIC_BROKER_CONFIG")})

            # Removing the per-broker value uncovers the cluster default.
            for b in brokers:
                client.alter_configs("broker", b, [("delete", BROKER_KEY, None)])
            _settled(client, "broker", broker, {BROKER_KEY: (default, "DYNAMIC_DEFAULT_BROKER_CONFIG")})
            _settled(client, "topic", topic, {TOPIC_SYNONYM: (default, "DYNAMIC_DEFAULT_BROKER_CONFIG")})
        finally:
            _restore_broker(client, [*brokers, ""])
        _settled(client, "broker", broker, {BROKER_KEY: (start.value, start.source)})
        _settled(client, "topic", topic, {TOPIC_SYNONYM: (start.value, start.source)})


# ListClientMetricsResources (74) comes with the CLIENT_METRICS resources (KIP-714): a broker without it
# (Kafka in ZooKeeper mode) refuses the resource type in IncrementalAlterConfigs.
@s.scenario("configs.client-metrics", "dynamic configs",
            needs=(base.INCREMENTAL_ALTER_CONFIGS, base.CLIENT_METRICS_CONFIGS), apis=(44, 32, 74), consumes=False)
def test_client_metrics_subscription(client: Client) -> None:
    """A KIP-714 metrics subscription is a CLIENT_METRICS config resource."""
    name = f"compat-subscription-{uuid.uuid4().hex[:10]}"
    try:
        client.alter_configs("client_metrics", name, [("set", "metrics", "org.apache.kafka.producer."),
                                                      ("set", "interval.ms", "60000")])
        _settled(client, "client_metrics", name, {"metrics": ("org.apache.kafka.producer.", "CLIENT_METRICS_CONFIG"),
                                                  "interval.ms": ("60000", "CLIENT_METRICS_CONFIG")})
    finally:
        try:
            client.alter_configs("client_metrics", name, [("delete", "metrics", None), ("delete", "interval.ms", None)])
        except ClientError:
            pass
