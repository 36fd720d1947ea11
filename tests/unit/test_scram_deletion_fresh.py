"""AlterUserScramCredentials against a store whose map is a cache (ZooKeeper): deleting a credential another
broker created a moment ago (not yet in this broker's cache) is checked against the store itself."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import anyio

from pykbroker.metadata.embedded import EmbeddedMetadataStore
from pykbroker.server.handlers.sasl import handle_alter_user_scram_credentials

SHA256 = 1


class _LaggingStore(EmbeddedMetadataStore):
    blocking = True

    def __init__(self, *args: Any, truth: set[str]) -> None:
        super().__init__(*args)
        self.truth = truth
        self.deleted: list[list[tuple[str, str]]] = []

    def scram_users(self) -> dict[str, dict[str, str]]:
        return {}  # the cache has not seen the credential yet

    def read_scram_mechanisms(self, user: str) -> set[str]:
        return set(self.truth) if user == "alice" else set()

    def alter_scram_credentials(self, upserts: dict[Any, Any], deletions: list[tuple[str, str]]) -> None:
        self.deleted.append(deletions)


def _delete(tmp_path: Path, truth: set[str]) -> tuple[_LaggingStore, dict[str, Any]]:
    store = _LaggingStore(tmp_path, 0, [("PLAINTEXT", "127.0.0.1", 9092)], truth=truth)
    store.start()
    ns = types.SimpleNamespace
    svc: Any = ns(store=store)
    ctx: Any = ns(authorizer=None, session=ns(principal="User:admin"))
    req = ns(deletions=[ns(name="alice", mechanism=SHA256)], upsertions=[])
    return store, anyio.run(handle_alter_user_scram_credentials, svc, ctx, req)


def test_a_credential_the_cache_has_not_seen_is_deleted(tmp_path: Path) -> None:
    store, out = _delete(tmp_path, {"SCRAM-SHA-256"})
    assert out["results"][0]["error_code"] == 0, out
    assert store.deleted == [[("alice", "SCRAM-SHA-256")]]


def test_a_credential_the_store_does_not_have_is_resource_not_found(tmp_path: Path) -> None:
    store, out = _delete(tmp_path, {"SCRAM-SHA-512"})
    assert out["results"][0]["error_code"] == 91, out  # RESOURCE_NOT_FOUND
    assert store.deleted == []
