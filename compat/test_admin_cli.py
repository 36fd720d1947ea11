"""pykbroker's admin CLI against every cluster the suite runs: pykbroker (one broker and three) and Apache Kafka
(3.9 on ZooKeeper, one broker and three; 4.x on KRaft). The same command lines, checked by exit code and by the
JSON documents they print (docs/admin.md), so a command that works on Kafka works the same on pykbroker."""

from __future__ import annotations

import json
import uuid

import pytest

from compat import scenario as s
from compat.admin_cli import AdminCli
from compat.clients.base import Client, Msg, wait_until
from compat.cluster import ClusterInfo
from compat.security import PASSWORDS

CLI = "admin CLI"


def _unique(prefix: str) -> str:
    return f"compat-cli-{prefix}-{uuid.uuid4().hex[:8]}"


@s.scenario("cli.cluster-info", CLI, apis=(60, 3), consumes=False)
def test_cluster_info(admin_cli: AdminCli, cluster: ClusterInfo) -> None:
    doc = admin_cli.json("cluster", "info")
    assert len(doc["brokers"]) == cluster.brokers, doc
    assert doc["controller"] in [b["id"] for b in doc["brokers"]] or doc["controller"] is None, doc
    assert sum(b["controller"] for b in doc["brokers"]) <= 1 and doc["cluster_id"], doc


