"""The compat suite's harness: "not supported by the broker" from API versions (not just API keys), the
report's column per broker, and the settings of the cluster the suite starts (--pykbroker-cluster)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from compat import realkafka, security
from compat.clients.base import Client, NotSupportedByClient, Sasl
from compat.clients.confluent import ConfluentClient
from compat.clients.kafka_python import DROPS_DATA_BEFORE_CLOSE, KafkaPythonClient
from compat.cluster import (
    SINGLE_NODE_OVERRIDES,
    ClusterInfo,
    ManagedPykbrokerCluster,
    cluster_overrides,
    recorded_requests,
)
from compat.realkafka import KafkaNode, KafkaSetupError, ManagedKafka, release, releases
from compat.report import check, render, render_brokers
from compat.scenario import CONSUMER_GROUP_HEARTBEAT, CONSUMER_PROTOCOL, GROUPS, broker_gaps, needed_versions
from pykbroker.config import BrokerConfig, parse_listener

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


def test_report_names_the_results_file_and_the_setup_behind_each_column() -> None:
    same = ("group.rebalance-join-leave", "java")
    single = _doc("pykbroker 0.1.0", "2026-11-23T10:00:00", {same: "pass"})
    single["broker"]["managed"] = True
    cluster = _doc("pykbroker 0.1.0, 3 brokers + ZooKeeper", "2026-11-23T10:05:00", {same: "pass"})
    cluster["broker"].update(managed=True, brokers=3, zookeeper=True)
    kafka = _doc("Apache Kafka 4.1.0", "2026-11-23T11:00:00", {same: "pass"})
    text = "\n".join(render_brokers([single, cluster, kafka], ["results/a.json", "results/b-cluster3.json", "k.json"]))
    rows = [line for line in text.splitlines() if line.startswith("| pykbroker") or line.startswith("| Apache")]
    assert rows[0].startswith("| pykbroker 0.1.0 | `results/a.json` | started by the suite: one broker |"), rows
    assert rows[1].startswith("| pykbroker 0.1.0, 3 brokers + ZooKeeper | `results/b-cluster3.json` | started by "
                              "the suite: ZooKeeper and 3 brokers, clients bootstrap from one of them |"), rows
    assert rows[2].startswith("| Apache Kafka 4.1.0 | `k.json` | an existing cluster at 127.0.0.1:9092 |"), rows
    assert "| client | pykbroker 0.1.0 | pykbroker 0.1.0, 3 brokers + ZooKeeper | Apache Kafka 4.1.0 |" in text
    assert "None: every scenario has the same outcome on every broker." in text
    head = render(single, "results/a.json", ["pykbroker 0.1.0, 3 brokers + ZooKeeper", "Apache Kafka 4.1.0"])
    assert ("- **Compared with:** pykbroker 0.1.0, 3 brokers + ZooKeeper; Apache Kafka 4.1.0 (see [Across brokers]"
            "(#across-brokers))") in head
    assert "Compared with" not in render(single, "results/a.json")


def test_not_possible_on_this_cluster_is_counted_apart() -> None:
    moved = ("logdirs.alter-replica", "java")
    doc = _doc("Apache Kafka 3.9.0", "2026-11-23T10:00:00",
               {moved: "not_supported:cluster", ("logdirs.describe", "java"): "pass"})
    assert "| java | 1 ✅ · 0 ❌ · 0 n/s · 0 — · 1 n/p |" in "\n".join(render_brokers([doc]))
    text = render(doc, "results.json")
    assert "| client | pass | fail | not supported (broker) | not possible with the client | not possible on this " \
           "cluster |" in text
    assert "| java | 1 | 0 | 0 | 0 | 1 |" in text
    # Without such an outcome the table keeps its four columns.
    plain = render(_doc("pykbroker", "2026-11-23T10:00:00", {moved: "pass"}), "results.json")
    assert "| java | 1 | 0 | 0 | 0 |" in plain and "not possible on this cluster |" not in plain


def test_a_suite_started_cluster_has_the_settings_of_a_kafka_cluster_of_its_size(tmp_path: Path) -> None:
    assert cluster_overrides(3) == {"offsets.topic.replication.factor": "3",
                                    "transaction.state.log.replication.factor": "3",
                                    "transaction.state.log.min.isr": "2", "group.initial.rebalance.delay.ms": "0"}
    assert cluster_overrides(5)["offsets.topic.replication.factor"] == "3"
    assert cluster_overrides(2)["transaction.state.log.replication.factor"] == "2"
    assert cluster_overrides(1)["transaction.state.log.min.isr"] == "1"
    managed = ManagedPykbrokerCluster(3, workdir=tmp_path, overrides={"num.partitions": "2"},
                                      trace_file=tmp_path / "trace.jsonl")
    nodes = managed.make_nodes("127.0.0.1:2181/compat")
    assert sorted(nodes) == [1, 2, 3]
    ports = set()
    for broker_id, node in nodes.items():
        o = node.overrides
        # pykbroker accepts the settings, and they say what the harness means.
        cfg = BrokerConfig(o)
        assert cfg.broker_id == broker_id and cfg["zookeeper.connect"] == "127.0.0.1:2181/compat"
        assert cfg["num.partitions"] == 2 and cfg["transaction.state.log.min.isr"] == 2
        client, sasl, repl = (parse_listener(x) for x in o["advertised.listeners"].split(","))
        assert (client.name, client.port) == ("PLAINTEXT", node.proxy_port)  # clients go through the proxy
        assert (sasl.name, sasl.port) == ("SASL_PLAINTEXT", node.sasl_proxy_port)  # the security scenarios' too
        assert cfg.security_protocols["SASL_PLAINTEXT"] == "SASL_PLAINTEXT"
        assert o["listeners"].split(",")[0] == f"PLAINTEXT://127.0.0.1:{node.broker_port}"
        assert repl.name == cfg["inter.broker.listener.name"] == "REPLICATION"  # brokers do not
        assert len(cfg["log.dirs"]) == 2
        assert node.trace_file == tmp_path / f"trace-broker{broker_id}.jsonl"
        ports |= {node.broker_port, node.proxy_port, node.sasl_port, node.sasl_proxy_port, repl.port}
    assert len(ports) == 15
    assert managed.nodes == {}  # nothing started


def test_cluster_info_travels_to_the_workers_whole() -> None:
    info = ClusterInfo("127.0.0.1:1", "pykbroker, 3 brokers + ZooKeeper", {3: (0, 12)}, managed=True,
                       record_files=["a.jsonl", "b.jsonl"], brokers=3)
    assert ClusterInfo.from_json(info.to_json()) == info


def test_the_proxies_records_are_merged_without_repeats(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rec = [{"client_id": "compat-java", "api_key": 3, "api_version": 12},
           {"client_id": "compat-kcat", "api_key": 0, "api_version": 9}]
    a.write_text(json.dumps(rec[0]) + "\n")
    b.write_text(json.dumps(rec[1]) + "\n" + json.dumps(rec[0]) + "\n\n")
    assert recorded_requests([str(a), str(b), str(tmp_path / "never-written.jsonl")]) == rec


def test_the_pom_pins_one_kafka_version_per_release_line() -> None:
    lines = releases()
    assert sorted(lines) == ["3.9", "4"]
    assert lines["3.9"].version.startswith("3.9.") and lines["3.9"].zookeeper
    assert lines["4"].version.startswith("4.") and not lines["4"].zookeeper
    assert release("4.x") == release(lines["4"].version) == lines["4"]
    assert lines["3.9"].lib.name == lines["3.9"].version  # each version in a folder of its own
    with pytest.raises(KafkaSetupError, match="choose from 3.9"):
        release("2.8")


def test_a_suite_started_kafka_has_the_settings_of_the_pykbroker_of_its_shape(tmp_path: Path) -> None:
    zk, kraft = release("3.9"), release("4")
    assert ManagedKafka(zk, 1, tmp_path).settings() == SINGLE_NODE_OVERRIDES
    assert ManagedKafka(zk, 3, tmp_path).settings() == cluster_overrides(3)
    assert ManagedKafka(zk, 3, tmp_path).results_suffix == f"-kafka-{zk.version}-cluster3"
    assert zk.label(1) == f"Apache Kafka {zk.version} (ZooKeeper)"
    assert zk.label(3) == f"Apache Kafka {zk.version}, 3 brokers + ZooKeeper"
    assert kraft.label(1) == f"Apache Kafka {kraft.version} (KRaft)"
    with pytest.raises(KafkaSetupError, match="one node"):
        ManagedKafka(kraft, 3, tmp_path)
    for rel, authorizer, listeners in ((zk, realkafka.ZOOKEEPER_AUTHORIZER, 2),
                                       (kraft, security.AUTHORIZER, 3)):
        node = KafkaNode(rel, tmp_path / rel.version, 1, {})
        o = node.settings
        assert o["authorizer.class.name"] == authorizer
        assert o["super.users"] == "User:admin;User:ANONYMOUS"
        assert ("broker.id" if rel.zookeeper else "node.id") in o
        assert len(o["listeners"].split(",")) == listeners  # PLAINTEXT, SASL_PLAINTEXT (and CONTROLLER)
        assert o["advertised.listeners"] == (f"PLAINTEXT://127.0.0.1:{node.port},"
                                             f"SASL_PLAINTEXT://127.0.0.1:{node.sasl_port}")
        assert len(o["log.dirs"].split(",")) == 2
        assert o["metric.reporters"] == realkafka.REPORTER_CLASS
        node.write_config()
        # Java properties: a backslash is escaped, the JAAS config's quotes and semicolon stay as they are.
        text = node.config_file.read_text()
        assert f"listener.name.sasl_plaintext.plain.sasl.jaas.config={security.plain_jaas()}\n" in text


def test_a_lib_folder_is_complete_only_with_every_jar_it_lists(tmp_path: Path) -> None:
    assert not realkafka._complete(tmp_path)
    (tmp_path / "a.jar").write_bytes(b"")
    (tmp_path / realkafka.COMPLETE).write_text("a.jar\nb.jar\n")
    assert not realkafka._complete(tmp_path)
    (tmp_path / "b.jar").write_bytes(b"")
    assert realkafka._complete(tmp_path)
    assert realkafka._properties({"k": "C:\\dir"}) == "k=C:\\\\dir\n"


def test_the_check_fails_on_kafka_failures_and_names_where_a_pykbroker_failure_passed() -> None:
    ok, bad, gap = ("group.rebalance-join-leave", "java"), ("offsets.by-time", "kcat"), ("topic.describe-partitions",
                                                                                           "java")
    pyk = _doc("pykbroker", "2026-11-23T10:00:00", {ok: "pass", bad: "fail", gap: "not_supported:broker"})
    pyk_cluster = _doc("pykbroker, 3 brokers", "2026-11-23T10:05:00", {ok: "pass", bad: "pass", gap: "pass"})
    pyk_cluster["broker"]["brokers"] = 3
    kafka = _doc("Apache Kafka 4.4.0 (KRaft)", "2026-11-23T11:00:00", {ok: "pass", bad: "pass", gap: "pass"})
    kafka["broker"]["kafka"] = "4.4.0"
    sources = ["p.json", "p3.json", "k.json"]
    problems, notes = check([pyk, pyk_cluster, kafka], sources)
    assert problems == ["`offsets.by-time` with kcat fails on pykbroker (p.json), and passes on Apache Kafka 4.4.0 "
                        "(KRaft). "]
    assert notes == ["`topic.describe-partitions` with java is not supported by pykbroker and passes on Apache Kafka "
                     "4.4.0 (KRaft): NOT SUPPORTED by broker"]
    kafka["results"][0]["outcome"] = "fail"
    problems, _ = check([pyk_cluster, kafka], sources[1:])
    assert len(problems) == 1 and problems[0].startswith(
        "`group.rebalance-join-leave` with java fails on Apache Kafka 4.4.0 (KRaft) (k.json): a scenario must hold")
    assert check([pyk_cluster], sources[1:2]) == ([], [])


def test_the_report_names_a_suite_started_kafka_and_each_run_s_wall_time() -> None:
    same = ("group.rebalance-join-leave", "java")
    zk = _doc("Apache Kafka 3.9.2, 3 brokers + ZooKeeper", "2026-11-23T11:00:00", {same: "pass"})
    zk["broker"].update(managed=True, brokers=3, zookeeper=True, kafka="3.9.2")
    zk.update(duration=201.6, workers=2)
    kraft = _doc("Apache Kafka 4.4.0 (KRaft)", "2026-11-23T12:00:00", {same: "pass"})
    kraft["broker"].update(managed=True, kafka="4.4.0")
    text = "\n".join(render_brokers([zk, kraft], ["z.json", "k.json"]))
    assert ("| `z.json` | started by the suite from Maven Central's jars (compat/kafka/pom.xml): ZooKeeper and 3 "
            "brokers, clients bootstrap from one of them | ") in text
    assert "| 3 min 22 s with 2 workers |" in text
    assert "(compat/kafka/pom.xml): one KRaft node (broker and controller) |" in text
    assert "| 1 s with 1 worker |" in text


def test_clients_that_cannot_do_a_scenario_on_kafka_say_so() -> None:
    # kafka-python drops a refusal read together with the close, as Kafka sends it.
    import kafka

    version = tuple(int(x) for x in kafka.__version__.split(".")[:3])
    wrong = KafkaPythonClient("127.0.0.1:1", Sasl("PLAIN", "alice", "wrong"))
    if version <= DROPS_DATA_BEFORE_CLOSE:
        with pytest.raises(NotSupportedByClient, match="refused SASL authentication"):
            wrong.authenticate(timeout=1.0)
