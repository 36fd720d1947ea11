"""Structured logs as an operator reads them: in JSON and logfmt every event carries its data as
fields of its own (start line, SASL, authorizer, group coordinator, request log), never as
``key=value`` text inside ``msg``; ``pykbroker.log.levels`` turns on one logger's DEBUG only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess, free_port
from tests.support.cluster import wait_for
from tests.support.consume import poll_values

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
TIMEOUT = 30.0
# A setting name with its value, or a field written into the text: what msg must not carry.
KEY_VALUE_IN_MSG = re.compile(r"(?<![\w.])[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*=\S")
LOGFMT_PAIR = re.compile(r'([\w.]+)=("(?:[^"\\]|\\.)*"|\S*)')


def parse_logfmt(line: str) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    consumed = 0
    for m in LOGFMT_PAIR.finditer(line):
        assert line[consumed:m.start()].strip() == "", f"not logfmt: {line!r}"
        value = m.group(2)
        if value.startswith('"'):
            value = json.loads(value)  # logfmt's quoting escapes as JSON strings do (\\ \" \n \t)
        doc[m.group(1)] = value
        consumed = m.end()
    assert line[consumed:].strip() == "", f"not logfmt: {line!r}"
    return doc


def events(b: BrokerProcess, fmt: str) -> list[dict[str, Any]]:
    lines = [line for line in b.log().splitlines() if line.strip()]
    return [json.loads(line) if fmt == "json" else parse_logfmt(line) for line in lines]


def sasl_client(bootstrap: str, user: str, password: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": user, "sasl.password": password, **extra}


@pytest.fixture(params=["json", "logfmt"])
def logged(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[BrokerProcess, str, str]]:
    """A broker with a SASL listener and ACLs, logging in the format under test, after one day's events."""
    fmt = request.param
    sasl_port = free_port()
    b = BrokerProcess(tmp_path, {
        "pykbroker.log.format": fmt,
        "pykbroker.log.levels": "pykbroker.request=DEBUG",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:ANONYMOUS;User:admin",
    })
    b.overrides["listeners"] = f"PLAINTEXT://127.0.0.1:{b.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
    b.start()
    sasl = f"127.0.0.1:{sasl_port}"
    topic, group = f"fields-{uuid.uuid4().hex[:8]}", f"fields-group-{uuid.uuid4().hex[:8]}"
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            f.result(TIMEOUT)
        producer = Producer(sasl_client(sasl, "admin", "admin-secret"))
        producer.produce(topic, b"v")
        assert producer.flush(TIMEOUT) == 0
        consumer = Consumer(sasl_client(sasl, "admin", "admin-secret", **{
            "group.id": group, "auto.offset.reset": "earliest"}))
        try:
            consumer.subscribe([topic])
            assert poll_values(consumer, lambda got: len(got) >= 1, TIMEOUT) == [b"v"]
        finally:
            consumer.close()
        denied = Producer(sasl_client(sasl, "alice", "alice-secret", **{"message.timeout.ms": 5000}))
        denied.produce(topic, b"not allowed")
        denied.flush(10)
        wrong = Producer(sasl_client(sasl, "alice", "not-her-password"))  # connects to its bootstrap at once
        wrong.poll(1)
        wait_for(lambda: "failed authentication" in b.log(), timeout=TIMEOUT, what="a failed login's line")
        wait_for(lambda: "Denied operation" in b.log(), timeout=TIMEOUT, what="the authorizer's denial")
        yield b, fmt, group
    finally:
        b.stop()


def one(docs: list[dict[str, Any]], msg: str, **match: Any) -> dict[str, Any]:
    hits = [d for d in docs if d.get("msg", "").startswith(msg) and all(d.get(k) == v for k, v in match.items())]
    assert hits, f"no {msg!r} line with {match} in {len(docs)} lines"
    return hits[0]


def test_events_carry_their_data_as_fields(logged: tuple[BrokerProcess, str, str]) -> None:
    b, fmt, group = logged
    docs = events(b, fmt)  # every line parses: one event per line in this format
    assert {"ts", "level", "logger", "msg"} <= set(docs[0])
    in_text = [d["msg"] for d in docs if KEY_VALUE_IN_MSG.search(d["msg"])]
    assert not in_text, f"key=value text inside msg: {in_text[:5]}"

    started = one(docs, "pykbroker ", logger="pykbroker.broker")
    assert {"broker_id", "cluster_id", "log_dirs", "listeners", "advertised"} <= set(started)
    assert str(started["broker_id"]) == "0"

    login = one(docs, "authenticated", principal="User:admin")
    assert login["mechanism"] == "PLAIN" and login["listener"] == "SASL_PLAINTEXT" and login["peer"]
    failed = one(docs, "failed authentication", user="alice")
    assert failed["mechanism"] == "PLAIN" and failed["reason"]
    assert "not-her-password" not in b.log()

    denial = one(docs, "Denied operation", principal="User:alice")
    assert denial["operation"] in ("DESCRIBE", "WRITE") and denial["resource_type"] == "Topic"
    assert denial["resource_name"].startswith("fields-") and denial["request"]

    stable = one(docs, "stabilized group", group_id=group)
    assert str(stable["generation_id"]) == "1" and str(stable["members"]) == "1"
    preparing = one(docs, "preparing to rebalance group", group_id=group)
    assert preparing["state"] == "Empty" and str(preparing["generation_id"]) == "0" and preparing["reason"]


def test_per_logger_levels(logged: tuple[BrokerProcess, str, str]) -> None:
    """pykbroker.request=DEBUG: the request log writes at DEBUG; every other logger stays at INFO."""
    b, fmt, _ = logged
    docs = events(b, fmt)
    requests = [d for d in docs if d["logger"] == "pykbroker.request.logger"]
    assert requests and all(d["level"] == "debug" for d in requests)
    produce = [d for d in requests if d.get("api") == "produce"]
    assert produce and {"client_id", "peer", "correlation_id", "latency_ms"} <= set(produce[0])
    other_debug = {d["logger"] for d in docs if d["level"] == "debug" and d["logger"] != "pykbroker.request.logger"}
    assert not other_debug, f"DEBUG lines from loggers left at INFO: {other_debug}"


@pytest.mark.parametrize("value, says", [
    ("pykbroker.request=LOUD", "unknown log level 'LOUD'"),
    ("pykbroker.request", "'pykbroker.request' is not logger=LEVEL"),
])
def test_bad_levels_refused_at_start(tmp_path: Path, value: str, says: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pykbroker", "serve", "--override", f"log.dirs={tmp_path}",
         "--override", f"listeners=PLAINTEXT://127.0.0.1:{free_port()}", "--override", f"pykbroker.log.levels={value}"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "pykbroker.log.levels" in proc.stderr and says in proc.stderr
