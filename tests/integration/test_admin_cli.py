"""The admin CLI (``pykbroker topic|config|acl|user|cluster``) run as operators run it: a subprocess against a
real broker, checked by its JSON documents, the table fields people read, and its exit codes.

The broker has an ACL authorizer; its PLAINTEXT listener is the super user ANONYMOUS (the operator), its
SASL_PLAINTEXT listener logs in alice (PLAIN) and SCRAM users, who get only what ACLs give them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.integration.test_security_sasl import start_broker
from tests.support.admin_cli import run, run_process
from tests.support.broker import BrokerProcess


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    b, sasl = start_broker(tmp_path_factory.mktemp("admin-cli"), **{
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:ANONYMOUS;User:admin", "allow.everyone.if.no.acl.found": "false"})
    try:
        yield b, sasl
    finally:
        b.stop()


class Run:
    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr

    @property
    def doc(self) -> Any:
        return json.loads(self.stdout)


def cli(*args: str, bootstrap: str | None = None, stdin: str | None = None, env: dict[str, str] | None = None,
        expect: int | None = 0, process: bool = False) -> Run:
    """``pykbroker ARGS`` (in this process, or with ``process`` as a subprocess); its exit code checked when
    ``expect`` is given."""
    argv = [*args, *(["-b", bootstrap] if bootstrap else [])]
    p = (run_process if process else run)(argv, stdin, env)
    out = Run(p.returncode, p.stdout.decode(), p.stderr.decode())
    if expect is not None:
        assert p.returncode == expect, (argv, p.returncode, out.stdout, out.stderr)
    return out


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_topic_lifecycle_in_json_and_tables(brokers: tuple[BrokerProcess, str]) -> None:
    b = brokers[0].bootstrap
    t = unique("admin")
    created = cli("topic", "create", t, "-p", "3", "-c", "retention.ms=3600000", "-o", "json", bootstrap=b)
    assert created.doc == [{"topic": t, "result": "created", "error": None}]
    assert t in cli("topic", "list", bootstrap=b).stdout.split()
    listed = cli("topic", "list", t, "-o", "json", bootstrap=b).doc
    assert listed == [{"name": t, "partitions": 3, "replication_factor": 1, "internal": False}]
    with_internal = {d["name"] for d in cli("topic", "list", "--internal", "-o", "json", bootstrap=b).doc}
    assert "__consumer_offsets" in with_internal or not with_internal - {t}

    p = Producer({"bootstrap.servers": b})
    for i in range(10):
        p.produce(t, f"v{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0

    described = cli("topic", "describe", t, "-o", "json", bootstrap=b).doc
    (doc,) = described
    assert doc["name"] == t and doc["internal"] is False and len(doc["topic_id"]) > 10
    assert doc["configs"] == {"retention.ms": "3600000"}
    assert [(q["partition"], q["leader"], q["replicas"], q["isr"], q["start_offset"], q["end_offset"])
            for q in doc["partitions"]] == [(0, 0, [0], [0], 0, 5), (1, 0, [0], [0], 0, 5), (2, 0, [0], [0], 0, 0)]
    table = cli("topic", "describe", t, bootstrap=b).stdout
    assert "Messages    10" in table
    row = next(line.split() for line in table.splitlines() if line.split()[:1] == ["0"])
    assert row == ["0", "0", "0", "0", "0", "5"]

    trimmed = cli("topic", "trim", t, "-p", "0", "--before", "3", "-o", "json", bootstrap=b).doc
    assert trimmed == {"topic": t, "partitions": [{"partition": 0, "start_offset": 3}]}
    everything = cli("topic", "trim", t, "-o", "json", bootstrap=b).doc
    assert everything["partitions"] == [{"partition": 0, "start_offset": 5}, {"partition": 1, "start_offset": 5},
                                        {"partition": 2, "start_offset": 0}]

    assert cli("topic", "add-partitions", t, "--total", "5", "-o", "json", bootstrap=b).doc == \
        {"topic": t, "partitions": 5}
    shrink = cli("topic", "add-partitions", t, "--total", "2", bootstrap=b, expect=1)
    assert "INVALID_PARTITIONS" in shrink.stderr

    cli("topic", "alter-config", t, "--set", "cleanup.policy=compact", "--delete", "retention.ms", bootstrap=b)
    assert cli("topic", "describe", t, "-o", "json", bootstrap=b).doc[0]["configs"] == {"cleanup.policy": "compact"}

    assert cli("topic", "delete", t, "-o", "json", bootstrap=b).doc == [{"topic": t, "result": "deleted",
                                                                          "error": None}]
    assert cli("topic", "list", t, "-o", "json", bootstrap=b).doc == []


def test_partial_failures_exit_1_and_say_which(brokers: tuple[BrokerProcess, str]) -> None:
    b = brokers[0].bootstrap
    t, missing = unique("partial"), unique("missing")
    cli("topic", "create", t, bootstrap=b)
    again = cli("topic", "create", t, "-o", "json", bootstrap=b, expect=1)
    assert again.doc == [{"topic": t, "result": "failed", "error": "TOPIC_ALREADY_EXISTS"}]
    assert f"create {t}: TOPIC_ALREADY_EXISTS" in again.stderr
    assert cli("topic", "create", t, "--if-not-exists", "-o", "json", bootstrap=b).doc[0]["result"] == "exists"

    both = cli("topic", "delete", t, missing, "-o", "json", bootstrap=b, expect=1)
    assert both.doc == [{"topic": t, "result": "deleted", "error": None},
                        {"topic": missing, "result": "failed", "error": "UNKNOWN_TOPIC_OR_PARTITION"}]
    assert cli("topic", "delete", missing, "--if-exists", bootstrap=b).code == 0
    described = cli("topic", "describe", missing, bootstrap=b, expect=1)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in described.stderr


def test_usage_and_unreachable_exit_codes(tmp_path: Path) -> None:
    assert cli("topic", "create", "x", "-c", "no-equals-sign", bootstrap="127.0.0.1:1", expect=2).stderr \
        .startswith("error: -c takes KEY=VALUE")
    assert cli("config", "get", "broker", "not-an-id", bootstrap="127.0.0.1:1", expect=2).code == 2
    assert "No such command" in cli("topic", "frobnicate", expect=2).stderr
    down = cli("topic", "list", "--timeout", "3", "-o", "json", bootstrap="127.0.0.1:1", expect=3)
    assert down.doc["error"] == "TRANSPORT" and "error: Metadata" in down.stderr
    missing = cli("topic", "list", "-F", str(tmp_path / "absent.properties"), expect=2)
    assert "cannot read the client config" in missing.stderr


def test_configs_of_brokers_topics_and_groups(brokers: tuple[BrokerProcess, str]) -> None:
    b = brokers[0].bootstrap
    cli("config", "set", "broker", "0", "log.cleaner.threads=2", bootstrap=b)
    got = cli("config", "get", "broker", "0", "log.cleaner.threads", "-o", "json", bootstrap=b).doc
    assert got == {"entity_type": "broker", "entity": "0", "configs": [
        {"name": "log.cleaner.threads", "value": "2", "source": "DYNAMIC_BROKER_CONFIG", "read_only": False,
         "sensitive": False}]}
    cli("config", "delete", "broker", "0", "log.cleaner.threads", bootstrap=b)
    after = cli("config", "get", "broker", "0", "log.cleaner.threads", "-o", "json", bootstrap=b).doc
    assert after["configs"][0]["source"] != "DYNAMIC_BROKER_CONFIG"

    cli("config", "set", "broker", "default", "log.retention.ms=7200000", bootstrap=b)
    default = cli("config", "get", "broker", "default", "-o", "json", bootstrap=b).doc["configs"]
    assert {"name": "log.retention.ms", "value": "7200000"} in [{k: c[k] for k in ("name", "value")}
                                                               for c in default]
    cli("config", "delete", "broker", "default", "log.retention.ms", bootstrap=b)

    # sensitive values are never shown: the SASL listener's JAAS config is set statically
    everything = cli("config", "get", "broker", "0", "--all", "-o", "json", bootstrap=b).doc["configs"]
    sensitive = [c for c in everything if c["sensitive"]]
    assert all(c["value"] is None for c in sensitive)
    table = cli("config", "get", "broker", "0", "--all", bootstrap=b).stdout
    assert "alice-secret" not in table and "admin-secret" not in table

    g = unique("group")
    cli("config", "set", "group", g, "consumer.session.timeout.ms=50000", bootstrap=b)
    group = cli("config", "get", "group", g, "consumer.session.timeout.ms", "-o", "json", bootstrap=b).doc
    assert group["configs"][0]["value"] == "50000"
    refused = cli("config", "set", "topic", unique("absent"), "retention.ms=1", bootstrap=b, expect=1)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in refused.stderr
    bad = cli("config", "set", "topic", "__consumer_offsets", "no.such.config=1", bootstrap=b, expect=1)
    assert "INVALID_CONFIG" in bad.stderr or "INVALID_REQUEST" in bad.stderr


def test_acls_gate_a_sasl_user_through_a_client_config_file(brokers: tuple[BrokerProcess, str],
                                                            tmp_path: Path) -> None:
    b, sasl = brokers[0].bootstrap, brokers[1]
    props = tmp_path / "alice.properties"
    props.write_text(f"bootstrap.servers={sasl}\nsecurity.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                     "sasl.username=alice\nsasl.password=alice-secret\n")
    prefix = unique("alice")
    refused = cli("topic", "create", f"{prefix}-1", "-F", str(props), "-o", "json", expect=1)
    assert refused.doc[0]["error"] == "TOPIC_AUTHORIZATION_FAILED"
    # A user who may not describe the cluster is told so, not shown an empty list (librdkafka's answer to a
    # refused DescribeAcls), and listing users does not crash (librdkafka's, on a refused
    # DescribeUserScramCredentials).
    assert cli("acl", "list", "-F", str(props), "-o", "json", expect=1).doc["error"] == "CLUSTER_AUTHORIZATION_FAILED"
    assert cli("user", "list", "-F", str(props), "-o", "json", expect=1).doc["error"] == "CLUSTER_AUTHORIZATION_FAILED"

    acl = ["--resource-type", "topic", "--resource-name", prefix, "--pattern", "prefixed",
           "--principal", "User:alice", "--operation", "create"]
    made = cli("acl", "create", *acl, "-o", "json", bootstrap=b).doc
    assert made == [{"principal": "User:alice", "host": "*", "operation": "create", "permission": "allow",
                     "resource_type": "topic", "resource_name": prefix, "pattern": "prefixed"}]
    # the environment names the file here: the same file, found the other way
    assert cli("topic", "create", f"{prefix}-1", "-o", "json", env={"PYKBROKER_CLIENT_CONFIG": str(props)}).doc \
        == [{"topic": f"{prefix}-1", "result": "created", "error": None}]
    listed = cli("acl", "list", "--principal", "User:alice", "-o", "json", bootstrap=b).doc
    assert made[0] in listed
    table = cli("acl", "list", "--principal", "User:alice", bootstrap=b).stdout
    assert any(line.split() == ["User:alice", "*", "create", "allow", "topic", prefix, "prefixed"]
               for line in table.splitlines())
    deleted = cli("acl", "delete", "--principal", "User:alice", "--resource-name", prefix, "-o", "json",
                  bootstrap=b).doc
    assert deleted == made
    assert made[0] not in cli("acl", "list", "-o", "json", bootstrap=b).doc
    wrong = tmp_path / "wrong.properties"
    wrong.write_text(props.read_text().replace("alice-secret", "nope"))
    failed = cli("topic", "list", "-F", str(wrong), "--timeout", "10", expect=3)
    assert "AUTHENTICATION" in failed.stderr


def test_scram_users_created_listed_and_deleted_log_in(brokers: tuple[BrokerProcess, str]) -> None:
    b, sasl = brokers[0].bootstrap, brokers[1]
    name = unique("bob")
    cli("user", "create", name, "--mechanism", "SCRAM-SHA-512", "--iterations", "4096", "--password-stdin",
        stdin="bob-secret\n", bootstrap=b)
    cli("user", "create", name, "--password-stdin", stdin="bob-secret\n", bootstrap=b)
    listed = cli("user", "list", name, "-o", "json", bootstrap=b).doc
    assert listed == [{"user": name, "credentials": [{"mechanism": "SCRAM-SHA-256", "iterations": 8192},
                                                      {"mechanism": "SCRAM-SHA-512", "iterations": 4096}]}] \
        or listed == [{"user": name, "credentials": [{"mechanism": "SCRAM-SHA-512", "iterations": 4096},
                                                      {"mechanism": "SCRAM-SHA-256", "iterations": 8192}]}]
    assert name in cli("user", "list", bootstrap=b).stdout
    login = ["-b", sasl, "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=SCRAM-SHA-512",
             "-X", f"sasl.username={name}", "-X", "sasl.password=bob-secret"]
    assert cli("topic", "list", *login, "-o", "json").doc == []  # logged in; no ACL shows it a topic
    deleted = cli("user", "delete", name, "-o", "json", bootstrap=b).doc
    assert deleted["user"] == name and sorted(deleted["deleted"]) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    assert cli("topic", "list", *login, "--timeout", "10", expect=3).code == 3
    assert "RESOURCE_NOT_FOUND" in cli("user", "list", name, bootstrap=b, expect=1).stderr
    empty = cli("user", "create", name, "--password-stdin", stdin="\n", bootstrap=b, expect=2)
    assert "the password is empty" in empty.stderr


def test_cluster_info(brokers: tuple[BrokerProcess, str]) -> None:
    b = brokers[0].bootstrap
    doc = cli("cluster", "info", "-o", "json", bootstrap=b).doc
    assert doc["controller"] == 0 and len(doc["cluster_id"]) >= 22
    (broker,) = doc["brokers"]
    assert {k: broker[k] for k in ("id", "host", "port", "rack", "controller")} == \
        {"id": 0, "host": "127.0.0.1", "port": int(b.rsplit(":", 1)[1]), "rack": None, "controller": True}
    table = cli("cluster", "info", bootstrap=b).stdout
    assert "Controller  0" in table and f"{broker['port']}" in table


def test_help_lists_the_admin_commands_and_completion_script() -> None:
    top = cli("--help", process=True).stdout
    assert "topic" in top and "serve" in top
    assert "create" in cli("topic", "--help", process=True).stdout
    script = cli("completion", "bash", process=True).stdout
    assert "_PYKBROKER_COMPLETE" in script and "complete " in script
    completed = cli(env={"_PYKBROKER_COMPLETE": "bash_complete", "COMP_WORDS": "pykbroker topic de",
                         "COMP_CWORD": "2"}, process=True)
    assert "describe" in completed.stdout and "delete" in completed.stdout
