"""The admin CLI's record and group commands (``produce``, ``consume``, ``group ...``) run as a user runs them: a
click app (tests/support/admin_cli.py) against a pykbroker broker subprocess, its stdout checked exactly."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from tests.support.admin_cli import run
from tests.support.broker import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("admin-records") / "broker")
    b.start()
    try:
        yield b
    finally:
        b.kill()


def cli(bootstrap: str, *args: str, stdin: bytes | None = None, expect: int = 0) -> subprocess.CompletedProcess[bytes]:
    """One CLI run; its exit code must be ``expect``."""
    p = run([*args, "-b", bootstrap, "--timeout", "10"], stdin)
    assert p.returncode == expect, (p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
    return p


def cli_json(bootstrap: str, *args: str, stdin: bytes | None = None, expect: int = 0) -> Any:
    return json.loads(cli(bootstrap, *args, "-o", "json", stdin=stdin, expect=expect).stdout)


def json_lines(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.decode().splitlines()]


def new_topic(bootstrap: str, partitions: int = 1, rf: int = 1) -> str:
    name = f"rec-{uuid.uuid4().hex[:8]}"
    cli(bootstrap, "topic", "create", name, "-p", str(partitions), "-r", str(rf))
    return name


def produce_json(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> Any:
    lines = "".join(json.dumps(r) + "\n" for r in records).encode()
    return cli_json(bootstrap, "produce", topic, "--format", "json", stdin=lines)


def test_produce_keys_and_headers_then_consume_offset_ranges(broker: BrokerProcess) -> None:
    b = broker.bootstrap
    topic = new_topic(b)
    lines = b"".join(b"k%d:v%d\n" % (i, i) for i in range(5)) + b"no-key\n"
    summary = cli_json(b, "produce", topic, "-k", ":", "-H", "app=cli", "-H", "n=1", stdin=lines)
    assert summary == {"topic": topic, "records": 6, "delivered": 6, "failed": 0,
                       "partitions": [{"partition": 0, "records": 6, "first_offset": 0, "last_offset": 5}]}

    def doc(offset: int, key: str | None, value: str) -> dict[str, Any]:
        return {"topic": topic, "partition": 0, "offset": offset, "key": key, "value": value,
                "headers": [["app", "cli"], ["n", "1"]]}

    def strip(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in records:
            assert r.pop("timestamp_type") == "CreateTime" and isinstance(r.pop("timestamp"), int)
        return records

    got = cli(b, "consume", topic, "--from", "1", "--to", "3", "--format", "json")
    assert strip(json_lines(got.stdout)) == [doc(1, "k1", "v1"), doc(2, "k2", "v2")]
    assert "2 record(s) consumed" in got.stderr.decode()
    # -N: the last N records; --to end stops at the high watermark.
    got = cli(b, "consume", topic, "--from", "-2", "--to", "end", "--format", "json")
    assert strip(json_lines(got.stdout)) == [doc(4, "k4", "v4"), doc(5, None, "no-key")]
    got = cli(b, "consume", topic, "--to", "end", "-k", "=")
    assert got.stdout == b"k0=v0\nk1=v1\nk2=v2\nk3=v3\nk4=v4\n=no-key\n"
    # --count without --to: stops after N records, well before the inactivity timeout.
    started = time.monotonic()
    got = cli(b, "consume", topic, "--from", "3", "-c", "2")
    assert got.stdout == b"v3\nv4\n" and time.monotonic() - started < 9
    # An --to beyond the end never waits for more.
    assert cli(b, "consume", topic, "--from", "5", "--to", "100").stdout == b"no-key\n"


def test_timestamps_binary_values_and_formats(broker: BrokerProcess) -> None:
    b = broker.bootstrap
    topic = new_topic(b, partitions=2)
    records = [
        {"key": "a", "value": "one", "timestamp": 1000, "partition": 0},
        {"key": {"base64": "AP8="}, "value": {"base64": "gAE="}, "timestamp": 2000, "partition": 0,
         "headers": [["bin", {"base64": "/w=="}], ["txt", "é"]]},
        {"key": None, "value": "", "timestamp": 3000, "partition": 0, "headers": {"h": None}},
        {"value": "p1", "timestamp": 1500, "partition": 1},
    ]
    summary = produce_json(b, topic, records)
    assert summary["partitions"] == [{"partition": 0, "records": 3, "first_offset": 0, "last_offset": 2},
                                     {"partition": 1, "records": 1, "first_offset": 0, "last_offset": 0}]
    expected = [
        {"topic": topic, "partition": 0, "offset": 0, "timestamp": 1000, "timestamp_type": "CreateTime",
         "key": "a", "value": "one", "headers": []},
        {"topic": topic, "partition": 0, "offset": 1, "timestamp": 2000, "timestamp_type": "CreateTime",
         "key": {"base64": "AP8="}, "value": {"base64": "gAE="}, "headers": [["bin", {"base64": "/w=="}],
                                                                            ["txt", "é"]]},
        {"topic": topic, "partition": 0, "offset": 2, "timestamp": 3000, "timestamp_type": "CreateTime",
         "key": None, "value": "", "headers": [["h", None]]},
    ]
    # From the first record at or after 2000 to the end.
    got = cli(b, "consume", topic, "-p", "0", "--from", "@2000", "--to", "end", "--format", "json")
    assert json_lines(got.stdout) == expected[1:]
    # Up to (not including) the first record at or after 3000.
    got = cli(b, "consume", topic, "-p", "0", "--to", "@3000", "--format", "json")
    assert json_lines(got.stdout) == expected[:2]
    got = cli(b, "consume", topic, "-p", "0", "--to", "end", "--format", "hex")
    assert got.stdout == b'0 0 61 6f6e65\n0 1 00ff 8001\n0 2 - ""\n'
    # Both partitions; the order between partitions is the fetch's, within a partition the offsets'.
    got = cli(b, "consume", topic, "--from", "@1500", "--to", "end", "--format", "hex")
    assert sorted(got.stdout.splitlines()) == [b'0 1 00ff 8001', b'0 2 - ""', b"1 0 - 7031"]
    # Text writes the raw bytes.
    assert cli(b, "consume", topic, "-p", "0", "--from", "1", "-c", "1").stdout == b"\x80\x01\n"


def test_group_consume_commits_lag_seek_and_delete(broker: BrokerProcess) -> None:
    b = broker.bootstrap
    topic = new_topic(b)
    group = f"g-{uuid.uuid4().hex[:8]}"
    produce_json(b, topic, [{"value": f"v{i}", "timestamp": 1000 * (i + 1)} for i in range(3)])
    got = cli(b, "consume", topic, "-g", group, "--to", "end")
    assert got.stdout == b"v0\nv1\nv2\n"

    def described() -> dict[str, Any]:
        docs = cli_json(b, "group", "describe", group)
        assert len(docs) == 1
        return dict(docs[0])

    def partitions(committed: int | None, end: int, lag: int | None) -> list[dict[str, Any]]:
        return [{"topic": topic, "partition": 0, "committed_offset": committed, "log_end_offset": end, "lag": lag,
                 "member_id": None}]

    doc = described()
    assert doc == {"group": group, "state": "Empty", "type": "classic", "coordinator": 0, "assignor": None,
                   "simple": False, "members": [], "partitions": partitions(3, 3, 0), "total_lag": 0}
    produce_json(b, topic, [{"value": f"v{i}", "timestamp": 1000 * (i + 1)} for i in range(3, 5)])
    doc = described()
    assert (doc["partitions"], doc["total_lag"]) == (partitions(3, 5, 2), 2)
    table = cli(b, "group", "describe", group).stdout.decode()
    assert "TotalLag     2" in table and table.splitlines()[-1].split() == [topic, "0", "3", "5", "2", "-", "-", "-"]
    assert {"group": group, "state": "Empty", "type": "classic", "simple": False} in \
        cli_json(b, "group", "list", "--state", "Empty")
    assert group not in {g["group"] for g in cli_json(b, "group", "list", "--state", "Stable")}

    def seek(*how: str, execute: bool = True) -> Any:
        doc = cli_json(b, "group", "seek", group, "--topic", topic, *how, *(["--execute"] if execute else []))
        assert (doc["group"], doc["topic"], doc["executed"]) == (group, topic, execute)
        assert len(doc["partitions"]) == 1 and doc["partitions"][0]["partition"] == 0
        return doc["partitions"][0]["current_offset"], doc["partitions"][0]["new_offset"]

    # A dry run shows the move and changes nothing (a time after the last record: the log end).
    assert seek("--to-datetime", "2100-01-01T00:00:00", execute=False) == (3, 5)
    dry = cli(b, "group", "seek", group, "--topic", topic, "--to-offset", "1")
    assert dry.stdout.decode().splitlines()[-1].split() == [topic, "0", "3", "1"]
    assert "dry run" in dry.stderr.decode()
    assert described()["partitions"] == partitions(3, 5, 2)
    # Each kind, clamped to [log start, log end] as kafka-consumer-groups does.
    assert seek("--to-earliest") == (3, 0)
    assert seek("--to-offset", "100") == (0, 5)
    assert seek("--shift-by", "-2") == (5, 3)
    assert seek("--shift-by", "-10") == (3, 0)
    assert seek("--to-latest") == (0, 5)
    assert seek("--to-timestamp", "3000") == (5, 2)
    assert seek("--to-datetime", "1970-01-01T00:00:02Z") == (2, 1)
    assert described()["partitions"] == partitions(1, 5, 4)
    # The group consumes on from its committed offset.
    assert cli(b, "consume", topic, "-g", group, "--to", "end").stdout == b"v1\nv2\nv3\nv4\n"
    assert described()["partitions"] == partitions(5, 5, 0)
    err = cli(b, "group", "seek", group, "--topic", topic, "--to-earliest", "--to-latest", expect=2)
    assert "exactly one of" in err.stderr.decode()

    missing = f"missing-{uuid.uuid4().hex[:8]}"
    assert "GROUP_ID_NOT_FOUND" in cli(b, "group", "describe", missing, expect=1).stderr.decode()
    result = cli_json(b, "group", "delete", group, missing, expect=1)
    assert result == [{"group": group, "result": "deleted", "error": None},
                      {"group": missing, "result": "failed", "error": "GROUP_ID_NOT_FOUND"}]
    assert group not in {g["group"] for g in cli_json(b, "group", "list")}


def _member(bootstrap: str, group: str, topic: str, client_id: str, partitions: int) -> Consumer:
    """A confluent-kafka group member that holds its assignment (bounded wait)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    deadline = time.monotonic() + 30
    while len(c.assignment()) < partitions:
        assert time.monotonic() < deadline, "no assignment within 30 s"
        c.poll(0.2)
    return c


