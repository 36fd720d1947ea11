"""The transaction coordinator's requests to other brokers (cluster mode).

A transaction spans partitions led by several brokers: its coordinator writes the markers of
the partitions it does not lead with WriteTxnMarkers to their leaders, and a partition leader
checks a transaction's first batch with its coordinator (AddPartitionsToTxn v5, ``verify_only``,
KIP-890) when that coordinator is another broker, as Kafka's brokers do (so does a group coordinator
before a transaction's first offsets). One connection per
broker, one request at a time on it; a failure closes it and the caller's retry reconnects, except
that a kept connection the peer closed (it restarted) is retried at once on a new one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from pykbroker.protocol.framing import BrokerConnectionError
from pykbroker.replication.client import BrokerClient

log = logging.getLogger("pykbroker.txn")

WRITE_TXN_MARKERS = 27
WRITE_TXN_MARKERS_VERSION = 1  # flexible
ADD_PARTITIONS_TO_TXN = 24
# As Kafka's brokers, the latest version: 4 brought verify_only (KIP-890), 5 answers TRANSACTION_ABORTABLE
# (a version 4 answer turns it into INVALID_TXN_STATE, which the caller could no longer tell apart).
ADD_PARTITIONS_TO_TXN_VERSION = 5

TopicPartition = tuple[str, int]
# How a connection opened before the peer restarted fails on its next request.
_CLOSED_BY_PEER = (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError, BrokenPipeError)


class InterBrokerClients:
    """Connections to the other brokers' inter-broker endpoints, made on first use."""

    def __init__(self, endpoint_of: Callable[[int], tuple[str, int] | None], *, client_id: str,
                 timeout_s: float) -> None:
        self._endpoint_of = endpoint_of
        self._client_id = client_id
        self._timeout_s = timeout_s
        self._clients: dict[int, tuple[BrokerClient, anyio.Lock]] = {}

    def _client(self, broker_id: int) -> tuple[BrokerClient, anyio.Lock] | None:
        endpoint = self._endpoint_of(broker_id)
        if endpoint is None:
            return None
        known = self._clients.get(broker_id)
        if known is not None and (known[0].host, known[0].port) == endpoint:
            return known
        client = BrokerClient(endpoint[0], endpoint[1], client_id=self._client_id, timeout_s=self._timeout_s)
        self._clients[broker_id] = (client, anyio.Lock())
        return self._clients[broker_id]

    async def write_markers(self, broker_id: int, producer_id: int, producer_epoch: int, commit: bool,
                            coordinator_epoch: int, partitions: Iterable[TopicPartition]
                            ) -> dict[TopicPartition, ErrorCode]:
        """One marker on each partition (all led by ``broker_id``); the leader's code for each.

        A broker that cannot be reached answers COORDINATOR_NOT_AVAILABLE for all: the markers are retried.
        """
        parts = sorted(partitions)
        by_topic: dict[str, list[int]] = {}
        for topic, index in parts:
            by_topic.setdefault(topic, []).append(index)
        body = {"markers": [{"producer_id": producer_id, "producer_epoch": producer_epoch,
                             "transaction_result": commit, "coordinator_epoch": coordinator_epoch,
                             "topics": [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]}]}
        resp = await self._request(broker_id, WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION, body)
        if resp is None:
            return dict.fromkeys(parts, ErrorCode.coordinator_not_available)
        out = dict.fromkeys(parts, ErrorCode.unknown_server_error)
        for marker in resp.markers:
            for topic in marker.topics:
                for p in topic.partitions:
                    out[(topic.name, int(p.partition_index))] = ErrorCode(int(p.error_code))
        return out

    async def verify(self, broker_id: int, transactional_id: str, producer_id: int, producer_epoch: int,
                     tp: TopicPartition) -> ErrorCode:
        """Ask the coordinator whether ``tp`` is in the producer's transaction (changes nothing there).

        As Kafka's AddPartitionsToTxnManager: COORDINATOR_NOT_AVAILABLE when the coordinator has no
        endpoint, NETWORK_EXCEPTION when the request failed, INVALID_TXN_STATE when this broker was not
        allowed to ask (CLUSTER_AUTHORIZATION_FAILED is not the client's error).
        """
        if self._endpoint_of(broker_id) is None:
            return ErrorCode.coordinator_not_available
        body = {"transactions": [{"transactional_id": transactional_id, "producer_id": producer_id,
                                  "producer_epoch": producer_epoch, "verify_only": True,
                                  "topics": [{"name": tp[0], "partitions": [tp[1]]}]}]}
        resp = await self._request(broker_id, ADD_PARTITIONS_TO_TXN, ADD_PARTITIONS_TO_TXN_VERSION, body)
        if resp is None:
            return ErrorCode.network_exception
        if int(resp.error_code) == ErrorCode.cluster_authorization_failed:
            return ErrorCode.invalid_txn_state
        if int(resp.error_code) != 0:
            return ErrorCode(int(resp.error_code))
        for result in resp.results_by_transaction:
            for topic in result.topic_results:
                for p in topic.results_by_partition:
                    if topic.name == tp[0] and int(p.partition_index) == tp[1]:
                        return ErrorCode(int(p.partition_error_code))
        return ErrorCode.unknown_server_error

    async def _request(self, broker_id: int, api_key: int, version: int, body: dict[str, Any]) -> Any:
        known = self._client(broker_id)
        if known is None:
            return None
        client, lock = known
        async with lock:
            for attempt in range(2):
                reused = client.connected
                try:
                    return await client.request(api_key, version, body)
                except BrokerConnectionError as e:
                    if attempt == 0 and reused and isinstance(e.__cause__, _CLOSED_BY_PEER):
                        continue  # kept from before the peer restarted: once more on a new connection
                    log.info("request %(api_key)d to broker %(broker_id)d failed: %(error)s",
                             {"api_key": api_key, "broker_id": broker_id, "error": e})
                    return None
        return None

    async def close(self) -> None:
        for client, _ in self._clients.values():
            await client.close()
        self._clients.clear()
