"""SSL listeners with real clients: produce and consume over TLS, mTLS principals mapped by
ssl.principal.mapping.rules, PKCS12 and PEM keystores, and refused handshakes (plaintext client on
an SSL port, TLS client on a PLAINTEXT port, untrusted and expired client certificates).

The broker's first listener stays PLAINTEXT (health check, topic creation).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess, free_port
from tests.support.certs import PASSWORD, Pki, make_pki
from tests.support.cluster import wait_for

TIMEOUT = 30.0
RULES = "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=([^,]*),O=Acme$/$1/L,DEFAULT"




@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class Tls:
    def __init__(self, broker: BrokerProcess, ssl_port: int, mtls_port: int, pki: Pki) -> None:
        self.broker, self.ssl_port, self.mtls_port, self.pki = broker, ssl_port, mtls_port, pki

    @property
    def ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"

    @property
    def mtls_bootstrap(self) -> str:
        return f"127.0.0.1:{self.mtls_port}"

    def topic(self, partitions: int = 1) -> str:
        name = f"tls-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT)
        return name


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Tls]:
    p0, p1, p2 = free_port(), free_port(), free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("tls-broker"), {
        "listeners": f"PLAINTEXT://127.0.0.1:{p0},SSL://127.0.0.1:{p1},MTLS://127.0.0.1:{p2}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL",
        # SSL: a PKCS12 keystore, no client certificates.
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(pki.server.p12),
        "ssl.keystore.password": PASSWORD,
        # MTLS: a PEM keystore, client certificates required, mapped to principals.
        "listener.name.mtls.ssl.keystore.type": "PEM",
        "listener.name.mtls.ssl.keystore.location": str(pki.server.pem),
        "listener.name.mtls.ssl.truststore.type": "PEM",
        "listener.name.mtls.ssl.truststore.location": str(pki.ca.cert_path),
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.mtls.ssl.principal.mapping.rules": RULES,
    }, port=p0).start()
    yield Tls(b, p1, p2, pki)
    b.stop()


def _confluent(bootstrap: str, pki: Pki, cert: Any = None, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "security.protocol": "SSL",
                            "ssl.ca.location": str(pki.ca.cert_path), **extra}
    if cert is not None:
        conf.update({"ssl.certificate.location": str(cert.cert), "ssl.key.location": str(cert.key)})
    return conf


def _confluent_roundtrip(conf: dict[str, Any], topic: str, n: int = 20) -> list[bytes]:
    p = Producer(conf)
    for i in range(n):
        p.produce(topic, f"m{i}".encode())
    assert p.flush(TIMEOUT) == 0
    c = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value() or b"")
    c.close()
    return got


def test_confluent_kafka_over_ssl_with_pkcs12_keystore(tls: Tls) -> None:
    topic = tls.topic()
    got = _confluent_roundtrip(_confluent(tls.ssl_bootstrap, tls.pki), topic)
    assert got == [f"m{i}".encode() for i in range(20)]


def test_kafka_python_over_ssl(tls: Tls) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    topic = tls.topic()
    kw = {"bootstrap_servers": tls.ssl_bootstrap, "security_protocol": "SSL", "ssl_cafile": str(tls.pki.ca.cert_path)}
    p = KafkaProducer(**kw)
    for i in range(10):
        p.send(topic, f"k{i}".encode())
    p.flush(TIMEOUT)
    p.close()
    c = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=15000, **kw)
    got = [m.value for _, m in zip(range(10), c, strict=False)]
    c.close()
    assert got == [f"k{i}".encode() for i in range(10)]


def test_aiokafka_over_mtls(tls: Tls) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context
    topic = tls.topic()
    pki = tls.pki

    async def run() -> list[bytes]:
        ctx = create_ssl_context(cafile=str(pki.ca.cert_path), certfile=str(pki.bob.cert), keyfile=str(pki.bob.key))
        p = AIOKafkaProducer(bootstrap_servers=tls.mtls_bootstrap, security_protocol="SSL", ssl_context=ctx)
        await p.start()
        try:
            for i in range(10):
                await p.send_and_wait(topic, f"a{i}".encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(topic, bootstrap_servers=tls.mtls_bootstrap, security_protocol="SSL",
                             ssl_context=ctx, auto_offset_reset="earliest")
        await c.start()
        out: list[bytes] = []
        try:
            async with asyncio.timeout(TIMEOUT):
                while len(out) < 10:
                    batch = await c.getmany(timeout_ms=500)
                    for msgs in batch.values():
                        out.extend(m.value for m in msgs)
        finally:
            await c.stop()
        return out

    assert asyncio.run(run()) == [f"a{i}".encode() for i in range(10)]
    wait_for(lambda: "principal=User:bob" in tls.broker.log(), what="bob's principal in the log")


def test_kcat_over_ssl(tls: Tls) -> None:
    topic = tls.topic()
    common = ["kcat", "-b", tls.ssl_bootstrap, "-X", "security.protocol=SSL",
              "-X", f"ssl.ca.location={tls.pki.ca.cert_path}", "-t", topic]
    subprocess.run([*common, "-P"], input=b"x1\nx2\nx3\n", check=True, timeout=TIMEOUT)
    out = subprocess.run([*common, "-C", "-o", "beginning", "-c", "3", "-e"], capture_output=True, check=True,
                         timeout=TIMEOUT)
    assert out.stdout.split() == [b"x1", b"x2", b"x3"]


def test_mtls_principal_mapping(tls: Tls) -> None:
    topic = tls.topic()
    got = _confluent_roundtrip(_confluent(tls.mtls_bootstrap, tls.pki, tls.pki.alice), topic, 5)
    assert len(got) == 5
    wait_for(lambda: "listener=MTLS principal=User:alice" in tls.broker.log(), what="alice's principal in the log")


def _handshake(port: int, pki: Pki, cert: Any) -> str:
    """A raw TLS handshake plus one read; what went wrong ('' when the broker kept the connection)."""
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        try:
            # ApiVersions v0 request: size, key 18, version 0, correlation 1, client id null.
            s.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff")
            return "" if s.recv(4) else "closed"
        except (ssl.SSLError, OSError) as e:
            return str(e) or type(e).__name__


@pytest.mark.parametrize("who", ["untrusted", "expired", "none"])
def test_bad_client_certificates_refused(tls: Tls, who: str) -> None:
    cert = None if who == "none" else getattr(tls.pki, who)
    assert _handshake(tls.mtls_port, tls.pki, tls.pki.bob) == ""  # a good certificate is served
    assert _handshake(tls.mtls_port, tls.pki, cert) != ""
    wait_for(lambda: "TLS handshake failed" in tls.broker.log() and "listener=MTLS reason=" in tls.broker.log(),
             what="handshake failure log")


def test_plaintext_client_on_ssl_port(tls: Tls) -> None:
    before = tls.broker.log().count("TLS handshake failed")
    admin = AdminClient({"bootstrap.servers": tls.ssl_bootstrap, "socket.timeout.ms": 3000})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    wait_for(lambda: tls.broker.log().count("TLS handshake failed") > before, what="handshake failure log")
    assert "WRONG_VERSION_NUMBER" in tls.broker.log() or "wrong version number" in tls.broker.log()
    # Other clients are unaffected.
    assert len(_confluent_roundtrip(_confluent(tls.ssl_bootstrap, tls.pki), tls.topic(), 3)) == 3


def test_tls_client_on_plaintext_port(tls: Tls) -> None:
    conf = _confluent(tls.broker.bootstrap, tls.pki, **{"socket.timeout.ms": 3000})
    admin = AdminClient(conf)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    wait_for(lambda: "the bytes are a TLS handshake" in tls.broker.log(), what="TLS-on-plaintext log line")
    assert len(_confluent_roundtrip(_confluent(tls.ssl_bootstrap, tls.pki), tls.topic(), 3)) == 3


def _start_fails(tmp_path: Path, overrides: dict[str, str]) -> str:
    p0, p1 = free_port(), free_port()
    args = [sys.executable, "-m", "pykbroker", "serve", "--override", f"log.dirs={tmp_path / 'logs'}",
            "--override", f"listeners=PLAINTEXT://127.0.0.1:{p0},SSL://127.0.0.1:{p1}"]
    for k, v in overrides.items():
        args += ["--override", f"{k}={v}"]
    out = subprocess.run(args, capture_output=True, timeout=60, text=True)
    assert out.returncode in (1, 2), out
    return out.stdout + out.stderr


def test_bad_keystores_stop_the_start(tmp_path: Path, pki: Pki) -> None:
    p12 = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(pki.server.p12)}
    assert "wrong password" in _start_fails(tmp_path, {**p12, "ssl.keystore.password": "nope"})
    assert "cannot read keystore" in _start_fails(tmp_path, {**p12, "ssl.keystore.location": "/nonexistent.p12"})
    assert "JKS" in _start_fails(tmp_path, {"ssl.keystore.location": str(pki.server.p12)})
    mismatch = pki.ca.dir / "mismatch.pem"
    mismatch.write_bytes(pki.bob.key.read_bytes() + pki.server.cert.read_bytes())
    assert "does not match" in _start_fails(tmp_path, {"ssl.keystore.type": "PEM",
                                                       "ssl.keystore.location": str(mismatch)})
    assert "not implement" in _start_fails(tmp_path, {"ssl.keymanager.algorithm": "SunX509"})


@pytest.mark.timeout(240)
@pytest.mark.xdist_group("replication")
@pytest.mark.parametrize("chosen_by", ["inter.broker.listener.name", "security.inter.broker.protocol"])
def test_cluster_replicates_over_an_ssl_inter_broker_listener(tmp_path: Path, pki: Pki, chosen_by: str) -> None:
    """Three brokers whose inter-broker listener is SSL with mTLS replicate an RF 3 topic; the listener is
    named by inter.broker.listener.name, or is the one named after security.inter.broker.protocol."""
    from tests.support.cluster import Cluster
    from tests.support.cluster import wait_for as cluster_wait
    from tests.support.zookeeper import zookeeper_available
    if not zookeeper_available():
        raise RuntimeError("ZooKeeper (Debian package zookeeper) is needed: run scripts/install.sh --test")
    inter = "INTERNAL" if chosen_by == "inter.broker.listener.name" else "SSL"
    common = {
        "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,{inter}:SSL",
        chosen_by: inter,
        "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(pki.server.p12),
        "ssl.keystore.password": PASSWORD,
        "ssl.truststore.type": "PKCS12", "ssl.truststore.location": str(pki.ca.p12_path),
        "ssl.truststore.password": PASSWORD, "ssl.client.auth": "required",
    }
    cluster = Cluster(tmp_path, 3, overrides=common)
    for b in cluster.brokers.values():  # PLAINTEXT first (health checks), SSL for replication
        b.overrides["listeners"] = f"PLAINTEXT://127.0.0.1:{b.port},{inter}://127.0.0.1:{free_port()}"
    with cluster:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic("rf3", 1, 3)])["rf3"].result(TIMEOUT)
        cluster.wait_leaders("rf3", 1)
        p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        for i in range(50):
            p.produce("rf3", f"r{i}".encode())
        assert p.flush(TIMEOUT) == 0
        # Every follower fetched over TLS: the ISR holds all three and each log end offset is 50.
        cluster_wait(lambda: cluster.partition_states("rf3")[0][2] == [1, 2, 3], timeout=30,
                     what="all three replicas in the ISR")
        logs = cluster.logs()
        assert "TLS handshake failed" not in logs, logs
        assert f'listener={inter} principal="User:CN=localhost,O=pykbroker tests"' in logs


KAFKAJS_SCRIPT = r"""
const fs = require('fs')
const { Kafka, logLevel } = require('kafkajs')
const [bootstrap, topic, ca, cert, key] = process.argv.slice(1)
const kafka = new Kafka({ clientId: 'tls-test', brokers: [bootstrap], logLevel: logLevel.ERROR,
  ssl: { ca: [fs.readFileSync(ca, 'utf-8')], cert: fs.readFileSync(cert, 'utf-8'),
         key: fs.readFileSync(key, 'utf-8') } })
