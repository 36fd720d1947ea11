"""The sans-I/O ClientTelemetry manager (KIP-714) on a hand-driven clock."""

from __future__ import annotations

import gzip
import uuid

import pytest
from kio.schema.errors import ErrorCode

from pykbroker.server.telemetry import (
    DEFAULT_INTERVAL_MS,
    INSTANCE_EXPIRY_MS,
    ClientSelector,
    ClientTelemetry,
    InvalidSubscription,
    metric_names,
    parse_subscription,
)

ZERO = uuid.UUID(int=0)
PRODUCER = ClientSelector("app-1", "confluent-kafka-python", "2.16.1", "127.0.0.1", "50000")


def otlp(*names: str) -> bytes:
    def ld(field: int, payload: bytes) -> bytes:
        assert len(payload) < 128
        return bytes([field << 3 | 2, len(payload)]) + payload

    return ld(1, ld(2, b"".join(ld(2, ld(1, n.encode())) for n in names)))


def test_metric_names_reads_otlp_and_refuses_garbage() -> None:
    assert metric_names(otlp("a.b", "c")) == ["a.b", "c"]
    assert metric_names(b"") == []
    with pytest.raises(ValueError):
        metric_names(b"\x0a\x05ab")  # length past the end


def test_no_subscription_gives_the_default_interval_and_no_metrics() -> None:
    tel = ClientTelemetry(max_bytes=1000)
    r = tel.get_subscriptions(ZERO, PRODUCER, 0)
    assert r["error_code"] == ErrorCode.none and r["client_instance_id"] != ZERO
    assert (r["push_interval"], r["requested_metrics"], r["telemetry_max_bytes"]) == (DEFAULT_INTERVAL_MS, (), 1000)


def test_matching_subscriptions_union_metrics_and_take_the_shortest_interval() -> None:
    tel = ClientTelemetry()
    tel.update_subscriptions({
        "a": {"metrics": "org.apache.kafka.producer.", "interval.ms": "5000", "match": "client_id=app-.*"},
        "b": {"metrics": "org.apache.kafka.consumer.", "interval.ms": "2000",
              "match": "client_software_name=confluent-kafka-python,client_source_address=127\\.0\\.0\\.1"},
        "c": {"metrics": "org.apache.kafka.", "interval.ms": "100", "match": "client_id=other"},
        "empty": {},
    })
    r = tel.get_subscriptions(None, PRODUCER, 0)
    assert r["requested_metrics"] == ("org.apache.kafka.consumer.", "org.apache.kafka.producer.")
    assert r["push_interval"] == 2000
    tel.update_subscriptions({"all": {"metrics": "org.apache.kafka.producer.,*"}})
    r = tel.get_subscriptions(r["client_instance_id"], PRODUCER, 1)
    assert r["requested_metrics"] == ("*",) and r["push_interval"] == DEFAULT_INTERVAL_MS


def test_get_and_push_follow_the_push_interval() -> None:
    tel = ClientTelemetry()
    tel.update_subscriptions({"s": {"metrics": "*", "interval.ms": "1000"}})
    r = tel.get_subscriptions(ZERO, PRODUCER, 10_000)
    inst, sub = r["client_instance_id"], r["subscription_id"]
    assert tel.get_subscriptions(inst, PRODUCER, 10_999)["error_code"] == ErrorCode.throttling_quota_exceeded
    # A push straight after the fetch is fine, the next one waits a whole interval.
    assert tel.push(inst, sub, False, 0, otlp("m1"), PRODUCER, 11_000) == ErrorCode.none
    assert tel.push(inst, sub, False, 0, otlp("m2"), PRODUCER, 11_999) == ErrorCode.throttling_quota_exceeded
    assert tel.push(inst, sub, False, 1, gzip.compress(otlp("m3")), PRODUCER, 12_000) == ErrorCode.none
    latest = tel.latest_metrics(inst)
    assert latest is not None and latest.metric_names == ["m3"] and latest.received_ms == 12_000
    assert latest.data == otlp("m3"), "kept decompressed"
    # Terminating: accepted even when early, then nothing more.
    assert tel.push(inst, sub, True, 0, otlp("bye"), PRODUCER, 12_001) == ErrorCode.none
    assert tel.push(inst, sub, False, 0, otlp("m4"), PRODUCER, 20_000) == ErrorCode.invalid_request
    assert tel.latest_metrics(inst).metric_names == ["bye"]  # type: ignore[union-attr]


