"""SASL_PLAINTEXT with real clients: PLAIN and SCRAM-SHA-512 logins, SCRAM users made through
AlterUserScramCredentials, failed logins, KIP-368 re-authentication.

The broker's first listener stays PLAINTEXT (health check, admin); the SASL listener is second.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from tests.support.broker import BrokerProcess, free_port
from tests.support.client_probes import KAFKAJS
from tests.support.cluster import wait_for

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
SCRAM_USER, SCRAM_PASSWORD = "scrammy", "scram-pass-0xdeadbeef"
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0




def sasl_overrides(port: int, **extra: str) -> dict[str, str]:
    return {
        "listeners": f"PLAINTEXT://127.0.0.1:{{p0}},SASL_PLAINTEXT://127.0.0.1:{port}",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        **extra,
    }


def start_broker(base: Path, **extra: str) -> tuple[BrokerProcess, str]:
    sasl_port = free_port()
    b = BrokerProcess(base, {})
    overrides = sasl_overrides(sasl_port, **extra)
    overrides["listeners"] = overrides["listeners"].replace("{p0}", str(b.port))
    b.overrides.update(overrides)
    b.start()
    return b, f"127.0.0.1:{sasl_port}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    b, sasl = start_broker(tmp_path_factory.mktemp("sasl"))
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        fut = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            SCRAM_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), SCRAM_PASSWORD.encode())])
        for f in fut.values():
            f.result(TIMEOUT)
        yield b, sasl
    finally:
        b.stop()


def creds(mechanism: str) -> tuple[str, str]:
    return ("alice", "alice-secret") if mechanism == "PLAIN" else (SCRAM_USER, SCRAM_PASSWORD)


def rd_conf(sasl: str, mechanism: str, user: str | None = None, password: str | None = None) -> dict[str, Any]:
    u, p = creds(mechanism)
    return {"bootstrap.servers": sasl, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism,
            "sasl.username": user or u, "sasl.password": password or p}


def new_topic(b: BrokerProcess) -> str:
    name = f"sasl-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(TIMEOUT)
    return name


def consume_plain(b: BrokerProcess, topic: str, count: int) -> list[bytes]:
    """Read back over the PLAINTEXT listener (what the SASL client wrote)."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "x", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append(m.value() or b"")
        return out
    finally:
        c.close()


