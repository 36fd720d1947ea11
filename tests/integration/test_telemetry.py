"""Client telemetry (KIP-714) against real clients and over the wire.

librdkafka (confluent-kafka) asks for its telemetry subscription on its own as soon as the broker
advertises GetTelemetrySubscriptions: without a subscription it must work unchanged and push
nothing; with a CLIENT_METRICS subscription (set through kafka-python's admin) it pushes OTLP
metrics every interval and the broker keeps them.  The error paths are spoken directly.
"""

from __future__ import annotations

import base64
import gzip
import logging
import re
import uuid
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from tests.integration.conftest import (
    CLIENT_TIMEOUT,
    BrokerFactory,
    RawConnection,
    consume_partitions,
    create_topic,
    make_producer,
    unique_topic,
    wait_until,
)
from tests.support.broker import BrokerProcess

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
INVALID_REQUEST, UNSUPPORTED_COMPRESSION, INVALID_RECORD, THROTTLED, UNKNOWN_SUBSCRIPTION, TOO_LARGE = (
    42, 76, 87, 89, 117, 118)
FIRST_PUSH = re.compile(r"client telemetry: first metrics from a client instance client_instance_id=(\S+) "
                        r"client_id=(\S+) software=(\S+) metrics=(\d+) examples=(\S*)")


class ClientLog(logging.Handler):
    """librdkafka's log lines, delivered to this Python logger by confluent-kafka on poll()."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def instance_id(self) -> uuid.UUID | None:
        for line in self.lines:
            m = re.search(r"client instance id changed from \S+ to (\S+)", line)
            if m:
                return uuid.UUID(bytes=base64.b64decode(m.group(1) + "=="))
        return None


def _logger(name: str) -> tuple[logging.Logger, ClientLog]:
    handler = ClientLog()
    lg = logging.getLogger(f"test.telemetry.{name}")
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    lg.addHandler(handler)
    return lg, handler


def subscribe(b: BrokerProcess, name: str, configs: dict[str, str]) -> None:
    """A CLIENT_METRICS subscription, set as an operator would: IncrementalAlterConfigs from an admin client."""
    admin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=int(CLIENT_TIMEOUT * 1000))
    try:
        # raise_on_unknown=False: kafka-python would first check the keys against DescribeConfigs of the
        # resource, which does not list CLIENT_METRICS keys for a resource that has none set yet.
        result = admin.alter_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, name, configs=configs)],
                                     incremental=True, raise_on_unknown=False)
        assert result == {"client_metrics": {name: "OK"}}, result
        listed = admin.list_config_resources([ConfigResourceType.CLIENT_METRICS])
        assert name in listed["client_metrics"], listed
    finally:
        admin.close()


def unsubscribe(b: BrokerProcess, name: str, keys: list[str]) -> None:
    """Delete a subscription's configs (an entity without configs is no subscription)."""
    with RawConnection(b) as c:  # IncrementalAlterConfigs, DELETE of each key
        r = c.request(44, 0, {"resources": [{"resource_type": 16, "resource_name": name, "configs": [
            {"name": k, "config_operation": 1, "value": None} for k in keys]}], "validate_only": False})
    assert int(r.responses[0].error_code) == 0, r


def first_pushes(b: BrokerProcess) -> dict[str, tuple[str, str, int, str]]:
    """client_id -> (instance id, software, metric count, sample names) from the broker's log."""
    return {m.group(2): (m.group(1), m.group(3), int(m.group(4)), m.group(5)) for m in FIRST_PUSH.finditer(b.log())}


def _advertised(b: BrokerProcess) -> set[int]:
    """The telemetry API keys a new connection's ApiVersions (v3, as clients send it) lists."""
    with RawConnection(b) as c:
        r = c.request(18, 3, {"client_software_name": "raw", "client_software_version": "1"})
    return {int(k.api_key) for k in r.api_keys} & {71, 72}


def test_telemetry_advertised_only_when_client_metrics_are_on(broker_factory: BrokerFactory) -> None:
    """As Kafka, which advertises the KIP-714 APIs only with a client telemetry reporter: by default only while
    a CLIENT_METRICS subscription exists, so a client logs nothing about telemetry otherwise."""
    b = broker_factory()
    assert _advertised(b) == set()
    topic = unique_topic("tel-quiet")
    create_topic(b, topic)
    lg, log = _logger("quiet")
    p = make_producer(b, **{"client.id": "tel-quiet", "logger": lg})
    p.produce(topic, value=b"q", partition=0)
    assert p.flush(CLIENT_TIMEOUT) == 0
    got = consume_partitions(b, [TopicPartition(topic, 0)], 1, logger=lg)
    assert [m.value() for m in got] == [b"q"]
    p.poll(0.5)
    assert not any("elemetry" in line for line in log.lines), log.lines
    # A subscription turns them on for new connections; deleting it turns them off again.
    subscribe(b, "on", {"metrics": "org.apache.kafka.producer.", "match": "client_id=nobody"})
    assert _advertised(b) == {71, 72}
    unsubscribe(b, "on", ["metrics", "match"])
    wait_until(lambda: not _advertised(b), timeout=10, what="the telemetry APIs hidden again")
    forced = broker_factory({"pykbroker.client.telemetry.enable": "true"})
    assert _advertised(forced) == {71, 72}
    never = broker_factory({"pykbroker.client.telemetry.enable": "false"})
    subscribe(never, "ignored", {"metrics": "org.apache.kafka.producer.", "match": "client_id=nobody"})
    assert _advertised(never) == set()


