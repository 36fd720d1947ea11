"""The schema registry's REST API endpoint by endpoint, against a broker subprocess with the registry on.

The table is derived from Confluent's Schema Registry API reference
(https://docs.confluent.io/platform/current/schema-registry/develop/api.html, and its per-endpoint pages such as
https://docs.confluent.io/cloud/current/ccloud/register/ and
https://docs.confluent.io/cloud/current/ccloud/test-compatibility-by-subject-name/): each row is a request and
the status and error code (or body) the reference documents for it. The rows run in order: each builds on the
registry state the rows before it left."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.integration.conftest import BrokerFactory, wait_until
from tests.support.broker import BrokerProcess, free_port

CT = "application/vnd.schemaregistry.v1+json"


def avro(name: str, *fields: tuple[str, str, Any]) -> str:
    """An Avro record; each field is (name, type, default), ``...`` for no default."""
    out = []
    for f, t, default in fields:
        d: dict[str, Any] = {"name": f, "type": t}
        if default is not ...:
            d["default"] = default
        out.append(d)
    return json.dumps({"type": "record", "name": name, "namespace": "test", "fields": out})


S1 = avro("A", ("a", "string", ...))
S2 = avro("A", ("a", "string", ...), ("b", "string", "x"))  # backward compatible with S1
S3 = avro("A", ("a", "string", ...), ("c", "int", ...))  # not backward compatible with S2
S4 = avro("A", ("a", "string", ...), ("d", "long", 0))
INNER = avro("Inner", ("x", "string", ...))
OUTER = json.dumps({"type": "record", "name": "Outer", "namespace": "test",
                    "fields": [{"name": "inner", "type": "test.Inner"}]})
INNER_REF = [{"name": "test.Inner", "subject": "inner", "version": 1}]


def record_named(name: str) -> Callable[[Any], bool]:
    return lambda body: json.loads(body)["name"] in (name, f"test.{name}")


def messages_given(body: Any) -> bool:
    return body["is_compatible"] is False and len(body["messages"]) > 0


# (method, path, body, expected status, expected: an int error_code, a JSON value the answer must equal (a dict:
# the keys given), or a predicate over the answer)
TABLE: list[tuple[str, str, Any, int, Any]] = [
    ("GET", "/", None, 200, {}),
    ("GET", "/schemas/types", None, 200, ["AVRO", "JSON", "PROTOBUF"]),
    ("GET", "/subjects", None, 200, []),
    ("GET", "/config", None, 200, {"compatibilityLevel": "BACKWARD"}),
    ("GET", "/mode", None, 200, {"mode": "READWRITE"}),
    # register, one id per schema across subjects
    ("POST", "/subjects/t-value/versions", {"schema": S1}, 200, {"id": 1}),
    ("POST", "/subjects/t-value/versions", {"schema": S1, "schemaType": "AVRO"}, 200, {"id": 1}),
    ("POST", "/subjects/u-value/versions", {"schema": S1}, 200, {"id": 1}),
    ("POST", "/subjects/t-value/versions", {"schema": S2}, 200, {"id": 2}),
    ("POST", "/subjects/t-value/versions", {"schema": S3}, 409, 409),
    ("GET", "/subjects", None, 200, ["t-value", "u-value"]),
    ("GET", "/subjects?subjectPrefix=t", None, 200, ["t-value"]),
    ("GET", "/subjects/t-value/versions", None, 200, [1, 2]),
    ("GET", "/subjects/nope/versions", None, 404, 40401),
    ("GET", "/subjects/t-value/versions/latest", None, 200, {"subject": "t-value", "version": 2, "id": 2}),
    ("GET", "/subjects/t-value/versions/-1", None, 200, {"version": 2}),
    ("GET", "/subjects/t-value/versions/1", None, 200, {"subject": "t-value", "version": 1, "id": 1}),
    ("GET", "/subjects/t-value/versions/3", None, 404, 40402),
    ("GET", "/subjects/nope/versions/1", None, 404, 40401),
    ("GET", "/subjects/t-value/versions/abc", None, 422, 42202),
    ("GET", "/subjects/t-value/versions/0", None, 422, 42202),
    ("GET", "/subjects/t-value/versions/1/schema", None, 200, record_named("A")),
    ("GET", "/subjects/t-value/versions/9/schema", None, 404, 40402),
    ("GET", "/subjects/t-value/versions/1/referencedby", None, 200, []),
    ("GET", "/subjects/nope/versions/1/referencedby", None, 404, 40401),
    ("GET", "/schemas/ids/1", None, 200, lambda b: record_named("A")(b["schema"]) and "schemaType" not in b),
    ("GET", "/schemas/ids/1/schema", None, 200, record_named("A")),
    ("GET", "/schemas/ids/1/subjects", None, 200, ["t-value", "u-value"]),
    ("GET", "/schemas/ids/1/versions", None, 200, [{"subject": "t-value", "version": 1},
                                                   {"subject": "u-value", "version": 1}]),
    ("GET", "/schemas/ids/99", None, 404, 40403),
    ("GET", "/schemas/ids/99/schema", None, 404, 40403),
    ("GET", "/schemas/ids/99/subjects", None, 404, 40403),
    ("GET", "/schemas/ids/99/versions", None, 404, 40403),
    ("GET", "/schemas?subjectPrefix=u", None, 200, lambda b: [(d["subject"], d["id"]) for d in b] == [("u-value", 1)]),
    # lookup
    ("POST", "/subjects/t-value", {"schema": S1}, 200, {"subject": "t-value", "version": 1, "id": 1}),
    ("POST", "/subjects/t-value", {"schema": S3}, 404, 40403),
    ("POST", "/subjects/nope", {"schema": S1}, 404, 40401),
    # compatibility
    ("POST", "/compatibility/subjects/t-value/versions/latest", {"schema": S3}, 200, {"is_compatible": False}),
    ("POST", "/compatibility/subjects/t-value/versions/latest?verbose=true", {"schema": S3}, 200, messages_given),
    ("POST", "/compatibility/subjects/t-value/versions/1", {"schema": S2}, 200, {"is_compatible": True}),
    ("POST", "/compatibility/subjects/t-value/versions", {"schema": S4}, 200, {"is_compatible": True}),
    ("POST", "/compatibility/subjects/t-value/versions/9", {"schema": S2}, 404, 40402),
    ("POST", "/compatibility/subjects/nope/versions/1", {"schema": S2}, 404, 40401),
    ("POST", "/compatibility/subjects/t-value/versions/x", {"schema": S2}, 422, 42202),
    ("POST", "/compatibility/subjects/t-value/versions/latest", {"schema": "{\"type\": \"recrod\"}"}, 422, 42201),
    # config
    ("GET", "/config/t-value", None, 404, 40408),
    ("GET", "/config/t-value?defaultToGlobal=true", None, 200, {"compatibilityLevel": "BACKWARD"}),
    ("PUT", "/config/t-value", {"compatibility": "NONE"}, 200, {"compatibility": "NONE"}),
    ("PUT", "/config/t-value", {"compatibility": "SIDEWAYS"}, 422, 42203),
    ("GET", "/config/t-value", None, 200, {"compatibilityLevel": "NONE"}),
    ("POST", "/subjects/t-value/versions", {"schema": S3}, 200, {"id": 3}),
    ("DELETE", "/config/t-value", None, 200, {"compatibilityLevel": "NONE"}),
    ("GET", "/config/t-value", None, 404, 40408),
    ("PUT", "/config", {"compatibility": "FULL"}, 200, {"compatibility": "FULL"}),
    ("GET", "/config", None, 200, {"compatibilityLevel": "FULL"}),
    ("GET", "/config/u-value?defaultToGlobal=true", None, 200, {"compatibilityLevel": "FULL"}),
    ("DELETE", "/config", None, 200, {"compatibilityLevel": "FULL"}),
    ("GET", "/config", None, 200, {"compatibilityLevel": "BACKWARD"}),
    # mode
    ("GET", "/mode/t-value", None, 404, 40409),
    ("GET", "/mode/t-value?defaultToGlobal=true", None, 200, {"mode": "READWRITE"}),
    ("PUT", "/mode/t-value", {"mode": "READONLY"}, 200, {"mode": "READONLY"}),
    ("GET", "/mode/t-value", None, 200, {"mode": "READONLY"}),
    ("POST", "/subjects/t-value/versions", {"schema": S4}, 422, 42205),
    ("DELETE", "/subjects/t-value/versions/1", None, 422, 42205),
    ("PUT", "/mode/t-value", {"mode": "SIDEWAYS"}, 422, 42204),
    ("DELETE", "/mode/t-value", None, 200, {"mode": "READONLY"}),
    ("GET", "/mode/t-value", None, 404, 40409),
    ("PUT", "/mode", {"mode": "IMPORT"}, 422, 42205),  # not into a registry that has subjects
    ("POST", "/subjects/imp/versions", {"schema": S4, "id": 100}, 422, 42205),  # an id of its own: IMPORT only
    ("PUT", "/mode/imp", {"mode": "IMPORT"}, 200, {"mode": "IMPORT"}),
    ("POST", "/subjects/imp/versions", {"schema": S4, "id": 100, "version": 5}, 200, {"id": 100}),
    ("POST", "/subjects/imp/versions", {"schema": S1, "id": 100, "version": 6}, 422, 42205),  # id taken
    ("GET", "/subjects/imp/versions/5", None, 200, {"version": 5, "id": 100}),
    ("PUT", "/mode/imp", {"mode": "READWRITE"}, 200, {"mode": "READWRITE"}),
    # deletes: soft first, then permanent
    ("DELETE", "/subjects/t-value/versions/1?permanent=true", None, 404, 40407),
    ("DELETE", "/subjects/t-value/versions/1", None, 200, 1),
    ("DELETE", "/subjects/t-value/versions/1", None, 404, 40406),
    ("DELETE", "/subjects/t-value/versions/9", None, 404, 40402),
    ("DELETE", "/subjects/t-value/versions/x", None, 422, 42202),
    ("GET", "/subjects/t-value/versions", None, 200, [2, 3]),
    ("GET", "/subjects/t-value/versions?deleted=true", None, 200, [1, 2, 3]),
    ("GET", "/subjects/t-value/versions/1", None, 404, 40402),
    ("GET", "/subjects/t-value/versions/1?deleted=true", None, 200, {"version": 1, "id": 1}),
    ("GET", "/schemas/ids/1", None, 200, lambda b: "schema" in b),  # the id still decodes
    ("DELETE", "/subjects/t-value/versions/1?permanent=true", None, 200, 1),
    ("GET", "/subjects/t-value/versions?deleted=true", None, 200, [2, 3]),
    ("DELETE", "/subjects/u-value?permanent=true", None, 404, 40405),
    ("DELETE", "/subjects/u-value", None, 200, [1]),
    ("DELETE", "/subjects/u-value", None, 404, 40404),
    ("GET", "/subjects", None, 200, ["imp", "t-value"]),
    ("GET", "/subjects?deleted=true", None, 200, ["imp", "t-value", "u-value"]),
    ("GET", "/subjects/u-value/versions", None, 404, 40401),
    ("DELETE", "/subjects/u-value?permanent=true", None, 200, [1]),
    ("DELETE", "/subjects/u-value", None, 404, 40401),
    ("GET", "/schemas/ids/1", None, 404, 40403),  # every version that had it is gone
    # references
    ("POST", "/subjects/inner/versions", {"schema": INNER}, 200, {"id": 101}),
    ("POST", "/subjects/outer/versions", {"schema": OUTER, "references": INNER_REF}, 200, {"id": 102}),
    ("GET", "/subjects/outer/versions/1", None, 200, {"references": INNER_REF}),
    ("GET", "/subjects/inner/versions/1/referencedby", None, 200, [102]),
    ("DELETE", "/subjects/inner/versions/1", None, 422, 42206),
    ("DELETE", "/subjects/inner", None, 422, 42206),
    ("POST", "/subjects/other/versions",
     {"schema": OUTER, "references": [{"name": "test.Inner", "subject": "inner", "version": 7}]}, 422, 42201),
    ("POST", "/subjects/other/versions", {"schema": OUTER}, 422, 42201),
    # a subject with a "/" (as Protobuf imports are registered), sent as %2F
    ("POST", "/subjects/dir%2Fx.proto/versions", {"schema": S4}, 200, {"id": 100}),
    ("GET", "/subjects/dir%2Fx.proto/versions/latest", None, 200, {"subject": "dir/x.proto", "version": 1, "id": 100}),
    ("GET", "/schemas/ids/100/subjects", None, 200, ["dir/x.proto", "imp"]),
    ("DELETE", "/subjects/dir%2Fx.proto", None, 200, [1]),
    # bad input
    ("POST", "/subjects/x/versions", b"{not json", 400, 400),
    ("POST", "/subjects/x/versions", {"schema": "{\"type\": \"recrod\"}"}, 422, 42201),
    ("POST", "/subjects/x/versions", {"schema": S1, "schemaType": "XML"}, 422, 42201),
    ("POST", "/subjects/x/versions", {}, 422, 42201),
    ("POST", "/subjects/x/versions", [1, 2], 422, 422),
    ("PUT", "/config", b"", 422, 422),
    ("GET", "/nothing/here", None, 404, 404),
    ("GET", "/schemas/ids/abc", None, 404, 404),
    ("PATCH", "/subjects", None, 405, 405),
]


@pytest.fixture(scope="module")
def registry(module_broker_factory: BrokerFactory) -> Iterator[tuple[BrokerProcess, str]]:
    port = free_port()
    b = module_broker_factory({"pykbroker.schema.registry.listener": f"http://127.0.0.1:{port}",
                               "pykbroker.schema.registry.max.request.bytes": "65536"})
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _get_ok(url), timeout=20, what="the schema registry to answer")
    yield b, url


def _get_ok(url: str) -> bool:
    try:
        return httpx.get(url + "/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _send(client: httpx.Client, method: str, path: str, body: Any, content_type: str = CT) -> httpx.Response:
    if body is None:
        return client.request(method, path)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.request(method, path, content=raw, headers={"Content-Type": content_type})


def test_every_endpoint_as_the_reference_documents_it(registry: tuple[BrokerProcess, str]) -> None:
    _, url = registry
    failures = []
    with httpx.Client(base_url=url, timeout=20) as client:
        for i, (method, path, body, status, expected) in enumerate(TABLE):
            r = _send(client, method, path, body)
            where = f"row {i}: {method} {path} -> {r.status_code} {r.text[:300]}"
            if r.status_code != status:
                failures.append(f"{where} (expected {status})")
                continue
            assert r.headers["content-type"].startswith(CT), where
            if r.status_code >= 400:
                doc = r.json()
                if doc.get("error_code") != expected or not isinstance(doc.get("message"), str):
                    failures.append(f"{where} (expected error_code {expected})")
                continue
            if callable(expected):
                got = r.text if path.endswith("/schema") else r.json()
                if not expected(got):
                    failures.append(f"{where} (predicate failed)")
            elif isinstance(expected, dict) and expected:
                doc = r.json()
                if {k: doc.get(k) for k in expected} != expected:
                    failures.append(f"{where} (expected {expected})")
            elif r.json() != expected:
                failures.append(f"{where} (expected {expected})")
    assert not failures, "\n".join(failures)


def test_content_types_accepted_and_refused(registry: tuple[BrokerProcess, str]) -> None:
    _, url = registry
    with httpx.Client(base_url=url, timeout=20) as client:
        for ctype in ("application/vnd.schemaregistry.v1+json", "application/vnd.schemaregistry+json",
                      "application/json"):
            r = _send(client, "POST", "/subjects/ct-value/versions", {"schema": S1}, ctype)
            assert r.status_code == 200, r.text
        r = _send(client, "POST", "/subjects/ct-value/versions", {"schema": S1}, "text/plain")
        assert (r.status_code, r.json()["error_code"]) == (415, 415)


def test_bodies_beyond_the_bound_get_413_and_the_broker_keeps_serving(registry: tuple[BrokerProcess, str]) -> None:
    b, url = registry
    huge = {"schema": json.dumps({"type": "record", "name": "Big", "doc": "x" * 200_000, "fields": []})}
    with httpx.Client(base_url=url, timeout=20) as client:
        r = _send(client, "POST", "/subjects/big-value/versions", huge)
        assert (r.status_code, r.json()["error_code"]) == (413, 413)

        def chunks() -> Iterator[bytes]:  # no Content-Length: bounded while reading
            for _ in range(100):
                yield b"x" * 4096

        r = client.post("/subjects/big-value/versions", content=chunks(), headers={"Content-Type": CT})
        assert (r.status_code, r.json()["error_code"]) == (413, 413)
        assert client.get("/subjects/big-value/versions").json()["error_code"] == 40401
        assert client.get("/").status_code == 200
    assert "Traceback" not in b.log()