def test_group_describe_active_member_and_seek_refused(broker: BrokerProcess) -> None:
    b = broker.bootstrap
    topic = new_topic(b, partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    member = _member(b, group, topic, "cli-test-member", 2)
    try:
        member.commit(offsets=[_tp(topic, 0, 0), _tp(topic, 1, 0)], asynchronous=False)
        doc = cli_json(b, "group", "describe", group)[0]
        assert (doc["state"], doc["type"], doc["assignor"], doc["coordinator"]) == ("Stable", "classic", "range", 0)
        [m] = doc["members"]
        assert m["client_id"] == "cli-test-member" and m["host"].lstrip("/") == "127.0.0.1"
        assert m["assignment"] == [{"topic": topic, "partition": 0}, {"topic": topic, "partition": 1}]
        assert [(p["partition"], p["committed_offset"], p["lag"], p["member_id"]) for p in doc["partitions"]] == \
            [(0, 0, 0, m["member_id"]), (1, 0, 0, m["member_id"])]
        table = cli(b, "group", "describe", group).stdout.decode()
        assert "State        Stable" in table and "cli-test-member" in table
        assert group in {g["group"] for g in cli_json(b, "group", "list", "--state", "Stable")}
        # Kafka resets only an inactive group's offsets: refused, nothing committed.
        refused = cli(b, "group", "seek", group, "--topic", topic, "--to-latest", "--execute", expect=1)
        assert "inactive" in refused.stderr.decode() and "Stable" in refused.stderr.decode()
        refused_json = cli_json(b, "group", "seek", group, "--topic", topic, "--to-latest", expect=1)
        assert refused_json["error"] == "NON_EMPTY_GROUP"
        deleted = cli_json(b, "group", "delete", group, expect=1)
        assert deleted == [{"group": group, "result": "failed", "error": "NON_EMPTY_GROUP"}]
    finally:
        member.close()
    assert [p["committed_offset"] for p in cli_json(b, "group", "describe", group)[0]["partitions"]] == [0, 0]


def _tp(topic: str, partition: int, offset: int) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(topic, partition, offset)


def test_failures_exit_1(broker: BrokerProcess) -> None:
    b = broker.bootstrap
    topic = new_topic(b)
    got = cli(b, "produce", topic, "-p", "7", "-X", "message.timeout.ms=2000", stdin=b"x\n", expect=1)
    assert "1 record(s) not written" in got.stderr.decode()
    # An unknown topic is an error, and asking about it does not create it.
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    got = cli(b, "consume", missing, "--to", "end", expect=1)
    assert "UNKNOWN_TOPIC_OR_PART" not in got.stdout.decode() and "Unknown topic" in got.stderr.decode()
    assert missing not in {t["name"] for t in cli_json(b, "topic", "list")}


def test_isolation_levels(broker: BrokerProcess) -> None:
    b = broker.bootstrap
    topic = new_topic(b)
    producer = Producer({"bootstrap.servers": b, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    for value, commit in ((b"committed", True), (b"aborted", False)):
        producer.begin_transaction()
        producer.produce(topic, value=value, partition=0)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    committed = cli(b, "consume", topic, "--to", "end", "--isolation-level", "read_committed", "--format", "json")
    assert [(r["offset"], r["value"]) for r in json_lines(committed.stdout)] == [(0, "committed")]
    uncommitted = cli(b, "consume", topic, "--to", "end", "--format", "json")
    assert [(r["offset"], r["value"]) for r in json_lines(uncommitted.stdout)] == [(0, "committed"), (2, "aborted")]
