"""The admin commands served by pykbroker's own wire client (the Admin APIs librdkafka lacks): quotas, client-metrics
configs, transactions, share groups, partition moves and elections, API versions, and SASL/SCRAM logins; each run as
the CLI's click app against broker subprocesses."""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from tests.integration.conftest import BrokerFactory, admin_for, create_topic, unique_topic
from tests.support.admin_cli import run
from tests.support.broker import BrokerProcess, free_port
from tests.support.certs import Pki, make_pki

SCRAM_USER, SCRAM_PASSWORD = "wire-admin", "wire-secret-0xc0ffee"


def cli(*args: str, stdin: str | None = None, expect: int = 0) -> subprocess.CompletedProcess[str]:
    """``pykbroker ARGS`` (the click app in this process, tests/support/admin_cli.py); its exit code checked."""
    ran = run([*args, "--timeout", "20"], stdin)
    done = subprocess.CompletedProcess(ran.args, ran.returncode, ran.stdout.decode(), ran.stderr.decode())
    assert done.returncode == expect, (done.returncode, done.stdout, done.stderr)
    return done


def doc(*args: str) -> Any:
    return json.loads(cli(*args, "-o", "json").stdout)


def rows(text: str) -> list[list[str]]:
    """The tables' rows as their cells (headers, rules and blank lines dropped)."""
    lines = [*text.splitlines(), ""]
    return [line.split() for line, after in itertools.pairwise(lines)
            if line.strip() and not line.startswith("─") and not after.startswith("─")]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory, pki: Pki) -> tuple[BrokerProcess, str, str]:
    """One broker with share groups and three listeners: PLAINTEXT, SASL_PLAINTEXT (SCRAM) and SSL (the client's
    certificate required)."""
    sasl_port, ssl_port = free_port(), free_port()
    b = module_broker_factory({"group.share.enable": "true", "sasl.enabled.mechanisms": "SCRAM-SHA-256",
                               "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.server.pem),
                               "ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca.cert_path),
                               "ssl.client.auth": "required"}, start=False)
    b.overrides["listeners"] = (f"PLAINTEXT://127.0.0.1:{b.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port},"
                                f"SSL://127.0.0.1:{ssl_port}")
    b.start()
    return b, f"127.0.0.1:{sasl_port}", f"127.0.0.1:{ssl_port}"


def test_quota_set_list_and_delete(broker: tuple[BrokerProcess, str, str]) -> None:
    b = broker[0].bootstrap
    out = cli("quota", "set", "--user", "alice", "producer_byte_rate=1024", "request_percentage=12.5", "-b", b)
    assert rows(out.stdout) == [["user=alice", "producer_byte_rate", "set", "1024"],
                                ["user=alice", "request_percentage", "set", "12.5"]]
    cli("quota", "set", "--user", "alice", "--client-id", "app", "consumer_byte_rate=2048", "-b", b)
    assert doc("quota", "set", "--default-client-id", "consumer_byte_rate=4096", "-b", b) == {
        "entity": {"client-id": None}, "changes": [{"key": "consumer_byte_rate", "operation": "set", "value": 4096.0}],
        "validate_only": False}
    assert doc("quota", "list", "--user", "alice", "-b", b) == [
        {"entity": {"user": "alice"}, "quotas": {"producer_byte_rate": 1024.0, "request_percentage": 12.5}},
        {"entity": {"user": "alice", "client-id": "app"}, "quotas": {"consumer_byte_rate": 2048.0}}]
    assert doc("quota", "list", "--default-client-id", "--strict", "-b", b) == [
        {"entity": {"client-id": None}, "quotas": {"consumer_byte_rate": 4096.0}}]
    listed = rows(cli("quota", "list", "-b", b).stdout)
    assert ["client-id=<default>", "consumer_byte_rate", "4096"] in listed
    assert ["user=alice", "request_percentage", "12.5"] in listed

    assert doc("quota", "set", "--user", "alice", "--delete", "request_percentage", "--delete",
               "producer_byte_rate", "-b", b) == {
        "entity": {"user": "alice"}, "changes": [{"key": "request_percentage", "operation": "delete", "value": None},
                                                 {"key": "producer_byte_rate", "operation": "delete", "value": None}],
        "validate_only": False}
    assert doc("quota", "list", "--user", "alice", "--strict", "-b", b) == []

    refused = cli("quota", "set", "--user", "alice", "producer_byte_rate=1.5", "-b", b, expect=1)
    assert "INVALID_REQUEST" in refused.stderr and "must be a Long value" in refused.stderr


