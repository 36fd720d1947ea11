"""pykbroker.metadata.scram_admin: kafka-configs' argument forms and the embedded store's offline edits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pykbroker.metadata.embedded import EmbeddedMetadataStore
from pykbroker.metadata.scram_admin import (
    CredentialRequest,
    EmbeddedCredentials,
    ScramAdminError,
    add,
    delete,
    describe,
    parse_add_config,
    parse_delete_config,
)


def test_kafka_configs_add_config_form() -> None:
    # the example of Kafka's security documentation
    kafkas = "SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]"
    assert parse_add_config(kafkas) == [("SCRAM-SHA-256", "alice-secret", 8192),
                                        ("SCRAM-SHA-512", "alice-secret", None)]
    assert parse_add_config(" scram-sha-512 = [iterations=4096] ") == [("SCRAM-SHA-512", None, 4096)]
    assert parse_add_config("SCRAM-SHA-512=[password=a=b]") == [("SCRAM-SHA-512", "a=b", None)]
    for bad in ("", "SCRAM-SHA-512=password", "SCRAM-SHA-512=[iterations=many]", "SCRAM-SHA-512=[x=1]",
                "MD5=[password=x]", "SCRAM-SHA-512=[password=x] SCRAM-SHA-256=[password=y]"):
        with pytest.raises(ScramAdminError):
            parse_add_config(bad)
    assert parse_delete_config("SCRAM-SHA-512, scram-sha-256") == ["SCRAM-SHA-512", "SCRAM-SHA-256"]
    with pytest.raises(ScramAdminError):
        parse_delete_config(" , ")


def test_embedded_add_replace_describe_delete(tmp_path: Path) -> None:
    data = tmp_path / "never-started"
    with EmbeddedCredentials(data) as store:
        assert add(store, "alice", [CredentialRequest("SCRAM-SHA-256", "one", 8192),
                                    CredentialRequest("SCRAM-SHA-512", "two")]) == \
            "Completed updating config for user alice."
    assert not (data / "meta.properties").exists()  # left to the broker's first start
    with EmbeddedCredentials(data) as store:
        first_salt = store.users()["alice"]["SCRAM-SHA-256"].split(",")[0]
        add(store, "alice", [CredentialRequest("SCRAM-SHA-256", "three", 4096)])  # replaces, with a new salt
        assert describe(store, None) == [
            "SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=4096, "
            "SCRAM-SHA-512=iterations=4096"]
        assert store.users()["alice"]["SCRAM-SHA-256"].split(",")[0] != first_salt
        with pytest.raises(ScramAdminError, match="cannot be altered twice"):
            add(store, "bob", [CredentialRequest("SCRAM-SHA-256", "x"), CredentialRequest("SCRAM-SHA-256", "y")])
        with pytest.raises(ScramAdminError, match=r"does not exist: user bob \(no SCRAM credentials\)"):
            delete(store, "bob", None)
        add(store, "carol", [CredentialRequest("SCRAM-SHA-256", "c")])
        with pytest.raises(ScramAdminError, match=r"does not exist: user carol \(SCRAM-SHA-512\)"):
            delete(store, "carol", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
        assert delete(store, "carol", ["scram-sha-256"]) == "Completed updating config for user carol."
        assert set(store.users()) == {"alice"}
    # what the broker loads at start is what was written
    broker_view = EmbeddedMetadataStore(data, 0, [])
    broker_view.start()
    try:
        assert sorted(broker_view.scram_credentials("alice")) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    finally:
        broker_view.close()
    with EmbeddedCredentials(data) as store:
        delete(store, "alice", None)
        assert store.users() == {} and describe(store, None) == []


def test_another_process_holding_the_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from pykbroker.metadata.embedded import "
         "lock_data_dir; lock_data_dir(Path(sys.argv[1])); print('locked', flush=True); sys.stdin.read()",
         str(data)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(ScramAdminError, match=r"Failed to acquire lock on file \.lock in .*Stop the broker"):
            EmbeddedCredentials(data)
    finally:
        holder.kill()
        holder.wait(10)
    with EmbeddedCredentials(data) as store:  # released when that process ended
        assert store.users() == {}
