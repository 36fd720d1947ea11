"""Kafka's own command-line tools, as an operator runs them: exit codes and the output they print.

Each scenario runs with the tools of every release line the pom pins against pykbroker, and with the tools
of its own line against Apache Kafka, so an invocation that works on Kafka 3.9 (or 4.x) is checked against
pykbroker with the same tools. The records and groups the tools look at are written with the helper client.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

from compat import scenario as s
from compat.check import text_msgs
from compat.clients.base import Client, Msg, wait_until
from compat.cluster import ClusterInfo
from compat.tools import KafkaTools, write

TOOLS = "tools"


def _table(text: str) -> list[dict[str, str]]:
    """The rows of a whitespace-aligned table the tools print (a header of upper-case names, then rows)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        cols = ln.split()
        if cols and all(re.fullmatch(r"[A-Z][A-Z-]*", c) for c in cols) and len(cols) > 2:
            return [dict(zip(cols, row.split(), strict=False)) for row in lines[i + 1:]
                    if len(row.split()) >= len(cols) - 3]
    return []


@s.scenario("tools.kafka-topics", TOOLS, apis=(19, 20, 37, 3, 32), consumes=False)
def test_topics(tools: KafkaTools, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(create=False)
    created = tools.ok("kafka-topics", "--create", "--topic", topic, "--partitions", "2", "--replication-factor",
                       "1", "--config", "retention.ms=3600000")
    # Kafka also warns here that the name has a period ('.'): a metric-name collision with '_' is possible.
    assert f"Created topic {topic}." in created.lines, str(created)
    again = tools.run("kafka-topics", "--create", "--topic", topic, "--partitions", "2", "--replication-factor", "1")
    assert again.returncode == 1 and f"Topic '{topic}' already exists" in again.stdout, str(again)
    tools.ok("kafka-topics", "--create", "--if-not-exists", "--topic", topic, "--partitions", "2",
             "--replication-factor", "1")
    listed = wait_until(lambda: tools.ok("kafka-topics", "--list").lines, 30, interval=0.3, what="the topic listed")
    assert topic in listed
    tools.ok("kafka-topics", "--alter", "--topic", topic, "--partitions", "3")

    def described() -> str | None:
        out = tools.ok("kafka-topics", "--describe", "--topic", topic).stdout
        return out if "PartitionCount: 3" in out else None

    out = wait_until(described, 30, interval=0.3, what="--describe shows 3 partitions")
    head = next(ln for ln in out.splitlines() if "PartitionCount" in ln)
    assert f"Topic: {topic}" in head and "ReplicationFactor: 1" in head and "retention.ms=3600000" in head, out
    parts = sorted(int(m) for m in re.findall(r"\tPartition: (\d+)\t", out))
    assert parts == [0, 1, 2], out
    assert all(re.search(r"Leader: \d+\tReplicas: \d+\tIsr: \d+", ln) for ln in out.splitlines()
               if "\tPartition: " in ln), out
    missing = tools.run("kafka-topics", "--describe", "--topic", topic + "-none")
    assert missing.returncode == 1 and "does not exist" in missing.stdout + missing.stderr, str(missing)
    tools.ok("kafka-topics", "--delete", "--topic", topic)
    wait_until(lambda: topic not in tools.ok("kafka-topics", "--list").lines, 30, interval=0.3,
               what="--list drops the deleted topic")


@s.scenario("tools.kafka-console-producer-consumer", TOOLS, apis=(0, 1, 2, 3, 10, 11, 14, 8, 9),
            consumes=False)
def test_console_producer_consumer(tools: KafkaTools, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    lines = [f"k{i}:value {i}" for i in range(20)]
    tools.ok("kafka-console-producer", "--topic", topic, "--property", "parse.key=true", "--property",
             "key.separator=:", stdin="\n".join(lines) + "\n")
    group = f"compat-tools-{uuid.uuid4().hex[:8]}"
    out = tools.ok("kafka-console-consumer", "--topic", topic, "--from-beginning", "--max-messages", "20",
                   "--property", "print.key=true", "--property", "key.separator=:", "--group", group,
                   "--timeout-ms", "30000")
    # (4.x first says that --property is deprecated in favour of --formatter-property.)
    assert sorted(ln for ln in out.lines if ln.startswith("k")) == sorted(lines), str(out)
    assert "Processed a total of 20 messages" in out.stderr, str(out)
    # One partition from an offset, without a group.
    one = tools.ok("kafka-console-consumer", "--topic", topic, "--partition", "0", "--offset", "earliest",
                   "--max-messages", "1", "--property", "print.offset=true", "--property", "print.partition=true",
                   "--timeout-ms", "30000")
    assert re.fullmatch(r"Partition:0\s+Offset:0\s+value \d+", one.lines[-1]), str(one)


@s.scenario("tools.kafka-consumer-groups", TOOLS, apis=(10, 11, 14, 8, 9, 15, 16, 42, 47, 2), consumes=False)
def test_consumer_groups(tools: KafkaTools, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    helper.produce(topic, text_msgs(6, partition=0) + text_msgs(4, partition=1))
    group = f"compat-tools-{uuid.uuid4().hex[:8]}"
    tools.ok("kafka-console-consumer", "--topic", topic, "--from-beginning", "--max-messages", "10", "--group", group,
             "--timeout-ms", "30000")
    assert group in tools.ok("kafka-consumer-groups", "--list").lines

    def rows() -> list[dict[str, str]]:
        return [r for r in _table(tools.ok("kafka-consumer-groups", "--describe", "--group", group).stdout)
                if r.get("TOPIC") == topic]

    got = wait_until(lambda: rows() if len(rows()) == 2 else None, 30, interval=0.3,
                     what="--describe lists both partitions")
    by_part = {int(r["PARTITION"]): r for r in got}
    assert {p: (r["CURRENT-OFFSET"], r["LOG-END-OFFSET"], r["LAG"]) for p, r in by_part.items()} == \
        {0: ("6", "6", "0"), 1: ("4", "4", "0")}, got
    state = tools.ok("kafka-consumer-groups", "--describe", "--group", group, "--state")
    assert re.search(rf"^{re.escape(group)}\s.*\bEmpty\s+0\s*$", state.stdout, re.M), str(state)
    reset = tools.ok("kafka-consumer-groups", "--reset-offsets", "--to-earliest", "--execute", "--topic", topic,
                     "--group", group)
    assert re.findall(rf"{re.escape(group)}\s+{re.escape(topic)}\s+(\d+)\s+(\d+)", reset.stdout) and all(
        off == "0" for _p, off in re.findall(rf"{re.escape(group)}\s+{re.escape(topic)}\s+(\d+)\s+(\d+)",
                                             reset.stdout)), str(reset)
    lag = {int(r["PARTITION"]): r["LAG"] for r in rows()}
    assert lag == {0: "6", 1: "4"}, lag
    shifted = tools.ok("kafka-consumer-groups", "--reset-offsets", "--shift-by", "2", "--execute",
                       "--topic", f"{topic}:0", "--group", group)
    assert re.search(rf"{re.escape(topic)}\s+0\s+2\b", shifted.stdout), str(shifted)
    dropped = tools.ok("kafka-consumer-groups", "--delete-offsets", "--group", group, "--topic", f"{topic}:1")
    assert re.search(r"Request succeed(ed)? for deleting offsets", dropped.stdout), str(dropped)
    assert re.search(rf"{re.escape(topic)}\s+1\s+Successful", dropped.stdout), str(dropped)
    deleted = tools.ok("kafka-consumer-groups", "--delete", "--group", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in deleted.stdout, str(deleted)
    gone = tools.run("kafka-consumer-groups", "--describe", "--group", group)
    # DescribeGroups up to v5 says Dead ("does not exist"); v6 (Kafka 4.x, KIP-1043) GROUP_ID_NOT_FOUND.
    assert (f"Consumer group '{group}' does not exist." in gone.stdout
            or f"GroupIdNotFoundException: Group {group} not found." in gone.stdout), str(gone)


@s.scenario("tools.kafka-configs", TOOLS, apis=(32, 33, 44, 48, 49), consumes=False)
def test_configs(tools: KafkaTools, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic()
    done = tools.ok("kafka-configs", "--entity-type", "topics", "--entity-name", topic, "--alter", "--add-config",
                    "retention.ms=7200000,max.message.bytes=200000")
    assert f"Completed updating config for topic {topic}." in done.stdout, str(done)
    desc = tools.ok("kafka-configs", "--entity-type", "topics", "--entity-name", topic, "--describe")
    assert f"Dynamic configs for topic {topic} are:" in desc.stdout, str(desc)
    assert re.search(r"^\s+retention.ms=7200000 sensitive=false synonyms=\{DYNAMIC_TOPIC_CONFIG:retention.ms=7200000",
                     desc.stdout, re.M), str(desc)
    assert re.search(r"^\s+max.message.bytes=200000 ", desc.stdout, re.M), str(desc)
    tools.ok("kafka-configs", "--entity-type", "topics", "--entity-name", topic, "--alter", "--delete-config",
             "retention.ms")
    after = tools.ok("kafka-configs", "--entity-type", "topics", "--entity-name", topic, "--describe").stdout
    assert "retention.ms=" not in after and "max.message.bytes=200000" in after, after
    assert helper.topic_configs(topic).get("max.message.bytes") == "200000"
    bad = tools.run("kafka-configs", "--entity-type", "topics", "--entity-name", topic, "--alter", "--add-config",
                    "retention.ms=not-a-number")
    assert bad.returncode != 0, str(bad)
    broker = str(helper.describe_cluster()["brokers"][0])
    every = tools.ok("kafka-configs", "--entity-type", "brokers", "--entity-name", broker, "--describe", "--all")
    assert f"All configs for broker {broker} are:" in every.stdout, str(every)
    assert re.search(r"^\s+num.partitions=\d+ sensitive=false", every.stdout, re.M), str(every)
    client = f"compat-tools-{uuid.uuid4().hex[:8]}"
    tools.ok("kafka-configs", "--entity-type", "clients", "--entity-name", client, "--alter", "--add-config",
             "producer_byte_rate=1048576,consumer_byte_rate=2097152")
    quotas = tools.ok("kafka-configs", "--entity-type", "clients", "--entity-name", client, "--describe")
    assert f"Quota configs for client-id '{client}' are" in quotas.stdout, str(quotas)
    assert "producer_byte_rate=1048576.0" in quotas.stdout and "consumer_byte_rate=2097152.0" in quotas.stdout, \
        str(quotas)
    tools.ok("kafka-configs", "--entity-type", "clients", "--entity-name", client, "--alter", "--delete-config",
             "producer_byte_rate,consumer_byte_rate")
    cleared = tools.ok("kafka-configs", "--entity-type", "clients", "--entity-name", client, "--describe")
    assert "producer_byte_rate" not in cleared.stdout, str(cleared)


@s.scenario("tools.kafka-acls", TOOLS, apis=(29, 30, 31), consumes=False)
def test_acls(tools: KafkaTools, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(create=False)
    user = f"User:compat-tools-{uuid.uuid4().hex[:8]}"
    added = tools.ok("kafka-acls", "--add", "--allow-principal", user, "--operation", "Read", "--operation",
                     "Describe", "--topic", topic)
    assert "Adding ACLs for resource" in added.stdout, str(added)
    listed = tools.ok("kafka-acls", "--list", "--topic", topic).stdout
    assert f"principal={user}, host=*, operation=READ, permissionType=ALLOW" in listed, listed
    assert f"principal={user}, host=*, operation=DESCRIBE, permissionType=ALLOW" in listed, listed
    by_user = tools.ok("kafka-acls", "--list", "--principal", user).stdout
    assert f"name={topic}, patternType=LITERAL" in by_user, by_user
    prefixed = tools.ok("kafka-acls", "--add", "--allow-principal", user, "--operation", "Write", "--topic",
                        topic[:20], "--resource-pattern-type", "prefixed")
    assert "patternType=PREFIXED" in prefixed.stdout, str(prefixed)
    tools.ok("kafka-acls", "--remove", "--force", "--allow-principal", user, "--operation", "Read", "--operation",
             "Describe", "--topic", topic)
    tools.ok("kafka-acls", "--remove", "--force", "--allow-principal", user, "--operation", "Write", "--topic",
             topic[:20], "--resource-pattern-type", "prefixed")
    left = tools.ok("kafka-acls", "--list", "--principal", user).stdout
    assert user not in left.replace(f"ACLs for principal `{user}`", ""), left


@s.scenario("tools.kafka-get-offsets-delete-records", TOOLS, apis=(2, 21), consumes=False)
def test_get_offsets_and_delete_records(tools: KafkaTools, helper: Client, new_topic,  # type: ignore[no-untyped-def]
                                        tmp_path: Path) -> None:
    topic = new_topic(partitions=2)
    base_ts = (int(time.time()) - 3600) * 1000
    helper.produce(topic, [Msg(value=b"v%d" % i, key=b"k", partition=0, timestamp=base_ts + i * 1000)
                           for i in range(10)])
    latest = tools.ok("kafka-get-offsets", "--topic", topic, "--time", "-1")
    assert sorted(latest.lines) == [f"{topic}:0:10", f"{topic}:1:0"], str(latest)
    earliest = tools.ok("kafka-get-offsets", "--topic", topic, "--time", "-2", "--partitions", "0")
    assert earliest.lines == [f"{topic}:0:0"], str(earliest)
    by_time = tools.ok("kafka-get-offsets", "--topic", topic, "--time", str(base_ts + 2500), "--partitions", "0")
    assert by_time.lines == [f"{topic}:0:3"], str(by_time)
    spec = write(tmp_path / "delete.json",
                 json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "offset": 4}]}))
    deleted = tools.ok("kafka-delete-records", "--offset-json-file", spec)
    assert re.search(rf"partition: {re.escape(topic)}-0\s+low_watermark: 4", deleted.stdout), str(deleted)
    after = tools.ok("kafka-get-offsets", "--topic", topic, "--time", "-2", "--partitions", "0")
    assert after.lines == [f"{topic}:0:4"], str(after)
    too_far = write(tmp_path / "too-far.json",
                    json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "offset": 50}]}))
    refused = tools.run("kafka-delete-records", "--offset-json-file", too_far)
    assert "OffsetOutOfRangeException" in refused.stdout + refused.stderr, str(refused)


