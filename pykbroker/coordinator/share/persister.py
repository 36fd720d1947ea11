"""Kafka's share-group state persister: where a share-partition leader reads and writes its state.

The state of (group, topic id, partition) lives with its share coordinator, the leader of the
``__share_group_state`` partition its key hashes to.  When that is this broker the call goes to the local
:class:`ShareStateStore` without a socket; otherwise it is a ReadShareGroupState / WriteShareGroupState /
DeleteShareGroupState request on the inter-broker connection to that broker (one per broker, as the
transaction coordinator's, :class:`InterBrokerClients`).  Errors come back as Kafka's codes; retrying is
the caller's business (the share-partition leader retries writes until they succeed or time out).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

from kio.schema.errors import ErrorCode

from pykbroker.coordinator.inter_broker import InterBrokerClients
from pykbroker.coordinator.share import serde
from pykbroker.coordinator.share.partition import RecordState, StateBatch
from pykbroker.coordinator.share.state_store import ShareStateStore
from pykbroker.protocol.responses.share import StateBatch as StateBatchBody

READ_SHARE_GROUP_STATE = 84
WRITE_SHARE_GROUP_STATE = 85
DELETE_SHARE_GROUP_STATE = 86

Items = Sequence[tuple[serde.StateKey, serde.Snapshot | None]]


def batches_body(batches: Sequence[StateBatch]) -> list[StateBatchBody]:
    return [{"first_offset": b.first_offset, "last_offset": b.last_offset, "delivery_state": int(b.state),
             "delivery_count": b.delivery_count} for b in batches]


def batches_from(wire: Any) -> tuple[StateBatch, ...]:
    return tuple(StateBatch(int(b.first_offset), int(b.last_offset), RecordState(int(b.delivery_state)),
                            int(b.delivery_count)) for b in wire)


class ShareStateClients(InterBrokerClients):
    """The share coordinator APIs on the other brokers' inter-broker endpoints."""

    async def read_state(self, broker_id: int, key: serde.StateKey, leader_epoch: int
                         ) -> tuple[ErrorCode, serde.Snapshot | None]:
        body = {"group_id": key.group_id, "topics": [{"topic_id": key.topic_id, "partitions": [
            {"partition": key.partition, "leader_epoch": leader_epoch}]}]}
        resp = await self._request(broker_id, READ_SHARE_GROUP_STATE, 0, body)
        if resp is None:
            return ErrorCode.coordinator_not_available, None
        for t in resp.results:
            for p in t.partitions:
                code = ErrorCode(int(p.error_code))
                if code != ErrorCode.none:
                    return code, None
                if int(p.start_offset) < 0:
                    return ErrorCode.none, None  # no state yet
                return ErrorCode.none, serde.Snapshot(int(p.state_epoch), leader_epoch, int(p.start_offset),
                                                      batches_from(p.state_batches))
        return ErrorCode.unknown_server_error, None

    async def write_state(self, broker_id: int, group_id: str, items: Items) -> dict[serde.StateKey, ErrorCode]:
        """Snapshots of one group's share-partitions (a None snapshot deletes the key: DeleteShareGroupState)."""
        out: dict[serde.StateKey, ErrorCode] = {}
        writes = [(k, s) for k, s in items if s is not None]
        deletes = [k for k, s in items if s is None]
        if writes:
            by_topic: dict[uuid.UUID, list[dict[str, Any]]] = {}
            for k, s in writes:
                assert s is not None
                by_topic.setdefault(k.topic_id, []).append({
                    "partition": k.partition, "state_epoch": s.state_epoch, "leader_epoch": s.leader_epoch,
                    "start_offset": s.start_offset, "state_batches": batches_body(s.batches)})
            body = {"group_id": group_id, "topics": [{"topic_id": t, "partitions": ps} for t, ps in by_topic.items()]}
            out.update(self._codes(group_id, [k for k, _ in writes],
                                   await self._request(broker_id, WRITE_SHARE_GROUP_STATE, 0, body)))
        if deletes:
            parts: dict[uuid.UUID, list[dict[str, Any]]] = {}
            for k in deletes:
                parts.setdefault(k.topic_id, []).append({"partition": k.partition})
            body = {"group_id": group_id, "topics": [{"topic_id": t, "partitions": ps} for t, ps in parts.items()]}
            out.update(self._codes(group_id, deletes,
                                   await self._request(broker_id, DELETE_SHARE_GROUP_STATE, 0, body)))
        return out

    @staticmethod
    def _codes(group_id: str, keys: list[serde.StateKey], resp: Any) -> dict[serde.StateKey, ErrorCode]:
        out = dict.fromkeys(keys, ErrorCode.coordinator_not_available if resp is None else
                            ErrorCode.unknown_server_error)
        if resp is not None:
            for t in resp.results:
                for p in t.partitions:
                    key = serde.StateKey(group_id, t.topic_id, int(p.partition))
                    if key in out:
                        out[key] = ErrorCode(int(p.error_code))
        return out


class Persister:
    """Routes each key to its share coordinator: the local store, or a request to the broker leading it."""

    def __init__(self, local: ShareStateStore, broker_id: int) -> None:
        self.local = local
        self.broker_id = broker_id
        self.remote: ShareStateClients | None = None  # set in a cluster

    def set_cluster(self, endpoint_of: Callable[[int], tuple[str, int] | None], timeout_s: float) -> None:
        self.remote = ShareStateClients(endpoint_of, client_id=f"broker-{self.broker_id}-share", timeout_s=timeout_s)

    def _node(self, key: serde.StateKey) -> int | None:
        return self.local.coordinator_node(key)

    async def read(self, key: serde.StateKey, leader_epoch: int) -> tuple[ErrorCode, serde.Snapshot | None]:
        node = self._node(key)
        if node == self.broker_id:
            return await self.local.read(key, leader_epoch)
        if node is None or self.remote is None:
            return ErrorCode.coordinator_not_available, None
        return await self.remote.read_state(node, key, leader_epoch)

    async def write(self, items: Items) -> dict[serde.StateKey, ErrorCode]:
        out: dict[serde.StateKey, ErrorCode] = {}
        local: list[tuple[serde.StateKey, serde.Snapshot | None]] = []
        remote: dict[tuple[int, str], list[tuple[serde.StateKey, serde.Snapshot | None]]] = {}
        for key, snap in items:
            node = self._node(key)
            if node == self.broker_id:
                local.append((key, snap))
            elif node is None or self.remote is None:
                out[key] = ErrorCode.coordinator_not_available
            else:
                remote.setdefault((node, key.group_id), []).append((key, snap))
        if local:
            out.update(await self.local.write(local))
        for (node, group_id), group in remote.items():
            assert self.remote is not None
            out.update(await self.remote.write_state(node, group_id, group))
        return out

    async def close(self) -> None:
        if self.remote is not None:
            await self.remote.close()
