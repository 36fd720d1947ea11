"""Client quota admin through kafka-python (its own AlterClientQuotas / DescribeClientQuotas request classes:
neither confluent-kafka nor aiokafka has these calls), for the quota tests."""

from __future__ import annotations

from typing import Any

from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import AlterClientQuotasRequest, DescribeClientQuotasRequest

from tests.support.broker import BrokerProcess

Entity = tuple[tuple[str, str | None], ...]


class KpQuotas:
    """kafka-python speaking the two APIs with its own request classes."""

    def __init__(self, b: BrokerProcess, timeout_s: float = 20.0) -> None:
        self.admin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=int(timeout_s * 1000))

    def close(self) -> None:
        self.admin.close()

    def _send(self, request: Any) -> Any:
        async def call() -> Any:
            return await self.admin._manager.send(request)
        return self.admin._manager.run(call)

    def alter(self, entity: Entity, ops: dict[str, float | None],
              validate_only: bool = False) -> tuple[int, str | None]:
        r = self._send(AlterClientQuotasRequest(
            entries=[(list(entity), [(k, 0.0 if v is None else v, v is None) for k, v in ops.items()])],
            validate_only=validate_only))
        (e,) = r.entries
        return e.error_code, e.error_message

    def describe(self, components: list[tuple[str, int, str | None]], strict: bool = False) -> Any:
        return self._send(DescribeClientQuotasRequest(components=components, strict=strict))

    def entries(self, components: list[tuple[str, int, str | None]],
                strict: bool = False) -> dict[Entity, dict[str, float]]:
        r = self.describe(components, strict)
        assert r.error_code == 0, (r.error_code, r.error_message)
        return {tuple(sorted((x.entity_type, x.entity_name) for x in e.entity)): {v.key: v.value for v in e.values}
                for e in r.entries}
