"""``pykbroker scram`` with the embedded metadata store: the first SCRAM user written into a stopped
broker's data directory, then a broker with no listener but SASL_PLAINTEXT that lets that user in (a
real client) and no one else; refused while the broker holds the directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess, free_port
from tests.support.consume import poll_values

TIMEOUT = 30.0
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# What the broker logs in with on its inter-broker listener, which is its only listener here.
JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="admin-secret";'


def scram(*args: object, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    return subprocess.run([sys.executable, "-m", "pykbroker", "scram", *map(str, args)], input=stdin,
                          capture_output=True, text=True, timeout=60, env=env)


def _client(port: int, user: str, password: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password,
            "broker.address.family": "v4", **extra}


def _auth_errors(conf: dict[str, Any]) -> list[KafkaError]:
    """The errors a client reports while it connects (bounded: 10 s)."""
    errors: list[KafkaError] = []
    p = Producer({**conf, "error_cb": lambda e: errors.append(e)})
    for _ in range(100):
        if errors:
            break
        p.poll(0.1)
    return errors


def _roundtrip(conf: dict[str, Any]) -> list[bytes]:
    topic = f"first-user-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT)
    p = Producer(conf)
    for i in range(5):
        p.produce(topic, f"m{i}".encode())
    assert p.flush(TIMEOUT) == 0
    c = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    try:
        return poll_values(c, lambda got: len(got) >= 5, TIMEOUT)
    finally:
        c.close()


def test_first_user_written_offline_logs_in_to_a_sasl_only_broker(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    props = tmp_path / "server.properties"
    settings = {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}", "log.dirs": str(data),
        "sasl.enabled.mechanisms": "SCRAM-SHA-512", "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": JAAS,
        "authorizer.class.name": AUTHORIZER, "super.users": "User:admin", "allow.everyone.if.no.acl.found": "false",
    }
    props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    secret = tmp_path / "admin.password"
    secret.write_text("admin-secret\n")
    secret.chmod(0o600)

    r = scram("add", "--config", props, "--user", "admin", "--mechanism", "SCRAM-SHA-512", "--iterations", 8192,
              "--password-file", secret)
    assert (r.returncode, r.stdout, r.stderr) == (0, "Completed updating config for user admin.\n", "")
    stored = (data / "__pykbroker_metadata.json").read_text()
    assert "admin-secret" not in stored  # salted keys only
    assert json.loads(stored)["scram_credentials"]["admin"]["SCRAM-SHA-512"].endswith(",iterations=8192")
    r = scram("list", "--log-dirs", data)
    assert r.stdout == "SCRAM credential configs for user-principal 'admin' are SCRAM-SHA-512=iterations=8192\n"

    broker = BrokerProcess(tmp_path / "broker", settings, port=port)  # ApiVersions is answered before login
    broker.extra_args = ["--config", str(props)]
    broker.start()
    try:
        assert _roundtrip(_client(port, "admin", "admin-secret")) == [f"m{i}".encode() for i in range(5)]
        wrong = _auth_errors(_client(port, "admin", "not-the-password"))
        assert wrong and wrong[0].code() == KafkaError._AUTHENTICATION
        assert "invalid credentials with SASL mechanism SCRAM-SHA-512" in wrong[0].str()

        # a running broker holds the data directory: the command refuses, saying why, and writes nothing
        before = (data / "__pykbroker_metadata.json").read_bytes()
        r = scram("add", "--config", props, "--user", "bob", "--mechanism", "SCRAM-SHA-512", "--password", "b")
        assert r.returncode == 1 and r.stdout == ""
        assert f"Failed to acquire lock on file .lock in {data}" in r.stderr and "Stop the broker" in r.stderr
        assert (data / "__pykbroker_metadata.json").read_bytes() == before
    finally:
        assert broker.stop() == 0

    # stopped: the kafka-configs form adds bob, who logs in after the restart; admin still does
    r = scram("add", "--log-dirs", data, "--user", "bob", "--add-config",
              "SCRAM-SHA-512=[iterations=4096,password=bob-secret]")
    assert r.returncode == 0, r.stderr
    broker.start()
    try:
        assert not _auth_errors(_client(port, "bob", "bob-secret"))
        assert not _auth_errors(_client(port, "admin", "admin-secret"))
    finally:
        assert broker.stop() == 0
    r = scram("delete", "--config", props, "--user", "bob")
    assert (r.returncode, r.stdout) == (0, "Completed updating config for user bob.\n")
    r = scram("list", "--config", props)
    assert r.stdout == "SCRAM credential configs for user-principal 'admin' are SCRAM-SHA-512=iterations=8192\n"


def test_a_broker_does_not_start_on_a_data_directory_another_process_holds(tmp_path: Path) -> None:
    """The same lock keeps a second broker off a running broker's data directory."""
    data = tmp_path / "data"
    first = BrokerProcess(tmp_path / "one", {"log.dirs": str(data)}).start()
    second = BrokerProcess(tmp_path / "two", {"log.dirs": str(data)})
    try:
        try:
            second.start(timeout=30)
        except RuntimeError as e:
            assert "exited with 1" in str(e)
        else:
            raise AssertionError("a second broker started on the same data directory")
        assert f"cannot start: Failed to acquire lock on file .lock in {data}" in second.log()
    finally:
        second.kill()
        first.stop()


