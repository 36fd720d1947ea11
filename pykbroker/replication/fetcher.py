"""Follower side of replication: fetch from each partition's leader and append what it has.

One fetcher task per (leader broker, fetcher index) -- ``num.replica.fetchers`` spreads a
leader's partitions over that many connections -- sending sessionless Fetch v12 requests
with this broker's id as ``replica_id``.  Each partition fetches from its log end offset with
the latest epoch of its leader-epoch cache as ``last_fetched_epoch``; the leader's
``diverging_epoch`` answer makes it truncate (KIP-320), OFFSET_OUT_OF_RANGE makes it truncate
to the leader's range, and leadership errors park it for ``replica.fetch.backoff.ms`` until the
metadata changes its role.  Everything but the network waits runs on the broker's event loop.
"""

from __future__ import annotations

import datetime
import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc
import anyio.lowlevel
from kio.schema.errors import ErrorCode

from pykbroker.protocol.framing import BrokerConnectionError
from pykbroker.protocol.records import InvalidRecords
from pykbroker.replication.client import BrokerClient
from pykbroker.replication.rules import follower_truncation_offset
from pykbroker.storage.log import KafkaStorageError, Log, LogStartOffsetIncrementReason, OffsetOutOfRange

if TYPE_CHECKING:
    from pykbroker.config import BrokerConfig

log = logging.getLogger("pykbroker.replication")


class Partition(Protocol):
    """What the fetcher needs of a followed partition; the replica manager's partitions (above this
    layer) satisfy it."""

    topic: str
    index: int
    log: Log
    leader_id: int
    leader_epoch: int
    high_watermark: int

    @property
    def tp(self) -> TopicPartition: ...


class ReplicaManager(Protocol):
    """What the fetcher needs of the replica manager that owns it: where each leader is, the bytes
    replicated in per topic, and the call that follows every append of fetched records."""

    endpoint_of: Callable[[int], tuple[str, int] | None] | None
    replication_bytes_in: dict[str, int]

    def on_follower_appended(self, p: Any, leader_high_watermark: int) -> None: ...

FETCH_API, FETCH_VERSION = 1, 12
LIST_OFFSETS_API, LIST_OFFSETS_VERSION = 2, 7
EARLIEST, LATEST = -2, -1

TopicPartition = tuple[str, int]
FetcherKey = tuple[int, int]  # (leader broker id, fetcher index)


@dataclass(frozen=True, slots=True)
class FetchSettings:
    broker_id: int
    num_fetchers: int = 1
    max_bytes: int = 1048576
    response_max_bytes: int = 10485760
    min_bytes: int = 1
    wait_max_ms: int = 500
    backoff_ms: int = 1000
    socket_timeout_ms: int = 30000
    # log.flush.on.ack: fetched records are fsynced before the next fetch reports them to the leader, so the
    # acknowledgement the leader gives once the ISR has fetched an offset means durable on every ISR replica.
    flush_appends: bool = False

    @classmethod
    def from_config(cls, config: BrokerConfig, broker_id: int) -> FetchSettings:
        return cls(
            broker_id=broker_id,
            num_fetchers=int(config["num.replica.fetchers"]),
            max_bytes=int(config["replica.fetch.max.bytes"]),
            response_max_bytes=int(config["replica.fetch.response.max.bytes"]),
            min_bytes=int(config["replica.fetch.min.bytes"]),
            wait_max_ms=int(config["replica.fetch.wait.max.ms"]),
            backoff_ms=int(config["replica.fetch.backoff.ms"]),
            socket_timeout_ms=int(config["replica.socket.timeout.ms"]),
            flush_appends=bool(config["log.flush.on.ack"]),
        )


@dataclass(slots=True)
class _FetchState:
    partition: Partition
    leader_id: int
    leader_epoch: int
    delayed_until: float = 0.0  # anyio clock: parked after a leadership error