@s.scenario("tools.kafka-log-dirs", TOOLS, apis=(35,), consumes=False)
def test_log_dirs(tools: KafkaTools, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    helper.produce(topic, text_msgs(5, partition=0))
    out = tools.ok("kafka-log-dirs", "--describe", "--topic-list", topic)
    doc = json.loads(next(ln for ln in out.lines if ln.startswith("{")))
    parts = {p["partition"]: p for b in doc["brokers"] for d in b["logDirs"] for p in d["partitions"]}
    assert set(parts) == {f"{topic}-0", f"{topic}-1"}, doc
    assert parts[f"{topic}-0"]["size"] > 0 and parts[f"{topic}-1"]["size"] == 0, doc
    assert all(d["error"] is None and d["logDir"] for b in doc["brokers"] for d in b["logDirs"]), doc
    leaders = set(helper.partition_leaders(topic).values())
    assert leaders <= {b["broker"] for b in doc["brokers"]}, doc


@s.scenario("tools.kafka-leader-election", TOOLS, apis=(43,), consumes=False)
def test_leader_election(tools: KafkaTools, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    out = tools.ok("kafka-leader-election", "--election-type", "preferred", "--topic", topic, "--partition", "0")
    assert f"Valid replica already elected for partitions {topic}-0" in out.stdout, str(out)
    bad = tools.run("kafka-leader-election", "--election-type", "preferred", "--topic", topic, "--partition", "9")
    assert bad.returncode != 0 and "UnknownTopicOrPartitionException" in bad.stdout + bad.stderr, str(bad)


@s.scenario("tools.kafka-reassign-partitions", TOOLS, apis=(45, 46, 3), consumes=False)
def test_reassign_partitions(tools: KafkaTools, helper: Client, new_topic,  # type: ignore[no-untyped-def]
                             tmp_path: Path) -> None:
    topic = new_topic(partitions=1)
    helper.produce(topic, text_msgs(5, partition=0))
    brokers = helper.describe_cluster()["brokers"]
    move = write(tmp_path / "move.json", json.dumps({"version": 1, "topics": [{"topic": topic}]}))
    gen = tools.ok("kafka-reassign-partitions", "--generate", "--topics-to-move-json-file", move, "--broker-list",
                   ",".join(map(str, brokers)))
    jsons = [json.loads(ln) for ln in gen.lines if ln.startswith("{")]
    assert "Current partition replica assignment" in gen.stdout and len(jsons) == 2, str(gen)
    current = jsons[0]["partitions"][0]["replicas"]
    assert jsons[0]["partitions"][0]["topic"] == topic and len(current) == 1, jsons
    target = [next((b for b in brokers if b not in current), current[0])]
    plan = write(tmp_path / "plan.json", json.dumps(
        {"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": target}]}))
    # --additional: other scenarios may have reassignments of their own in progress on this shared cluster,
    # and without it the tool refuses to start while any exists.
    started = tools.ok("kafka-reassign-partitions", "--execute", "--additional", "--reassignment-json-file", plan)
    assert f"Successfully started partition reassignment for {topic}-0" in started.stdout, str(started)

    def verified() -> str | None:
        out = tools.ok("kafka-reassign-partitions", "--verify", "--reassignment-json-file", plan).stdout
        return out if f"Reassignment of partition {topic}-0 is completed." in out else None

    wait_until(verified, 60, interval=0.3, what="--verify says the reassignment completed")
    assert helper.partition_leaders(topic) == {0: target[0]}
    assert [r.value for r in helper.consume(topic, [0], count=5)] == [m.value for m in text_msgs(5, partition=0)]


