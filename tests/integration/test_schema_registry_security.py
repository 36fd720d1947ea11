"""The schema registry's security end to end: a broker subprocess with a SASL_PLAINTEXT/SCRAM listener, the ACL
authorizer and an https registry with basic authentication; confluent-kafka's SchemaRegistryClient and its Avro
serializer against it as SCRAM users with and without ACLs.

The broker's first listener is PLAINTEXT with User:ANONYMOUS a super user (health check, admin set-up).
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, Producer
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
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support.broker import BrokerProcess, free_port
from tests.support.certs import Pki, make_pki

TIMEOUT = 30.0
PASSWORDS = {"writer": "writer-pass-0x51", "reader": "reader-pass-0x52", "eve": "eve-pass-0x53"}
ORDER = ('{"type":"record","name":"Order","namespace":"com.example",'
         '"fields":[{"name":"id","type":"long"},{"name":"item","type":"string"}]}')


@dataclass
class Setup:
    broker: BrokerProcess
    sasl: str
    registry: str
    pki: Pki


def _registry_up(url: str, ca: Path) -> bool:
    try:
        return httpx.get(url + "/", verify=ssl.create_default_context(cafile=str(ca)), timeout=1.0).status_code == 401
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    base = tmp_path_factory.mktemp("sr-security")
    pki = make_pki(base / "pki")
    sasl_port, registry_port = free_port(), free_port()
    b = BrokerProcess(base / "broker", {})
    b.overrides.update({
        "listeners": f"PLAINTEXT://127.0.0.1:{b.port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        "pykbroker.schema.registry.listener": f"https://127.0.0.1:{registry_port}",
        "pykbroker.schema.registry.authentication": "basic",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pki.server.pem),
    })
    b.start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        users = [UserScramCredentialUpsertion(name, ScramCredentialInfo(mech, 4096), pw.encode())
                 for (name, pw), mech in zip(PASSWORDS.items(), (ScramMechanism.SCRAM_SHA_256,
                                                                   ScramMechanism.SCRAM_SHA_512,
                                                                   ScramMechanism.SCRAM_SHA_256), strict=True)]
        for f in admin.alter_user_scram_credentials(users).values():
            f.result(TIMEOUT)
        admin.create_topics([NewTopic("orders", 1, 1)])["orders"].result(TIMEOUT)
        acls = [AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, f"User:{user}", "*", op,
                           AclPermissionType.ALLOW)
                for user, op in (("writer", AclOperation.WRITE), ("reader", AclOperation.READ))]
        acls.append(AclBinding(ResourceType.GROUP, "orders-readers", ResourcePatternType.LITERAL, "User:reader", "*",
                               AclOperation.READ, AclPermissionType.ALLOW))
        for f in admin.create_acls(acls).values():
            f.result(TIMEOUT)
        url = f"https://127.0.0.1:{registry_port}"
        deadline = time.monotonic() + TIMEOUT
        while not _registry_up(url, pki.ca.cert_path):
            assert time.monotonic() < deadline, f"registry not up in {TIMEOUT}s:\n{b.log()}"
            time.sleep(0.1)
        yield Setup(b, f"127.0.0.1:{sasl_port}", url, pki)
    finally:
        b.stop()


def _client(s: Setup, user: str, password: str | None = None) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": s.registry, "ssl.ca.location": str(s.pki.ca.cert_path),
                                 "basic.auth.user.info": f"{user}:{password or PASSWORDS[user]}"})


def test_scram_users_register_and_read_within_their_topic_acls(setup: Setup) -> None:
    writer = _client(setup, "writer")
    schema_id = writer.register_schema("orders-value", Schema(ORDER, "AVRO"))
    assert writer.get_latest_version("orders-value").schema_id == schema_id  # WRITE implies the lookup
    reader = _client(setup, "reader")
    assert reader.get_schema(schema_id).schema_str is not None  # READ on orders: fetch by id
    assert reader.get_subjects() == ["orders-value"]
    with pytest.raises(SchemaRegistryError) as denied:
        reader.register_schema("orders-value", Schema(ORDER.replace('"item"', '"item2"'), "AVRO"))
    assert denied.value.http_status_code == 403


def test_serializers_through_sasl_and_the_registry(setup: Setup) -> None:
    """The whole path a user sees: Avro through the SASL listener, schemas through the https registry."""
    writer_registry = _client(setup, "writer")
    serializer = AvroSerializer(writer_registry, ORDER)
    producer = Producer({"bootstrap.servers": setup.sasl, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "SCRAM-SHA-256", "sasl.username": "writer",
                         "sasl.password": PASSWORDS["writer"]})
    value = serializer({"id": 7, "item": "book"}, SerializationContext("orders", MessageField.VALUE))
    producer.produce("orders", value=value)
    assert producer.flush(TIMEOUT) == 0
    deserializer = AvroDeserializer(_client(setup, "reader"))
    consumer = Consumer({"bootstrap.servers": setup.sasl, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "reader",
                         "sasl.password": PASSWORDS["reader"], "group.id": "orders-readers",
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe(["orders"])
        deadline = time.monotonic() + TIMEOUT
        got = None
        while got is None and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got = deserializer(msg.value(), SerializationContext("orders", MessageField.VALUE))
        assert got == {"id": 7, "item": "book"}
    finally:
        consumer.close()


def test_wrong_password_and_unknown_user_get_401(setup: Setup) -> None:
    for user, password in (("writer", "not-the-password"), ("nobody", "whatever")):
        with pytest.raises(SchemaRegistryError) as refused:
            _client(setup, user, password).get_subjects()
        assert refused.value.http_status_code == 401
    r = httpx.get(setup.registry + "/subjects", verify=ssl.create_default_context(cafile=str(setup.pki.ca.cert_path)),
                  timeout=TIMEOUT)
    assert r.status_code == 401 and r.headers["www-authenticate"].lower().startswith("basic realm=")
    assert "failed authentication" in setup.broker.log() and "not-the-password" not in setup.broker.log()


def test_user_without_acls_gets_403(setup: Setup) -> None:
    eve = _client(setup, "eve")
    with pytest.raises(SchemaRegistryError) as denied:
        eve.register_schema("orders-value", Schema(ORDER, "AVRO"))
    assert denied.value.http_status_code == 403
    with pytest.raises(SchemaRegistryError) as denied:
        eve.set_compatibility(level="NONE")  # the global level: ALTER_CONFIGS on the cluster
    assert denied.value.http_status_code == 403
    assert eve.get_subjects() == []  # authenticated, but no subject is readable


def test_https_needs_the_ca(setup: Setup) -> None:
    untrusting = SchemaRegistryClient({"url": setup.registry, "ssl.ca.location": str(setup.pki.other_ca.cert_path),
                                       "basic.auth.user.info": f"writer:{PASSWORDS['writer']}"})
    with pytest.raises(Exception, match="(?i)certificate"):
        untrusting.get_subjects()


@pytest.mark.parametrize("overrides, reason", [
    ({"pykbroker.schema.registry.listener": "https://127.0.0.1:{port}"}, "has no keystore"),
    ({"pykbroker.schema.registry.listener": "https://127.0.0.1:{port}", "ssl.keystore.type": "PKCS12",
      "ssl.keystore.location": "{p12}", "ssl.keystore.password": "not-the-password"}, "wrong password"),
    ({"pykbroker.schema.registry.authentication": "basic"}, "needs the schema registry"),
])
def test_settings_that_cannot_work_refuse_to_start(tmp_path: Path, overrides: dict[str, str], reason: str) -> None:
    pki = make_pki(tmp_path / "pki")
    port = free_port()
    b = BrokerProcess(tmp_path / "broker", {k: v.format(port=port, p12=pki.server.p12) for k, v in overrides.items()})
    with pytest.raises(RuntimeError, match="broker exited") as failed:
        b.start(timeout=TIMEOUT)
    assert reason in str(failed.value)
