"""The compat suite's harness: "not supported by the broker" from API versions (not just API keys), and the
report's column per broker."""

from __future__ import annotations

from typing import Any

from compat.clients.base import Client
from compat.clients.confluent import ConfluentClient
from compat.report import render, render_brokers
from compat.scenario import CONSUMER_GROUP_HEARTBEAT, CONSUMER_PROTOCOL, GROUPS, broker_gaps, needed_versions

# ApiVersions ranges as the brokers answer them (only the keys that matter here).
KAFKA_3_8 = {8: (0, 9), 9: (0, 9), 10: (0, 5), 68: (0, 0)}
KAFKA_4_0 = {8: (2, 9), 9: (1, 9), 10: (0, 6), 68: (0, 1)}
NO_KIP_848 = {8: (0, 9), 9: (0, 9), 10: (0, 5)}


def test_librdkafka_needs_consumer_group_heartbeat_v1() -> None:
    assert ConfluentClient.api_versions_needed == {CONSUMER_GROUP_HEARTBEAT: 1}
    assert Client.api_versions_needed == {}


def test_needed_versions_take_the_highest_need_of_the_clients_involved() -> None:
    assert needed_versions(CONSUMER_PROTOCOL, []) == {68: 0, 10: 0, 8: 0, 9: 0}
    assert needed_versions(CONSUMER_PROTOCOL, [{}, {68: 1}]) == {68: 1, 10: 0, 8: 0, 9: 0}
    assert needed_versions(CONSUMER_PROTOCOL, [{68: 1}, {68: 0}]) == {68: 1, 10: 0, 8: 0, 9: 0}
    # A client's needs count only for APIs the scenario uses.
    assert needed_versions(GROUPS, [{68: 1}]) == dict.fromkeys(GROUPS, 0)


def test_kafka_3_8_cannot_serve_librdkafka_but_can_serve_the_java_client() -> None:
    librdkafka = needed_versions(CONSUMER_PROTOCOL, [ConfluentClient.api_versions_needed])
    java = needed_versions(CONSUMER_PROTOCOL, [{}])
    assert broker_gaps(KAFKA_3_8, librdkafka) == [
        "ConsumerGroupHeartbeat(68) v1+ is needed, the broker advertises v0–0"]
    assert broker_gaps(KAFKA_3_8, java) == []
    assert broker_gaps(KAFKA_4_0, librdkafka) == []
    assert broker_gaps(KAFKA_4_0, java) == []


def test_an_api_that_is_not_advertised_is_named() -> None:
    assert broker_gaps(NO_KIP_848, needed_versions(CONSUMER_PROTOCOL, [{68: 1}])) == [
        "ConsumerGroupHeartbeat(68) is not advertised"]
    assert broker_gaps({}, {22: 0, 24: 0}) == ["InitProducerId(22) is not advertised",
                                               "AddPartitionsToTxn(24) is not advertised"]


def _doc(label: str, finished: str, outcomes: dict[tuple[str, str], str]) -> dict[str, Any]:
    results = []
    for (scenario, client), outcome in outcomes.items():
        r: dict[str, Any] = {"scenario": scenario, "client": client, "family": "consumer groups",
                             "nodeid": f"{scenario}[{client}]", "outcome": outcome, "duration": 1.0, "detail": ""}
        if outcome.startswith("not_supported"):
            r.update(outcome="not_supported", by=outcome.split(":")[1], detail=f"NOT SUPPORTED by {outcome[14:]}")
        results.append(r)
    return {"broker": {"label": label, "bootstrap": "127.0.0.1:9092", "managed": False, "api_versions": {}},
            "started": finished, "finished": finished, "duration": 1.0, "clients": {}, "results": results}


def test_report_has_a_column_per_broker_and_lists_only_differences() -> None:
    same = ("group.rebalance-join-leave", "java")
    kip848 = ("group.rebalance-consumer-protocol", "confluent-kafka")
    pyk = _doc("pykbroker", "2026-11-23T10:00:00", {same: "pass", kip848: "pass"})
    kafka = _doc("Apache Kafka 3.8.0", "2026-11-23T11:00:00", {same: "pass", kip848: "not_supported:broker"})
    text = "\n".join(render_brokers([pyk, kafka]))
    assert "| client | pykbroker | Apache Kafka 3.8.0 |" in text
    assert "| java | 1 ✅ · 0 ❌ · 0 n/s · 0 — | 1 ✅ · 0 ❌ · 0 n/s · 0 — |" in text
    assert "| confluent-kafka | 1 ✅ · 0 ❌ · 0 n/s · 0 — | 0 ✅ · 0 ❌ · 1 n/s · 0 — |" in text
    assert "| `group.rebalance-consumer-protocol` | confluent-kafka | ✅ | n/s |" in text
    assert "group.rebalance-join-leave` |" not in text.split("differs between brokers")[1]
    # The same label twice (two runs of one broker) gets the runs' times to tell the columns apart.
    twice = "\n".join(render_brokers([pyk, _doc("pykbroker", "2026-11-24T09:30:00", {same: "fail"})]))
    assert "| client | pykbroker (2026-11-23T10:00) | pykbroker (2026-11-24T09:30) |" in twice


def test_report_keeps_the_failed_attempts_of_a_rerun() -> None:
    doc = _doc("pykbroker", "2026-11-23T10:00:00", {("group.consume-commit-resume", "kafka-python"): "pass"})
    doc["results"][0]["reruns"] = [{"phase": "call", "detail": "TimeoutError: timed out after 45.0s"}]
    text = render(doc, "results.json")
    assert "## Reruns" in text
    assert "- `group.consume-commit-resume` with kafka-python (pass in the end): TimeoutError: timed out" in text