@s.scenario("tools.kafka-transactions", TOOLS, apis=(65, 66, 61, 22, 24, 26), consumes=False)
def test_transactions(tools: KafkaTools, helper: Client, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic()
    tid = f"compat-tools-{uuid.uuid4().hex[:8]}"
    helper.produce_transactions(topic, [(text_msgs(3, partition=0), True)], tid)
    listed = tools.ok("kafka-transactions", "list")
    assert listed.lines[0].split() == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"], \
        str(listed)
    row = next((ln.split() for ln in listed.lines if ln.split()[:1] == [tid]), None)
    assert row is not None and row[3] == "CompleteCommit", str(listed)
    desc = tools.ok("kafka-transactions", "describe", "--transactional-id", tid)
    assert desc.lines[0].split()[:4] == ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch"], \
        str(desc)
    assert tid in desc.lines[1].split() and "CompleteCommit" in desc.lines[1].split(), str(desc)
    producers = tools.ok("kafka-transactions", "describe-producers", "--topic", topic, "--partition", "0")
    assert producers.lines[0].split()[:2] == ["ProducerId", "ProducerEpoch"], str(producers)
    assert len(producers.lines) == 2 and producers.lines[1].split()[0] == row[2], str(producers)
    missing = tools.run("kafka-transactions", "describe", "--transactional-id", tid + "-none")
    assert missing.returncode != 0 and "could not be found" in missing.stdout + missing.stderr, str(missing)


@s.scenario("tools.kafka-perf-tests", TOOLS, apis=(0, 1, 3, 10, 11, 14), consumes=False)
def test_perf_tests(tools: KafkaTools, cluster: ClusterInfo, new_topic) -> None:  # type: ignore[no-untyped-def]
    topic = new_topic(partitions=2)
    prod = tools.ok("kafka-producer-perf-test", "--topic", topic, "--num-records", "2000", "--record-size", "100",
                    "--throughput", "-1", "--producer-props", f"bootstrap.servers={cluster.bootstrap}", "acks=all",
                    bootstrap=False)
    assert re.match(r"2000 records sent, [\d.]+ records/sec", prod.lines[-1]), str(prod)  # after 4.x's deprecation
    cons = tools.ok("kafka-consumer-perf-test", "--topic", topic, "--messages", "2000", "--timeout", "30000")
    # (4.x first says that --messages is deprecated in favour of --num-records.)
    at = next(i for i, ln in enumerate(cons.lines) if ln.startswith("start.time,"))
    header = [c.strip() for c in cons.lines[at].split(",")]
    values = [c.strip() for c in cons.lines[at + 1].split(",")]
    assert header[4] == "data.consumed.in.nMsg" and values[4] == "2000", str(cons)