;(async () => {
  const p = kafka.producer()
  await p.connect()
  await p.send({ topic, messages: [0, 1, 2, 3, 4].map(i => ({ value: `j${i}` })) })
  await p.disconnect()
  const c = kafka.consumer({ groupId: `g-${topic}` })
  await c.connect()
  await c.subscribe({ topic, fromBeginning: true })
  const got = []
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('timeout')), 30000)
    c.run({ eachMessage: async ({ message }) => {
      got.push(message.value.toString())
      if (got.length >= 5) { clearTimeout(timer); resolve() }
    } })
  })
  await c.disconnect()
  console.log(JSON.stringify(got))
})().catch(e => { console.error(e); process.exit(1) })
"""


def test_kafkajs_over_mtls(tls: Tls) -> None:
    import json
    import os

    from compat import env
    env.node_modules()
    topic = tls.topic()
    out = subprocess.run(["node", "-e", KAFKAJS_SCRIPT, tls.mtls_bootstrap, topic, str(tls.pki.ca.cert_path),
                          str(tls.pki.bob.cert), str(tls.pki.bob.key)], capture_output=True, text=True, timeout=90,
                         env={**os.environ, "NODE_PATH": str(env.JS_DIR / "node_modules")})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [f"j{i}" for i in range(5)]
