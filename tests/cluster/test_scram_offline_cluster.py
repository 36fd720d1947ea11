"""``pykbroker scram`` with ZooKeeper: the admin user written before any broker exists, in Kafka's layout;
then three brokers with one SASL_SSL listener each, logging in to each other as that user with SCRAM, and a
real client producing with acks=all and consuming. Users added and deleted while the brokers run take effect
through the brokers' watches."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from tests.support.broker import BrokerProcess, free_port, tls_healthcheck
from tests.support.certs import Pki, make_pki
from tests.support.cluster import CLUSTER_DEFAULTS, wait_for
from tests.support.consume import poll_values
from tests.support.zookeeper import ZooKeeperEnsemble

TIMEOUT = 30.0
CHROOT = "/secured"
JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" '
        'password="admin-secret";')


def scram(*args: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    return subprocess.run([sys.executable, "-m", "pykbroker", "scram", *map(str, args)], capture_output=True,
                          text=True, timeout=90, env=env)


class Secured:
    def __init__(self, base: Path) -> None:
        self.pki: Pki = make_pki(base / "pki")
        self.zk = ZooKeeperEnsemble(base / "zookeeper", 1)
        self.brokers: list[BrokerProcess] = []
        self.base = base

    @property
    def connect(self) -> str:
        return self.zk.connect + CHROOT

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def add_brokers(self) -> None:
        for broker_id in (1, 2, 3):
            port = free_port()
            b = BrokerProcess(self.base / f"broker{broker_id}", {
                **CLUSTER_DEFAULTS, "broker.id": str(broker_id), "zookeeper.connect": self.connect,
                "listeners": f"SASL_SSL://127.0.0.1:{port}", "inter.broker.listener.name": "SASL_SSL",
                "ssl.keystore.type": "PEM", "ssl.keystore.location": str(self.pki.server.pem),
                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.pki.ca.cert_path),
                "sasl.enabled.mechanisms": "SCRAM-SHA-512", "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": JAAS,
                "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "super.users": "User:admin",
                "allow.everyone.if.no.acl.found": "false",
                "default.replication.factor": "3", "min.insync.replicas": "2",
            }, port=port)
            b.ready = functools.partial(tls_healthcheck, b.bootstrap, self.pki.ca.cert_path)
            self.brokers.append(b)

    def client(self, user: str, password: str, **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password,
                "ssl.ca.location": str(self.pki.ca.cert_path), "broker.address.family": "v4", **extra}

    def logs(self) -> str:
        return "\n".join(f"==== broker {i}\n{b.log()[-4000:]}" for i, b in enumerate(self.brokers, 1))

    def close(self) -> None:
        for b in self.brokers:
            b.kill()
        self.zk.kill()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    s = Secured(tmp_path)
    try:
        s.zk.start()
        yield s
    finally:
        s.close()


def _login_errors(conf: dict[str, Any], seconds: float = 10.0) -> list[KafkaError]:
    errors: list[KafkaError] = []
    p = Producer({**conf, "error_cb": lambda e: errors.append(e)})
    for _ in range(int(seconds / 0.1)):
        if errors:
            break
        p.poll(0.1)
    return errors


def _logs_in(conf: dict[str, Any]) -> bool:
    """Whether a Metadata request after a SASL login succeeds (no ACL is needed for an empty topic list)."""
    try:
        md = AdminClient(conf).list_topics(timeout=5)
    except Exception:
        return False
    return len(md.brokers) == 3


def test_admin_written_to_zookeeper_first_runs_a_sasl_ssl_cluster(secured: Secured) -> None:
    r = scram("add", "--zookeeper", secured.connect, "--user", "admin", "--mechanism", "SCRAM-SHA-512",
              "--password", "admin-secret")
    assert (r.returncode, r.stdout) == (0, "Completed updating config for user admin.\n"), r.stderr

    # Kafka's ZooKeeper layout, as kafka-configs --zookeeper writes it (the chroot created on the way)
    zk = KazooClient(hosts=secured.zk.connect)
    zk.start(timeout=TIMEOUT)
    try:
        doc = json.loads(zk.get(f"{CHROOT}/config/users/admin")[0])
        assert doc["version"] == 1 and list(doc["config"]) == ["SCRAM-SHA-512"]
        assert re.fullmatch(r"salt=[A-Za-z0-9+/=]+,stored_key=[A-Za-z0-9+/=]+,server_key=[A-Za-z0-9+/=]+,"
                            r"iterations=4096", doc["config"]["SCRAM-SHA-512"])
        changes = zk.get_children(f"{CHROOT}/config/changes")
        assert [json.loads(zk.get(f"{CHROOT}/config/changes/{c}")[0]) for c in changes] == \
            [{"version": 2, "entity_path": "users/admin"}]
        assert not zk.exists(f"{CHROOT}/brokers/ids")  # written before any broker existed
    finally:
        zk.stop()
        zk.close()

    secured.add_brokers()
    for b in secured.brokers:
        b.start(60)
    admin_conf = secured.client("admin", "admin-secret")
    wait_for(lambda: _logs_in(admin_conf), timeout=60, what="three brokers answering admin over SASL_SSL")

    # acks=all with min.insync.replicas=2 on 3 replicas: the followers replicate over SASL_SSL as admin
    topic = f"secured-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(admin_conf)
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(TIMEOUT)
    p = Producer({**admin_conf, "acks": "all", "message.timeout.ms": 30000})
    for i in range(30):
        p.produce(topic, f"m{i}".encode(), partition=i % 3)
    assert p.flush(TIMEOUT) == 0, secured.logs()
    c = Consumer({**admin_conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    try:
        got = set(poll_values(c, lambda values: len(values) >= 30, TIMEOUT))
    finally:
        c.close()
    assert got == {f"m{i}".encode() for i in range(30)}
    for b in secured.brokers:  # each broker logged in to the others as admin (its replica fetchers)
        assert re.search(r"authenticated peer=127\.0\.0\.1:\d+ listener=SASL_SSL mechanism=SCRAM-SHA-512 "
                         r"principal=User:admin", b.log())

    # while the brokers run: a user written to ZooKeeper logs in once the watches fire; deleted, no longer
    late = secured.client("late", "late-secret")
    errors = _login_errors(late)
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION
    r = scram("add", "--zookeeper", secured.connect, "--user", "late", "--add-config",
              "SCRAM-SHA-512=[iterations=8192,password=late-secret]")
    assert r.returncode == 0, r.stderr
    each = [{**late, "bootstrap.servers": b.bootstrap} for b in secured.brokers]
    wait_for(lambda: all(_logs_in(conf) for conf in each), timeout=30, what="every broker letting the new user in")
    r = scram("list", "--zookeeper", secured.connect)
    assert r.stdout.splitlines() == [
        "SCRAM credential configs for user-principal 'admin' are SCRAM-SHA-512=iterations=4096",
        "SCRAM credential configs for user-principal 'late' are SCRAM-SHA-512=iterations=8192"]
    r = scram("delete", "--zookeeper", secured.connect, "--user", "late", "--delete-config", "SCRAM-SHA-512")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: all(any(e.code() == KafkaError._AUTHENTICATION for e in _login_errors(conf, 5))
                         for conf in each), timeout=45, what="every broker refusing the deleted user")
