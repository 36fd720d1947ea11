"""SASL_SSL: SASL logins (PLAIN, SCRAM-SHA-512) inside TLS, with real clients, and an ACL decided on the
SASL principal (not the certificate's) on that listener.

The broker's first listener stays PLAINTEXT (health check, topic creation, SCRAM user creation);
ANONYMOUS is a super user there, the SASL users are not.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.support.broker import BrokerProcess, free_port
from tests.support.certs import PASSWORD, Pki, make_pki
from tests.support.client_probes import KAFKAJS
from tests.support.consume import poll_values

TIMEOUT = 30.0
JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_alice="alice-secret" user_bob="bob-secret";')


class Secured:
    def __init__(self, broker: BrokerProcess, port: int, pki: Pki) -> None:
        self.broker, self.port, self.pki = broker, port, pki

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.broker.bootstrap, "broker.address.family": "v4"})

    def topic(self) -> str:
        name = f"sasl-ssl-{uuid.uuid4().hex[:8]}"
        admin = self.admin()
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(TIMEOUT)
        return name

    def allow(self, principal: str, rtype: ResourceType, name: str, op: AclOperation) -> None:
        admin = self.admin()
        binding = AclBinding(rtype, name, ResourcePatternType.LITERAL, principal, "*", op, AclPermissionType.ALLOW)
        for f in admin.create_acls([binding], request_timeout=TIMEOUT).values():
            f.result(timeout=TIMEOUT)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    p0, p1 = free_port(), free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("sasl-ssl"), {
        "listeners": f"PLAINTEXT://127.0.0.1:{p0},SASL_SSL://127.0.0.1:{p1}",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.server.pem),
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
    }, port=p0).start()
    s = Secured(b, p1, pki)
    admin = s.admin()
    upsert = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                          b"carol-secret")
    for f in admin.alter_user_scram_credentials([upsert], request_timeout=TIMEOUT).values():
        f.result(timeout=TIMEOUT)
    yield s
    b.stop()


def _conf(s: Secured, mechanism: str, user: str, password: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": s.bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password, "ssl.ca.location": str(s.pki.ca.cert_path),
            "broker.address.family": "v4", **extra}


def _confluent_roundtrip(s: Secured, mechanism: str, user: str, password: str) -> list[bytes]:
    topic = s.topic()
    s.allow(f"User:{user}", ResourceType.TOPIC, topic, AclOperation.ALL)
    group = f"g-{uuid.uuid4().hex[:6]}"
    s.allow(f"User:{user}", ResourceType.GROUP, group, AclOperation.READ)
    p = Producer(_conf(s, mechanism, user, password))
    for i in range(10):
        p.produce(topic, f"m{i}".encode())
    assert p.flush(TIMEOUT) == 0
    c = Consumer(_conf(s, mechanism, user, password, **{"group.id": group, "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    try:
        return poll_values(c, lambda got: len(got) >= 10, 40)
    finally:
        c.close()


@pytest.mark.parametrize("mechanism,user,password", [("PLAIN", "alice", "alice-secret"),
                                                     ("SCRAM-SHA-512", "carol", "carol-secret")])
def test_confluent_produces_and_consumes_over_sasl_ssl(secured: Secured, mechanism: str, user: str,
                                                        password: str) -> None:
    assert _confluent_roundtrip(secured, mechanism, user, password) == [f"m{i}".encode() for i in range(10)]


def test_the_sasl_principal_is_the_one_authorized(secured: Secured) -> None:
    """bob authenticates inside the same TLS as alice but has no ACL: his produce is refused."""
    topic = secured.topic()
    secured.allow("User:alice", ResourceType.TOPIC, topic, AclOperation.WRITE)
    errors: list[KafkaError | None] = []
    p = Producer(_conf(secured, "PLAIN", "bob", "bob-secret", **{"message.timeout.ms": 10000, "retries": 0}))
    p.produce(topic, b"x", on_delivery=lambda err, msg: errors.append(err))
    p.flush(TIMEOUT)
    assert errors and errors[0] is not None and errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_kafka_python_over_sasl_ssl(secured: Secured) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = secured.topic()
    secured.allow("User:alice", ResourceType.TOPIC, topic, AclOperation.ALL)
    common = {"bootstrap_servers": secured.bootstrap, "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
              "sasl_plain_username": "alice", "sasl_plain_password": "alice-secret",
              "ssl_cafile": str(secured.pki.ca.cert_path), "ssl_check_hostname": False}
    p = KafkaProducer(**common)
    for i in range(5):
        p.send(topic, f"k{i}".encode()).get(timeout=TIMEOUT)
    p.close()
    c = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=10000, **common)
    got = [m.value for _, m in zip(range(5), c, strict=False)]
    c.close()
    assert got == [f"k{i}".encode() for i in range(5)]


def test_aiokafka_over_sasl_ssl(secured: Secured) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = secured.topic()
    secured.allow("User:carol", ResourceType.TOPIC, topic, AclOperation.ALL)
    ctx = ssl.create_default_context(cafile=str(secured.pki.ca.cert_path))
    ctx.check_hostname = False
    common = {"bootstrap_servers": secured.bootstrap, "security_protocol": "SASL_SSL",
              "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "carol",
              "sasl_plain_password": "carol-secret", "ssl_context": ctx}

    async def run() -> list[bytes]:
        p = AIOKafkaProducer(**common)
        await p.start()
        try:
            for i in range(5):
                await p.send_and_wait(topic, f"a{i}".encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **common)
        await c.start()
        out: list[bytes] = []
        try:
            async with asyncio.timeout(TIMEOUT):
                async for m in c:
                    out.append(m.value)
                    if len(out) == 5:
                        break
        finally:
            await c.stop()
        return out

    assert asyncio.run(run()) == [f"a{i}".encode() for i in range(5)]


def test_a_wrong_password_inside_tls_is_refused_and_logged(secured: Secured, tmp_path: Path) -> None:
    errors: list[KafkaError] = []
    p = Producer(_conf(secured, "PLAIN", "alice", "not-her-password",
                       error_cb=lambda e: errors.append(e)))
    for _ in range(100):
        if errors:
            break
        p.poll(0.1)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    log = secured.broker.log()
    assert "not-her-password" not in log


JAVA = """
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.*;