def test_subscription_change_reevaluates_the_instance_at_once() -> None:
    tel = ClientTelemetry()
    tel.update_subscriptions({"s": {"metrics": "a.", "interval.ms": "60000"}})
    r = tel.get_subscriptions(ZERO, PRODUCER, 0)
    inst, old = r["client_instance_id"], r["subscription_id"]
    tel.update_subscriptions({"s": {"metrics": "a.,b.", "interval.ms": "60000"}})
    r2 = tel.get_subscriptions(inst, PRODUCER, 5)
    assert r2["error_code"] == ErrorCode.none and r2["requested_metrics"] == ("a.", "b.")
    assert r2["subscription_id"] != old
    tel.update_subscriptions({"s": {"metrics": "a.,b.", "interval.ms": "60000"}})  # no change: nothing new
    assert tel.get_subscriptions(inst, PRODUCER, 6)["error_code"] == ErrorCode.throttling_quota_exceeded


def test_stale_subscription_lets_the_client_fetch_again() -> None:
    tel = ClientTelemetry()
    r = tel.get_subscriptions(ZERO, PRODUCER, 0)
    inst, sub = r["client_instance_id"], r["subscription_id"]
    assert tel.push(inst, sub ^ 1, False, 0, otlp("m"), PRODUCER, 1) == ErrorCode.unknown_subscription_id
    again = tel.get_subscriptions(inst, PRODUCER, 2)
    assert again["error_code"] == ErrorCode.none and again["subscription_id"] == sub


def test_size_codec_and_payload_checks() -> None:
    tel = ClientTelemetry(max_bytes=64)
    for payload, codec, want in [
        (b"x" * 65, 0, ErrorCode.telemetry_too_large),
        (gzip.compress(otlp("y" * 120) * 10), 1, ErrorCode.telemetry_too_large),  # inflates past 16 x 64
        (otlp("ok"), 7, ErrorCode.unsupported_compression_type),
        (b"\xff\xff", 0, ErrorCode.invalid_record),
        (b"garbage", 4, ErrorCode.invalid_record),
    ]:
        r = tel.get_subscriptions(ZERO, PRODUCER, 0)
        assert tel.push(r["client_instance_id"], r["subscription_id"], False, codec, payload, PRODUCER, 0) == want
    assert tel.push(ZERO, 0, False, 0, b"", PRODUCER, 0) == ErrorCode.invalid_request


def test_idle_instances_are_forgotten() -> None:
    tel = ClientTelemetry()
    tel.update_subscriptions({"s": {"metrics": "*", "interval.ms": "1000"}})
    r = tel.get_subscriptions(ZERO, PRODUCER, 0)
    inst = r["client_instance_id"]
    tel.get_subscriptions(ZERO, PRODUCER, INSTANCE_EXPIRY_MS - 1)
    assert inst in tel.instances
    tel.get_subscriptions(ZERO, PRODUCER, INSTANCE_EXPIRY_MS)
    assert inst not in tel.instances


@pytest.mark.parametrize("configs", [
    {"interval.ms": "99"},
    {"interval.ms": "3600001"},
    {"interval.ms": "soon"},
    {"match": "client_id"},
    {"match": "colour=red"},
    {"match": "client_id=["},
    {"metric": "x"},
])
def test_invalid_subscriptions(configs: dict[str, str]) -> None:
    with pytest.raises(InvalidSubscription):
        parse_subscription("s", configs)
