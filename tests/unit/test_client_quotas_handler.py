"""AlterClientQuotas against a store whose map is a cache (ZooKeeper): every operation reaches the store."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import anyio

from pykbroker.metadata.embedded import EmbeddedMetadataStore
from pykbroker.server.handlers.quotas import handle_alter_client_quotas


class _StaleStore(EmbeddedMetadataStore):
    """A broker whose cache has not yet seen another broker's quota writes."""

    blocking = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.sent: list[dict[Any, dict[str, float | None]]] = []

    def client_quotas(self) -> dict[Any, dict[str, float]]:
        return {}

    def alter_client_quotas(self, changes: dict[Any, dict[str, float | None]]) -> None:
        self.sent.append(changes)


def _entry(remove: bool, value: float = 0.0) -> Any:
    ns = types.SimpleNamespace
    return ns(entity=[ns(entity_type="client-id", entity_name="c1")],
              ops=[ns(key="producer_byte_rate", value=value, remove=remove)])


def test_a_removal_the_cache_has_not_seen_still_reaches_the_store(tmp_path: Path) -> None:
    """A quota set through another broker and removed through this one before its cache caught up: the
    removal is written (it was dropped as a no-op, leaving the quota in ZooKeeper; compat CI failure)."""
    store = _StaleStore(tmp_path, 0, [("PLAINTEXT", "127.0.0.1", 9092)])
    store.start()
    svc: Any = types.SimpleNamespace(store=store, quotas=None)
    ctx: Any = types.SimpleNamespace(authorizer=None)
    out = anyio.run(handle_alter_client_quotas, svc, ctx,
                    types.SimpleNamespace(entries=[_entry(remove=True)], validate_only=False))
    assert out["entries"][0]["error_code"] == 0
    assert store.sent == [{(("client-id", "c1"),): {"producer_byte_rate": None}}]