def test_refusals_are_one_line_with_exit_status_1(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    cases: list[tuple[list[object], str]] = [
        (["add", "--log-dirs", data, "--user", "a", "--mechanism", "SCRAM-SHA-256", "--iterations", 100,
          "--password", "x"], "Too few iterations: 100 (at least 4096)"),
        (["add", "--log-dirs", data, "--user", "a", "--mechanism", "SCRAM-SHA-256", "--iterations", 20000,
          "--password", "x"], "Too many iterations: 20000 (at most 16384)"),
        (["add", "--log-dirs", data, "--user", "", "--mechanism", "SCRAM-SHA-256", "--password", "x"],
         "Username must not be empty"),
        (["add", "--log-dirs", data, "--user", "a", "--add-config", "SCRAM-SHA-1=[password=x]"],
         "Unknown SCRAM mechanism 'SCRAM-SHA-1'"),
        (["add", "--log-dirs", data, "--user", "a", "--add-config", "SCRAM-SHA-256=[salt=x]"],
         "unknown entry 'salt'"),
        (["add", "--log-dirs", data, "--user", "a", "--password", "x"], "name the mechanisms"),
        (["add", "--log-dirs", data, "--user", "a", "--mechanism", "SCRAM-SHA-256"], "no password"),
        (["delete", "--log-dirs", data, "--user", "nobody"],
         "Attempt to delete a user credential that does not exist: user nobody"),
        (["list", "--log-dirs", data, "--user", "nobody"],
         "Attempt to describe a user credential that does not exist: nobody"),
        (["list", "--config", tmp_path / "missing.properties"], "cannot read config file"),
        (["list", "--log-dirs", tmp_path / "mistyped"], "is not a directory: no broker has run there"),
    ]
    for args, message in cases:
        r = scram(*args, stdin="")
        assert r.returncode == 1 and r.stdout == "" and len(r.stderr.splitlines()) == 1, (args, r)
        assert r.stderr.startswith("error: ") and message in r.stderr, (args, r.stderr)
    assert not (data / "__pykbroker_metadata.json").exists()  # nothing was written


def test_the_password_can_come_from_stdin(tmp_path: Path) -> None:
    data = tmp_path / "data"
    r = scram("add", "--log-dirs", data, "--user", "carol", "--mechanism", "SCRAM-SHA-256",
              "--mechanism", "SCRAM-SHA-512", "--password-file", "-", stdin="carol-secret\n")
    assert r.returncode == 0, r.stderr
    from pykbroker.metadata.embedded import EmbeddedMetadataStore
    from pykbroker.security.sasl.scram import ScramClient, ScramCredential, ScramServer

    store = EmbeddedMetadataStore.offline(data)
    try:
        creds = store.scram_credentials("carol")
    finally:
        store.close()
    assert sorted(creds) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    for mech, cred in creds.items():  # the stored keys verify the password read from stdin, not its newline
        def lookup(_user: str, _mech: str, found: ScramCredential = cred) -> ScramCredential:
            return found

        server = ScramServer(mech, lookup)
        client = ScramClient(mech, "carol", "carol-secret")
        client.verify_server_final(server.evaluate(client.final_message(server.evaluate(client.first_message()))))
        assert server.complete
