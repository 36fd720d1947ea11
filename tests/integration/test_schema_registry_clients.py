"""confluent-kafka's Schema Registry client and its Avro, Protobuf and JSON Schema serializers against the
broker's registry, producing and consuming through the same broker; schema evolution under every compatibility
level; a restart that keeps every schema and id; bad input that gets a clear error while Kafka clients go on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.integration.conftest import (
    BrokerFactory,
    consume_partitions,
    create_topic,
    make_producer,
    produce_all,
    unique_topic,
    wait_until,
)
from tests.support.broker import BrokerProcess, free_port

FD = descriptor_pb2.FieldDescriptorProto


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def registry(broker_factory: BrokerFactory) -> Iterator[tuple[BrokerProcess, str]]:
    port = free_port()
    b = broker_factory({"pykbroker.schema.registry.listener": f"http://127.0.0.1:{port}"})
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _answers(url), timeout=20, what="the schema registry to answer")
    yield b, url


def _round_trip(b: BrokerProcess, topic: str, values: list[bytes]) -> list[bytes]:
    create_topic(b, topic)
    reports = produce_all(make_producer(b), topic, [{"value": v} for v in values])
    assert all(r.error is None for r in reports), reports
    msgs = consume_partitions(b, [TopicPartition(topic, 0, 0)], len(values))
    return [m.value() or b"" for m in msgs]


def test_avro_serializer_and_deserializer(registry: tuple[BrokerProcess, str]) -> None:
    b, url = registry
    client = SchemaRegistryClient({"url": url})
    schema = json.dumps({"type": "record", "name": "User", "namespace": "test", "fields": [
        {"name": "name", "type": "string"}, {"name": "age", "type": "int"},
        {"name": "email", "type": ["null", "string"], "default": None}]})
    topic = unique_topic("avro")
    ctx = SerializationContext(topic, MessageField.VALUE)
    ser = AvroSerializer(client, schema)
    users = [{"name": f"u{i}", "age": i, "email": None if i % 2 else f"u{i}@x"} for i in range(5)]
    got = _round_trip(b, topic, [ser(u, ctx) for u in users])
    fresh = SchemaRegistryClient({"url": url})  # no cache: the deserializer asks the registry for the id
    de = AvroDeserializer(fresh)
    assert [de(v, ctx) for v in got] == users
    latest = client.get_latest_version(f"{topic}-value")
    assert latest.version == 1 and latest.schema.schema_type == "AVRO"
    assert fresh.get_schema(latest.schema_id).schema_type == "AVRO"
    assert client.get_subjects() == [f"{topic}-value"]


def _protobuf_classes() -> Any:
    """A Person message importing an Address from another file, built from FileDescriptorProtos at test time
    (no protoc): the serializer registers the imported file as a reference of its own subject."""
    pool = descriptor_pool.DescriptorPool()
    dep = descriptor_pb2.FileDescriptorProto(name="srtest/address.proto", package="srtest", syntax="proto3")
    address = dep.message_type.add(name="Address")
    address.field.add(name="city", number=1, type=FD.TYPE_STRING, label=FD.LABEL_OPTIONAL)
    main = descriptor_pb2.FileDescriptorProto(name="srtest/person.proto", package="srtest", syntax="proto3",
                                              dependency=["srtest/address.proto"])
    person = main.message_type.add(name="Person")
    person.field.add(name="name", number=1, type=FD.TYPE_STRING, label=FD.LABEL_OPTIONAL)
    person.field.add(name="age", number=2, type=FD.TYPE_INT32, label=FD.LABEL_OPTIONAL)
    person.field.add(name="address", number=3, type=FD.TYPE_MESSAGE, label=FD.LABEL_OPTIONAL,
                     type_name=".srtest.Address")
    pool.Add(dep)
    pool.Add(main)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("srtest.Person"))


def test_protobuf_serializer_and_deserializer_with_a_reference(registry: tuple[BrokerProcess, str]) -> None:
    b, url = registry
    person = _protobuf_classes()
    client = SchemaRegistryClient({"url": url})
    topic = unique_topic("proto")
    ctx = SerializationContext(topic, MessageField.VALUE)
    ser = ProtobufSerializer(person, client, {"use.deprecated.format": False})
    people = [person(name=f"p{i}", age=30 + i, address={"city": f"c{i}"}) for i in range(3)]
    got = _round_trip(b, topic, [ser(p, ctx) for p in people])
    de = ProtobufDeserializer(person, {"use.deprecated.format": False}, SchemaRegistryClient({"url": url}))
    assert [de(v, ctx) for v in got] == people
    assert sorted(client.get_subjects()) == sorted([f"{topic}-value", "srtest/address.proto"])
    latest = client.get_latest_version(f"{topic}-value")
    assert latest.schema.schema_type == "PROTOBUF"
    assert [(r.name, r.subject, r.version) for r in latest.schema.references] == \
        [("srtest/address.proto", "srtest/address.proto", 1)]
    ref = client.get_latest_version("srtest/address.proto")
    assert client.get_referenced_by("srtest/address.proto", ref.version) == [latest.schema_id]


def test_json_schema_serializer_and_deserializer(registry: tuple[BrokerProcess, str]) -> None:
    b, url = registry
    schema = json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
                         "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
                         "required": ["id"]})
    client = SchemaRegistryClient({"url": url})
    topic = unique_topic("json")
    ctx = SerializationContext(topic, MessageField.VALUE)
    ser = JSONSerializer(schema, client)
    orders = [{"id": i, "item": f"thing {i}"} for i in range(4)]
    got = _round_trip(b, topic, [ser(o, ctx) for o in orders])
    de = JSONDeserializer(schema, schema_registry_client=SchemaRegistryClient({"url": url}))
    assert [de(v, ctx) for v in got] == orders
    assert client.get_latest_version(f"{topic}-value").schema.schema_type == "JSON"


def _avro(*fields: dict[str, Any]) -> Schema:
    return Schema(json.dumps({"type": "record", "name": "E", "namespace": "evo", "fields": list(fields)}), "AVRO")


F_STR = {"name": "f", "type": "string"}
F_STR_DEFAULT = {"name": "f", "type": "string", "default": ""}
F_INT_DEFAULT = {"name": "f", "type": "int", "default": 0}
G = {"name": "g", "type": "string"}
G_DEFAULT = {"name": "g", "type": "string", "default": "x"}

# level -> (schemas registered in order that are accepted, the next one, refused with 409)
EVOLUTION: dict[str, tuple[list[Schema], Schema]] = {
    # readers of the new schema read the old data: a new field needs a default
    "BACKWARD": ([_avro(F_STR), _avro(F_STR, G_DEFAULT)], _avro(F_STR, G_DEFAULT, {"name": "h", "type": "int"})),
    # old readers read new data: a field without a default cannot go
    "FORWARD": ([_avro(F_STR, G), _avro(F_STR, G, {"name": "h", "type": "int"})], _avro(G)),
    "FULL": ([_avro(F_STR), _avro(F_STR, G_DEFAULT)], _avro(F_STR, G_DEFAULT, {"name": "h", "type": "int"})),
    "NONE": ([_avro(F_STR), _avro({"name": "f", "type": "int"}), _avro(G)], _avro(G)),  # the last: same schema
    # each step is compatible with the one before, the last not with the first
    "BACKWARD_TRANSITIVE": ([_avro(F_STR), _avro(G_DEFAULT)], _avro(G_DEFAULT, F_INT_DEFAULT)),
    "FORWARD_TRANSITIVE": ([_avro(F_STR_DEFAULT), _avro(G)], _avro(G, {"name": "f", "type": "int"})),
    "FULL_TRANSITIVE": ([_avro(F_STR_DEFAULT), _avro(G_DEFAULT)], _avro(G_DEFAULT, F_INT_DEFAULT)),
}


def test_schema_evolution_under_every_compatibility_level(registry: tuple[BrokerProcess, str]) -> None:
    _, url = registry
    client = SchemaRegistryClient({"url": url})
    for level, (accepted, refused) in EVOLUTION.items():
        subject = f"evo-{level.lower()}"
        assert client.set_compatibility(subject, level) == {"compatibility": level}
        ids = [client.register_schema(subject, s) for s in accepted]
        assert len(set(ids)) == len(ids) or level == "NONE", (level, ids)
        if level == "NONE":
            assert client.register_schema(subject, refused) == ids[-1]  # accepted: the same schema again
            continue
        assert client.test_compatibility(subject, refused) is False, level
        with pytest.raises(SchemaRegistryError) as exc:
            client.register_schema(subject, refused)
        assert (exc.value.http_status_code, exc.value.error_code) == (409, 409), level
        assert client.get_versions(subject) == list(range(1, len(accepted) + 1)), level
        if level.endswith("_TRANSITIVE"):  # the same step passes the level's non-transitive form
            base = level.removesuffix("_TRANSITIVE")
            client.set_compatibility(subject, base)
            client.register_schema(subject, refused)
            assert client.get_versions(subject) == list(range(1, len(accepted) + 2)), level


def test_restart_keeps_every_schema_and_id(registry: tuple[BrokerProcess, str]) -> None:
    b, url = registry
    client = SchemaRegistryClient({"url": url})
    registered = {}
    for i in range(12):
        subject = f"keep-{i % 4}"
        schema = _avro(*({"name": f"f{j}", "type": "string", "default": ""} for j in range(i // 4 + 1)))
        registered[(subject, i // 4 + 1)] = client.register_schema(subject, schema)
    client.set_compatibility("keep-0", "FULL")
    client.delete_version("keep-1", 1)
    b.restart()
    wait_until(lambda: _answers(url), timeout=20, what="the schema registry to answer after the restart")
    after = SchemaRegistryClient({"url": url})
    for (subject, version), schema_id in registered.items():
        if (subject, version) == ("keep-1", 1):
            assert after.get_versions(subject) == [2, 3]
            continue
        assert after.get_version(subject, version).schema_id == schema_id
    assert after.get_compatibility("keep-0") == "FULL"
    # the next id comes after every id handed out before the restart
    new_id = after.register_schema("keep-new", _avro({"name": "z", "type": "long"}))
    assert new_id == max(registered.values()) + 1


def test_bad_input_gets_a_clear_error_and_kafka_clients_go_on(registry: tuple[BrokerProcess, str]) -> None:
    b, url = registry
    client = SchemaRegistryClient({"url": url})
    cases = [
        Schema("{\"type\": \"record\", \"name\": \"R\", \"fields\": [{\"name\": \"a\", \"type\": \"strin\"}]}", "AVRO"),
        Schema("syntax = \"proto3\"; message M { strin a = 1; }", "PROTOBUF"),
        Schema("{\"type\": 12}", "JSON"),
        Schema(json.dumps({"type": "record", "name": "R", "fields": [{"name": "o", "type": "other.T"}]}), "AVRO",
               [SchemaReference("other.T", "no-such-subject", 1)]),
    ]
    for schema in cases:
        with pytest.raises(SchemaRegistryError) as exc:
            client.register_schema("bad-value", schema)
        assert (exc.value.http_status_code, exc.value.error_code) == (422, 42201), schema.schema_str
        assert exc.value.error_message
    assert "no-such-subject" in str(exc.value.error_message)
    with httpx.Client(base_url=url, timeout=10) as http:
        r = http.post("/subjects/bad-value/versions", content=b'{"schema": ',
                      headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        assert (r.status_code, r.json()["error_code"]) == (400, 400)
        r = http.post("/subjects/bad-value/versions", content=b"x" * (5 << 20),
                      headers={"Content-Type": "application/json"})
        assert (r.status_code, r.json()["error_code"]) == (413, 413)
    with pytest.raises(SchemaRegistryError) as exc:
        client.get_latest_version("bad-value")
    assert exc.value.error_code == 40401
    topic = unique_topic("after-bad")
    assert _round_trip(b, topic, [b"still", b"serving"]) == [b"still", b"serving"]
    assert "Traceback" not in b.log()