def test_client_metrics_config_set_get_delete(broker: tuple[BrokerProcess, str, str]) -> None:
    b = broker[0].bootstrap
    name = unique_topic("sub")
    assert doc("config", "set", "client-metrics", name, "metrics=org.apache.kafka.producer.", "interval.ms=5000",
               "-b", b) == {"entity_type": "client-metrics", "entity": name, "changes": [
                   {"name": "metrics", "operation": "set", "value": "org.apache.kafka.producer."},
                   {"name": "interval.ms", "operation": "set", "value": "5000"}]}
    got = doc("config", "get", "client-metrics", name, "-b", b)
    assert got == {"entity_type": "client-metrics", "entity": name, "configs": [
        {"name": "interval.ms", "value": "5000", "source": "CLIENT_METRICS_CONFIG", "read_only": False,
         "sensitive": False},
        {"name": "metrics", "value": "org.apache.kafka.producer.", "source": "CLIENT_METRICS_CONFIG",
         "read_only": False, "sensitive": False}]}
    assert rows(cli("config", "delete", "client-metrics", name, "interval.ms", "-b", b).stdout) == [
        ["interval.ms", "delete", "-"]]
    assert [c["name"] for c in doc("config", "get", "client-metrics", name, "-b", b)["configs"]] == ["metrics"]
    refused = cli("config", "set", "client-metrics", name, "interval.ms=5", "-b", b, expect=1)
    assert "INVALID_REQUEST" in refused.stderr and "interval.ms" in refused.stderr


def test_open_transaction_listed_and_described(broker: tuple[BrokerProcess, str, str]) -> None:
    b = broker[0].bootstrap
    topic, txn_id = unique_topic("txn"), unique_topic("tid")
    create_topic(broker[0], topic, 2)
    producer = Producer({"bootstrap.servers": b, "broker.address.family": "v4", "transactional.id": txn_id,
                         "transaction.timeout.ms": 45000})
    producer.init_transactions(20)
    producer.begin_transaction()
    producer.produce(topic, b"v", partition=1)
    assert producer.flush(20) == 0
    try:
        listed = [t for t in doc("txn", "list", "-b", b) if t["transactional_id"] == txn_id]
        assert len(listed) == 1 and listed[0]["state"] == "Ongoing" and listed[0]["coordinator"] == 0
        assert txn_id not in [t["transactional_id"] for t in doc("txn", "list", "--state", "Empty", "-b", b)]
        described = doc("txn", "describe", txn_id, "-b", b)
        start = described.pop("start_time_ms")
        assert isinstance(start, int) and abs(start - time.time() * 1000) < 120_000
        assert described == {"transactional_id": txn_id, "coordinator": 0, "state": "Ongoing",
                             "producer_id": listed[0]["producer_id"], "producer_epoch": described["producer_epoch"],
                             "timeout_ms": 45000, "partitions": [{"topic": topic, "partition": 1}]}
        table = cli("txn", "describe", txn_id, "-b", b).stdout
        assert "State            Ongoing" in table and [topic, "1"] in rows(table.split("TOPIC", 1)[1])
    finally:
        producer.abort_transaction(20)
    assert doc("txn", "describe", txn_id, "-b", b)["state"] == "CompleteAbort"
    missing = cli("txn", "describe", "no-such-id", "-b", b, expect=1)
    assert "TRANSACTIONAL_ID_NOT_FOUND" in missing.stderr


@pytest.fixture
def share_consumers() -> Iterator[list[ShareConsumer]]:
    consumers: list[ShareConsumer] = []
    yield consumers
    for c in consumers:
        c.close()


