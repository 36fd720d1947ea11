"""pykbroker.event.loop=uvloop in a real ``pykbroker serve``: real clients produce (acks=all, fsync before
the acknowledgement), consume large fetches (records sent from the segment files), join a group and commit,
over PLAINTEXT and TLS; a hostile frame closes only its own connection; SIGTERM stops the broker cleanly; and
the setting with uvloop not installed fails the start, saying so."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.integration.conftest import BrokerFactory, create_topic, make_producer, produce_all, unique_topic
from tests.support.broker import BrokerProcess, free_port
from tests.support.certs import PASSWORD, make_pki

TIMEOUT = 30.0
UVLOOP = {"pykbroker.event.loop": "uvloop", "log.flush.on.ack": "true"}


def _produce(b: BrokerProcess, conf: dict[str, Any], topic: str, values: list[bytes]) -> None:
    reports = produce_all(make_producer(b, **conf, acks="all"), topic,
                          [{"key": b"%d" % i, "value": v} for i, v in enumerate(values)])
    assert [r.error for r in reports if r.error is not None] == []


def _consume_group(conf: dict[str, Any], topic: str, group: str, n: int) -> list[bytes]:
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "fetch.max.bytes": 4 << 20})
    c.subscribe([topic])  # a group join, then fetches from offset 0
    got: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT
    for _ in range(int(TIMEOUT / 0.2) + 10):  # bounded in turns and in time
        if len(got) >= n or time.monotonic() >= deadline:
            break
        for m in c.consume(num_messages=500, timeout=0.2):
            assert m.error() is None, m.error()
            got.append(m.value() or b"")
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition(topic, 0)], timeout=TIMEOUT)
    c.close()
    assert committed[0].offset == n
    return got


def test_uvloop_serves_produce_large_fetches_groups_and_a_clean_stop(broker_factory: BrokerFactory) -> None:
    b = broker_factory(UVLOOP)
    topic = unique_topic("uv")
    create_topic(b, topic, partitions=1)
    values = [bytes([i % 251]) * 4096 for i in range(400)]  # 1.6 MB: fetched as ranges of the segment file
    conf = {"bootstrap.servers": b.bootstrap}
    _produce(b, conf, topic, values)
    assert _consume_group(conf, topic, "uv-group", len(values)) == values

    # A 21-byte request with a header that claims more than it has: that connection closes, the others go on.
    with socket.create_connection(("127.0.0.1", b.port), timeout=TIMEOUT) as s:
        s.sendall(struct.pack(">i", 17) + struct.pack(">hhi", 18, 3, 1) + struct.pack(">h", 200) + b"abcdefg")
        assert s.recv(1024) == b""
    _produce(b, conf, topic, [b"after"])
    assert b.proc is not None and b.proc.poll() is None
    assert b.stop() == 0
    assert "event_loop=uvloop" in b.log()


def test_uvloop_serves_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    p0, p1 = free_port(), free_port()
    b = BrokerProcess(tmp_path / "broker", {
        **UVLOOP,
        "listeners": f"PLAINTEXT://127.0.0.1:{p0},SSL://127.0.0.1:{p1}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(pki.server.p12),
        "ssl.keystore.password": PASSWORD,
    }, port=p0)
    with b:
        topic = unique_topic("uvtls")
        create_topic(b, topic, partitions=1)
        conf = {"bootstrap.servers": f"127.0.0.1:{p1}", "security.protocol": "SSL",
                "ssl.ca.location": str(pki.ca.cert_path)}
        values = [b"tls-%d" % i * 500 for i in range(200)]
        _produce(b, conf, topic, values)
        assert _consume_group(conf, topic, "uv-tls", len(values)) == values


def test_uvloop_not_installed_fails_the_start(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "uvloop"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('uvloop is not installed here (test shadow)')\n")
    b = BrokerProcess(tmp_path / "broker", UVLOOP)
    b.env = {"PYTHONPATH": str(shadow.parent)}
    with pytest.raises(RuntimeError) as failed:
        b.start(timeout=20)
    assert "pykbroker.event.loop=uvloop but uvloop is not installed" in str(failed.value)
