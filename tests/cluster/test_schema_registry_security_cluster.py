"""The schema registry's security in a two-broker ZooKeeper cluster: https registries with basic authentication
and the ACL authorizer. A write sent to the broker that is not the writer is forwarded over https (the writer's
certificate checked against the truststore) with the client's credentials, and the writer authenticates and
authorizes it again; SCRAM users and ACLs made through one broker apply on both."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.support.broker import free_port
from tests.support.certs import make_pki
from tests.support.cluster import Cluster, wait_for

pytestmark = [pytest.mark.timeout(600)]

TOPIC = "_schemas"
CT = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
TIMEOUT = 30.0
SCHEMA = json.dumps({"type": "record", "name": "Order", "namespace": "sec",
                     "fields": [{"name": "id", "type": "long"}]})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, dict[int, str], Path]]:
    base = tmp_path_factory.mktemp("sr-sec-cluster")
    pki = make_pki(base / "pki")
    urls = {i: f"https://127.0.0.1:{free_port()}" for i in (1, 2)}
    c = Cluster(base, 2, overrides={
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:ANONYMOUS",  # the PLAINTEXT inter-broker and admin connections
        "pykbroker.schema.registry.authentication": "basic",
        "pykbroker.schema.registry.topic.replication.factor": "2",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.server.pem),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(pki.ca.cert_path),
    }, broker_overrides={i: {"pykbroker.schema.registry.listener": u} for i, u in urls.items()})
    with c:
        c.wait_leaders(TOPIC, 1, timeout=90)
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        users = [UserScramCredentialUpsertion(u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), p.encode())
                 for u, p in (("ci", "ci-pass-0x61"), ("viewer", "viewer-pass-0x62"))]
        for f in admin.alter_user_scram_credentials(users).values():
            f.result(TIMEOUT)
        acls = [AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:ci", "*",
                           AclOperation.WRITE, AclPermissionType.ALLOW),
                AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:viewer", "*",
                           AclOperation.DESCRIBE, AclPermissionType.ALLOW)]
        for f in admin.create_acls(acls).values():
            f.result(TIMEOUT)
        yield c, urls, pki.ca.cert_path


def _post(url: str, ca: Path, user: str, password: str) -> httpx.Response:
    return httpx.post(f"{url}/subjects/orders-value/versions", content=json.dumps({"schema": SCHEMA}), headers=CT,
                      auth=(user, password), verify=ssl.create_default_context(cafile=str(ca)), timeout=40)


def test_forwarded_writes_are_authenticated_and_authorized(cluster: tuple[Cluster, dict[int, str], Path]) -> None:
    c, urls, ca = cluster
    writer = c.leaders(TOPIC)[0]
    follower = next(i for i in urls if i != writer)

    # Users and ACLs reach both brokers through ZooKeeper: poll until the follower's registry knows ci.
    deadline = time.monotonic() + TIMEOUT
    r = _post(urls[follower], ca, "ci", "ci-pass-0x61")
    while r.status_code in (401, 403) and time.monotonic() < deadline:
        time.sleep(0.2)
        r = _post(urls[follower], ca, "ci", "ci-pass-0x61")
    assert r.status_code == 200, r.text  # forwarded to the writer over https, with ci's credentials
    schema_id = r.json()["id"]

    verify = ssl.create_default_context(cafile=str(ca))

    def visible() -> bool:
        g = httpx.get(f"{urls[follower]}/schemas/ids/{schema_id}", auth=("viewer", "viewer-pass-0x62"),
                      verify=verify, timeout=10)
        return g.status_code == 200
    wait_for(visible, timeout=TIMEOUT)

    assert _post(urls[follower], ca, "ci", "wrong").status_code == 401
    denied = _post(urls[follower], ca, "viewer", "viewer-pass-0x62")
    assert denied.status_code == 403 and denied.json()["error_code"] == 40301
    # The writer itself answers the same: the same users and ACLs on every broker.
    assert _post(urls[writer], ca, "viewer", "viewer-pass-0x62").status_code == 403
    assert _post(urls[writer], ca, "ci", "ci-pass-0x61").json()["id"] == schema_id