def end_offset_plain(b: BrokerProcess, topic: str) -> int:
    """Partition 0's high watermark, asked over the PLAINTEXT listener."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "x", "enable.auto.commit": False})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)[1])
    finally:
        c.close()


# --- admin: SCRAM credentials -------------------------------------------------------------------

def test_scram_credentials_described_and_validated(broker: tuple[BrokerProcess, str]) -> None:
    b, _ = broker
    admin: Any = AdminClient({"bootstrap.servers": b.bootstrap})
    described = admin.describe_user_scram_credentials([SCRAM_USER])[SCRAM_USER].result(TIMEOUT)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_512, 4096)]
    everyone = admin.describe_user_scram_credentials().result(TIMEOUT)
    assert SCRAM_USER in everyone
    with pytest.raises(KafkaException, match="RESOURCE_NOT_FOUND|does not exist"):
        admin.describe_user_scram_credentials(["nobody"])["nobody"].result(TIMEOUT)
    low = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "lowiter", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"pw")])
    with pytest.raises(KafkaException, match="UNACCEPTABLE_CREDENTIAL|iterations"):
        low["lowiter"].result(TIMEOUT)
    gone = admin.alter_user_scram_credentials([UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_256)])
    with pytest.raises(KafkaException, match="RESOURCE_NOT_FOUND|does not exist"):
        gone["nobody"].result(TIMEOUT)
    # The salted keys only are stored: the metadata file holds no password.
    text = (b.data_dir / "logs" / "__pykbroker_metadata.json").read_text()
    assert SCRAM_USER in text and SCRAM_PASSWORD not in text


# --- clients ------------------------------------------------------------------------------------

MECHANISMS = ["PLAIN", "SCRAM-SHA-512"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka(broker: tuple[BrokerProcess, str], mechanism: str) -> None:
    b, sasl = broker
    topic = new_topic(b)
    p = Producer(rd_conf(sasl, mechanism))
    for i in range(5):
        p.produce(topic, f"m{i}".encode())
    assert p.flush(TIMEOUT) == 0
    c = Consumer({**rd_conf(sasl, mechanism), "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 5 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value() or b"")
        assert got == [f"m{i}".encode() for i in range(5)]
    finally:
        c.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python(broker: tuple[BrokerProcess, str], mechanism: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    b, sasl = broker
    topic = new_topic(b)
    u, pw = creds(mechanism)
    conf = {"bootstrap_servers": sasl, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": u, "sasl_plain_password": pw}
    p = KafkaProducer(**conf)
    for i in range(3):
        p.send(topic, f"k{i}".encode()).get(TIMEOUT)
    p.close()
    c = KafkaConsumer(**conf, consumer_timeout_ms=10000)
    c.assign([KTP(topic, 0)])
    c.seek_to_beginning()
    got = []
    for m in c:
        got.append(m.value)
        if len(got) == 3:
            break
    c.close()
    assert got == [b"k0", b"k1", b"k2"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aiokafka(broker: tuple[BrokerProcess, str], mechanism: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as ATP

    b, sasl = broker
    topic = new_topic(b)
    u, pw = creds(mechanism)
    conf = {"bootstrap_servers": sasl, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": u, "sasl_plain_password": pw}

    async def run() -> list[bytes]:
        p = AIOKafkaProducer(**conf)
        await p.start()
        try:
            for i in range(3):
                await p.send_and_wait(topic, f"a{i}".encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(**conf, auto_offset_reset="earliest")
        await c.start()
        try:
            c.assign([ATP(topic, 0)])
            await c.seek_to_beginning(ATP(topic, 0))
            out: list[bytes] = []
            async with asyncio.timeout(TIMEOUT):
                while len(out) < 3:
                    batch = await c.getmany(timeout_ms=500)
                    out += [m.value for ms in batch.values() for m in ms]
            return out
        finally:
            await c.stop()

    assert asyncio.run(run()) == [b"a0", b"a1", b"a2"]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kcat(broker: tuple[BrokerProcess, str], mechanism: str) -> None:
    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        pytest.fail("kcat is not installed (scripts/install.sh --test installs it)")
    b, sasl = broker
    topic = new_topic(b)
    u, pw = creds(mechanism)
    sec = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={mechanism}",
           "-X", f"sasl.username={u}", "-X", f"sasl.password={pw}"]
    subprocess.run([kcat, "-b", sasl, *sec, "-P", "-t", topic], input=b"x1\nx2\n", check=True, timeout=TIMEOUT)
    out = subprocess.run([kcat, "-b", sasl, *sec, "-C", "-t", topic, "-o", "beginning", "-c", "2", "-e"],
                         capture_output=True, check=True, timeout=TIMEOUT)
    assert out.stdout.split() == [b"x1", b"x2"]





@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafkajs(broker: tuple[BrokerProcess, str], mechanism: str, tmp_path: Path) -> None:
    modules = ROOT / "compat" / "js" / "node_modules"
    if shutil.which("node") is None or not (modules / "kafkajs").exists():
        pytest.fail("node or kafkajs is not installed (scripts/install.sh --test installs them)")
    b, sasl = broker
    topic = new_topic(b)
    script = tmp_path / "sasl.js"
    script.write_text(KAFKAJS)
    out = subprocess.run(["node", str(script), sasl, mechanism, *creds(mechanism), topic], capture_output=True,
                         timeout=60, env={**os.environ, "NODE_PATH": str(modules)})
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert json.loads(out.stdout) == ["j0", "j1"]


JAVA = """
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.*;

