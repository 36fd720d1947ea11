"""IncrementalAlterConfigs against a store whose maps are a cache (ZooKeeper): the operations build on what the
store holds now, so a change another broker just made is not silently undone by this broker's stale cache."""

from __future__ import annotations

import types
import uuid
from pathlib import Path
from typing import Any

import anyio

from pykbroker.config import OP_SET, BrokerConfig
from pykbroker.metadata.embedded import EmbeddedMetadataStore
from pykbroker.metadata.store import PartitionAssignment, TopicRecord
from pykbroker.server.handlers.configs import handle_incremental_alter_configs

TOPIC, GROUP = 2, 32


class _LaggingStore(EmbeddedMetadataStore):
    """The truth (what ZooKeeper holds) has a change the broker's cache has not seen yet."""

    blocking = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.truth_topic: dict[str, str] = {"retention.ms": "1000"}
        self.truth_group: dict[str, str] = {"consumer.session.timeout.ms": "50000"}
        self.topic_writes: list[dict[str, str]] = []
        self.entity_writes: list[dict[str, str]] = []

    def read_topic_configs(self, name: str, *, fresh: bool = False) -> dict[str, str] | None:
        if not fresh:
            return super().read_topic_configs(name)
        return dict(self.truth_topic)

    def read_entity_configs(self, resource_type: int, name: str) -> dict[str, str]:
        return dict(self.truth_group)

    def set_topic_configs(self, name: str, configs: dict[str, str]) -> TopicRecord:
        self.topic_writes.append(dict(configs))
        return super().set_topic_configs(name, configs)

    def set_entity_configs(self, resource_type: int, name: str, configs: dict[str, str]) -> None:
        self.entity_writes.append(dict(configs))


def _request(rtype: int, name: str, key: str, value: str) -> Any:
    ns = types.SimpleNamespace
    return ns(resources=[ns(resource_type=rtype, resource_name=name,
                            configs=[ns(name=key, config_operation=OP_SET, value=value)])],
              validate_only=False)


def _setup(tmp_path: Path) -> tuple[_LaggingStore, Any, Any]:
    store = _LaggingStore(tmp_path, 0, [("PLAINTEXT", "127.0.0.1", 9092)])
    store.start()
    store.create_topic(TopicRecord("t", uuid.uuid4(), {0: PartitionAssignment([0])}))
    config = BrokerConfig({"log.dirs": str(tmp_path)})
    svc: Any = types.SimpleNamespace(store=store, config=config)
    ctx: Any = types.SimpleNamespace(authorizer=None)
    return store, svc, ctx


def test_topic_set_keeps_a_change_the_cache_has_not_seen(tmp_path: Path) -> None:
    store, svc, ctx = _setup(tmp_path)
    assert store.topic("t") is not None and "retention.ms" not in store.topic("t").configs  # the cache lags
    out = anyio.run(handle_incremental_alter_configs, svc, ctx, _request(TOPIC, "t", "cleanup.policy", "compact"))
    assert out["responses"][0]["error_code"] == 0, out
    assert store.topic_writes == [{"retention.ms": "1000", "cleanup.policy": "compact"}]


def test_group_set_keeps_a_change_the_cache_has_not_seen(tmp_path: Path) -> None:
    store, svc, ctx = _setup(tmp_path)
    out = anyio.run(handle_incremental_alter_configs, svc, ctx,
                    _request(GROUP, "g", "consumer.heartbeat.interval.ms", "6000"))
    assert out["responses"][0]["error_code"] == 0, out
    assert store.entity_writes == [{"consumer.session.timeout.ms": "50000", "consumer.heartbeat.interval.ms": "6000"}]