def test_confluent_kafka_works_unchanged_with_telemetry_advertised(broker_factory: BrokerFactory) -> None:
    """No subscription: librdkafka fetches an empty one, pushes nothing, and produces and consumes as before."""
    b = broker_factory({"pykbroker.client.telemetry.enable": "true"})
    topic = unique_topic("tel-none")
    create_topic(b, topic)
    lg, log = _logger("none")
    p = make_producer(b, **{"client.id": "tel-none", "logger": lg, "debug": "telemetry"})
    for i in range(5):
        p.produce(topic, value=f"m{i}".encode(), partition=0)
    assert p.flush(CLIENT_TIMEOUT) == 0
    wait_until(lambda: p.poll(0.1) is not None and log.instance_id(), timeout=15,
               what="librdkafka to fetch its telemetry subscription")
    got = consume_partitions(b, [TopicPartition(topic, 0)], 5, logger=lg)
    assert [m.value() for m in got] == [f"m{i}".encode() for i in range(5)]
    assert not any("PushTelemetryRequest" in line for line in log.lines), "nothing subscribed, nothing pushed"
    assert "client telemetry: first metrics" not in b.log()


def test_subscribed_confluent_kafka_pushes_and_the_broker_keeps_the_metrics(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    client_id = f"tel-{uuid.uuid4().hex[:8]}"
    subscribe(b, "producers", {"metrics": "org.apache.kafka.producer.", "interval.ms": "500",
                               "match": f"client_id={client_id},client_software_name=confluent-kafka-.*"})
    subscribe(b, "nobody", {"metrics": "org.apache.kafka.", "interval.ms": "100", "match": "client_id=nobody"})
    topic = unique_topic("tel")
    create_topic(b, topic)
    lg, log = _logger(client_id)
    p = make_producer(b, **{"client.id": client_id, "logger": lg, "debug": "telemetry"})
    p.produce(topic, value=b"x", partition=0)
    assert p.flush(CLIENT_TIMEOUT) == 0

    def pushed() -> tuple[str, str, int, str] | None:
        p.poll(0.1)
        return first_pushes(b).get(client_id)

    instance, software, count, sample = wait_until(pushed, timeout=20, what="a telemetry push from the producer")
    assert software.startswith("confluent-kafka-python/")
    assert count > 0 and all(n.startswith("org.apache.kafka.producer.") for n in sample.split(","))
    assert uuid.UUID(instance) == log.instance_id(), "the broker kept the metrics of the instance it assigned"
    # Every interval (500 ms, the subscription matching this client, not the 100 ms one) another push.
    wait_until(lambda: p.poll(0.1) is not None and
               sum("PushTelemetryRequest succeeded" in line for line in log.lines) >= 3,
               timeout=20, what="three accepted pushes")
    assert not any("PushTelemetry failed" in line or "THROTTLING" in line for line in log.lines)
    assert p.flush(CLIENT_TIMEOUT) == 0


# --- the protocol, spoken directly -------------------------------------------------------------------


def otlp(*names: str) -> bytes:
    """OTLP MetricsData with one resource, one scope and metrics with these names (protobuf by hand)."""

    def ld(field: int, payload: bytes) -> bytes:
        n = len(payload)
        size = bytearray()
        while True:
            b = n & 0x7F
            n >>= 7
            size.append(b | (0x80 if n else 0))
            if not n:
                break
        return bytes([field << 3 | 2]) + bytes(size) + payload

    metrics = b"".join(ld(2, ld(1, name.encode())) for name in names)
    return ld(1, ld(2, metrics))


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory({"telemetry.max.bytes": "2048"})


def get(c: RawConnection, instance: uuid.UUID | None = None) -> Any:
    return c.request(71, 0, {"client_instance_id": instance or uuid.UUID(int=0)})


def push(c: RawConnection, instance: uuid.UUID, sub: int, data: bytes, compression: int = NONE,
         terminating: bool = False) -> int:
    r = c.request(72, 0, {"client_instance_id": instance, "subscription_id": sub, "terminating": terminating,
                          "compression_type": compression, "metrics": data})
    return int(r.error_code)


def test_get_telemetry_subscriptions_without_a_subscription(broker: BrokerProcess) -> None:
    with RawConnection(broker) as c:
        r = get(c)
        assert int(r.error_code) == 0 and r.client_instance_id.int != 0
        assert list(r.accepted_compression_types) == [ZSTD, LZ4, GZIP, SNAPPY]
        assert r.push_interval.total_seconds() == 300 and r.telemetry_max_bytes == 2048
        assert r.requested_metrics == () and r.delta_temporality
        # Asking again within the push interval is throttled; a new instance is not.
        again = get(c, r.client_instance_id)
        assert int(again.error_code) == THROTTLED
        other = get(c)
        assert int(other.error_code) == 0 and other.client_instance_id != r.client_instance_id
        # ListClientMetricsResources: nothing configured on this broker.
        assert c.request(74, 0, {}).config_resources == ()


@pytest.mark.parametrize("compression", [NONE, GZIP, SNAPPY, LZ4, ZSTD])
def test_push_each_compression_then_throttled(broker: BrokerProcess, compression: int) -> None:
    import cramjam
    import lz4.frame
    import zstandard

    data = otlp("org.apache.kafka.producer.record.send.rate", "org.apache.kafka.client.x")
    packed = {NONE: data, GZIP: gzip.compress(data), SNAPPY: bytes(cramjam.snappy.compress_raw(data)),
              LZ4: lz4.frame.compress(data), ZSTD: zstandard.ZstdCompressor().compress(data)}[compression]
    with RawConnection(broker) as c:
        r = get(c)
        inst, sub = r.client_instance_id, int(r.subscription_id)
        assert push(c, inst, sub, packed, compression) == 0
        assert push(c, inst, sub, packed, compression) == THROTTLED  # one push per interval
        assert push(c, inst, sub, packed, compression, terminating=True) == 0  # a goodbye is always accepted
        assert push(c, inst, sub, packed, compression) == INVALID_REQUEST  # nothing after it


def test_push_errors(broker: BrokerProcess) -> None:
    with RawConnection(broker) as c:
        assert push(c, uuid.UUID(int=0), 0, otlp("a")) == INVALID_REQUEST
        r = get(c)
        assert push(c, r.client_instance_id, int(r.subscription_id) + 1, otlp("a")) == UNKNOWN_SUBSCRIPTION
        # After a stale subscription id the client may fetch again at once.
        r2 = get(c, r.client_instance_id)
        assert int(r2.error_code) == 0 and r2.subscription_id == r.subscription_id

        r = get(c)
        assert push(c, r.client_instance_id, r.subscription_id, otlp("a"), compression=9) == UNSUPPORTED_COMPRESSION
        assert int(get(c, r.client_instance_id).error_code) == 0

        r = get(c)
        big = otlp(*[f"org.apache.kafka.metric.{i:04d}" for i in range(100)])
        assert len(big) > 2048
        assert push(c, r.client_instance_id, r.subscription_id, big) == TOO_LARGE

        r = get(c)  # compressed under the limit, but inflating far past it
        bomb = gzip.compress(otlp("x" * 60000))
        assert len(bomb) < 2048
        assert push(c, r.client_instance_id, r.subscription_id, bomb, GZIP) == TOO_LARGE

        r = get(c)
        assert push(c, r.client_instance_id, r.subscription_id, b"\x0a\xff\xff\xff\x0f", NONE) == INVALID_RECORD
        r = get(c)
        assert push(c, r.client_instance_id, r.subscription_id, b"not gzip", GZIP) == INVALID_RECORD


def test_subscription_change_is_answered_at_once(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    with RawConnection(b) as c:
        r = get(c)
        assert r.requested_metrics == ()
        subscribe(b, "raw", {"metrics": "org.apache.kafka.consumer.,org.apache.kafka.producer.",
                             "interval.ms": "60000", "match": "client_id=raw-.*"})
        # Within the old interval, but the subscription changed: no throttling, the new set at once.
        r2 = get(c, r.client_instance_id)
        assert int(r2.error_code) == 0
        assert sorted(r2.requested_metrics) == ["org.apache.kafka.consumer.", "org.apache.kafka.producer."]
        assert r2.push_interval.total_seconds() == 60 and r2.subscription_id != r.subscription_id
        # A push right after fetching the subscription is accepted.
        assert push(c, r.client_instance_id, r2.subscription_id, otlp("org.apache.kafka.producer.x")) == 0
        assert [x.resource_name for x in c.request(74, 0, {}).config_resources] == ["raw"]
    wait_until(lambda: "client_id=raw-test" in b.log(), timeout=5, what="the broker to log the first push")