public class SaslProbe {
    public static void main(String[] a) throws Exception {
        String module = a[1].equals("PLAIN") ? "org.apache.kafka.common.security.plain.PlainLoginModule"
                                             : "org.apache.kafka.common.security.scram.ScramLoginModule";
        Properties p = new Properties();
        p.put("bootstrap.servers", a[0]);
        p.put("security.protocol", "SASL_PLAINTEXT");
        p.put("sasl.mechanism", a[1]);
        p.put("sasl.jaas.config", module + " required username=\\"" + a[2] + "\\" password=\\"" + a[3] + "\\";");
        Properties pp = new Properties(); pp.putAll(p);
        pp.put("key.serializer", StringSerializer.class.getName());
        pp.put("value.serializer", StringSerializer.class.getName());
        int count = a.length > 5 ? Integer.parseInt(a[5]) : 2;
        long pauseMs = a.length > 6 ? Long.parseLong(a[6]) : 0;
        try (KafkaProducer<String, String> prod = new KafkaProducer<>(pp)) {
            for (int i = 0; i < count; i++) {
                prod.send(new ProducerRecord<>(a[4], "v" + i)).get();
                if (pauseMs > 0) Thread.sleep(pauseMs);
            }
        }
        Properties cp = new Properties(); cp.putAll(p);
        cp.put("key.deserializer", StringDeserializer.class.getName());
        cp.put("value.deserializer", StringDeserializer.class.getName());
        List<String> got = new ArrayList<>();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
            TopicPartition tp = new TopicPartition(a[4], 0);
            c.assign(List.of(tp));
            c.seekToBeginning(List.of(tp));
            long end = System.currentTimeMillis() + 25000;
            while (got.size() < count && System.currentTimeMillis() < end)
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) got.add(r.value());
        }
        System.out.println(String.join(",", got));
    }
}
"""


def run_java_probe(tmp_path: Path, sasl: str, mechanism: str, topic: str, *extra: str) -> str:
    if shutil.which("javac") is None:
        pytest.fail("no JDK (scripts/install.sh --test installs one)")
    from compat import env

    try:
        cp = os.pathsep.join(str(p) for p in env.jars())
    except Exception as e:  # mvn copies them from Maven Central (compat/env.py)
        pytest.fail(f"kafka-clients jars unavailable (scripts/install.sh --test fetches them): {e}")
    src = tmp_path / "SaslProbe.java"
    src.write_text(JAVA)
    subprocess.run(["javac", "-nowarn", "-cp", cp, "-d", str(tmp_path), str(src)], check=True, timeout=120)
    out = subprocess.run(["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", f"{tmp_path}{os.pathsep}{cp}",
                          "SaslProbe", sasl, mechanism, *creds(mechanism), topic, *extra],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return out.stdout.decode().strip().splitlines()[-1]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_java(broker: tuple[BrokerProcess, str], mechanism: str, tmp_path: Path) -> None:
    b, sasl = broker
    assert run_java_probe(tmp_path, sasl, mechanism, new_topic(b)) == "v0,v1"


# --- failures -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_wrong_password(broker: tuple[BrokerProcess, str], mechanism: str) -> None:
    b, sasl = broker
    topic = new_topic(b)
    bad_password = f"wrong-{uuid.uuid4().hex}"
    errors: list[Any] = []
    p = Producer({**rd_conf(sasl, mechanism, password=bad_password), "error_cb": errors.append,
                  "message.timeout.ms": 3000})
    p.produce(topic, b"never")
    p.flush(10)
    assert any("uthentication" in e.str() for e in errors), [e.str() for e in errors]
    user = creds(mechanism)[0]
    wait_for(lambda: "failed authentication" in b.log() and f"mechanism={mechanism} user={user} " in b.log(),
             what="the failed-login log line")
    assert bad_password not in b.log()
    assert end_offset_plain(b, topic) == 0  # nothing was written (read at once, not waited for)
    # Other clients are unaffected.
    good = Producer(rd_conf(sasl, mechanism))
    good.produce(topic, b"fine")
    assert good.flush(TIMEOUT) == 0
    assert consume_plain(b, topic, 1) == [b"fine"]


def test_unknown_mechanism(broker: tuple[BrokerProcess, str]) -> None:
    b, sasl = broker
    errors: list[Any] = []
    p = Producer({"bootstrap.servers": sasl, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "OAUTHBEARER",
                  "enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": "principal=admin",
                  "error_cb": errors.append})
    p.produce("whatever", b"x")
    p.flush(5)
    assert any("OAUTHBEARER" in e.str() or "mechanism" in e.str().lower() for e in errors), \
        [e.str() for e in errors]
    wait_for(lambda: "unsupported SASL mechanism" in b.log() and "mechanism=OAUTHBEARER" in b.log(),
             what="the log line")


def test_reauthentication(tmp_path: Path) -> None:
    """connections.max.reauth.ms: librdkafka re-authenticates and its connection keeps working."""
    b, sasl = start_broker(tmp_path, **{"connections.max.reauth.ms": "1500"})
    try:
        topic = new_topic(b)
        p = Producer(rd_conf(sasl, "PLAIN"))
        for i in range(12):  # ~6 s: four session lifetimes
            p.produce(topic, f"r{i}".encode())
            p.poll(0)
            time.sleep(0.5)
        assert p.flush(TIMEOUT) == 0
        assert len(consume_plain(b, topic, 12)) == 12
        assert "re-authenticated" in b.log()
        assert "expired" not in b.log()
        # A client that does not re-authenticate: its first request after the lifetime closes the connection.
        import socket
        import struct

        from pykbroker.protocol import codec
        from tests.support.cluster import read_frame, request_frame

        host, port = sasl.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.settimeout(10)
            sock.sendall(_v1_frame(17, 1, {"mechanism": "PLAIN"}))
            assert codec.decode_response(17, 1, read_frame(sock), 4).error_code == 0
            sock.sendall(request_frame(36, 2, {"auth_bytes": b"\x00alice\x00alice-secret"}))
            resp = codec.decode_response(36, 2, read_frame(sock), 5)
            assert resp.error_code == 0 and resp.session_lifetime.total_seconds() * 1000 == 1500
            body = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
            sock.sendall(request_frame(3, 12, body, correlation_id=11))
            assert struct.unpack_from(">i", read_frame(sock), 0)[0] == 11  # within the session: answered
            time.sleep(1.6)  # the session lifetime itself is what this waits out
            sock.sendall(request_frame(3, 12, body, correlation_id=12))
            assert sock.recv(100) == b""
        wait_for(lambda: "expired" in b.log() and "instead of re-authenticating" in b.log(), what="expiry log line")
    finally:
        b.stop()


def test_java_reauthentication(tmp_path: Path) -> None:
    """The Java client re-authenticates (KIP-368) on its open connection and keeps producing."""
    b, sasl = start_broker(tmp_path / "broker", **{"connections.max.reauth.ms": "1500"})
    try:
        topic = new_topic(b)
        admin: Any = AdminClient({"bootstrap.servers": b.bootstrap})
        for f in admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
                SCRAM_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                SCRAM_PASSWORD.encode())]).values():
            f.result(TIMEOUT)
        out = run_java_probe(tmp_path, sasl, "SCRAM-SHA-512", topic, "8", "500")  # ~4 s: several lifetimes
        assert out == ",".join(f"v{i}" for i in range(8))
        assert "re-authenticated" in b.log() and "expired" not in b.log()
    finally:
        b.stop()


# --- protocol-level: SaslHandshake v0 raw tokens, requests before authentication ---------------

def _v1_frame(api_key: int, version: int, body: dict[str, Any], cid: int = 7) -> bytes:
    """A request with header v1 (SaslHandshake has no flexible version)."""
    import struct

    from pykbroker.protocol import codec

    client = b"raw"
    header = struct.pack(">hhih", api_key, version, cid, len(client)) + client
    payload = header + codec.encode_entity(codec.build(codec.request_class(api_key, version), body))
    return struct.pack(">i", len(payload)) + payload


def test_handshake_v0_raw_tokens_and_gating(broker: tuple[BrokerProcess, str]) -> None:
    import socket
    import struct

    from pykbroker.protocol import codec
    from tests.support.cluster import read_frame, request_frame

    b, sasl = broker
    host, port = sasl.rsplit(":", 1)
    metadata_body = {"topics": None, "allow_auto_topic_creation": False,
                     "include_topic_authorized_operations": False}
    # Anything but ApiVersions / SaslHandshake before authentication closes the connection.
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.settimeout(10)
        s.sendall(request_frame(3, 12, metadata_body))
        assert s.recv(100) == b""
    wait_for(lambda: "Unexpected Kafka request of type METADATA during SASL handshake" in b.log(),
             what="the gating log line")
    # SaslHandshake v0, then the PLAIN token as a raw size-prefixed frame, then Kafka requests.
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.settimeout(10)
        s.sendall(_v1_frame(17, 0, {"mechanism": "PLAIN"}))
        frame = read_frame(s)
        resp = codec.decode_response(17, 0, frame, 4)
        assert resp.error_code == 0 and "PLAIN" in resp.mechanisms
        token = b"\x00alice\x00alice-secret"
        s.sendall(struct.pack(">i", len(token)) + token)
        assert read_frame(s) == b""  # PLAIN's empty server token, raw
        s.sendall(request_frame(3, 12, metadata_body, correlation_id=9))
        frame = read_frame(s)
        assert struct.unpack_from(">i", frame, 0)[0] == 9
    # Unsupported mechanism: the enabled list comes back.
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.settimeout(10)
        s.sendall(_v1_frame(17, 1, {"mechanism": "GSSAPI"}))
        resp = codec.decode_response(17, 1, read_frame(s), 4)
        assert resp.error_code == 33 and list(resp.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert s.recv(100) == b"", "a failed handshake closes the connection, as in Kafka"


def test_failed_authentication_is_answered_late_then_closed(tmp_path: Path) -> None:
    """Kafka's KIP-306: the answer to a failed SASL authentication waits
    connection.failed.authentication.delay.ms, then the broker closes the connection."""
    import socket

    from pykbroker.protocol import codec
    from tests.support.cluster import read_frame

    b, sasl = start_broker(tmp_path, **{"connection.failed.authentication.delay.ms": "600"})
    try:
        host, port = sasl.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.settimeout(10)
            s.sendall(_v1_frame(17, 1, {"mechanism": "PLAIN"}))
            assert codec.decode_response(17, 1, read_frame(s), 4).error_code == 0
            sent = time.monotonic()
            s.sendall(_v1_frame(36, 1, {"auth_bytes": b"\x00alice\x00not-her-password"}, cid=8))
            resp = codec.decode_response(36, 1, read_frame(s), 4)
            waited = time.monotonic() - sent
            assert resp.error_code == 58 and "Invalid username or password" in (resp.error_message or "")
            assert waited >= 0.5, f"answered after {waited:.3f} s, not after the delay"
            assert s.recv(100) == b"", "the connection closes after the answer"
        # A good login on a new connection still works, and the broker serves on.
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.settimeout(10)
            s.sendall(_v1_frame(17, 1, {"mechanism": "PLAIN"}))
            assert codec.decode_response(17, 1, read_frame(s), 4).error_code == 0
            s.sendall(_v1_frame(36, 1, {"auth_bytes": b"\x00alice\x00alice-secret"}, cid=9))
            assert codec.decode_response(36, 1, read_frame(s), 4).error_code == 0
        wait_for(lambda: "closing connection" in b.log() and "reason=\"failed authentication\"" in b.log(),
                 what="the close's log line")
    finally:
        b.stop()


# --- a ZooKeeper cluster ------------------------------------------------------------------------

@pytest.mark.parametrize("inter_broker_sasl", [False, True], ids=["plaintext-inter-broker", "sasl-inter-broker"])
def test_zk_cluster_scram_and_replication(tmp_path: Path, inter_broker_sasl: bool) -> None:
    """SCRAM users created on one broker log in on another (ZooKeeper /config/users); with a
    SASL_PLAINTEXT inter-broker listener the followers log in (PLAIN) and an RF 3 topic replicates."""
    from tests.support.cluster import Cluster

    overrides = {"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
                 "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS}
    if inter_broker_sasl:
        overrides.update({"inter.broker.listener.name": "SASL_PLAINTEXT",
                          "sasl.mechanism.inter.broker.protocol": "PLAIN"})
    cluster = Cluster(tmp_path, 3, overrides=overrides)
    sasl_of: dict[int, str] = {}
    for i, b in cluster.brokers.items():
        port = free_port()
        sasl_of[i] = f"127.0.0.1:{port}"
        b.overrides["listeners"] = f"PLAINTEXT://127.0.0.1:{b.port},SASL_PLAINTEXT://127.0.0.1:{port}"
    with cluster:  # starts ZooKeeper and the brokers
        admin: Any = AdminClient({"bootstrap.servers": cluster.broker(1).bootstrap})
        for f in admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
                SCRAM_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                SCRAM_PASSWORD.encode())]).values():
            f.result(TIMEOUT)
        topic = f"rf3-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(TIMEOUT)
        cluster.wait_leaders(topic, 1)

        def logs_in_on_broker_3() -> bool:
            p = Producer({**rd_conf(sasl_of[3], "SCRAM-SHA-512"), "message.timeout.ms": 5000, "acks": "all"})
            p.produce(topic, b"via-3")
            return p.flush(10) == 0

        wait_for(logs_in_on_broker_3, timeout=30, what="a SCRAM login on broker 3 with the user made on broker 1")
        admin2: Any = AdminClient({"bootstrap.servers": cluster.broker(2).bootstrap})
        described = admin2.describe_user_scram_credentials([SCRAM_USER])[SCRAM_USER].result(TIMEOUT)
        assert [i.iterations for i in described.scram_credential_infos] == [4096]
        # Kafka's ZooKeeper layout: a config key per mechanism in /config/users/<user>, salted keys only.
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=cluster.zk.connect)
        zk.start(timeout=10)
        try:
            node = json.loads(zk.get(f"/config/users/{SCRAM_USER}")[0])
            changes = zk.get_children("/config/changes")
        finally:
            zk.stop()
            zk.close()
        value = node["config"]["SCRAM-SHA-512"]
        assert value.startswith("salt=") and ",stored_key=" in value and value.endswith(",iterations=4096")
        assert SCRAM_PASSWORD not in value and changes

        def fully_replicated() -> bool:
            states = cluster.partition_states(topic)
            return bool(states) and all(sorted(isr) == [1, 2, 3] for _, _, isr in states.values())

        wait_for(fully_replicated, timeout=30, what=f"ISR of {topic} = all three brokers")
        if inter_broker_sasl:
            logs = "\n".join(b.log() for b in cluster.brokers.values())
            assert "mechanism=PLAIN principal=User:admin" in logs
            assert "admin-secret" not in logs


def test_oauthbearer_unsecured(tmp_path: Path) -> None:
    """OAUTHBEARER with unsecured JWS tokens (librdkafka's enable.sasl.oauthbearer.unsecure.jwt)."""
    b, sasl = start_broker(tmp_path, **{
        "sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER",
        "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"})
    try:
        topic = new_topic(b)
        p = Producer({"bootstrap.servers": sasl, "security.protocol": "SASL_PLAINTEXT",
                      "sasl.mechanisms": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
                      "sasl.oauthbearer.config": "principal=carol"})
        p.produce(topic, b"o1")
        assert p.flush(TIMEOUT) == 0
        assert consume_plain(b, topic, 1) == [b"o1"]
        assert "mechanism=OAUTHBEARER principal=User:carol" in b.log()
    finally:
        b.stop()
