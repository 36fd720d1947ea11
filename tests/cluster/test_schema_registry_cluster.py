"""The schema registry in a three-broker ZooKeeper cluster (docs/schema-registry.md "In a cluster"): every
broker serves the API, writes go to the leader of ``_schemas`` (forwarded by the others), reads come from each
broker's replica. The leader is killed with SIGKILL in the middle of a stream of registrations from clients
that retry on 5xx; afterwards every acknowledged registration is readable from every broker with its id, and
no id names two different schemas."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.broker import free_port
from tests.support.cluster import Cluster, wait_for

pytestmark = [pytest.mark.timeout(600)]

TOPIC = "_schemas"
CT = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
REGISTRATIONS = 60
KILL_AT = 20
RETRY_DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, dict[int, str]]]:
    ports = {i: free_port() for i in (1, 2, 3)}
    urls = {i: f"http://127.0.0.1:{p}" for i, p in ports.items()}
    c = Cluster(tmp_path_factory.mktemp("sr-cluster"), 3, overrides={"min.insync.replicas": "2"},
                broker_overrides={i: {"pykbroker.schema.registry.listener": u} for i, u in urls.items()})
    with c:
        c.wait_leaders(TOPIC, 1, timeout=90)
        yield c, urls


def schema(i: int) -> str:
    return json.dumps({"type": "record", "name": f"R{i}", "namespace": "cluster",
                       "fields": [{"name": f"f{i}", "type": "string"}]})


def register(url: str, subject: str, text: str) -> httpx.Response:
    return httpx.post(f"{url}/subjects/{subject}/versions", content=json.dumps({"schema": text}), headers=CT,
                      timeout=40)


def register_retrying(urls: list[str], subject: str, text: str) -> int | None:
    """As a client with several registry URLs: on a 5xx or a refused connection, the next URL; bounded."""
    deadline = time.monotonic() + RETRY_DEADLINE_S
    for attempt in range(1000):
        if time.monotonic() >= deadline:
            return None
        url = urls[attempt % len(urls)]
        try:
            r = register(url, subject, text)
        except httpx.HTTPError:
            time.sleep(0.2)
            continue
        if r.status_code == 200:
            return int(r.json()["id"])
        assert r.status_code >= 500, r.text  # anything else is a wrong answer, not a failover
        assert r.json()["error_code"] in (50001, 50002, 50003, 50004), r.text
        time.sleep(0.2)
    return None


def test_register_through_one_broker_read_through_another(cluster: tuple[Cluster, dict[int, str]]) -> None:
    c, urls = cluster
    writer = c.leaders(TOPIC)[0]
    other = next(i for i in urls if i != writer)
    third = next(i for i in urls if i not in (writer, other))
    r = register(urls[other], "across-value", schema(1000))  # forwarded to the writer
    assert r.status_code == 200, r.text
    schema_id = r.json()["id"]

    def seen() -> Any:
        g = httpx.get(f"{urls[third]}/subjects/across-value/versions/latest", timeout=10)
        return g.json() if g.status_code == 200 else None

    got = wait_for(seen, timeout=30, what="the registration on a third broker")
    assert got["id"] == schema_id and json.loads(got["schema"])["name"] in ("R1000", "cluster.R1000")
    assert httpx.get(f"{urls[third]}/schemas/ids/{schema_id}", timeout=10).status_code == 200
    r = httpx.put(f"{urls[third]}/config/across-value", content=json.dumps({"compatibility": "FULL"}),
                  headers=CT, timeout=20)
    assert r.json() == {"compatibility": "FULL"}
    got = wait_for(lambda: httpx.get(f"{urls[other]}/config/across-value", timeout=10).json()
                   .get("compatibilityLevel"), timeout=30, what="the config on another broker")
    assert got == "FULL"


def test_killing_the_writer_mid_stream_loses_and_reuses_no_id(cluster: tuple[Cluster, dict[int, str]]) -> None:
    c, urls = cluster
    r = httpx.put(f"{urls[1]}/config", content=json.dumps({"compatibility": "NONE"}), headers=CT, timeout=20)
    assert r.status_code == 200, r.text
    writer = c.leaders(TOPIC)[0]
    order = [urls[writer]] + [u for i, u in sorted(urls.items()) if i != writer]  # the writer first: kill hurts
    acked: dict[tuple[str, str], int] = {}
    for i in range(REGISTRATIONS):
        if i == KILL_AT:
            c.kill(writer)
        subject = f"stream-{i % 7}-value"
        schema_id = register_retrying(order, subject, schema(i))
        assert schema_id is not None, f"registration {i} not acknowledged within {RETRY_DEADLINE_S} s\n{c.logs()}"
        acked[(subject, schema(i))] = schema_id
    assert len(set(acked.values())) == len(acked), "one id acknowledged for two schemas"
    assert c.leaders(TOPIC)[0] != writer  # the registrations after the kill went to a new writer
    c.broker(writer).start()
    c.wait_registered(list(c.brokers), timeout=60)
    for broker_id, url in urls.items():
        for (subject, text), schema_id in acked.items():
            def found(subject: str = subject, text: str = text, url: str = url) -> Any:
                r = httpx.post(f"{url}/subjects/{subject}", content=json.dumps({"schema": text}), headers=CT,
                               timeout=10)
                return r.json() if r.status_code == 200 else None

            got = wait_for(found, timeout=60, what=f"{subject} on broker {broker_id}")
            assert got["id"] == schema_id, (broker_id, subject, got)
        # every id this broker knows names one schema
        by_id: dict[int, set[str]] = {}
        for subject in httpx.get(f"{url}/subjects?deleted=true", timeout=10).json():
            for v in httpx.get(f"{url}/subjects/{subject}/versions?deleted=true", timeout=10).json():
                doc = httpx.get(f"{url}/subjects/{subject}/versions/{v}?deleted=true", timeout=10).json()
                by_id.setdefault(doc["id"], set()).add(doc["schema"])
        assert all(len(texts) == 1 for texts in by_id.values()), (broker_id, by_id)