public class SecureProbe {
    // args: bootstrap protocol(SSL|SASL_SSL) mechanism user password topic ca.pem
    public static void main(String[] a) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", a[0]);
        p.put("security.protocol", a[1]);
        p.put("ssl.truststore.type", "PEM");
        p.put("ssl.truststore.location", a[6]);
        p.put("ssl.endpoint.identification.algorithm", "");
        if (a[1].equals("SASL_SSL")) {
            String module = a[2].equals("PLAIN") ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                                                 : "org.apache.kafka.common.security.scram.ScramLoginModule";
            p.put("sasl.mechanism", a[2]);
            p.put("sasl.jaas.config", module + " required username=\\"" + a[3] + "\\" password=\\"" + a[4] + "\\";");
        }
        Properties pp = new Properties(); pp.putAll(p);
        pp.put("key.serializer", StringSerializer.class.getName());
        pp.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(pp)) {
            for (int i = 0; i < 3; i++) prod.send(new ProducerRecord<>(a[5], "j" + i)).get();
        }
        Properties cp = new Properties(); cp.putAll(p);
        cp.put("key.deserializer", StringDeserializer.class.getName());
        cp.put("value.deserializer", StringDeserializer.class.getName());
        List<String> got = new ArrayList<>();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
            TopicPartition tp = new TopicPartition(a[5], 0);
            c.assign(List.of(tp));
            c.seekToBeginning(List.of(tp));
            long end = System.currentTimeMillis() + 25000;
            while (got.size() < 3 && System.currentTimeMillis() < end)
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) got.add(r.value());
        }
        System.out.println(String.join(",", got));
    }
}
"""


@pytest.fixture(scope="module")
def java_probe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    if shutil.which("javac") is None:
        pytest.fail("no JDK (scripts/install.sh --test installs one)")
    from compat import env

    cp = os.pathsep.join(str(p) for p in env.jars())
    out = tmp_path_factory.mktemp("java-probe")
    src = out / "SecureProbe.java"
    src.write_text(JAVA)
    subprocess.run(["javac", "-nowarn", "-cp", cp, "-d", str(out), str(src)], check=True, timeout=120)
    return out, cp


def _java(probe: tuple[Path, str], *args: str) -> str:
    out_dir, cp = probe
    out = subprocess.run(["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", f"{out_dir}{os.pathsep}{cp}",
                          "SecureProbe", *args], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return out.stdout.decode().strip().splitlines()[-1]


def test_java_over_sasl_ssl_with_scram(secured: Secured, java_probe: tuple[Path, str]) -> None:
    topic = secured.topic()
    secured.allow("User:carol", ResourceType.TOPIC, topic, AclOperation.ALL)
    got = _java(java_probe, secured.bootstrap, "SASL_SSL", "SCRAM-SHA-512", "carol", "carol-secret", topic,
                str(secured.pki.ca.cert_path))
    assert got == "j0,j1,j2"


def test_java_over_ssl(ssl_only: Secured, java_probe: tuple[Path, str]) -> None:
    topic = ssl_only.topic()
    got = _java(java_probe, ssl_only.bootstrap, "SSL", "-", "-", "-", topic, str(ssl_only.pki.ca.cert_path))
    assert got == "j0,j1,j2"


@pytest.fixture(scope="module")
def ssl_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """A plain SSL listener (no SASL, no authorizer), for the Java client's TLS."""
    pki = make_pki(tmp_path_factory.mktemp("pki-ssl"))
    p0, p1 = free_port(), free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("ssl-only"), {
        "listeners": f"PLAINTEXT://127.0.0.1:{p0},SSL://127.0.0.1:{p1}",
        "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(pki.server.p12),
        "ssl.keystore.password": PASSWORD,
    }, port=p0).start()
    yield Secured(b, p1, pki)
    b.stop()