def test_share_group_listed_and_described_with_lag(broker: tuple[BrokerProcess, str, str],
                                                   share_consumers: list[ShareConsumer]) -> None:
    b = broker[0].bootstrap
    topic, group = unique_topic("share"), unique_topic("sg")
    create_topic(broker[0], topic, 1)
    admin = admin_for(broker[0])
    resource = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=20)
    producer = Producer({"bootstrap.servers": b, "broker.address.family": "v4"})
    for i in range(10):
        producer.produce(topic, b"v%d" % i)
    assert producer.flush(20) == 0
    c = ShareConsumer({"bootstrap.servers": b, "broker.address.family": "v4", "group.id": group,
                       "client.id": "wire-share", "share.acknowledgement.mode": "explicit"})
    share_consumers.append(c)
    c.subscribe([topic])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 10 and time.monotonic() < deadline:
        got += [m for m in c.poll(0.5) if m.error() is None]
    assert len(got) == 10

    assert {"group": group, "state": "Stable", "coordinator": 0} in doc("share-group", "list", "-b", b)
    described = doc("share-group", "describe", group, "-b", b)
    [member] = described["members"]
    assert member["client_id"] == "wire-share" and member["assignment"] == [{"topic": topic, "partition": 0}]
    assert member["subscribed_topics"] == [topic]
    assert (described["group"], described["coordinator"], described["state"]) == (group, 0, "Stable")
    # Acquired, not acknowledged: the share-partition starts at 0, all ten records are lag.
    assert described["offsets"] == [{"topic": topic, "partition": 0, "start_offset": 0, "end_offset": 10,
                                     "lag": 10, "member_id": member["member_id"]}]

    for m in got:
        c.acknowledge(m, AcknowledgeType.ACCEPT)
    c.commit_sync()
    for i in range(5):
        producer.produce(topic, b"w%d" % i)
    assert producer.flush(20) == 0
    described = doc("share-group", "describe", group, "-b", b)
    assert described["offsets"] == [{"topic": topic, "partition": 0, "start_offset": 10, "end_offset": 15,
                                     "lag": 5, "member_id": member["member_id"]}]
    table = cli("share-group", "describe", group, "-b", b).stdout
    assert [topic, "0", "10", "15", "5", member["member_id"]] in rows(table.split("LAG", 1)[1])
    assert "GROUP_ID_NOT_FOUND" in cli("share-group", "describe", "no-such-group", "-b", b, expect=1).stderr


def test_cluster_info_shows_api_versions(broker: tuple[BrokerProcess, str, str]) -> None:
    b = broker[0].bootstrap
    info = doc("cluster", "info", "-b", b)
    [only] = info["brokers"]
    versions = {v["name"]: (v["api_key"], v["min"], v["max"]) for v in only["api_versions"]}
    assert versions["Produce"][:2] == (0, 0) and versions["Fetch"][:2] == (1, 0)
    assert versions["ApiVersions"][0] == 18 and versions["ApiVersions"][2] >= 3
    assert "DescribeClientQuotas" in versions and only["reachable"] is True
    table = rows(cli("cluster", "info", "-b", b).stdout.split("FETCH", 1)[1])
    assert table[0][-2:] == [str(versions["Produce"][2]), str(versions["Fetch"][2])]
    by_api = cli("cluster", "info", "--api-versions", "-b", b).stdout
    assert any(r[:2] == ["DescribeClientQuotas", "48"] for r in rows(by_api.split("Broker 0", 1)[1]))


def test_sasl_scram_login(broker: tuple[BrokerProcess, str, str]) -> None:
    plain, sasl, _ = broker
    cli("user", "create", SCRAM_USER, "--mechanism", "SCRAM-SHA-256", "--iterations", "4096", "--password-stdin",
        "-b", plain.bootstrap, stdin=SCRAM_PASSWORD + "\n")
    cli("quota", "set", "--client-id", "scram-app", "producer_byte_rate=777", "-b", plain.bootstrap)
    login = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=SCRAM-SHA-256",
             "-X", f"sasl.username={SCRAM_USER}"]
    assert doc("quota", "list", "--client-id", "scram-app", "-b", sasl, *login,
               "-X", f"sasl.password={SCRAM_PASSWORD}") == [
        {"entity": {"client-id": "scram-app"}, "quotas": {"producer_byte_rate": 777.0}}]
    wrong = cli("quota", "list", "-b", sasl, *login, "-X", "sasl.password=wrong", expect=3)
    assert "SASL_AUTHENTICATION_FAILED" in wrong.stderr and sasl in wrong.stderr
    gssapi = cli("quota", "list", "-b", sasl, "-X", "security.protocol=SASL_PLAINTEXT",
                 "-X", "sasl.mechanism=GSSAPI", expect=2)
    assert "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512" in gssapi.stderr
    # Nothing listens: exit 3.
    assert cli("quota", "list", "-b", f"127.0.0.1:{free_port()}", expect=3).stderr.startswith("error: no broker")


def test_tls_with_client_certificate(broker: tuple[BrokerProcess, str, str], pki: Pki) -> None:
    plain, _, tls = broker
    cli("quota", "set", "--client-id", "tls-app", "consumer_byte_rate=555", "-b", plain.bootstrap)
    secured = ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={pki.ca.cert_path}",
               "-X", f"ssl.certificate.location={pki.alice.cert}", "-X", f"ssl.key.location={pki.alice.key}"]
    assert doc("quota", "list", "--client-id", "tls-app", "-b", tls, *secured) == [
        {"entity": {"client-id": "tls-app"}, "quotas": {"consumer_byte_rate": 555.0}}]
    untrusted = cli("quota", "list", "-b", tls, "-X", "security.protocol=SSL",
                    "-X", f"ssl.ca.location={pki.other_ca.cert_path}", expect=3)
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