async def _flush_all(logs: list[Log]) -> None:
    """fsync what was just appended to ``logs``, in worker threads, all at once; a log whose dir failed is
    offline already (the next fetch skips it)."""
    async def one(lg: Log) -> None:
        try:
            await anyio.to_thread.run_sync(lg.flush_to, lg.log_end_offset)
        except KafkaStorageError:
            pass

    async with anyio.create_task_group() as tg:
        for lg in logs:
            tg.start_soon(one, lg)


class ReplicaFetcherManager:
    """Which partitions follow which leader, and the fetcher tasks serving them."""

    def __init__(self, replicas: ReplicaManager, settings: FetchSettings | None) -> None:
        self.replicas = replicas
        self.settings = settings
        self._states: dict[TopicPartition, _FetchState] = {}
        self._running: set[FetcherKey] = set()
        self._changed: anyio.Event | None = None  # made by a waiting fetcher, set by the next change
        self._group: anyio.abc.TaskGroup | None = None

    # -- membership (event loop) -------------------------------------------------------------------

    def has(self, tp: TopicPartition) -> bool:
        return tp in self._states

    def add(self, p: Partition) -> None:
        """Fetch ``p`` from its leader (restarting from our LEO after a leader or epoch change)."""
        self._states[p.tp] = _FetchState(p, p.leader_id, p.leader_epoch)
        self._signal()

    def remove(self, tp: TopicPartition) -> None:
        if self._states.pop(tp, None) is not None:
            self._signal()

    def partitions(self) -> dict[TopicPartition, int]:
        """Followed partitions and their leaders."""
        return {tp: st.leader_id for tp, st in self._states.items()}

    def _signal(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        if self._group is not None:
            self._start_missing()

    def _key(self, tp: TopicPartition, leader_id: int) -> FetcherKey:
        n = self.settings.num_fetchers if self.settings is not None else 1
        return leader_id, zlib.crc32(f"{tp[0]}-{tp[1]}".encode()) % max(n, 1)

    def _start_missing(self) -> None:
        assert self._group is not None
        for tp, st in self._states.items():
            key = self._key(tp, st.leader_id)
            if key not in self._running:
                self._running.add(key)
                self._group.start_soon(self._run_fetcher, key)

    # -- tasks -------------------------------------------------------------------------------------

    async def run(self) -> None:
        """For the broker's lifetime: the task group of the fetcher tasks."""
        async with anyio.create_task_group() as tg:
            self._group = tg
            try:
                self._start_missing()
                await anyio.sleep_forever()
            finally:
                self._group = None
                self._running.clear()

    def _assigned(self, key: FetcherKey) -> dict[TopicPartition, _FetchState]:
        return {tp: st for tp, st in self._states.items() if self._key(tp, st.leader_id) == key}

    async def _run_fetcher(self, key: FetcherKey) -> None:
        """Fetch the partitions of ``key`` until none is left (a later add starts a new task)."""
        assert self.settings is not None
        backoff_s = self.settings.backoff_ms / 1000
        client: list[BrokerClient | None] = [None]
        try:
            while True:
                assigned = self._assigned(key)
                if not assigned:
                    self._running.discard(key)  # no await since the check: add() sees it at once
                    return
                try:
                    await self._fetch_once(key, assigned, client)
                except Exception:  # never take the broker down; retry after the backoff
                    log.exception("Replica fetcher for broker %(broker_id)d failed", {"broker_id": key[0]})
                    await anyio.sleep(backoff_s)
        finally:
            self._running.discard(key)
            if client[0] is not None:
                await client[0].close()

    async def _fetch_once(self, key: FetcherKey, assigned: dict[TopicPartition, _FetchState],
                          client_box: list[BrokerClient | None]) -> None:
        assert self.settings is not None
        settings = self.settings
        leader_id = key[0]
        backoff_s = settings.backoff_ms / 1000
        now = anyio.current_time()
        ready = {tp: st for tp, st in assigned.items() if st.delayed_until <= now and not st.partition.log.offline}
        if not ready:  # all parked (or offline): until the first backoff ends or the assignment changes
            waits = [st.delayed_until - now for st in assigned.values() if not st.partition.log.offline]
            if self._changed is None:
                self._changed = anyio.Event()
            changed = self._changed
            with anyio.move_on_after(max(min(waits) if waits else backoff_s, 0.001)):
                await changed.wait()
            return
        endpoint = self.replicas.endpoint_of(leader_id) if self.replicas.endpoint_of else None
        if endpoint is None:
            await anyio.sleep(backoff_s)
            return
        client = client_box[0]
        if client is None or (client.host, client.port) != endpoint:
            if client is not None:
                await client.close()
            client = client_box[0] = BrokerClient(endpoint[0], endpoint[1],
                                                  client_id=f"broker-{settings.broker_id}-fetcher",
                                                  timeout_s=settings.socket_timeout_ms / 1000)
        body = self._build_fetch(ready)
        try:
            resp = await client.request(FETCH_API, FETCH_VERSION, body,
                                        timeout_s=(settings.socket_timeout_ms + settings.wait_max_ms) / 1000)
        except BrokerConnectionError as exc:
            log.info("Fetch from broker %(leader_id)d failed: %(error)s", {"leader_id": leader_id, "error": exc})
            await anyio.sleep(backoff_s)
            return
        if int(resp.error_code) != ErrorCode.none:
            log.warning("Fetch from broker %(leader_id)d answered %(error)s",
                        {"leader_id": leader_id, "error": ErrorCode(resp.error_code).name})
            await anyio.sleep(backoff_s)
            return
        out_of_range: list[_FetchState] = []
        appended: list[Log] = []
        for t in resp.responses:
            for pd in t.partitions:
                st = ready.get((t.topic, int(pd.partition_index)))
                if st is None or self._states.get(st.partition.tp) is not st:
                    continue  # no longer ours to fetch, or refetched by a role change
                leo = st.partition.log.log_end_offset
                if self._process(st, pd, backoff_s):
                    out_of_range.append(st)
                elif st.partition.log.log_end_offset > leo:
                    appended.append(st.partition.log)
        if settings.flush_appends and appended:
            await _flush_all(appended)
        for st in out_of_range:
            try:
                await self._handle_out_of_range(client, st)
            except BrokerConnectionError as exc:
                log.info("ListOffsets to broker %(leader_id)d failed: %(error)s",
                         {"leader_id": leader_id, "error": exc})
                st.delayed_until = anyio.current_time() + backoff_s
        await anyio.lowlevel.checkpoint()

    def _build_fetch(self, ready: dict[TopicPartition, _FetchState]) -> dict[str, Any]:
        assert self.settings is not None
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, index), st in ready.items():
            lg = st.partition.log
            latest = lg.leader_epoch_cache.latest_epoch()
            topics.setdefault(topic, []).append({
                "partition": index,
                "current_leader_epoch": st.leader_epoch,
                "fetch_offset": lg.log_end_offset,
                "last_fetched_epoch": -1 if latest is None else latest,
                "log_start_offset": lg.log_start_offset,
                "partition_max_bytes": self.settings.max_bytes,
            })
        return {
            "replica_id": self.settings.broker_id,
            "max_wait": datetime.timedelta(milliseconds=self.settings.wait_max_ms),
            "min_bytes": self.settings.min_bytes,
            "max_bytes": self.settings.response_max_bytes,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
            "forgotten_topics_data": [],
            "rack_id": "",
        }

    def _process(self, st: _FetchState, pd: Any, backoff_s: float) -> bool:
        """Apply one partition's answer; True when it needs the out-of-range handling."""
        p = st.partition
        err = int(pd.error_code)
        if p.log.offline:
            return False
        if err == ErrorCode.offset_out_of_range:
            return True
        if err != ErrorCode.none:
            log.debug("Fetch of %(topic)s-%(partition)d from %(leader_id)d answered %(error)s; backing off",
                      {"topic": p.topic, "partition": p.index, "leader_id": st.leader_id, "error": ErrorCode(err).name})
            st.delayed_until = anyio.current_time() + backoff_s
            return False
        div = pd.diverging_epoch
        try:
            if int(div.epoch) >= 0 or int(div.end_offset) >= 0:
                self.truncate_on_divergence(p, (int(div.epoch), int(div.end_offset)))
                return False
            records = pd.records
            if records:
                p.log.append_as_follower(records)
                counts = self.replicas.replication_bytes_in
                counts[p.topic] = counts.get(p.topic, 0) + len(records)
            leader_start = int(pd.log_start_offset)
            if leader_start > p.log.log_start_offset:
                try:
                    p.log.delete_records_before(min(leader_start, p.log.log_end_offset),
                                                reason=LogStartOffsetIncrementReason.LEADER_OFFSET_INCREMENTED)
                except OffsetOutOfRange:
                    pass
        except InvalidRecords as exc:
            log.warning("Fetched data of %(topic)s-%(partition)d is invalid (%(error)s); refetching after backoff",
                        {"topic": p.topic, "partition": p.index, "error": exc})
            st.delayed_until = anyio.current_time() + backoff_s
            return False
        except KafkaStorageError:
            return False
        self.replicas.on_follower_appended(p, int(pd.high_watermark))
        return False

    def truncate_on_divergence(self, p: Partition, diverging: tuple[int, int]) -> None:
        """The leader says our log diverges from its history at ``diverging``: truncate (Kafka's rule)."""
        lg = p.log
        local = lg.end_offset_for_epoch(diverging[0]) if diverging[0] >= 0 else None
        offset = follower_truncation_offset(diverging, local, lg.log_end_offset, p.high_watermark)
        if offset < lg.log_end_offset:
            log.info("Truncating %(topic)s-%(partition)d to %(offset)d after the leader's diverging epoch "
                     "%(diverging)s (LEO was %(log_end_offset)d)",
                     {"topic": p.topic, "partition": p.index, "offset": offset, "diverging": diverging,
                      "log_end_offset": lg.log_end_offset})
        lg.truncate_to(offset)  # at the log end it still drops epochs we started there and never wrote
        p.high_watermark = min(p.high_watermark, lg.log_end_offset)

    async def _handle_out_of_range(self, client: BrokerClient, st: _FetchState) -> None:
        """Our LEO is outside the leader's log: ask it for its range and truncate into it."""
        p = st.partition
        latest = await self._list_offset(client, st, LATEST)
        if self._states.get(p.tp) is not st:
            return  # a role change meanwhile (leader here, or another leader): the answer is not about our log
        lg = p.log
        if latest is not None and latest < lg.log_end_offset:
            log.info("Truncating %(topic)s-%(partition)d to the leader's end %(latest)d (LEO was %(log_end_offset)d)",
                     {"topic": p.topic, "partition": p.index, "latest": latest, "log_end_offset": lg.log_end_offset})
            lg.truncate_to(latest)
            p.high_watermark = min(p.high_watermark, lg.log_end_offset)
            return
        earliest = await self._list_offset(client, st, EARLIEST)
        if self._states.get(p.tp) is not st:
            return
        if earliest is not None and earliest > lg.log_end_offset:
            log.info("Restarting %(topic)s-%(partition)d at the leader's log start %(earliest)d (LEO was "
                     "%(log_end_offset)d)",
                     {"topic": p.topic, "partition": p.index, "earliest": earliest,
                      "log_end_offset": lg.log_end_offset})
            lg.truncate_fully_and_start_at(earliest)
            p.high_watermark = earliest

    async def _list_offset(self, client: BrokerClient, st: _FetchState, timestamp: int) -> int | None:
        p = st.partition
        assert self.settings is not None
        # As a replica: the leader answers LATEST with its log end offset, not its high watermark.
        spec = {"partition_index": p.index, "current_leader_epoch": st.leader_epoch, "timestamp": timestamp}
        body = {"replica_id": self.settings.broker_id, "isolation_level": 0,
                "topics": [{"name": p.topic, "partitions": [spec]}]}
        resp = await client.request(LIST_OFFSETS_API, LIST_OFFSETS_VERSION, body)
        for t in resp.topics:
            for pr in t.partitions:
                if int(pr.error_code) == ErrorCode.none and int(pr.partition_index) == p.index:
                    return int(pr.offset)
        return None