def test_kcat_over_sasl_ssl(secured: Secured) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed (scripts/install.sh --test installs it)"
    topic = secured.topic()
    secured.allow("User:alice", ResourceType.TOPIC, topic, AclOperation.ALL)
    sec = ["-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=alice",
           "-X", "sasl.password=alice-secret", "-X", f"ssl.ca.location={secured.pki.ca.cert_path}"]
    subprocess.run([kcat, "-b", secured.bootstrap, *sec, "-P", "-t", topic], input=b"c1\nc2\n", check=True,
                   timeout=TIMEOUT)
    out = subprocess.run([kcat, "-b", secured.bootstrap, *sec, "-C", "-t", topic, "-o", "beginning", "-c", "2",
                          "-e"], capture_output=True, check=True, timeout=TIMEOUT)
    assert out.stdout.split() == [b"c1", b"c2"]





def test_kafkajs_over_sasl_ssl(secured: Secured, tmp_path: Path) -> None:
    from compat import env

    topic = secured.topic()
    secured.allow("User:carol", ResourceType.TOPIC, topic, AclOperation.ALL)
    secured.allow("User:carol", ResourceType.GROUP, f"g-{topic}", AclOperation.READ)
    script = tmp_path / "sasl_ssl.js"
    script.write_text(KAFKAJS)
    out = subprocess.run(["node", str(script), secured.bootstrap, "SCRAM-SHA-512", "carol", "carol-secret", topic,
                          str(secured.pki.ca.cert_path)], capture_output=True, timeout=90,
                         env={**os.environ, "NODE_PATH": str(env.JS_DIR / "node_modules")})
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert json.loads(out.stdout) == ["j0", "j1"]
