"""Produce requests a broker makes for delayed delivery in a cluster (inter-broker listener).

Two uses, each with its own connections so that one cannot hold up the other: forwarding a
client's delayed records to the leader of their ``__delayed_records`` partition, and delivering due
records to the leader of their target partition. Both are acks=-1 Produce requests.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.inter_broker import InterBrokerClients

PRODUCE = 0
PRODUCE_VERSION = 9  # flexible; what the delivering idempotent batches need (v3+)


class ProduceClients(InterBrokerClients):
    """One connection per broker, one request at a time on it (see InterBrokerClients)."""

    async def produce(self, broker_id: int, topic: str, partition: int, records: bytes, timeout_ms: int
                      ) -> ErrorCode | None:
        """Append one batch with acks=-1; the leader's code, or None when it could not be reached."""
        body = {"transactional_id": None, "acks": -1, "timeout": timeout_ms,
                "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}]}
        resp = await self._request(broker_id, PRODUCE, PRODUCE_VERSION, body)
        if resp is None:
            return None
        for t in resp.responses:
            for p in t.partition_responses:
                if t.name == topic and int(p.index) == partition:
                    return ErrorCode(int(p.error_code))
        return ErrorCode.unknown_server_error