@s.scenario("cli.topic", CLI, apis=(19, 20, 37, 3, 32, 44, 21, 2), consumes=False)
def test_topic(admin_cli: AdminCli, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    t = new_topic(create=False)
    created = admin_cli.json("topic", "create", t, "-p", "2", "-r", "1", "-c", "retention.ms=3600000")
    assert created == [{"topic": t, "result": "created", "error": None}]
    again = admin_cli.run("topic", "create", t, "-o", "json")
    assert again.returncode == 1 and again.doc == [{"topic": t, "result": "failed", "error": "TOPIC_ALREADY_EXISTS"}], \
        str(again)
    assert admin_cli.json("topic", "create", t, "--if-not-exists")[0]["result"] == "exists"
    listed = wait_until(lambda: admin_cli.json("topic", "list", t) or None, 30, interval=0.3, what="topic listed")
    assert listed == [{"name": t, "partitions": 2, "replication_factor": 1, "internal": False}]

    helper.produce(t, [Msg(f"v{i}".encode(), partition=i % 2) for i in range(6)])
    (doc,) = admin_cli.json("topic", "describe", t)
    assert doc["name"] == t and doc["internal"] is False and doc["configs"] == {"retention.ms": "3600000"}, doc
    assert [(p["partition"], p["start_offset"], p["end_offset"], len(p["replicas"]), p["isr"] == p["replicas"])
            for p in doc["partitions"]] == [(0, 0, 3, 1, True), (1, 0, 3, 1, True)], doc
    assert admin_cli.json("topic", "trim", t, "-p", "1", "--before", "2") == \
        {"topic": t, "partitions": [{"partition": 1, "start_offset": 2}]}
    admin_cli.ok("topic", "alter-config", t, "--set", "cleanup.policy=compact", "--delete", "retention.ms")
    admin_cli.ok("topic", "add-partitions", t, "--total", "3")

    def changed() -> dict | None:
        (d,) = admin_cli.json("topic", "describe", t)
        return d if len(d["partitions"]) == 3 and d["configs"] == {"cleanup.policy": "compact"} else None

    d = wait_until(changed, 30, interval=0.3, what="3 partitions and the altered configs")
    assert d["partitions"][1]["start_offset"] == 2, d
    missing = admin_cli.run("topic", "describe", t + "-none")
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr, str(missing)
    assert admin_cli.json("topic", "delete", t) == [{"topic": t, "result": "deleted", "error": None}]
    wait_until(lambda: admin_cli.json("topic", "list", t) == [], 30, interval=0.3, what="the topic gone")


@s.scenario("cli.config", CLI, apis=(32, 44), consumes=False)
def test_config(admin_cli: AdminCli, new_topic) -> None:  # type: ignore[no-untyped-def]
    t = new_topic()
    admin_cli.ok("config", "set", "topic", t, "retention.ms=7200000", "max.message.bytes=200000")
    got = wait_until(lambda: admin_cli.json("config", "get", "topic", t)["configs"] or None, 30, interval=0.3,
                     what="the topic's configs")
    assert [(c["name"], c["value"], c["source"]) for c in got] == [
        ("max.message.bytes", "200000", "DYNAMIC_TOPIC_CONFIG"), ("retention.ms", "7200000", "DYNAMIC_TOPIC_CONFIG")]
    admin_cli.ok("config", "delete", "topic", t, "max.message.bytes")
    one = admin_cli.json("config", "get", "topic", t, "max.message.bytes")["configs"]
    assert one[0]["source"] == "DEFAULT_CONFIG" or one[0]["source"] == "STATIC_BROKER_CONFIG", one
    refused = admin_cli.run("config", "set", "topic", t, "retention.ms=not-a-number")
    assert refused.returncode == 1 and ("INVALID_CONFIG" in refused.stderr or "INVALID_REQUEST" in refused.stderr), \
        str(refused)

    broker = str(admin_cli.json("cluster", "info")["brokers"][0]["id"])
    admin_cli.ok("config", "set", "broker", broker, "log.cleaner.threads=2")
    threads = admin_cli.json("config", "get", "broker", broker, "log.cleaner.threads")["configs"]
    assert [(c["value"], c["source"]) for c in threads] == [("2", "DYNAMIC_BROKER_CONFIG")], threads
    admin_cli.ok("config", "delete", "broker", broker, "log.cleaner.threads")
    everything = admin_cli.json("config", "get", "broker", broker, "--all")["configs"]
    assert all(c["value"] is None for c in everything if c["sensitive"])
    assert any(c["name"] == "num.io.threads" for c in everything), everything[:3]


@s.scenario("cli.acl", CLI, apis=(29, 30, 31, 19), consumes=False)
def test_acl(admin_cli: AdminCli, cluster: ClusterInfo) -> None:
    if cluster.sasl_bootstrap is None:
        pytest.skip(f"{s.NS_CLUSTER}: no SASL_PLAINTEXT listener (give --sasl-bootstrap with --bootstrap)")
    alice = ("PLAIN", "alice", PASSWORDS["alice"])
    prefix = _unique("alice")
    refused = admin_cli.run("topic", "create", f"{prefix}-1", "-o", "json", login=alice)
    assert refused.returncode == 1 and refused.doc[0]["error"] == "TOPIC_AUTHORIZATION_FAILED", str(refused)
    binding = ["--resource-type", "topic", "--resource-name", prefix, "--pattern", "prefixed", "--principal",
               "User:alice", "--operation", "create"]
    made = admin_cli.json("acl", "create", *binding)
    assert made == [{"principal": "User:alice", "host": "*", "operation": "create", "permission": "allow",
                     "resource_type": "topic", "resource_name": prefix, "pattern": "prefixed"}]
    try:
        wait_until(lambda: made[0] in admin_cli.json("acl", "list", "--principal", "User:alice") or None, 30,
                   interval=0.3, what="the ACL listed")
        created = wait_until(lambda: ((r := admin_cli.run("topic", "create", f"{prefix}-1", "-o", "json",
                                                          login=alice)).returncode == 0 and r) or None,
                             30, interval=0.5, what="alice allowed to create")
        assert created.doc == [{"topic": f"{prefix}-1", "result": "created", "error": None}]
    finally:
        deleted = admin_cli.json("acl", "delete", "--principal", "User:alice", "--resource-name", prefix)
        admin_cli.run("topic", "delete", f"{prefix}-1", "--if-exists")
    assert deleted == made


@s.scenario("cli.user", CLI, apis=(50, 51), consumes=False)
def test_user(admin_cli: AdminCli, cluster: ClusterInfo) -> None:
    name = _unique("user")
    admin_cli.ok("user", "create", name, "--mechanism", "SCRAM-SHA-512", "--iterations", "4096", "--password-stdin",
                 stdin="cli-secret\n")
    listed = wait_until(lambda: admin_cli.json("user", "list", name) if admin_cli.run("user", "list", name)
                        .returncode == 0 else None, 30, interval=0.3, what="the user listed")
    assert listed == [{"user": name, "credentials": [{"mechanism": "SCRAM-SHA-512", "iterations": 4096}]}]
    if cluster.sasl_bootstrap is not None:
        login = ("SCRAM-SHA-512", name, "cli-secret")
        wait_until(lambda: admin_cli.run("topic", "list", "--timeout", "10", login=login).returncode == 0 or None,
                   60, interval=1.0, what="the new user logs in")
    assert admin_cli.json("user", "delete", name) == {"user": name, "deleted": ["SCRAM-SHA-512"]}
    gone = admin_cli.run("user", "list", name)
    assert gone.returncode == 1 and "RESOURCE_NOT_FOUND" in gone.stderr, str(gone)


def _lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@s.scenario("cli.produce-consume", CLI, apis=(0, 1, 2, 3), consumes=False)
def test_produce_consume(admin_cli: AdminCli, new_topic) -> None:  # type: ignore[no-untyped-def]
    t = new_topic(partitions=2)
    records = [{"key": f"k{i}", "value": f"v{i}", "headers": [["n", str(i)]], "partition": i % 2} for i in range(6)]
    records.append({"key": None, "value": {"base64": "AP8="}, "headers": [], "partition": 0})
    stdin = "".join(json.dumps(r) + "\n" for r in records)
    summary = admin_cli.json("produce", t, "--format", "json", stdin=stdin)
    assert summary == {"topic": t, "records": 7, "delivered": 7, "failed": 0, "partitions": [
        {"partition": 0, "records": 4, "first_offset": 0, "last_offset": 3},
        {"partition": 1, "records": 3, "first_offset": 0, "last_offset": 2}]}, summary
    got = _lines(admin_cli.ok("consume", t, "-p", "0", "--from", "1", "--to", "end", "--format", "json").stdout)
    assert [(r["offset"], r["key"], r["value"], r["headers"]) for r in got] == [
        (1, "k2", "v2", [["n", "2"]]), (2, "k4", "v4", [["n", "4"]]), (3, None, {"base64": "AP8="}, [])], got
    last = _lines(admin_cli.ok("consume", t, "--from", "-1", "--to", "end", "--format", "json").stdout)
    assert sorted((r["partition"], r["offset"]) for r in last) == [(0, 3), (1, 2)], last
    text = admin_cli.ok("consume", t, "-p", "1", "--to", "end", "-k", "=").stdout
    assert text.splitlines() == ["k1=v1", "k3=v3", "k5=v5"], text


@s.scenario("cli.group", CLI, apis=(8, 9, 10, 11, 12, 14, 15, 16, 42), consumes=False)
def test_group(admin_cli: AdminCli, new_topic) -> None:  # type: ignore[no-untyped-def]
    t = new_topic(partitions=1)
    group = _unique("group")
    admin_cli.ok("produce", t, stdin="".join(f"m{i}\n" for i in range(5)))
    read = admin_cli.ok("consume", t, "-g", group, "--to", "end").stdout
    assert read.splitlines() == [f"m{i}" for i in range(5)], read

    def lag(expected: int) -> dict | None:
        (d,) = admin_cli.json("group", "describe", group)
        return d if d["total_lag"] == expected and d["state"] == "Empty" else None

    d = wait_until(lambda: lag(0), 30, interval=0.5, what="the group's lag 0")
    assert [(p["topic"], p["partition"], p["committed_offset"], p["log_end_offset"], p["lag"])
            for p in d["partitions"]] == [(t, 0, 5, 5, 0)], d
    admin_cli.ok("produce", t, stdin="m5\nm6\n")
    wait_until(lambda: lag(2), 30, interval=0.5, what="the group's lag 2")
    assert group in [g["group"] for g in admin_cli.json("group", "list")]

    dry = admin_cli.json("group", "seek", group, "--topic", t, "--to-offset", "1")
    assert dry == {"group": group, "topic": t, "executed": False,
                   "partitions": [{"partition": 0, "current_offset": 5, "new_offset": 1}]}, dry
    assert lag(2) is not None  # a dry run changes nothing
    done = admin_cli.json("group", "seek", group, "--topic", t, "--shift-by", "-10", "--execute")
    assert done["executed"] and done["partitions"] == [{"partition": 0, "current_offset": 5, "new_offset": 0}], done
    wait_until(lambda: lag(7), 30, interval=0.5, what="lag 7 after the seek to the log start")
    assert admin_cli.json("group", "delete", group) == [{"group": group, "result": "deleted", "error": None}]
    gone = admin_cli.run("group", "describe", group)
    assert gone.returncode == 1 and "GROUP_ID_NOT_FOUND" in gone.stderr, str(gone)
